"""The layout search on a published case: gpt3-175b on 1024 A100s (Narayanan et al., SC'21)."""

from __future__ import annotations

import pytest

from simgrid.sweep import SweepConstraints, sweep


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="known disagreement (see docs/design.md, 'Known disagreements'): the simulator ranks tp 4, pp 16, "
    "dp 16 (25.9 s) 3% ahead of tp 8, pp 8, dp 16 (26.7 s): tp 8 pays 3.0 s of exposed tensor-parallel "
    "all-reduces against 1.2 s, more than its smaller pipeline bubble (6% vs 15%) saves. strict: this test "
    "starts failing (XPASS) as soon as the model reproduces Megatron's finding, so the mark must go then.",
)
def test_gpt3_175b_on_1024_a100_prefers_tp8_with_pipeline_parallelism() -> None:
    """Megatron-LM's finding (SC'21 section 5.4 and Table 1, Korthikanti 2022 Table 3: 175B trained with
    tp = 8, pp = 8): for gpt3-175b on 1024 A100-80GB with global batch 1536 the best layout uses tensor
    parallelism over all 8 GPUs of a node and pipeline parallelism across nodes.

    The search is the one Megatron-LM had in 2021: mixed-precision Adam without ZeRO (the distributed
    optimizer came to Megatron-LM later), full recompute and micro-batch 1 (SC'21 Table 1's recipe at this
    size), the 1F1B schedule (interleaving changes the bubble, not the tp/pp trade-off), tp over 1, 2, 4, 8
    and pp over 1 .. 16, so less tensor parallelism, deeper pipelines and no pipeline are all competitors;
    the memory model and the engine decide. (With ZeRO-1 allowed the simulator ranks tp 4, pp 4, dp 64
    within a few percent of tp 8, pp 8: the distributed optimizer removes the memory wall that forces
    tp = 8; see docs/validation.md.)
    """
    constraints = SweepConstraints(
        schedules=("1f1b",), recompute=("full",), micro_batch_sizes=(1,), zero_stages=(0,), max_pp=16,
    )
    result = sweep("gpt3-175b", "dgx-a100-hdr", 1024, 1536, constraints=constraints, workers=2, progress=False)
    assert not result.failures, result.failures[:3]
    best = result.best()
    assert best["tp"] == 8, result.table.head(5).to_string()
    assert best["pp"] > 1, result.table.head(5).to_string()
