"""The layout search on a published case: gpt3-175b on 1024 A100s with global batch 1536 (Narayanan et al.,
SC'21), searched with the recipe Megatron-LM had in 2021.

Megatron's finding (SC'21 takeaway #1, from its Fig. 13, and the tp = 8 of every large model it trained):
use tensor parallelism up to the GPUs of one server, then pipeline parallelism across servers. The tests
below assert the parts of that finding the simulator reproduces, and keep the one part it does not (tp 8
strictly ahead of tp 4 at this size) as a strict expected failure; docs/design.md ("Known disagreements")
works the numbers and records why the disagreement is kept rather than tuned away.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from simgrid.sweep import SweepConstraints, SweepResult, sweep

#: Ranking gaps below this are not findings: half the 10% step-time accuracy the simulator is validated to
#: against Megatron's published runs (docs/validation.md).
RESOLVABLE_GAP = 0.05


@pytest.fixture(scope="module")
def megatron_2021_search() -> SweepResult:
    """Mixed-precision Adam without ZeRO (the distributed optimizer came to Megatron-LM later), full
    recompute and micro-batch 1 (SC'21 Table 1's recipe at this size), the 1F1B schedule, tp over 1 .. 16
    with tensor parallelism allowed across nodes, pp over 1 .. 16: the memory model and the engine decide."""
    constraints = SweepConstraints(
        schedules=("1f1b",), recompute=("full",), micro_batch_sizes=(1,), zero_stages=(0,),
        max_pp=16, max_tp=16, allow_tp_across_nodes=True,
    )
    result = sweep("gpt3-175b", "dgx-a100-hdr", 1024, 1536, constraints=constraints, workers=2, progress=False)
    assert not result.failures, result.failures[:3]
    return result


def _fastest(table: pd.DataFrame) -> dict[str, Any]:
    assert not table.empty
    row: dict[str, Any] = table.sort_values("step_time_s").iloc[0].to_dict()
    return row


@pytest.mark.slow
def test_winner_needs_pipeline_parallelism(megatron_2021_search: SweepResult) -> None:
    """Without ZeRO a 175B model does not fit one 8-GPU node's worth of tensor parallelism: the winner
    pipelines across nodes."""
    best = megatron_2021_search.best()
    assert best["pp"] > 1, megatron_2021_search.table.head(5).to_string()
    assert best["tp"] <= 8, megatron_2021_search.table.head(5).to_string()


@pytest.mark.slow
def test_tensor_parallelism_across_nodes_loses_clearly(megatron_2021_search: SweepResult) -> None:
    """Every layout whose tensor-parallel group spans nodes (tp 16 on 8-GPU DGX A100s: its all-reduces run
    over InfiniBand) is slower than the best in-node layout by far more than the simulator's error."""
    table = megatron_2021_search.table
    in_node = _fastest(table[table["tp"] <= 8])
    across = table[table["tp"] > 8]
    assert not across.empty, "the search should have simulated tp 16 layouts"
    gap = across["step_time_s"].min() / in_node["step_time_s"] - 1.0
    assert gap > 4 * RESOLVABLE_GAP, table.to_string()


@pytest.mark.slow
def test_megatrons_tp8_layout_is_within_the_simulators_resolution_of_the_best(
    megatron_2021_search: SweepResult,
) -> None:
    """Megatron's choice (tp 8 with pipeline parallelism) is not ruled out: its best layout is within
    RESOLVABLE_GAP of the winner, so the simulator cannot call it a worse choice."""
    table = megatron_2021_search.table
    tp8 = _fastest(table[(table["tp"] == 8) & (table["pp"] > 1)])
    gap = tp8["step_time_s"] / megatron_2021_search.best()["step_time_s"] - 1.0
    assert gap <= RESOLVABLE_GAP, table.to_string()


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="known disagreement (docs/design.md, 'Known disagreements'): the simulator ranks tp 4, pp 16, dp 16 "
    "(28.1 s) 3.0% ahead of tp 8, pp 8, dp 16 (29.0 s): tp 8 pays 3.0 s of exposed tensor-parallel all-reduces "
    "against 1.2 s, more than its smaller pipeline bubble (6% vs 15%) saves. strict: this starts failing "
    "(XPASS) as soon as the model ranks tp 8 first, and the mark must go then.",
)
def test_winner_is_tp8_with_pipeline_parallelism(megatron_2021_search: SweepResult) -> None:
    """The finding as Megatron states it, at this size: the winner is tp 8 with pp > 1."""
    best = megatron_2021_search.best()
    assert best["tp"] == 8 and best["pp"] > 1, megatron_2021_search.table.head(5).to_string()
