"""Bubble fraction on the ideal cluster against the textbook formulas (issue 4's required test).

Equal stage times: real stages differ (the first carries the embedding, the last the head and loss),
so the test rewrites the costs of a built program: every forward of a (stage, micro-batch) costs one
unit of FLOPs in total, a full backward two, an input-grad or weight-grad backward one each, with no
memory traffic or kernel overhead, split evenly over the ops that cover it. On the ``ideal`` cluster
(every op at peak, infinite bandwidth, zero latency) communication is then free, stages are equal and
the pipeline behaves as in the papers: GPipe / 1F1B (p-1)/(m+p-1), interleaved (p-1)/(v*m+p-1)
(Narayanan et al., SC'21, sec. 2.2), and ZB-H1 lower than 1F1B (Qi et al., ICLR 2024).
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from simgrid.engine import simulate_program
from simgrid.hardware import load_cluster
from simgrid.ir import Compute, Program
from simgrid.layout import Layout
from simgrid.metrics import bubble_fraction
from simgrid.model import get_model
from simgrid.schedules import build_program

UNIT_FLOPS = 312e9  # 1 ms on the ideal GPU (312 TFLOP/s)
UNITS = {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0, "R": 1.0}


def equal_stage_program(program: Program) -> Program:
    """The same program with every (kind, stage, micro-batch) costing UNITS[kind] units in total."""
    ranks = []
    for ops in program.ranks:
        pieces = Counter((op.kind, op.stage, op.microbatch) for op in ops if isinstance(op, Compute))
        new_ops = []
        for op in ops:
            if isinstance(op, Compute) and op.kind in UNITS:
                share = UNITS[op.kind] * UNIT_FLOPS / pieces[(op.kind, op.stage, op.microbatch)]
                op = dataclasses.replace(op, flops=share, hbm_bytes=0.0, kernels=0, gemm_mnk=(0, 0, 0), gemms=(),
                                         attention_flops=0.0, attention_shape=(0, 0, 0))
            new_ops.append(op)
        ranks.append(tuple(new_ops))
    return dataclasses.replace(program, ranks=tuple(ranks))


def ideal_bubble(model_name: str, layout: Layout, granularity: str = "stage") -> float:
    model = get_model(model_name)
    program = equal_stage_program(build_program(model, layout, granularity=granularity))  # type: ignore[arg-type]
    result = simulate_program(program, load_cluster("ideal", gpus=layout.world_size), mode="full")
    return bubble_fraction(result.trace)


@pytest.mark.parametrize(("schedule", "p", "m"), [("gpipe", 4, 8), ("1f1b", 4, 8), ("1f1b", 2, 6), ("gpipe", 2, 3)])
def test_gpipe_and_1f1b_bubble_is_textbook(schedule: str, p: int, m: int) -> None:
    """GPipe and 1F1B idle (p-1)/(m+p-1) of the pipeline window when stages are equal."""
    layout = Layout(pp=p, global_batch_size=m, schedule=schedule)  # type: ignore[arg-type]
    assert ideal_bubble("tiny-gpt", layout) == pytest.approx((p - 1) / (m + p - 1), rel=1e-9, abs=1e-12)


@pytest.mark.parametrize(("model", "p", "v", "m"), [("tiny-gpt", 2, 2, 4), ("gpt2-small", 4, 3, 8), ("gpt2-small", 2, 3, 6)])
def test_interleaved_bubble_is_textbook(model: str, p: int, v: int, m: int) -> None:
    """Interleaved 1F1B with v chunks per rank idles (p-1)/(v*m+p-1)."""
    layout = Layout(pp=p, vpp=v, global_batch_size=m, schedule="interleaved-1f1b")
    assert ideal_bubble(model, layout) == pytest.approx((p - 1) / (v * m + p - 1), rel=1e-9, abs=1e-12)


def test_block_granularity_gives_the_same_bubble() -> None:
    """Splitting each stage's work into per-block ops changes nothing when totals are equal."""
    layout = Layout(pp=4, global_batch_size=8, schedule="1f1b")
    assert ideal_bubble("tiny-gpt", layout, "block") == pytest.approx(3 / 11, rel=1e-9)


def test_zero_bubble_h1_beats_1f1b() -> None:
    """ZB-H1 fills the 1F1B bubble with deferred weight-gradient work: strictly lower bubble."""
    one_f_one_b = ideal_bubble("tiny-gpt", Layout(pp=4, global_batch_size=8, schedule="1f1b"))
    zb_h1 = ideal_bubble("tiny-gpt", Layout(pp=4, global_batch_size=8, schedule="zb-h1"))
    assert zb_h1 < one_f_one_b - 1e-6
