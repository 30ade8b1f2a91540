"""Pipeline SEND/RECV as Megatron-LM's batched, synchronised p2p runs them (``p2p_order = "megatron-batched"``).

Without ``overlap_p2p_comm`` (Megatron-Core's non-interleaved schedule always, its interleaved one when the flag is
off, and Megatron-LM 2021/2022) each p2p call of the schedule is one ``batch_isend_irecv`` whose requests are all
waited for, followed by ``torch.cuda.synchronize()`` (p2p_communication.py lines 102-108 and 121-166, 363-371 at
338af514; lines 108-112 at 64a83fb, Megatron-LM of March 2021). Read from schedules.py at 338af514:

* ``forward_backward_pipelining_without_interleaving`` (lines 1209-1470): warm-up ``recv_forward``, forward,
  ``send_forward``; one more ``recv_forward``; each steady iteration forward, ``send_forward_recv_backward``,
  backward, ``send_backward_recv_forward`` (``send_backward`` in the last); cool-down ``recv_backward``,
  backward, ``send_backward``. The same calls at 64a83fb (schedules.py lines 360-451).
* ``forward_backward_pipelining_with_interleaving`` without overlap (lines 806-832, 970-1037, 1054-1071): after
  each warm-up forward ``send_forward_recv_forward`` (the last one also receives the first backward's gradient),
  and one ``send_forward_backward_recv_forward_backward`` after each steady iteration's forward *and* backward,
  so the forward's output leaves only after the backward; the cool-down as in the overlapped path.

Every call is blocking (waited right after it is issued). The ops of one batch run concurrently in NCCL (one
group): the lowering marks them ``grouped`` (:class:`simgrid.ir.ops.Send`), so a send and a receive to one peer
run at once on their own direction streams. Both ends issue them in one canonical order (activations before
gradients, then by sender), which orders two sends to one peer in a group (pp 2) the same way on both ends.
"""

from __future__ import annotations

from simgrid.schedules.lower.p2p_megatron import (
    Call,
    forward_chunk,
    steady_recv_backward,
    steady_recv_forward,
    warmup_steps,
)


def _ordered(ops: list[tuple[str, str, int]], rank: int, pp: int) -> list[tuple[str, str, int]]:
    def sender(op: tuple[str, str, int]) -> int:
        kind, direction, _ = op
        if kind == "send":
            return rank
        return (rank - 1) % pp if direction == "F" else (rank + 1) % pp

    return sorted(ops, key=lambda op: (op[1] != "F", sender(op)))


def batched_calls(pp: int, vpp: int, m: int, rank: int, f_steps: list[int], b_steps: list[int],
                  interleaved: bool) -> list[Call]:
    """Rank ``rank``'s blocking p2p calls in issue order (``f_steps[k]`` / ``b_steps[k]``: steps of its k-th
    forward / backward in Megatron's order)."""
    calls = _interleaved(pp, vpp, m, rank, f_steps, b_steps) if interleaved else _plain(pp, m, rank, f_steps, b_steps)
    for c in calls:
        c.ops, c.blocking = _ordered(c.ops, rank, pp), True
    return calls


def _plain(pp: int, m: int, rank: int, f_steps: list[int], b_steps: list[int]) -> list[Call]:
    first, last = rank == 0, rank == pp - 1
    warmup = min(pp - rank - 1, m)
    remaining = m - warmup
    recv_f = [] if first else [("recv", "F", 0)]
    send_f = [] if last else [("send", "F", 0)]
    recv_b = [] if last else [("recv", "B", 0)]
    send_b = [] if first else [("send", "B", 0)]
    calls = []
    for i in range(warmup):
        calls += [Call(step=f_steps[i] - 1, ops=list(recv_f)), Call(step=f_steps[i], ops=list(send_f))]
    if remaining:
        calls.append(Call(step=f_steps[warmup] - 1, ops=list(recv_f)))
    for i in range(remaining):
        calls.append(Call(step=f_steps[warmup + i], ops=send_f + recv_b))
        calls.append(Call(step=b_steps[i], ops=send_b + ([] if i == remaining - 1 else recv_f)))
    for i in range(remaining, m):
        calls += [Call(step=b_steps[i] - 1, ops=list(recv_b)), Call(step=b_steps[i], ops=list(send_b))]
    return [c for c in calls if c.ops]


def _interleaved(pp: int, vpp: int, m: int, rank: int, f_steps: list[int], b_steps: list[int]) -> list[Call]:
    total = m * vpp
    warmup = warmup_steps(pp, vpp, m, rank)
    remaining = total - warmup
    first, last = rank == 0, rank == pp - 1

    def chunk_f(k: int) -> int:
        return forward_chunk(pp, vpp, k)

    def chunk_b(k: int) -> int:
        return vpp - 1 - forward_chunk(pp, vpp, k)

    calls = [] if first else [Call(step=0, ops=[("recv", "F", 0)])]
    for k in range(warmup):  # lines 806-832
        ops = [] if last and chunk_f(k) == vpp - 1 else [("send", "F", chunk_f(k))]
        if not (first and chunk_f(k + 1) == 0) and k != total - 1:
            ops.append(("recv", "F", chunk_f(k + 1)))
        if k == warmup - 1 and remaining and not last:
            ops.append(("recv", "B", vpp - 1))
        calls.append(Call(step=f_steps[k], ops=ops))
    for k in range(remaining):  # lines 970-1037: one call after the forward and the backward
        fk = k + warmup
        ops = [] if last and chunk_f(fk) == vpp - 1 else [("send", "F", chunk_f(fk))]
        if not (first and chunk_b(k) == 0):
            ops.append(("send", "B", chunk_b(k)))
        recv_f, into_f = steady_recv_forward(pp, vpp, rank, fk)  # the wrap lock-step, as p2p_megatron
        if recv_f and k != remaining - 1:
            ops.append(("recv", "F", into_f))
        recv_b, into_b = steady_recv_backward(pp, vpp, rank, k)
        if recv_b:
            ops.append(("recv", "B", into_b))
        calls.append(Call(step=b_steps[k], ops=ops, made={"F": f_steps[fk]}))
    if not remaining and not last:  # lines 1054-1057
        calls.append(Call(step=f_steps[-1], ops=[("recv", "B", vpp - 1)]))
    for k in range(remaining, total):  # lines 1058-1071
        ops = [] if first and chunk_b(k) == 0 else [("send", "B", chunk_b(k))]
        if not (last and chunk_b(k + 1) == vpp - 1) and k != total - 1:
            ops.append(("recv", "B", chunk_b(k + 1)))
        calls.append(Call(step=b_steps[k], ops=ops))
    return [c for c in calls if c.ops]
