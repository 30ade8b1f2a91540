"""Pass: pipeline SEND/RECV between stages, placed so that an unbuffered transport cannot deadlock.

Gloo has no buffering: a send completes only once the peer has posted the matching receive, and the IR
runs the transfers between two ranks on one stream per peer, in issue order. Both ends of a link must
therefore issue their transfers in the *same* order, and that order must be one some execution of the
compute order can follow. We take the witness from the unit-time run of the pipeline order
(:func:`simgrid.schedules.unit_time.simulate_unit_time`): every transfer happens when its producer
finishes there, and each link orders its transfers by that time (ties broken by stage, direction and
micro-batch, the same on both ends). Then, on each rank:

* a SEND goes right after the compute of the action that produced the tensor;
* a RECV is posted as early as that link order allows: right after the previous transfer of the same
  link on this rank (or at the start of the step), so the sender never waits for it to be posted;
* the RECV's WAIT sits right before the first op of the consuming action; the received buffer
  (category ``comm``) is freed once that action's ops are done;
* WAITs on SENDs are lazy: all at the end of the pipeline phase, before the optimizer.

Because every transfer can happen at its time in the witness run, and the op dependencies admit no
choice, the program finishes under any durations (checked by the IR dry run in the tests).
Stages on the same pipeline rank (the tip of the V in ZBV) hand tensors over locally, without ops.

That is ``Layout.p2p_order = "witness"``. With ``"megatron-core"`` (interleaved 1F1B only) each rank
instead issues its transfers, and waits for them, where Megatron-Core's interleaved schedule with
``overlap_p2p_comm`` does (:mod:`simgrid.schedules.lower.p2p_megatron`); a peer pair's link order is then
that issue order, the same on both ends (checked there), and the dry run checks that it finishes.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from simgrid.errors import ScheduleError
from simgrid.ir.ops import Alloc, Collective, Free, Op, P2PKey, Recv, Send, Wait
from simgrid.layout.mesh import Mesh
from simgrid.schedules.lower.context import LoweringContext, Role
from simgrid.schedules.lower.p2p_batched import batched_calls
from simgrid.schedules.lower.p2p_megatron import match_calls, megatron_calls, megatron_order
from simgrid.schedules.pipeline import pipeline_order
from simgrid.schedules.unit_time import DEFAULT_DURATIONS, simulate_unit_time


@dataclass(frozen=True)
class Transfer:
    """One pipeline tensor moving between two pipeline ranks."""

    key: P2PKey
    src_rank: int
    """Sending pipeline rank."""
    dst_rank: int
    """Receiving pipeline rank."""
    producer_step: int
    """Step index (in the sender's role) of the action that produces the tensor."""
    consumer_step: int
    """Step index (in the receiver's role) of the action that consumes it."""
    time: float
    """Producer finish time in the unit-time witness run."""


def pipeline_transfers(ctx: LoweringContext) -> list[Transfer]:
    """Every inter-rank pipeline transfer of the step, with its producer and consumer steps."""
    order = ctx.order
    timing = simulate_unit_time(order)
    num_stages = ctx.layout.num_stages
    # Step index of each action: step 0 is the prologue.
    where: dict[tuple[int, str, int], tuple[int, int]] = {}
    for rank, row in enumerate(order):
        for index, action in enumerate(row):
            kind = "G" if action.kind in ("B", "I") else action.kind
            where[(action.stage, kind, action.microbatch)] = (rank, index + 1)
    transfers = []
    for rank, row in enumerate(order):
        for index, action in enumerate(row):
            s, mb = action.stage, action.microbatch
            if action.kind == "F" and s + 1 < num_stages:
                key = P2PKey(src_stage=s, dst_stage=s + 1, microbatch=mb, direction="F")
                dst_rank, consumer = where[(s + 1, "F", mb)]
            elif action.kind in ("B", "I") and s > 0:
                key = P2PKey(src_stage=s, dst_stage=s - 1, microbatch=mb, direction="B")
                dst_rank, consumer = where[(s - 1, "G", mb)]
            else:
                continue
            if dst_rank == rank:
                continue
            finish = timing.starts[rank][index] + DEFAULT_DURATIONS[action.kind]
            transfers.append(Transfer(key, rank, dst_rank, index + 1, consumer, finish))
    return transfers


def _link_order(transfers: list[Transfer]) -> dict[tuple[int, int], list[Transfer]]:
    links: dict[tuple[int, int], list[Transfer]] = defaultdict(list)
    for t in transfers:
        links[(min(t.src_rank, t.dst_rank), max(t.src_rank, t.dst_rank))].append(t)
    for items in links.values():
        items.sort(key=lambda t: (t.time, t.key.src_stage, t.key.direction, t.key.microbatch))
    return links


def _handle(prefix: str, key: P2PKey) -> str:
    return f"{prefix}{key.direction}:s{key.src_stage}-s{key.dst_stage}:m{key.microbatch}"


@dataclass
class _Placement:
    """Per pipeline rank, the p2p ops to put before (``heads``), after (``ends``, buffer frees) and at the end
    (``tails``, sends, receives and blocking waits) of each step, and the send waits left to the end."""

    heads: list[dict[int, list[Op]]]
    ends: list[dict[int, list[Op]]]
    tails: list[dict[int, list[Op]]]
    send_waits: list[list[Op]]


def _witness_placement(ctx: LoweringContext, place: _Placement, peer: list[int], size: int) -> None:
    for (low, high), items in sorted(_link_order(pipeline_transfers(ctx)).items()):
        anchor = {low: 0, high: 0}
        for t in items:
            anchor[t.src_rank] = t.producer_step
            send = _handle("send", t.key)
            place.tails[t.src_rank][t.producer_step].append(
                Send(peer=peer[t.dst_rank], bytes=size, key=t.key, handle=send)
            )
            place.send_waits[t.src_rank].append(Wait(handle=send))
            recv = _handle("recv", t.key)
            post = anchor[t.dst_rank]
            if post >= t.consumer_step:
                raise ScheduleError(  # an order/witness mismatch: a bug, not a user error
                    f"internal: RECV {recv} on pipeline rank {t.dst_rank} cannot be posted before step "
                    f"{t.consumer_step}"
                )
            place.tails[t.dst_rank][post] += [
                Alloc(name=recv, bytes=size, category="comm"),
                Recv(peer=peer[t.src_rank], bytes=size, key=t.key, handle=recv),
            ]
            place.heads[t.dst_rank][t.consumer_step].append(Wait(handle=recv))
            place.ends[t.dst_rank][t.consumer_step].append(Free(name=recv))


def _megatron_placement(ctx: LoweringContext, place: _Placement, peer: list[int], size: int) -> None:
    # Megatron's posting points and waits: overlapped (simgrid.schedules.lower.p2p_megatron) or batched and
    # synchronised (simgrid.schedules.lower.p2p_batched).
    lay = ctx.layout
    interleaved = ctx.schedule == "interleaved-1f1b"
    transfers = pipeline_transfers(ctx)
    calls = []
    for rank, row in enumerate(ctx.order):
        steps: dict[str, list[int]] = {"F": [], "B": []}
        for index, action in enumerate(row):
            steps.setdefault(action.kind, []).append(index + 1)
        if interleaved:
            expected = megatron_order(lay.pp, lay.vpp, ctx.num_microbatches, rank)
        else:
            expected = [(a.stage, a.kind) for a in pipeline_order("1f1b", lay.pp, ctx.num_microbatches)[rank]]
        if [(a.stage, a.kind) for a in row] != expected:
            raise ScheduleError(
                f"p2p_order {lay.p2p_order!r} posts transfers where Megatron's schedule does, but pipeline rank "
                f"{rank}'s compute order is not that schedule's; use p2p_order 'witness'"
            )
        if lay.p2p_order == "megatron-batched":
            calls.append(batched_calls(lay.pp, lay.vpp, ctx.num_microbatches, rank, steps["F"], steps["B"],
                                       interleaved))
        else:
            calls.append(megatron_calls(lay.pp, lay.vpp, ctx.num_microbatches, rank, steps["F"], steps["B"]))
    # A batched call is one batch_isend_irecv, an NCCL group: its ops run at once (Send.grouped).
    grouped = lay.p2p_order == "megatron-batched"
    wire, gather = _scatter_gather(ctx, size)
    consumers = {t.key: t.consumer_step for t in transfers}
    sent = {(t.src_rank, t.producer_step): t.key for t in transfers}
    for rank, items in enumerate(match_calls(lay.pp, calls, sent, consumers)):
        tails = place.tails[rank]
        pending: list[Op] = []
        gathers: list[Op] = []
        for index, p in enumerate(items):
            handle = _handle(p.kind, p.key)
            if p.kind == "send":
                tails[p.call.step].append(Send(peer=peer[p.peer], bytes=wire, key=p.key, handle=handle,
                                               grouped=grouped))
            else:  # the buffer is sized for the (gathered) whole tensor, which lives until its consumer
                tails[p.call.step] += [Alloc(name=handle, bytes=size, category="comm"),
                                       Recv(peer=peer[p.peer], bytes=wire, key=p.key, handle=handle, grouped=grouped)]
                place.ends[rank][consumers[p.key]].append(Free(name=handle))
                if gather:
                    gathers += [Collective(kind="all_gather", group=Mesh.tp_group_name(ctx.coord(rank)), bytes=size,
                                           purpose="pp-gather", handle=f"gather:{handle}", label="pp-gather"),
                                Wait(handle=f"gather:{handle}")]
            if p.call.blocking:  # waited right after the call's last op, then its receives gathered
                pending.append(Wait(handle=handle))
                if index + 1 == len(items) or items[index + 1].call is not p.call:
                    tails[p.call.step] += pending + gathers
                    pending, gathers = [], []
            elif p.call.wait_step is not None:
                place.heads[rank][p.call.wait_step].append(Wait(handle=handle))
            else:  # the step's last forward send: Megatron never waits for it in the schedule
                place.send_waits[rank].append(Wait(handle=handle))


def _scatter_gather(ctx: LoweringContext, size: int) -> tuple[int, bool]:
    """(bytes each rank sends, whether the receiver all-gathers over tp) under ``Layout.p2p_scatter_gather``.

    Megatron-LM ``_communicate`` (p2p_communication.py at 2755bcb87b lines 63-72, 96-102, 142-156; e269e20 lines
    61-64, 88-92, 133-141): each tensor-parallel rank sends the ``1/tp`` slice ``split_tensor_into_1d_equal_chunks``
    makes, and after the batch and ``torch.cuda.synchronize()`` every received slice is put back together by
    ``gather_split_1d_tensor``, a synchronous ``all_gather`` on the tensor-parallel group (mpu/random.py lines
    113-124 at e269e20). 2755bcb87b sends the tensor whole when tp does not divide its elements (lines 66-72),
    which cannot happen here: tp divides the heads, so the hidden size.
    """
    lay = ctx.layout
    if not lay.p2p_scatter_gather or lay.tp == 1:
        return size, False
    return size // lay.tp, True


def add_pipeline_p2p(ctx: LoweringContext, roles: list[Role]) -> list[Role]:
    """Insert SEND/RECV/WAIT (and receive-buffer ALLOC/FREE) into every pipeline rank's role."""
    if ctx.layout.pp == 1:
        return roles
    size = ctx.p2p_bytes
    peer = [ctx.canonical_rank(r) for r in range(ctx.layout.pp)]
    place = _Placement(heads=[defaultdict(list) for _ in roles], ends=[defaultdict(list) for _ in roles],
                       tails=[defaultdict(list) for _ in roles], send_waits=[[] for _ in roles])
    if ctx.layout.p2p_order != "witness":
        _megatron_placement(ctx, place, peer, size)
    else:
        _witness_placement(ctx, place, peer, size)
    for rank, role in enumerate(roles):
        head, end, tail = place.heads[rank], place.ends[rank], place.tails[rank]
        for index, step in enumerate(role):
            # Most steps have no transfer: look up without the defaultdicts making empty lists, and
            # still give every step a fresh list, as the concatenation does.
            first, after, last = head.get(index), end.get(index), tail.get(index)
            if first is None and after is None and last is None:
                step.ops = step.ops[:]
            else:
                step.ops = (first or []) + step.ops + (after or []) + (last or [])
        role[-1].ops = place.send_waits[rank] + role[-1].ops
    return roles
