"""Pipeline send/receive pass: placement, matching keys and order, deadlock freedom under gloo rules."""

from __future__ import annotations

import pytest
from schedule_helpers import context, flat

from simgrid.ir.dryrun import cost_by_kind, dry_run
from simgrid.ir.ops import Alloc, Compute, Free, Op, P2PKey, Recv, Send, Wait
from simgrid.ir.program import Program
from simgrid.ir.validate import validate_program
from simgrid.schedules.lower.compute import compute_steps
from simgrid.schedules.lower.p2p import add_pipeline_p2p, pipeline_transfers


def _roles(**layout: object) -> tuple[object, list[list[Op]]]:
    ctx = context("stage", **layout)
    roles = add_pipeline_p2p(ctx, [compute_steps(ctx, r) for r in range(ctx.layout.pp)])
    return ctx, [flat(role) for role in roles]


def _p2p_text(ops: list[Op]) -> list[str]:
    return [f"{type(op).__name__.upper()} {op.key.direction}{op.key.microbatch}" for op in ops
            if isinstance(op, (Send, Recv))]


def test_two_stage_1f1b_posts_receives_early_and_sends_after_the_producer() -> None:
    """pp = 2, m = 2 (orders 0: F0 F1 B0 B1; 1: F0 B0 F1 B1): the link carries F0, F1, then B0, B1 (by
    producer finish time 1, 2, 4, 7); each side issues them in that order, receives as early as possible."""
    _, ranks = _roles(pp=2, global_batch_size=2)
    assert _p2p_text(ranks[0]) == ["SEND F0", "SEND F1", "RECV B0", "RECV B1"]
    assert _p2p_text(ranks[1]) == ["RECV F0", "RECV F1", "SEND B0", "SEND B1"]
    # Rank 1 posts both forward receives before any compute (in the prologue).
    first_compute = next(i for i, op in enumerate(ranks[1]) if isinstance(op, Compute))
    assert sum(isinstance(op, Recv) for op in ranks[1][:first_compute]) == 2


def test_send_follows_its_producer_and_wait_precedes_its_consumer() -> None:
    """SEND right after the compute that made the tensor; the RECV's WAIT right before the consumer."""
    _, ranks = _roles(pp=3, global_batch_size=4)
    for ops in ranks:
        for index, op in enumerate(ops):
            if isinstance(op, Send):
                back = index - 1
                while isinstance(ops[back], (Free, Send, Recv, Alloc)):  # only buffer/transfer bookkeeping between
                    back -= 1
                producer = ops[back]
                assert isinstance(producer, Compute) and producer.stage == op.key.src_stage
                assert producer.microbatch == op.key.microbatch
            if isinstance(op, Wait) and op.handle.startswith("recv"):
                consumer = ops[index + 1]
                recv = next(o for o in ops if isinstance(o, Recv) and o.handle == op.handle)
                assert isinstance(consumer, Compute) and consumer.stage == recv.key.dst_stage
                assert consumer.microbatch == recv.key.microbatch
                assert consumer.kind == ("F" if recv.key.direction == "F" else "B")


def test_receive_buffers_are_allocated_at_the_post_and_freed_after_use() -> None:
    """Each RECV has a comm ALLOC right before it and a FREE after its consumer."""
    ctx, ranks = _roles(pp=2, global_batch_size=2)
    for ops in ranks:
        for index, op in enumerate(ops):
            if isinstance(op, Recv):
                assert ops[index - 1] == Alloc(name=op.handle, bytes=ctx.p2p_bytes, category="comm")
                assert Free(name=op.handle) in ops[index:]


def test_v_schedule_hands_over_locally_at_the_tip() -> None:
    """ZBV: stages pp-1 and pp share a rank, so no transfer between them."""
    ctx = context(pp=2, vpp=2, schedule="zbv", global_batch_size=3)
    keys = {(t.key.src_stage, t.key.dst_stage) for t in pipeline_transfers(ctx)}
    assert (1, 2) not in keys and (2, 1) not in keys
    assert keys == {(0, 1), (1, 0), (2, 3), (3, 2)}


def test_transfers_use_the_canonical_peer_and_p2p_bytes() -> None:
    """Keys name the stages; the peer is the neighbouring pipeline rank; sizes are p2p_bytes."""
    ctx, ranks = _roles(pp=2, dp=2, global_batch_size=4)
    send = next(op for op in ranks[0] if isinstance(op, Send))
    assert send.key == P2PKey(src_stage=0, dst_stage=1, microbatch=0, direction="F")
    assert send.peer == ctx.mesh.rank(pp=1, dp=0, tp=0)
    assert send.bytes == ctx.p2p_bytes


@pytest.mark.parametrize(
    "layout",
    [
        {"pp": 4, "global_batch_size": 8, "schedule": "gpipe"},
        {"pp": 4, "global_batch_size": 3},
        {"pp": 3, "vpp": 2, "schedule": "interleaved-1f1b", "global_batch_size": 6},
        {"pp": 4, "schedule": "zb-h1", "global_batch_size": 5},
        {"pp": 3, "vpp": 2, "schedule": "zbv", "global_batch_size": 7},
    ],
)
def test_compute_and_p2p_program_passes_validation_and_dry_runs(layout: dict) -> None:
    """Sends match receives in per-link order and the rendezvous dry run finishes, for several costs."""
    _, ranks = _roles(**layout)
    program = Program(ranks=ranks)
    validate_program(program)
    for units in ({"F": 1, "B": 2, "I": 1, "W": 1}, {"F": 3, "B": 1, "I": 1, "W": 5}):
        dry_run(program, cost_by_kind(units))
