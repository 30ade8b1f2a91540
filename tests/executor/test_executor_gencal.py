"""Generation's in-situ calibration: recorded steps turned into the serving cost model's events (collectives
and hand-offs under the model's sizes, ranks' compute), the rates recovered from steps priced at known
rates, and a real 2-rank run writing every row the serving model reads."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

from executor.gencal import (  # noqa: E402
    StageStep,
    calibrate_generation,
    fit_rates,
    generation_layouts,
    run_means,
    run_samples,
    step_shape,
    with_rows,
)
from executor.generate import CommCall, GenerationResult, RankTimeline  # noqa: E402
from executor.launch import LaunchConfig  # noqa: E402
from executor.profilefit import ComputeFit, build_profile  # noqa: E402
from simgrid.errors import SimgridError  # noqa: E402
from simgrid.hardware import ClusterSpec  # noqa: E402
from simgrid.model import get_model  # noqa: E402
from simgrid.serving import IterationCostModel, ServingConfig, ServingLayout  # noqa: E402
from simgrid.serving.insitu import LAUNCH_KEY, MATRIX_KEY, InSituCosts, collective_key, hop_key  # noqa: E402
from simgrid.topology import Topology  # noqa: E402

TINY = get_model("tiny-gpt")  # 4 layers, h 64, vocab 256


def _profile() -> ClusterSpec:
    """A CPU-like profile as the training calibration writes it: 30 GFLOP/s, 10 GB/s, no launch cost."""
    comm = {"collectives": [("all_reduce", 256, 3e-4), ("all_reduce", 2**20, 2e-3)],
            "p2p": [(256, 2e-4), (2**20, 1e-3)], "memory_Bps": 10e9}
    fit = ComputeFit(peak_flops=30e9, bandwidth_Bps=10e9, overhead_s=0.0, samples=1, mean_abs_error=0.0)
    return build_profile(name="cpu", world_size=2, comm=comm, fit=fit)


def _cost(layout: ServingLayout, spec: ClusterSpec | None = None) -> IterationCostModel:
    spec = spec or _profile()
    return IterationCostModel(TINY, layout, ServingConfig(dtype="fp32"), Topology(spec.sized(layout.world_size)))


def _tp2_run(calls_per_step: int = 10) -> GenerationResult:
    """Two ranks, a prefill and one decode step of 2 prompts of 6 tokens: each step 10 ms long, starting
    at 0 and 10 ms; every all-reduce takes 0.5 ms, the logits' all-gather 1 ms, called back to back."""
    timelines = []
    for rank in range(2):
        line = RankTimeline(rank=rank)
        for step in range(2):
            start = 0.010 * step
            line.steps.append((start, start + 0.010))
            t = start + 0.001
            for i in range(calls_per_step):
                kind, length = ("all_gather", 0.001) if i == calls_per_step - 1 else ("all_reduce", 0.0005)
                line.calls.append(CommCall(step=step, kind=kind, bytes=123, start_s=t, end_s=t + length))
                t += length + 0.0001
        timelines.append(line)
    return GenerationResult(tokens=[[0, 0], [0, 0]], step_s=[0.010, 0.010], timelines=timelines)


def test_tensor_parallel_calls_are_filed_under_the_models_sizes() -> None:
    """Prefill of 12 tokens: 9 all-reduces of 12 x 64 x 4 = 3072 B; decode of 2: 512 B; the logits' gather
    under its whole output, 2 x 256 x 4 = 2048 B (not the rank's slice the executor sent). Each rank's
    compute is its step less its calls: 10 ms - 9 x 0.5 - 1 = 4.5 ms."""
    samples, steps = run_samples(_tp2_run(), _cost(ServingLayout(tp=2)), batch=2, prompt_tokens=6)
    by_key: dict[str, list[float]] = {}
    for key, sec in samples:
        by_key.setdefault(key, []).append(sec)
    assert set(by_key) == {collective_key("all_reduce", 2, 3072), collective_key("all_reduce", 2, 512),
                           collective_key("all_gather", 2, 2048)}
    assert by_key[collective_key("all_reduce", 2, 3072)] == pytest.approx([0.0005] * 18)
    assert by_key[collective_key("all_gather", 2, 2048)] == pytest.approx([0.001] * 4)
    assert [(s.stage, s.prefill, s.shape.tokens) for s in steps] == [(0, True, 12), (0, True, 12), (0, False, 2),
                                                                    (0, False, 2)]
    assert [s.compute_s for s in steps] == pytest.approx([0.0045] * 4)


def test_a_run_that_disagrees_with_the_model_is_refused() -> None:
    """An all-reduce missing from a step (generation and the cost model count differently) names both lists."""
    with pytest.raises(SimgridError, match="the serving cost model expects"):
        run_samples(_tp2_run(calls_per_step=9), _cost(ServingLayout(tp=2)), batch=2, prompt_tokens=6)


def test_pipeline_hand_offs_run_from_the_send_to_the_peers_receive() -> None:
    """PP2, one decode step (2 sequences): stage 0 sends at 1 ms, stage 1's receive returns at 3 ms: 2 ms
    under the model's 2 x 2 x 64 x 4 = 1024 B; stage 1 sends the token ids at 5 ms, stage 0's receive
    returns at 9 ms: 4 ms under 16 B. Compute: stage 0 10 - 8 = 2 ms of its 10 ms step (its send took 1 ms,
    its receive 7), stage 1 its 7 ms step less 3 ms of calls."""
    def call(step: int, kind: str, start: float, end: float) -> CommCall:
        return CommCall(step=step, kind=kind, bytes=1, start_s=start, end_s=end)

    stage0 = RankTimeline(rank=0, steps=[(0.0, 0.001), (0.0, 0.010)],
                          calls=[call(1, "send", 0.001, 0.002), call(1, "recv", 0.002, 0.009)])
    stage1 = RankTimeline(rank=1, steps=[(0.0, 0.001), (0.001, 0.008)],
                          calls=[call(1, "recv", 0.001, 0.003), call(1, "send", 0.005, 0.006)])
    run = GenerationResult(tokens=[[0, 0]] * 2, step_s=[0.001, 0.010], timelines=[stage0, stage1])
    samples, steps = run_samples(run, _cost(ServingLayout(pp=2)), batch=2, prompt_tokens=6)
    assert samples == [(hop_key(1024), pytest.approx(0.002)), (hop_key(16), pytest.approx(0.004))]
    decode = [s for s in steps if not s.prefill]
    assert [(s.stage, s.compute_s) for s in decode] == [(0, pytest.approx(0.002)), (1, pytest.approx(0.004))]


def test_rates_are_recovered_from_steps_priced_at_known_rates() -> None:
    """Stage-steps whose compute is exactly what the serving model charges at 18 us per kernel and 80
    GFLOP/s (prefills of 2 x 30 and 8 x 20 tokens, decodes after them, TP2 and PP2) give back those rates,
    starting from the profile's 30 GFLOP/s and no launch cost."""
    truth = with_rows(_profile(), [(LAUNCH_KEY, 18e-6), (MATRIX_KEY, 1 / 80)])
    steps = []
    for layout in (ServingLayout(tp=2), ServingLayout(pp=2)):
        cost = _cost(layout, truth)
        for batch, prompt in ((2, 30), (8, 20)):
            for step in range(4):
                shape = step_shape(batch, prompt, step)
                for stage in range(layout.pp):
                    parts = cost.stage_parts(stage, shape)
                    steps.append(StageStep(layout=layout, stage=stage, shape=shape, prefill=step == 0,
                                           compute_s=parts["gemm"] + parts["attention"] + parts["elementwise"]
                                           + parts["launch"]))
    rows = dict(fit_rates(TINY, _profile(), steps))
    assert rows[LAUNCH_KEY] == pytest.approx(18e-6, rel=1e-3)
    assert rows[MATRIX_KEY] == pytest.approx(1 / 80, rel=1e-3)


def test_rows_are_means_of_run_means_with_every_call_counted() -> None:
    """A call ten times the others counts in its run's mean (a step pays gloo's 4 ms ticks at their rate):
    runs of (1, 1, 10) and (2) us give (4 + 2) / 2 = 3 us; over ten runs of means 1..10 us the slowest and
    fastest run are trimmed (5.5 us)."""
    assert run_means([("a", 0, 1e-6), ("a", 0, 1e-6), ("a", 0, 10e-6), ("a", 1, 2e-6)]) == {"a": pytest.approx(3.0)}
    assert run_means([("b", run, (run + 1) * 1e-6) for run in range(10)]) == {"b": pytest.approx(5.5)}


def test_layouts_are_the_ones_the_model_splits_into() -> None:
    """Two ranks: TP2 and PP2; one rank: one process (launch cost only)."""
    assert generation_layouts(TINY, 2) == [ServingLayout(tp=2), ServingLayout(pp=2)]
    assert generation_layouts(TINY, 1) == [ServingLayout()]


@pytest.mark.torch
@pytest.mark.timeout(240)
def test_real_generation_writes_every_row_the_serving_model_reads() -> None:
    """tiny-gpt on 2 gloo ranks (TP2 and PP2; prompts shortened to its 32-token context): a launch cost, a
    matrix rate, all-reduces at the decode and prefill sizes, the logits' gather and both hand-offs, all
    positive; the serving model on the profile with these rows reads them all back."""
    fit = calibrate_generation(TINY, _profile(), world_size=2,
                               config=LaunchConfig(world_size=2, run_timeout_s=200, comm_timeout_s=60))
    rows = dict(fit.rows)
    assert fit.decode_samples > 0 and fit.prefill_samples > 0
    assert rows[MATRIX_KEY] > 0 and rows[LAUNCH_KEY] >= 0
    assert collective_key("all_reduce", 2, 2 * 64 * 4) in rows  # a 2-sequence decode
    assert collective_key("all_reduce", 2, 8 * 64 * 4) in rows  # an 8-sequence decode
    assert collective_key("all_gather", 2, 8 * 256 * 4) in rows
    assert hop_key(2 * 2 * 64 * 4) in rows and hop_key(8 * 8) in rows
    assert all(sec > 0 for key, sec in rows.items() if key != LAUNCH_KEY)
    insitu = InSituCosts.from_tables(with_rows(_profile(), list(fit.rows)).measured)
    assert insitu is not None and insitu.launch_us == pytest.approx(fit.launch_us)
    assert "us per kernel" in fit.summary() and "all_reduce:2:512" in fit.summary()
    assert dataclasses.replace(fit, rows=()).summary().endswith("no communication (one rank)")
