"""The sweep runner with a stand-in cost model: memory filter, ranking, failures, workers, progress."""

from __future__ import annotations

import io
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pandas as pd
import pytest

from simgrid.errors import LayoutError, SimulationError
from simgrid.layout import Layout
from simgrid.model.spec import ModelSpec
from simgrid.sweep import (
    RESULT_COLUMNS,
    ProgressBar,
    SweepConstraints,
    SweepResult,
    cheapest_recompute,
    rank_table,
    sweep,
    sweep_layouts,
)
from simgrid.sweep.progress import format_duration

MODEL = ModelSpec(name="small", num_layers=4, hidden_size=64, num_heads=4, vocab_size=128, seq_length=64)
GIB = 1024**3


@dataclass(frozen=True)
class FakeGPU:
    """Stand-in GPU: only the capacity matters to the stand-in memory estimate."""

    memory_bytes: int = 10 * GIB


@dataclass(frozen=True)
class FakeCluster:
    """Stand-in sized cluster (picklable, so it reaches worker processes)."""

    gpus_per_node: int = 4
    gpu: FakeGPU = FakeGPU()


def fake_memory(model: ModelSpec, layout: Layout, gpu: Any) -> dict[str, Any]:
    """Weights of 24 GiB split over tp*pp (plus 1 GiB of activations per micro-batch sequence)."""
    breakdown = {"weights": 24 * GIB // (layout.tp * layout.pp), "activations": layout.micro_batch_size * GIB}
    total = sum(breakdown.values())
    return {"fits": total <= gpu.memory_bytes, "breakdown": breakdown, "total_bytes": total}


def fake_simulate(model: ModelSpec, cluster: Any, layout: Layout, **_: Any) -> dict[str, Any]:
    """Step time 1 + 0.1*tp + 0.2*pp - 0.05*mbs seconds; fails on purpose for tp=2, pp=2, mbs=2."""
    if (layout.tp, layout.pp, layout.micro_batch_size) == (2, 2, 2):
        raise SimulationError("stand-in failure")
    step = 1 + 0.1 * layout.tp + 0.2 * layout.pp - 0.05 * layout.micro_batch_size
    return {
        "step_time_s": step, "tokens_per_s": 1000 / step, "mfu": 0.5 / step, "hfu": 0.6 / step,
        "tflops_per_gpu": 100 / step, "bubble_fraction": 0.0, "peak_memory_bytes": int(GIB * step),
        "memory_capacity_bytes": 10 * GIB, "fits": True, "exposed_comm_s": {"tp": 0.1, "pp": 0.0, "dp": 0.0},
    }


CONSTRAINTS = SweepConstraints(schedules=("1f1b",), zero_stages=(0,), recompute=("none",), max_mbs=2)


def _run(**kwargs: Any) -> Any:
    return sweep(MODEL, FakeCluster(), 8, 16, constraints=CONSTRAINTS, progress=False,
                 simulate_fn=fake_simulate, estimate_memory_fn=fake_memory, **kwargs)


def test_layouts_that_do_not_fit_are_dropped_with_the_dominant_category() -> None:
    """(tp, pp) in {(1,1), (2,1), (1,2)}: 24 GiB of weights over <= 2 GPUs cannot fit in 10 GiB."""
    result = _run(workers=1)
    # Valid pairs on 8 GPUs / 4 per node / 4 layers: (1,1) (1,2) (1,4) (2,1) (2,2) (2,4) (4,1) (4,2), two mbs each.
    assert result.enumerated == 16
    # weights 24/(tp*pp) GiB + mbs GiB > 10 GiB exactly when tp*pp <= 2: (1,1), (1,2), (2,1) x 2 mbs = 6.
    assert result.memory_dropped == 6
    assert result.memory_reasons == {"weights": 6}
    assert not any((r.tp * r.pp) <= 2 for r in result.table.itertuples())


def test_a_failing_simulation_is_recorded_and_the_sweep_goes_on() -> None:
    """The stand-in raises for tp=2 pp=2 mbs=2; that layout is a failure, the other 9 are ranked."""
    result = _run(workers=1)
    assert len(result.failures) == 1
    (failure,) = result.failures
    assert (failure.layout.tp, failure.layout.pp, failure.layout.micro_batch_size) == (2, 2, 2)
    assert "SimulationError: stand-in failure" in failure.error
    assert len(result.table) == 16 - 6 - 1
    assert result.simulated == 10
    assert any("1 failed" in line for line in result.summary_lines())


def test_table_is_ranked_best_first_by_step_time() -> None:
    """By the stand-in formula the fitting layouts (tp*pp >= 4) rank (4,1,2) 1.5 s first, then (2,2,1) and
    (4,1,1) at 1.55 s, and (2,4,1) last at 1.95 s."""
    result = _run(workers=1)
    steps = list(result.table["step_time_s"])
    assert steps == sorted(steps)
    best = result.best()
    assert (best["tp"], best["pp"], best["mbs"]) == (4, 1, 2)
    assert best["step_time_s"] == pytest.approx(1.5)
    runners_up = {(int(r.tp), int(r.pp), int(r.mbs)) for r in result.table.iloc[1:3].itertuples()}
    assert runners_up == {(2, 2, 1), (4, 1, 1)}
    assert (int(result.table.iloc[-1]["tp"]), int(result.table.iloc[-1]["pp"])) == (2, 4)  # 1.95 s
    assert list(result.table.columns) == list(RESULT_COLUMNS)


def test_top_keeps_the_best_rows_but_counts_cover_everything() -> None:
    """top=3 truncates the table; the counts still describe all 16 layouts."""
    result = _run(workers=1, top=3)
    assert len(result.table) == 3
    assert result.enumerated == 16 and result.memory_dropped == 6


def test_worker_processes_give_the_same_ranking_as_in_process() -> None:
    """Two spawn workers produce the same rows as the in-process path."""
    serial = _run(workers=1)
    parallel = _run(workers=2)
    assert parallel.table.to_dict("records") == serial.table.to_dict("records")
    assert len(parallel.failures) == 1


def test_layouts_that_fit_rank_before_those_that_do_not() -> None:
    """rank_table puts fits=True rows first even when a non-fitting row is faster."""
    rows = [
        {"dp": 1, "tp": 1, "pp": 1, "step_time_s": 1.0, "peak_memory_bytes": 9, "fits": False},
        {"dp": 1, "tp": 1, "pp": 1, "step_time_s": 2.0, "peak_memory_bytes": 1, "fits": True},
    ]
    df = rank_table(rows)
    assert list(df["fits"]) == [True, False]


def test_best_of_an_empty_sweep_explains_why() -> None:
    """With nothing simulated, best() raises naming the counts."""
    result = sweep_layouts(MODEL, FakeCluster(), 8, [], progress=False, simulate_fn=fake_simulate,
                           estimate_memory_fn=fake_memory)
    with pytest.raises(LayoutError, match="no layout could be simulated"):
        result.best()


def test_progress_off_a_terminal_is_a_plain_line_every_interval() -> None:
    """A redirected search prints no control characters but, every ``interval_s`` (here on a fake clock),
    one line with done/total, the rate and the time left; close() adds the last line."""
    clock = iter([0.0, 1.0, 6.0, 7.0, 12.5, 13.0]).__next__
    stream = io.StringIO()
    bar = ProgressBar(4, stream=stream, interval_s=5.0, clock=clock)
    bar.advance(1)  # t = 1: too early for a line
    assert stream.getvalue() == ""
    bar.advance(1)  # t = 6: a line
    bar.advance(1, failed=True)  # t = 7: too early again
    bar.update_to(4)  # t = 12.5: a line
    bar.close()  # t = 13: the last line
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3 and "\r" not in stream.getvalue()
    assert lines[0].startswith("simgrid: 2/4 layouts") and "ETA" in lines[0]
    assert "4/4" in lines[-1] and "(1 failed)" in lines[-1]


def test_progress_is_silent_when_disabled_and_a_short_run_prints_nothing() -> None:
    """enabled=False prints nothing; a run shorter than one interval prints no line either."""
    stream = io.StringIO()
    bar = ProgressBar(4, stream=stream, enabled=False)
    bar.advance(4)
    bar.close()
    quick = ProgressBar(4, stream=stream)
    quick.advance(4)
    quick.close()
    assert stream.getvalue() == ""
    assert "0/4 layouts" in ProgressBar(4, stream=stream).render(1.0)


@pytest.mark.parametrize(("seconds", "text"), [(42.4, "42s"), (185, "3m05s"), (3720, "1h02m"), (float("nan"), "?")])
def test_format_duration(seconds: float, text: str) -> None:
    """Durations print in the largest sensible unit."""
    assert format_duration(seconds) == text


def test_recompute_variants_of_a_fitting_layout_are_skipped() -> None:
    """Only the least-recompute variant of otherwise equal fitting layouts is simulated."""
    a_none = Layout(dp=2, tp=2, micro_batch_size=1, global_batch_size=4, recompute="none")
    a_full = Layout(dp=2, tp=2, micro_batch_size=1, global_batch_size=4, recompute="full")
    b_sel = Layout(dp=2, tp=2, micro_batch_size=2, global_batch_size=4, recompute="selective")
    b_full = Layout(dp=2, tp=2, micro_batch_size=2, global_batch_size=4, recompute="full")
    assert cheapest_recompute([a_full, b_full, a_none, b_sel]) == [a_none, b_sel]


def test_sweep_counts_the_skipped_recompute_variants() -> None:
    """With recompute none/selective/full and everything fitting, two of every three are skipped."""
    everything_fits = SweepConstraints(schedules=("1f1b",), zero_stages=(0,), max_mbs=1, tp=4, pp=2)
    result = sweep(MODEL, FakeCluster(), 8, 16, constraints=everything_fits, progress=False, workers=1,
                   simulate_fn=fake_simulate, estimate_memory_fn=fake_memory)
    assert result.enumerated == 3  # dp = 1: one layout per recompute policy
    assert result.dominated == 2
    assert list(result.table["recompute"]) == ["none"]
    unpruned = sweep(MODEL, FakeCluster(), 8, 16, constraints=everything_fits, progress=False, workers=1,
                     simulate_fn=fake_simulate, estimate_memory_fn=fake_memory, prune_recompute=False)
    assert len(unpruned.table) == 3 and unpruned.dominated == 0


def test_summary_shows_each_invalid_reason_with_a_concrete_example() -> None:
    """The account of dropped candidates quotes one candidate's own numbers (``e.g.`` when several share
    the reason) instead of the blanked reason key."""
    result = SweepResult(
        table=pd.DataFrame(), tried=5,
        invalid_reasons=Counter({"pp = N does not divide N": 4, "tp = N too big": 1}),
        invalid_examples={"pp = N does not divide N": "pp = 3 does not divide 32", "tp = N too big": "tp = 16 too big"},
    )
    lines = result.summary_lines()
    assert "       4 invalid, e.g. pp = 3 does not divide 32" in lines
    assert "       1 invalid: tp = 16 too big" in lines
