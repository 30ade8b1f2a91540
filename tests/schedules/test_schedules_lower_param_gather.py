"""ZeRO-1 parameter all-gather overlapped with the next step's forward (Megatron-Core --overlap-param-gather):
where the gathers and their waits sit, one in flight, bytes conserved, stage-granularity splitting."""

from __future__ import annotations

import dataclasses
from itertools import pairwise

import pytest
from schedule_helpers import TINY

from simgrid.errors import LayoutError
from simgrid.ir.dryrun import dry_run
from simgrid.ir.ops import Collective, Compute, Wait
from simgrid.ir.validate import validate_program
from simgrid.layout.spec import Layout
from simgrid.schedules import build_program
from simgrid.schedules.buckets import grad_buckets

BASE = Layout(dp=2, zero=1, global_batch_size=6, bucket_size_MB=0.02, overlap_param_gather=True)


def _ops(layout: Layout, rank: int = 0, granularity: str = "block") -> tuple:
    program = build_program(TINY, layout, granularity=granularity)  # type: ignore[arg-type]
    validate_program(program)
    dry_run(program)
    return program.ranks[rank]


def _gathers(ops: tuple) -> list[tuple[int, Collective]]:
    return [(i, op) for i, op in enumerate(ops) if isinstance(op, Collective) and op.purpose == "zero-param"]


def _first_compute(ops: tuple) -> int:
    return next(i for i, op in enumerate(ops) if isinstance(op, Compute))


def test_gathers_run_in_forward_order_each_waited_before_its_first_forward() -> None:
    """The forward-first bucket's gather is issued before any compute; every bucket's WAIT sits right before
    the micro-batch-0 forward op of the bucket's first block and is followed by the next bucket's gather."""
    ops = _ops(BASE)
    buckets = grad_buckets(TINY, BASE, 0)
    assert len(buckets) >= 3
    gathers = _gathers(ops)
    assert [op.label for _, op in gathers] == [f"s0:bucket{b.index}" for b in reversed(buckets)]
    assert gathers[0][0] < _first_compute(ops)
    for k, bucket in enumerate(reversed(buckets)):
        handle = gathers[k][1].handle
        wait = next(i for i, op in enumerate(ops) if isinstance(op, Wait) and op.handle == handle)
        after = wait + 1
        if k + 1 < len(buckets):
            assert ops[after] is gathers[k + 1][1]  # the next gather is issued once this one is done
            after += 1
        forward = ops[after]
        assert isinstance(forward, Compute) and forward.kind == "F" and forward.microbatch == 0
        assert forward.block_start == min(bucket.blocks)


def test_one_gather_in_flight_and_none_after_the_optimizer() -> None:
    """Each gather is issued only after the previous one was waited for; the optimizer step is followed by no
    parameter gather (the next step's forward gathers what it updated)."""
    ops = _ops(BASE)
    gathers = _gathers(ops)
    for (_, prev), (index, _) in pairwise(gathers):
        waited = next(i for i, op in enumerate(ops) if isinstance(op, Wait) and op.handle == prev.handle)
        assert waited < index
    opt = next(i for i, op in enumerate(ops) if isinstance(op, Compute) and op.kind == "OPT")
    assert max(i for i, _ in gathers) < opt


@pytest.mark.parametrize("granularity", ["block", "stage"])
@pytest.mark.parametrize("extra", [{}, {"pp": 2, "schedule": "1f1b", "global_batch_size": 8}, {"tp": 2, "sequence_parallel": True,
                                                                             "tp_comm_overlap": True}],
                         ids=["dp", "pp2", "tp2-overlap"])
def test_bytes_and_compute_are_conserved(granularity: str, extra: dict[str, object]) -> None:
    """With and without the overlap every rank gathers the same buckets with the same bytes, once each, and
    runs the same forward FLOPs (stage granularity only splits the first forward at bucket edges)."""
    on = dataclasses.replace(BASE, **extra)  # type: ignore[arg-type]
    off = dataclasses.replace(on, overlap_param_gather=False)
    ranks = range(on.world_size)
    for rank in ranks:
        with_ops, without = _ops(on, rank, granularity), _ops(off, rank, granularity)
        assert sorted((op.label, op.bytes) for _, op in _gathers(with_ops)) == \
            sorted((op.label, op.bytes) for _, op in _gathers(without))
        flops = [sum(op.flops for op in o if isinstance(op, Compute) and op.kind == "F")
                 for o in (with_ops, without)]
        assert flops[0] == pytest.approx(flops[1], rel=1e-12)


def test_stage_granularity_splits_only_the_first_forward_at_bucket_edges() -> None:
    """At stage granularity micro-batch 0's forward becomes one op per bucket range (each after its WAIT);
    the later micro-batches keep one forward op for the stage."""
    ops = _ops(BASE, granularity="stage")
    buckets = grad_buckets(TINY, BASE, 0)
    first = [op for op in ops if isinstance(op, Compute) and op.kind == "F" and op.microbatch == 0]
    assert [op.block_start for op in first] == sorted(min(b.blocks) for b in buckets)
    later = [op for op in ops if isinstance(op, Compute) and op.kind == "F" and op.microbatch == 1]
    assert len(later) == 1


def test_later_pipeline_rank_gathers_its_single_megatron_bucket_during_the_fill() -> None:
    """Megatron buckets with pp 2: pipeline rank 1 holds one bucket, gathered from the prologue and waited for
    only after the first activation arrives, so the gather runs through the pipeline fill."""
    layout = dataclasses.replace(BASE, pp=2, schedule="1f1b", global_batch_size=8,
                                 bucket_policy="megatron")
    program = build_program(TINY, layout)
    ops = program.ranks[program.groups["pp/dp0-tp0"][1]]
    gathers = _gathers(ops)
    assert len(gathers) == 1 and gathers[0][0] < _first_compute(ops)
    wait = next(i for i, op in enumerate(ops) if isinstance(op, Wait) and op.handle == gathers[0][1].handle)
    recv = next(i for i, op in enumerate(ops) if type(op).__name__ == "Recv")
    assert recv < wait < _first_compute(ops)


@pytest.mark.parametrize("fields", [{"zero": 0}, {"zero": 2}, {"overlap_grad_reduce": False}])
def test_overlap_param_gather_needs_zero1_with_overlapped_grad_reduce(fields: dict[str, object]) -> None:
    """Megatron-LM asserts the distributed optimizer and --overlap-grad-reduce for --overlap-param-gather."""
    with pytest.raises(LayoutError, match=r"overlap_param_gather .* needs zero = 1 with overlap_grad_reduce"):
        dataclasses.replace(BASE, **fields)  # type: ignore[arg-type]
