"""Gradient synchronisation and parameter collectives of data parallelism, on :class:`executor.grads.GradBook`.

* ``dp-grad`` (DDP bucket all-reduce), ``ps-reduce`` / ``ps-broadcast`` (parameter server: gradients
  reduced to the root, updated parameters broadcast from it), ``zero-grad`` / ``zero-param`` on buckets
  (ZeRO-1/2: reduce-scatter of the padded flat bucket, all-gather of the updated master shards); the
  same purposes on ``b<block>[+b<block>...]:param|grad`` labels are ZeRO-3's and go to :mod:`.zero3`;
* ``embed-grad``: the all-reduce of a tied embedding's gradient between the first and last pipeline stage;
* ``s<stage>:sp-grads`` (purpose ``tp``, reached through :mod:`.blockcomm`): sequence parallelism's sum of
  partial gradients over the tensor-parallel group.

Each first finishes the lazy segments of the blocks whose gradients it reads (:meth:`RankState.finish_blocks`).
"""

from __future__ import annotations

import re
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from executor.comm import Pending, all_gather_dim0, all_reduce, flatten, group_rank, reduce_scatter_dim0
from executor.grads import block_parameters, split_parameters
from executor.handlers.zero3 import zero3_collective
from executor.state import RankState
from simgrid.errors import ProgramError
from simgrid.ir.ops import Collective
from simgrid.schedules.buckets import grad_buckets


def data_parallel(state: RankState, op: Collective) -> Pending:
    """A data-parallel gradient or parameter collective, on a bucket (``s<stage>:bucket<i>``) or, under
    ZeRO-3, on the parameters of the blocks the label names (``b<block>[+b<block>...]:param|grad``)."""
    group, members = state.group(op)
    label = op.label
    zero3 = re.fullmatch(r"(b\d+(?:\+b\d+)*):(param|grad)", label)
    if zero3:
        blocks = tuple(int(b) for b in re.findall(r"\d+", zero3.group(1)))
        return zero3_collective(state, op, blocks, group, members)
    bucket = re.fullmatch(r"s(\d+):(e?)bucket(\d+)", label)
    if bucket is None:
        raise ProgramError(f"{op.purpose} collective label {label!r} is not 's<stage>:bucket<i>', "
                           "'s<stage>:ebucket<i>' or 'b<block>:...'")
    return _bucket(state, op, int(bucket.group(1)), int(bucket.group(3)), group, members,
                   experts=bool(bucket.group(2)))


# -- sequence-parallel partial gradients ---------------------------------------------------------------
def _sp_grad_slot(state: RankState, p: nn.Parameter) -> tuple[torch.Tensor, Any]:
    """(full-size flat gradient of ``p`` as this rank holds it, function writing a reduced one back).

    Where the gradient lives at the step end: a ZeRO-3 shard, a slice of a ZeRO-1/2 bucket shard (zeros
    outside this rank's slice; tensor-parallel peers hold the same slice, so the sum stays exact), the
    data-parallel reduced accumulator, or the local ``p.grad``.
    """
    book = state.book
    numel = p.numel()
    pshard = book.zero3.get(id(p))
    if pshard is not None:
        numel = pshard.numel  # the parameter itself is released (empty) between ZeRO-3 gathers
        lo = min(book.dp_index * pshard.shard.numel(), numel)
        hi = min(lo + pshard.shard.numel(), numel)
        full = pshard.grad.new_zeros(numel)
        full[lo:hi] = pshard.grad[: hi - lo]

        def write_shard(reduced: torch.Tensor) -> None:
            pshard.grad[: hi - lo] = reduced[lo:hi]

        return full, write_shard
    for shard in book.buckets.values():
        if any(q is p for q in shard.params):
            offset = _offset(shard.params, p)
            lo, hi = max(offset, shard.start), min(offset + numel, shard.stop)
            full = shard.grad.new_zeros(numel)
            if lo < hi:
                full[lo - offset: hi - offset] = shard.grad[lo - shard.start: hi - shard.start]

            def write_bucket(reduced: torch.Tensor, shard: Any = shard, lo: int = lo, hi: int = hi,
                             offset: int = offset) -> None:
                if lo < hi:
                    shard.grad[lo - shard.start: hi - shard.start] = reduced[lo - offset: hi - offset]

            return full, write_bucket
    if id(p) in book.reduced:
        return book.reduced[id(p)].reshape(-1).clone(), lambda reduced: book.reduced.__setitem__(
            id(p), reduced.view_as(p).clone())
    local = p.grad if p.grad is not None else torch.zeros_like(p)

    def write_local(reduced: torch.Tensor) -> None:
        p.grad = reduced.view_as(p).clone()

    return local.reshape(-1).clone(), write_local


def sp_grads(state: RankState, op: Collective, stage: int, group: Any) -> Pending:
    """``s<stage>:sp-grads``: sum over the TP group the gradients of the stage's sequence-parallel partial
    parameters (norms, row-parallel biases, learned positions; Megatron-LM ``_allreduce_layernorm_grads``)."""
    blocks = sorted(b for b, s in state.stage_of.items() if s == stage)
    state.finish_blocks(set(blocks))
    params = [p for _, p in block_parameters(state.modules, blocks) if id(p) in state.sp_params]
    slots = [_sp_grad_slot(state, p) for p in params]
    flat = torch.cat([full for full, _ in slots]) if slots else torch.zeros(0, device=state.ctx.device)
    work = all_reduce(flat, group)

    def write_back() -> None:
        offset = 0
        for full, write in slots:
            write(flat[offset: offset + full.numel()])
            offset += full.numel()

    return Pending(handle=op.handle, works=[work], on_complete=write_back)


# -- buckets: DDP, parameter server, ZeRO-1/2 ---------------------------------------------------------
def _bucket_params(state: RankState, stage: int, index: int, experts: bool = False
                   ) -> list[tuple[str, nn.Parameter]]:
    buckets = grad_buckets(state.spec, state.layout, stage, experts=experts)
    if not 0 <= index < len(buckets):
        raise ProgramError(f"stage {stage} has {len(buckets)} gradient buckets, not bucket {index}")
    blocks = list(buckets[index].blocks)
    state.finish_blocks(set(blocks))
    return split_parameters(state.modules, blocks, experts=experts)


def _bucket(state: RankState, op: Collective, stage: int, index: int, group: Any,
            members: tuple[int, ...], *, experts: bool = False) -> Pending:
    book = state.book
    size = len(members)
    key = (stage, -1 - index) if experts else (stage, index)  # GradBook's key of a routed-expert bucket
    if op.purpose == "zero-param":
        found = book.buckets.get(key)
        if found is None:
            raise ProgramError(f"zero-param gather of s{stage}:bucket{index} before its gradients were reduced")
        full, work = all_gather_dim0(found.master, group, size)
        return Pending(handle=op.handle, works=[work], on_complete=lambda: book.write_gathered(found, full))
    if op.purpose == "ps-broadcast":
        params = [p for _, p in block_parameters(state.modules, _stage_bucket_blocks(state, stage, index))]
        flat = flatten([p.detach() for p in params])
        work = dist.broadcast(flat, src=_root(op), group=group, async_op=True)

        def write() -> None:
            if state.rank != op.root:
                book.write_flat(params, flat)

        return Pending(handle=op.handle, works=[work], on_complete=write)
    named = _bucket_params(state, stage, index, experts)
    params = [p for _, p in named]
    if op.purpose == "dp-grad":
        flat = book.take_local(params)
        return Pending(handle=op.handle, works=[all_reduce(flat, group)],
                       on_complete=lambda: book.add_reduced(params, flat))
    if op.purpose == "ps-reduce":
        flat = book.take_local(params)
        work = dist.reduce(flat, dst=_root(op), group=group, async_op=True)

        def keep() -> None:
            if state.rank == op.root:
                book.add_reduced(params, flat)

        return Pending(handle=op.handle, works=[work], on_complete=keep)
    # zero-grad: reduce-scatter of the padded flat bucket.
    shard = book.bucket(key, named)
    flat = flatten([p.grad if p.grad is not None else torch.zeros_like(p) for p in params], pad_to=size)
    twin = tied_twin(state)
    for p in params:
        p.grad = None
    getter, work, note = reduce_scatter_dim0(flat, group, size, group_rank(members, state.rank), state.backend)

    def accumulate() -> None:
        shard.grad += getter()
        if twin is not None and any(p is twin for p in params):
            # Keep the twin's full reduced gradient for the tied-embedding all-reduce that follows.
            offset = _offset(params, twin)
            full = getattr(getter, "full", None)
            if full is None:
                raise ProgramError("tied embeddings with ZeRO over NCCL need the full reduced gradient")
            book.reduced[id(twin)] = full[offset: offset + twin.numel()].view_as(twin).clone()

    return Pending(handle=op.handle, works=[work], on_complete=accumulate, note=note)


def _stage_bucket_blocks(state: RankState, stage: int, index: int) -> list[int]:
    return list(grad_buckets(state.spec, state.layout, stage)[index].blocks)


def _root(op: Collective) -> int:
    if op.root is None:
        raise ProgramError(f"{op.kind} needs a root rank")
    return op.root


def _offset(params: list[nn.Parameter], target: nn.Parameter) -> int:
    offset = 0
    for p in params:
        if p is target:
            return offset
        offset += p.numel()
    raise ProgramError("parameter not in bucket")


# -- tied embeddings ---------------------------------------------------------------------------------
def tied_twin(state: RankState) -> nn.Parameter | None:
    """This rank's copy of a tied embedding matrix that has a twin on another pipeline stage."""
    if not state.spec.tied_embeddings or (0 in state.modules and state.head in state.modules):
        return None
    if 0 in state.modules:
        return state.modules[0].wte
    if state.head in state.modules:
        return state.modules[state.head].head_weight
    return None


def embed_grad(state: RankState, op: Collective) -> Pending:
    """``embed-grad``: sum a tied embedding's gradient over its two pipeline stages."""
    group, _ = state.group(op)
    twin = tied_twin(state)
    if twin is None:
        raise ProgramError("embed-grad all-reduce on a rank without a tied embedding twin")
    blocks = {0} if 0 in state.modules else {state.head}
    state.finish_blocks(blocks)
    book = state.book
    before = book.reduced.get(id(twin))
    target = before if before is not None else twin.grad
    if target is None:
        target = torch.zeros_like(twin)
        twin.grad = target
    snapshot = target.clone()
    work = all_reduce(target, group)

    def propagate() -> None:
        # A ZeRO shard that already holds part of the twin's gradient gets the other stage's share too.
        delta = target - snapshot
        for shard in book.buckets.values():
            if any(p is twin for p in shard.params):
                offset = _offset(shard.params, twin)
                lo, hi = max(offset, shard.start), min(offset + twin.numel(), shard.stop)
                if lo < hi:
                    shard.grad[lo - shard.start: hi - shard.start] += delta.reshape(-1)[lo - offset: hi - offset]

    return Pending(handle=op.handle, works=[work], on_complete=propagate)
