"""The compute time of a stage does not depend on how finely the program is cut: one stage-granularity op
over blocks ``[start, end)`` costs the sum of the per-block ops it stands for (GEMMs are separate launches,
so merging equal shapes of several layers must not pack their tiles into shared waves)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from simgrid.costs import compute_time_s
from simgrid.hardware import load_cluster
from simgrid.layout import Layout
from simgrid.model import get_model
from simgrid.schedules.lower.compute import compute_op
from simgrid.schedules.lower.context import LoweringContext

CASES = [
    ("tiny-gpt", "dgx-a100-hdr", Layout(tp=2, cp=2, dp=4, global_batch_size=32, recompute="full")),
    ("gpt2-small", "dgx-h100-ndr", Layout(tp=2, dp=2, micro_batch_size=2, global_batch_size=8)),
    ("megatron-1.7b", "dgx-a100-hdr", Layout(tp=1, pp=2, dp=4, global_batch_size=64, schedule="1f1b",
                                              sequence_parallel=False, flash_attention=True)),
    ("llama2-7b", "dgx-h100-ndr", Layout(tp=4, pp=2, dp=1, global_batch_size=8, schedule="1f1b",
                                          sequence_parallel=True, flash_attention=True, kernel_fusion="eager")),
]


@pytest.mark.parametrize(("name", "cluster", "layout"), CASES, ids=[c[0] for c in CASES])
def test_stage_op_costs_the_sum_of_its_block_ops(name: str, cluster: str, layout: Layout) -> None:
    model = dataclasses.replace(get_model(name), num_layers=4)
    gpu = load_cluster(cluster, gpus=layout.world_size).gpu
    ctx = LoweringContext(model=model, layout=layout, granularity="stage")
    for stage in range(layout.num_stages):
        blocks = ctx.blocks(stage)
        for kind in ("F", "B"):
            whole = compute_op(ctx, kind, stage, 0, blocks.start, blocks.stop)
            parts = [compute_op(ctx, kind, stage, 0, b, b + 1) for b in blocks]
            assert whole.gemms and all(p.gemms or p.flops == p.attention_flops for p in parts)
            total = sum(compute_time_s(p, gpu, dtype=layout.precision) for p in parts)
            assert math.isclose(compute_time_s(whole, gpu, dtype=layout.precision), total, rel_tol=1e-9), (kind, stage)
        if layout.recompute != "none":  # block granularity reruns only the blocks that recompute anything
            whole = compute_op(ctx, "R", stage, 0, blocks.start, blocks.stop)
            parts = [compute_op(ctx, "R", stage, 0, b, b + 1) for b in blocks if ctx.cost(b).recompute_flops > 0]
            total = sum(compute_time_s(p, gpu, dtype=layout.precision) for p in parts)
            assert math.isclose(compute_time_s(whole, gpu, dtype=layout.precision), total, rel_tol=1e-9), ("R", stage)
