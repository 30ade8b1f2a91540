"""The search's ranking is event-level exact: its best layouts are those of simulating every layout, and
each of their rows is what ``simgrid simulate`` reports for that layout (and the SimPy interpreter's step).

A smaller search than the benchmarks' (small-gpt on 16 A100s, every schedule, ZeRO stage, recompute
policy, micro-batch size, sequence parallelism and FlashAttention setting): the branch-and-bound search
(best 20 exact, the rest skipped by their lower bound) against the exhaustive one, and its top 20 against
:func:`simgrid.simulate` (what the CLI's ``simulate`` runs) at the search's stage granularity.
"""

from __future__ import annotations

import math

import pytest

from simgrid.engine import simulate_program
from simgrid.hardware import load_cluster
from simgrid.layout import Layout
from simgrid.simulation import simulate
from simgrid.sweep import SweepConstraints, sweep
from simgrid.sweep.runner import METRIC_COLUMNS

SEARCH = ("small-gpt", "dgx-a100-hdr", 16, 64)
CONSTRAINTS = SweepConstraints(sequence_parallel=(False, True), flash_attention=(False, True), max_mbs=4)


@pytest.fixture(scope="module")
def searches() -> tuple[object, object]:
    bounded = sweep(*SEARCH, constraints=CONSTRAINTS, workers=1, progress=False)
    exhaustive = sweep(*SEARCH, constraints=CONSTRAINTS, workers=1, progress=False, exact_top=None)
    return bounded, exhaustive


def test_branch_and_bound_keeps_the_exhaustive_top_20(searches: tuple) -> None:
    """The bound skipped most layouts, yet the best 20 rows are exactly the exhaustive search's."""
    bounded, exhaustive = searches
    assert bounded.exact_top == 20 and exhaustive.exact_top is None
    assert bounded.bounded > bounded.enumerated // 2
    assert exhaustive.bounded == 0 and len(exhaustive.table) > 5 * len(bounded.table) // 2
    assert bounded.table.head(20).to_dict("records") == exhaustive.table.head(20).to_dict("records")


def test_top_20_equal_simulate_of_the_same_layouts(searches: tuple) -> None:
    """Each of the 20 best rows: step time within 1e-9 of simulate()'s, every other metric equal too."""
    bounded, _ = searches
    model, cluster, gpus, gbs = SEARCH
    for row in bounded.table.head(20).to_dict("records"):
        layout = Layout(dp=row["dp"], tp=row["tp"], pp=row["pp"], cp=row["cp"], vpp=row["vpp"], zero=row["zero"],
                        micro_batch_size=row["mbs"], global_batch_size=gbs, schedule=row["schedule"],
                        recompute=row["recompute"], sequence_parallel=row["sequence_parallel"],
                        flash_attention=row["flash_attention"])
        result = simulate(model, cluster, layout, granularity="stage")
        metrics = result.metrics
        assert math.isclose(row["step_time_s"], metrics.step_time_s, rel_tol=1e-9, abs_tol=0.0), layout
        # simulate() runs the fast engine; the SimPy interpreter gives the same step for the same program.
        reference = simulate_program(result.program, load_cluster(cluster, gpus=gpus), engine="simpy")
        assert math.isclose(row["step_time_s"], reference.makespan_s, rel_tol=1e-9, abs_tol=0.0), layout
        for name in METRIC_COLUMNS:
            assert row[name] == pytest.approx(getattr(metrics, name), rel=1e-9), (layout, name)
        for kind in ("tp", "cp", "pp", "dp"):
            assert row[f"exposed_{kind}_s"] == pytest.approx(metrics.exposed_comm_s[kind], rel=1e-9, abs=1e-15)


def test_summary_says_what_the_bound_skipped(searches: tuple) -> None:
    """The account names the skipped layouts and how to simulate them anyway."""
    bounded, _ = searches
    text = "\n".join(bounded.summary_lines())
    assert f"skipped {bounded.bounded} whose lower bound exceeds the 20th best step time" in text
    assert "--exhaustive" in text
