"""Pipeline SEND/RECV posted where Megatron-Core's interleaved schedule posts them (``p2p_order = "megatron-core"``).

Read from ``forward_backward_pipelining_with_interleaving`` in megatron/core/pipeline_parallel/schedules.py at
Megatron-LM 338af514 (NeMo 24.07's commit; lines 760-1075 are identical at f2e5db4) with ``overlap_p2p_comm`` on
(the default for the interleaved schedule: ``--no-overlap-p2p-communication`` is a store_false flag,
megatron/training/arguments.py line 1405, and ``batch_p2p_comm = not overlap_p2p_comm``, line 621). Every
rank runs the same virtual micro-batch index ``k``; forward ``k`` is chunk ``(k % (pp*vpp)) // pp`` and
backward ``k`` walks the chunks in reverse. On each rank:

* prologue: a blocking ``recv_forward`` for forward 0 (line 765; none on the first stage);
* after each forward ``k`` one ``send_forward_recv_forward(..., overlap_p2p_comm=True)`` (lines 834-840 in
  warm-up, 925-931 in steady state): the output goes to the next rank and the receive for the *next* forward
  is posted; both are waited for just before the next forward (lines 772-774, 885-887). The first rank
  decides whether a wrap tensor comes and which chunk it feeds in lock-step with the last rank, ``pp - 1``
  forwards behind it (lines 906-915), not from its own next forward;
* after the last warm-up forward, the receive for the first backward (lines 855-861);
* after each steady-state backward ``k`` one ``send_backward_recv_backward(..., overlap_p2p_comm=True)``
  (lines 962-968), waited for just before the next backward (lines 934-936, 1050-1052); the last rank
  mirrors the first rank's lock-step (lines 950-958);
* cool-down: the same call without overlap (lines 1068-1070), so it waits for its send and its receive
  before the next backward starts.

Within one call the ops are separate ``isend`` / ``irecv`` (``_p2p_ops``, p2p_communication.py lines
169-253): even ranks send first, odd ranks receive first. torch puts a peer pair's ops on one NCCL stream
in issue order, so both ends of every link must issue their transfers in the same order; this module
derives each rank's issue order from the code above, matches the n-th receive from a peer to the n-th
send in that direction, and checks that both ends agree, that every received tensor is the one the code
files it as (stage and micro-batch) and that it is waited for no later than its consumer.

When m = pp Megatron-Core runs every forward before the first backward (lines 599-601, 1054-1057), which is
not torch's ``interleaved-1f1b`` order; the lowering then runs :func:`megatron_actions` instead.

Not modelled: with pp = 2 Megatron puts one direction on the world group (lines 180-185), i.e. a second
stream per pair; here both directions share one stream (the orders still agree).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from simgrid.errors import ScheduleError
from simgrid.ir.ops import P2PKey
from simgrid.ir.torch_csv import Action


@dataclass
class Call:
    """One p2p call of Megatron's schedule on one rank: its ops, where it is issued and where it is waited."""

    step: int
    """Step (0 = prologue, i + 1 = action i) after whose compute the call is issued."""
    ops: list[tuple[str, str, int]] = field(default_factory=list)
    """``(send|recv, F|B, chunk)`` in issue order; for a receive, ``chunk`` is the local chunk Megatron files
    the tensor under (``input_tensors[c]`` / ``output_tensor_grads[c]``)."""
    wait_step: int | None = None
    """Step before whose compute the call's handles are waited for; None: waited only at the step's end."""
    blocking: bool = False
    """Waited right after it is issued (no overlap)."""
    made: dict[str, int] = field(default_factory=dict)
    """Step of the action that produced each direction's sent tensor, where it is not ``step`` (the batched
    path sends a forward's output only after the backward that follows it)."""


def megatron_calls(pp: int, vpp: int, m: int, rank: int, f_steps: list[int], b_steps: list[int]) -> list[Call]:
    """Rank ``rank``'s p2p calls in issue order; ``f_steps[k]`` / ``b_steps[k]`` are the steps of its forward /
    backward ``k`` (Megatron's virtual micro-batch index)."""
    total = m * vpp
    warmup = warmup_steps(pp, vpp, m, rank)
    remaining = total - warmup
    first, last, even = rank == 0, rank == pp - 1, rank % 2 == 0

    def chunk_f(k: int) -> int:
        return forward_chunk(pp, vpp, k)

    def chunk_b(k: int) -> int:
        return vpp - 1 - forward_chunk(pp, vpp, k)

    def call(step: int, send: tuple[str, str, int] | None, recv: tuple[str, str, int] | None,
             wait_step: int | None, blocking: bool = False) -> Call:
        ops = [op for op in ((send, recv) if even else (recv, send)) if op is not None]  # _p2p_ops
        return Call(step=step, ops=ops, wait_step=wait_step, blocking=blocking)

    def next_f(k: int) -> int | None:
        return f_steps[k + 1] if k + 1 < total else None

    calls = []
    if not first:
        calls.append(call(0, None, ("recv", "F", 0), None, blocking=True))  # line 765
    for k in range(warmup):  # lines 770-866
        recv = not (first and chunk_f(k + 1) == 0) and k != total - 1
        send = not (last and chunk_f(k) == vpp - 1)
        calls.append(call(f_steps[k], ("send", "F", chunk_f(k)) if send else None,
                          ("recv", "F", chunk_f(k + 1)) if recv else None, next_f(k)))
        if k == warmup - 1 and not last and remaining:  # lines 842-863: receive for the first backward
            calls.append(call(f_steps[k], None, ("recv", "B", vpp - 1), b_steps[0]))
    if not remaining and not last:  # m = pp: a blocking recv_backward before the cool-down (lines 1054-1057)
        calls.append(call(f_steps[-1], None, ("recv", "B", vpp - 1), None, blocking=True))
    for k in range(remaining):  # lines 869-968
        fk = k + warmup
        send = not (last and chunk_f(fk) == vpp - 1)
        recv, into = steady_recv_forward(pp, vpp, rank, fk)
        recv = recv and k != remaining - 1
        calls.append(call(f_steps[fk], ("send", "F", chunk_f(fk)) if send else None,
                          ("recv", "F", into) if recv else None, next_f(fk)))
        send = not (first and chunk_b(k) == 0)
        recv, into = steady_recv_backward(pp, vpp, rank, k)
        calls.append(call(b_steps[k], ("send", "B", chunk_b(k)) if send else None,
                          ("recv", "B", into) if recv else None, b_steps[k + 1]))
    for k in range(remaining, total):  # lines 1058-1071, not overlapped
        recv = not (last and chunk_b(k + 1) == vpp - 1) and k != total - 1
        send = not (first and chunk_b(k) == 0)
        calls.append(call(b_steps[k], ("send", "B", chunk_b(k)) if send else None,
                          ("recv", "B", chunk_b(k + 1)) if recv else None, None, blocking=True))
    return calls


def megatron_order(pp: int, vpp: int, m: int, rank: int) -> list[tuple[int, str]]:
    """``(stage, kind)`` of rank ``rank``'s computations in Megatron-Core's interleaved order (m a multiple of pp):
    the warm-up forwards, then one forward and one backward per steady-state iteration, then the cool-down."""
    total = m * vpp
    warmup = warmup_steps(pp, vpp, m, rank)
    forwards = [(forward_chunk(pp, vpp, k) * pp + rank, "F") for k in range(total)]
    backwards = [((vpp - 1 - forward_chunk(pp, vpp, k)) * pp + rank, "B") for k in range(total)]
    order = forwards[:warmup]
    for k in range(total - warmup):
        order += [forwards[warmup + k], backwards[k]]
    return order + backwards[total - warmup:]


def forward_chunk(pp: int, vpp: int, k: int) -> int:
    """Local model chunk of a rank's forward ``k`` (``get_model_chunk_id``, schedules.py lines 625-631); backward
    ``k`` runs chunk ``vpp - 1 -`` that."""
    return (k % (pp * vpp)) // pp


def steady_recv_forward(pp: int, vpp: int, rank: int, fk: int) -> tuple[bool, int]:
    """After steady-state forward ``fk``: whether rank ``rank`` receives an activation, and the local chunk it files
    it under. The first rank decides in lock-step with the last rank, ``pp - 1`` forwards behind it (schedules.py
    lines 906-915 at 338af514; lines 297-306 at e269e20): nothing comes when the last rank's forward then ran its
    last chunk. Shared by the overlapped and the batched calls."""
    if rank == 0:
        c = forward_chunk(pp, vpp, fk - (pp - 1))
        return c != vpp - 1, c + 1
    return True, forward_chunk(pp, vpp, fk + 1)


def steady_recv_backward(pp: int, vpp: int, rank: int, k: int) -> tuple[bool, int]:
    """After steady-state backward ``k``: whether rank ``rank`` receives a gradient, and the local chunk it files it
    under; the last rank mirrors the first rank's lock-step (lines 950-958 at 338af514; lines 309-318 at e269e20)."""
    if rank == pp - 1:
        c = vpp - 1 - forward_chunk(pp, vpp, k - (pp - 1))
        return c != 0, c - 1
    return True, vpp - 1 - forward_chunk(pp, vpp, k + 1)


def warmup_steps(pp: int, vpp: int, m: int, rank: int) -> int:
    """Warm-up forwards of rank ``rank`` (schedules.py lines 599-605): every forward when m = pp, else 2 per hop to
    the last rank plus vpp - 1 rounds."""
    total = m * vpp
    return total if m == pp else min(2 * (pp - rank - 1) + (vpp - 1) * pp, total)


def megatron_actions(pp: int, vpp: int, m: int) -> list[list[Action]]:
    """Megatron-Core's interleaved compute order per pipeline rank as pipeline actions (each stage takes its
    micro-batches in order); the ``interleaved-1f1b`` order except when m = pp, where Megatron runs every
    forward before the first backward."""
    orders = []
    for rank in range(pp):
        taken: dict[tuple[int, str], int] = defaultdict(int)
        row = []
        for stage, kind in megatron_order(pp, vpp, m, rank):
            row.append(Action(stage, kind, taken[(stage, kind)]))
            taken[(stage, kind)] += 1
        orders.append(row)
    return orders


@dataclass(frozen=True)
class Posted:
    """One transfer as one rank issues it."""

    kind: str
    """``send`` or ``recv``."""
    peer: int
    """The other pipeline rank."""
    key: P2PKey
    call: Call
    """The call that issues it."""


def match_calls(pp: int, calls: list[list[Call]], sent: dict[tuple[int, int], P2PKey],
                consumers: dict[P2PKey, int]) -> list[list[Posted]]:
    """Each rank's transfers in issue order, receives matched first-come first-served to the peer's sends in
    that direction. ``sent[(rank, step)]`` is the transfer the action at that step produces (the lowering's
    keys); ``consumers[key]`` the receiver's step that uses it. Raises ScheduleError if Megatron's calls and
    the lowering's transfers disagree (a bug, not a user error)."""
    sent = dict(sent)
    queues: dict[tuple[int, int, str], list[P2PKey]] = defaultdict(list)
    for rank, row in enumerate(calls):
        for c in row:
            for kind, direction, _ in c.ops:
                if kind == "send":
                    key = sent.pop((rank, c.made.get(direction, c.step)), None)
                    if key is None or key.direction != direction:
                        raise ScheduleError(f"internal: Megatron sends {direction} after step {c.step} of pipeline "
                                            f"rank {rank}, but the order produces no such tensor there")
                    queues[(rank, _peer(pp, rank, kind, direction), direction)].append(key)
    if sent:
        raise ScheduleError(f"internal: transfers {sorted(map(str, sent.values()))} are never sent")
    posted: list[list[Posted]] = [[] for _ in calls]
    received: dict[tuple[int, int, str], int] = defaultdict(int)
    sends: dict[tuple[int, int, str], int] = defaultdict(int)
    for rank, row in enumerate(calls):
        for c in row:
            for kind, direction, chunk in c.ops:
                peer = _peer(pp, rank, kind, direction)
                if kind == "send":
                    key = queues[(rank, peer, direction)][sends[(rank, peer, direction)]]
                    sends[(rank, peer, direction)] += 1
                    posted[rank].append(Posted(kind, peer, key, c))
                    continue
                items, index = queues[(peer, rank, direction)], received[(peer, rank, direction)]
                if index >= len(items):
                    raise ScheduleError(f"internal: pipeline rank {rank} posts a receive ({direction}) from rank "
                                        f"{peer} that has no matching send")
                received[(peer, rank, direction)] += 1
                key, wait = items[index], c.step if c.blocking else c.wait_step
                if key.dst_stage != chunk * pp + rank or wait is None or wait > consumers[key]:
                    raise ScheduleError(f"internal: pipeline rank {rank} receives {key} as chunk {chunk}, waited "
                                        f"before step {wait}, consumed at step {consumers[key]}")
                posted[rank].append(Posted(kind, peer, key, c))
    for link, items in queues.items():
        if received[link] != len(items):
            raise ScheduleError(f"internal: transfers {link[0]} -> {link[1]} ({link[2]}) are not all received")
    for rank in range(pp):
        for peer in range(rank + 1, pp):
            here = [p.key for p in posted[rank] if p.peer == peer]
            there = [p.key for p in posted[peer] if p.peer == rank]
            if here != there:
                raise ScheduleError(f"internal: pipeline ranks {rank} and {peer} issue their transfers in different "
                                    "orders (a deadlock on one stream per peer pair)")
    return posted


def _peer(pp: int, rank: int, kind: str, direction: str) -> int:
    # Activations go to the next rank and gradients to the previous one (the last rank's next is rank 0).
    return (rank + 1) % pp if (kind == "send") == (direction == "F") else (rank - 1) % pp
