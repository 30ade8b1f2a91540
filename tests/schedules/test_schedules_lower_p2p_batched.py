"""``p2p_order = "megatron-batched"``: each of Megatron-LM's p2p calls is one batch, waited for at once (338af514
p2p_communication.py lines 102-108, 363-371; the same calls at 64a83fb, March 2021); the op order read by hand from
schedules.py, both ends of every link in one order, and the program finishing under any durations."""

from __future__ import annotations

import pytest
from schedule_helpers import context, flat

from simgrid.errors import LayoutError
from simgrid.ir.dryrun import cost_by_kind, dry_run
from simgrid.ir.ops import Collective, Compute, Op, Recv, Send, Wait
from simgrid.ir.program import Program
from simgrid.ir.validate import validate_program
from simgrid.layout.spec import Layout
from simgrid.schedules.lower.compute import compute_steps
from simgrid.schedules.lower.p2p import add_pipeline_p2p


def _ranks(**layout: object) -> list[list[Op]]:
    ctx = context("stage", p2p_order="megatron-batched", **layout)
    return [flat(role) for role in add_pipeline_p2p(ctx, [compute_steps(ctx, r) for r in range(ctx.layout.pp)])]


def _text(ops: list[Op]) -> str:
    out = []
    for op in ops:
        if isinstance(op, (Send, Recv)):
            out.append(f"{type(op).__name__[0]}{op.key.direction}{op.key.microbatch}")
        elif isinstance(op, Wait):
            out.append("W")
        elif isinstance(op, Compute):
            out.append(f"{op.kind}{op.microbatch}")
    return " ".join(out)


def test_two_stage_1f1b_blocks_on_every_call() -> None:
    """pp 2, m 2, by hand from forward_backward_pipelining_without_interleaving (338af514 lines 1209-1470): rank 0
    warms up with F0 then send_forward; steady F1, send_forward_recv_backward, B0; cool-down recv_backward, B1.
    Rank 1: recv_forward, F0, B0, send_backward_recv_forward (activation first on the shared stream), F1, B1,
    send_backward. Every call's requests are waited for right after it."""
    ranks = _ranks(pp=2, schedule="1f1b", global_batch_size=2)
    assert _text(ranks[0]) == "F0 SF0 W F1 SF1 RB0 W W B0 RB1 W B1"
    assert _text(ranks[1]) == "RF0 W F0 B0 RF1 SB0 W W F1 B1 SB1 W"


def test_interleaved_steady_state_sends_the_forward_output_after_the_backward() -> None:
    """Without overlap the steady iteration's one call (lines 1026-1036) follows both computations, so a forward's
    output leaves only after the backward that follows it."""
    ranks = _ranks(pp=4, vpp=2, schedule="interleaved-1f1b", global_batch_size=8)
    ops = ranks[1]
    kinds = [(i, op.kind) for i, op in enumerate(ops) if isinstance(op, Compute)]
    first_b = next(i for i, kind in kinds if kind == "B")
    last_f_before = max(i for i, kind in kinds if kind == "F" and i < first_b)
    between = [op for op in ops[last_f_before + 1:first_b] if isinstance(op, Send)]
    assert not between  # the forward just before the first backward sends nothing before that backward
    after = next(op for op in ops[first_b:] if isinstance(op, Send) and op.key.direction == "F")
    assert after.key.src_stage == ops[last_f_before].stage and after.key.microbatch == ops[last_f_before].microbatch


@pytest.mark.parametrize("schedule,pp,vpp,m", [("1f1b", 2, 1, 1), ("1f1b", 2, 1, 4), ("1f1b", 4, 1, 2),
                                               ("1f1b", 4, 1, 8), ("1f1b", 3, 1, 7), ("interleaved-1f1b", 2, 2, 4),
                                               ("interleaved-1f1b", 3, 2, 6), ("interleaved-1f1b", 4, 3, 12),
                                               ("interleaved-1f1b", 4, 2, 4), ("interleaved-1f1b", 8, 2, 16)])
def test_program_validates_and_finishes_under_any_durations(schedule: str, pp: int, vpp: int, m: int) -> None:
    program = Program(ranks=_ranks(pp=pp, vpp=vpp, schedule=schedule, global_batch_size=m))
    validate_program(program)
    for units in ({"F": 1, "B": 2}, {"F": 3, "B": 1}, {"F": 1, "B": 1}, {"F": 1, "B": 7}):
        dry_run(program, cost_by_kind(units))


def test_layout_refuses_batched_order_outside_megatrons_schedules() -> None:
    with pytest.raises(LayoutError, match=r"p2p_order 'megatron-batched' is Megatron-LM's batched, synchronised p2p"
                                          r".*schedule = 'gpipe'.*use p2p_order 'witness'"):
        Layout(pp=2, schedule="gpipe", global_batch_size=2, p2p_order="megatron-batched")
    with pytest.raises(LayoutError, match=r"m = 6\)"):
        Layout(pp=4, vpp=2, schedule="interleaved-1f1b", global_batch_size=6, p2p_order="megatron-batched")


def test_every_batched_transfer_is_one_group_and_witness_ones_are_not() -> None:
    """A call is one batch_isend_irecv, an NCCL group: its ops carry ``grouped`` (their own direction streams);
    the witness order's separate isend / irecv do not."""
    for order, grouped in (("megatron-batched", True), ("witness", False)):
        ctx = context("stage", p2p_order=order, pp=4, vpp=2, schedule="interleaved-1f1b", global_batch_size=8)
        ranks = [flat(role) for role in add_pipeline_p2p(ctx, [compute_steps(ctx, r) for r in range(4)])]
        flags = {op.grouped for ops in ranks for op in ops if isinstance(op, (Send, Recv))}
        assert flags == {grouped}


def _gather_ranks(**layout: object) -> tuple[int, list[list[Op]]]:
    ctx = context("stage", p2p_order="megatron-batched", p2p_scatter_gather=True, **layout)
    roles = add_pipeline_p2p(ctx, [compute_steps(ctx, r) for r in range(ctx.layout.pp)])
    return ctx.p2p_bytes, [flat(role) for role in roles]


def test_scatter_gather_sends_a_tp_slice_and_gathers_it_after_the_call() -> None:
    """Megatron-LM ``_communicate`` (e269e20 p2p_communication.py lines 61-64, 88-92, 133-141): each TP rank sends
    1/tp of the tensor; after the batch (and its synchronize) each received slice is all-gathered over TP, whole
    size, waited for, before the compute that uses it. pp 2, m 2, tp 2: rank 1 receives F0 and F1, rank 0 B0, B1."""
    size, ranks = _gather_ranks(pp=2, tp=2, schedule="1f1b", global_batch_size=2)
    transfers = [op for ops in ranks for op in ops if isinstance(op, (Send, Recv))]
    assert {op.bytes for op in transfers} == {size // 2}
    gathers = {rank: [op for op in ops if isinstance(op, Collective)] for rank, ops in enumerate(ranks)}
    assert [len(g) for g in gathers.values()] == [2, 2]
    for rank, ops in enumerate(ranks):
        for op in gathers[rank]:
            assert (op.kind, op.purpose, op.bytes) == ("all_gather", "pp-gather", size) and "tp" in op.group
            at = ops.index(op)
            recv = next(o for o in ops if isinstance(o, Recv) and op.handle == f"gather:{o.handle}")
            waits = [i for i, o in enumerate(ops) if isinstance(o, Wait) and o.handle == recv.handle]
            consumer = next(i for i, o in enumerate(ops) if isinstance(o, Compute) and i > at)
            assert waits[0] < at < ops.index(Wait(handle=op.handle)) < consumer


def test_scatter_gather_without_tp_is_the_plain_batch_and_layout_messages() -> None:
    size, ranks = _gather_ranks(pp=2, schedule="1f1b", global_batch_size=2)
    assert not any(isinstance(op, Collective) for ops in ranks for op in ops)
    assert {op.bytes for ops in ranks for op in ops if isinstance(op, Send)} == {size}
    with pytest.raises(LayoutError, match=r"p2p_scatter_gather is Megatron-LM's batched p2p .*sequence_parallel = "
                                          r"True\); set those or drop p2p_scatter_gather"):
        Layout(pp=2, tp=2, schedule="1f1b", global_batch_size=2, p2p_order="megatron-batched",
               sequence_parallel=True, p2p_scatter_gather=True)
    with pytest.raises(LayoutError, match=r"p2p_order = 'megatron-core'"):
        Layout(pp=2, tp=2, vpp=2, schedule="interleaved-1f1b", global_batch_size=2, p2p_order="megatron-core",
               p2p_scatter_gather=True)
