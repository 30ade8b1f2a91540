"""``p2p_order = "megatron-core"``: transfers posted and waited where Megatron-Core's interleaved schedule does
(Megatron-LM 338af514 schedules.py, forward_backward_pipelining_with_interleaving with overlap_p2p_comm), both
ends of every link in one order, the program finishing under any durations, and the layout's refusal."""

from __future__ import annotations

from itertools import pairwise

import pytest
from schedule_helpers import context, flat

from simgrid.errors import LayoutError
from simgrid.ir.dryrun import cost_by_kind, dry_run
from simgrid.ir.ops import Compute, Op, Recv, Send, Wait
from simgrid.ir.program import Program
from simgrid.ir.validate import validate_program
from simgrid.layout.spec import Layout
from simgrid.schedules.lower.compute import compute_steps
from simgrid.schedules.lower.p2p import add_pipeline_p2p
from simgrid.schedules.lower.p2p_megatron import megatron_order
from simgrid.schedules.pipeline import pipeline_order


def _ranks(order: str = "megatron-core", **layout: object) -> tuple[object, list[list[Op]]]:
    ctx = context("stage", schedule="interleaved-1f1b", p2p_order=order, **layout)
    roles = add_pipeline_p2p(ctx, [compute_steps(ctx, r) for r in range(ctx.layout.pp)])
    return ctx, [flat(role) for role in roles]


def _link(ops: list[Op], peer: int) -> list[str]:
    return [f"{'S' if isinstance(op, Send) else 'R'}{op.key.direction}{op.key.microbatch}" for op in ops
            if isinstance(op, (Send, Recv)) and op.peer == peer]


def test_wrap_link_posts_the_forward_receive_before_the_gradient_send() -> None:
    """pp 4, vpp 2, m 8, rank 0's link to rank 3 (stage 3 -> 4 activations, stage 4 -> 3 gradients). By hand from
    the code: rank 0 runs 10 warm-up forwards (lines 603-605) and receives chunk 1's inputs after forwards 3-6
    (recv_prev is off while the next forward is chunk 0, lines 792-796); steady iteration k's receive follows the
    last rank's chunk of forward k + 10 - 3 (lines 906-913: chunk 1 at k = 0, none), so k = 1..4 receive m4..m7
    after their forward and before their backward, whose gradients (chunk 1 for k = 0..3) go out after it; the
    cool-down sends chunk 1's gradients of backwards 8-11. The witness order put SB1 before RF4."""
    ctx, ranks = _ranks(pp=4, vpp=2, global_batch_size=8)
    peer = ctx.canonical_rank(3)
    expected = ["RF0", "RF1", "RF2", "RF3", "SB0", "RF4", "SB1", "RF5", "SB2", "RF6", "SB3", "RF7",
                "SB4", "SB5", "SB6", "SB7"]
    assert _link(ranks[0], peer) == expected
    assert _link(ranks[3], ctx.canonical_rank(0)) == [("R" if t[0] == "S" else "S") + t[1:] for t in expected]
    _, witness = _ranks("witness", pp=4, vpp=2, global_batch_size=8)
    assert _link(witness[0], peer)[4:7] == ["SB0", "SB1", "RF4"]


def test_receive_for_the_next_forward_follows_each_forward_and_is_waited_before_the_next() -> None:
    """Rank 1 (pp 4, vpp 2, m 8): after every forward but the last, the call's SEND and its RECV (rank 1 is odd:
    receive first, _p2p_ops lines 221-236), and both waited right before the next forward."""
    _, ranks = _ranks(pp=4, vpp=2, global_batch_size=8)
    ops = ranks[1]
    forwards = [i for i, op in enumerate(ops) if isinstance(op, Compute) and op.kind == "F"]
    for this, after in pairwise(forwards):
        between = ops[this + 1:after]
        p2p = [op for op in between if isinstance(op, (Send, Recv))]
        assert isinstance(p2p[0], Recv) and p2p[0].key.direction == "F"
        assert isinstance(p2p[1], Send) and p2p[1].key.direction == "F"
        waits = [op.handle for op in between if isinstance(op, Wait)]
        assert f"recvF:s{p2p[0].key.src_stage}-s{p2p[0].key.dst_stage}:m{p2p[0].key.microbatch}" in waits
        assert isinstance(ops[after - 1], Wait)  # waited right before the next forward, not at its consumer


def test_gradient_sends_are_waited_before_the_next_backward() -> None:
    """Each backward's gradient SEND is waited for before the next backward: in steady state with the call's
    handles (lines 934-936), in the cool-down right after the call, which is not overlapped (lines 1068-1070).
    The witness order leaves every send wait to the end of the pipeline phase."""
    _, ranks = _ranks(pp=4, vpp=2, global_batch_size=8)
    ops = ranks[2]
    sends = [i for i, op in enumerate(ops) if isinstance(op, Send) and op.key.direction == "B"]
    assert len(sends) == 16
    for i in sends:
        backward = next((j for j in range(i + 1, len(ops)) if isinstance(ops[j], Compute) and ops[j].kind == "B"),
                        len(ops))
        assert Wait(handle=ops[i].handle) in ops[i + 1:backward]


@pytest.mark.parametrize("pp,vpp,m", [(2, 2, 4), (2, 3, 6), (3, 2, 6), (4, 2, 8), (4, 3, 12), (4, 2, 16),
                                      (5, 2, 10), (8, 2, 16), (4, 2, 4), (3, 3, 3)])
def test_program_validates_and_finishes_under_any_durations(pp: int, vpp: int, m: int) -> None:
    """Sends match receives in per-link order and the rendezvous dry run finishes for several cost ratios."""
    _, ranks = _ranks(pp=pp, vpp=vpp, global_batch_size=m)
    program = Program(ranks=ranks)
    validate_program(program)
    for units in ({"F": 1, "B": 2}, {"F": 3, "B": 1}, {"F": 1, "B": 1}, {"F": 1, "B": 7}):
        dry_run(program, cost_by_kind(units))


@pytest.mark.parametrize("pp,vpp,m", [(2, 2, 4), (4, 2, 8), (4, 3, 24), (3, 4, 9)])
def test_megatron_order_equals_the_interleaved_order(pp: int, vpp: int, m: int) -> None:
    """The compute order the posting points are read against is the simulator's interleaved-1f1b order."""
    order = pipeline_order("interleaved-1f1b", pp, m, vpp)
    for rank in range(pp):
        assert megatron_order(pp, vpp, m, rank) == [(a.stage, a.kind) for a in order[rank]]


def test_m_equal_to_pp_runs_every_forward_first() -> None:
    """m = pp: Megatron-Core runs all forwards before the first backward (lines 599-601) and posts a blocking
    recv_backward before the cool-down (lines 1054-1057); torch's interleaved order does not, so the lowering
    runs Megatron's."""
    assert megatron_order(4, 2, 4, 3) == [(s, "F") for s in (3, 3, 3, 3, 7, 7, 7, 7)] + [
        (s, "B") for s in (7, 7, 7, 7, 3, 3, 3, 3)]
    _, ranks = _ranks(pp=4, vpp=2, global_batch_size=4)
    kinds = [op.kind for op in ranks[1] if isinstance(op, Compute)]
    assert kinds == ["F"] * 8 + ["B"] * 8


@pytest.mark.parametrize("layout,what", [
    ({"pp": 4, "global_batch_size": 8}, "schedule = '1f1b'"),
    ({"pp": 4, "vpp": 2, "schedule": "interleaved-1f1b", "global_batch_size": 10}, "m = 10"),
])
def test_layout_refuses_megatron_core_order_outside_its_schedule(layout: dict, what: str) -> None:
    with pytest.raises(LayoutError, match=r"p2p_order 'megatron-core' is Megatron-Core's overlapped p2p") as info:
        Layout(p2p_order="megatron-core", **layout)  # type: ignore[arg-type]
    assert what in str(info.value) and "use p2p_order 'witness'" in str(info.value)


def test_layout_refuses_an_unknown_order_and_round_trips() -> None:
    with pytest.raises(LayoutError, match=r"p2p_order = 'nccl' is not one of witness, megatron-core"):
        Layout(p2p_order="nccl")  # type: ignore[arg-type]
    lay = Layout(pp=2, vpp=2, schedule="interleaved-1f1b", global_batch_size=4, p2p_order="megatron-core")
    assert Layout.from_dict(lay.to_dict()) == lay
