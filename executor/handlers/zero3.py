"""ZeRO-3 (Rajbhandari et al., SC'20, section 5.3): a block's parameters are gathered before use and
released after, its gradients reduce-scattered to each rank's 1/dp shard.

Labels ``b<block>:param`` (purpose ``zero-param``: all-gather the shards of every parameter the block
reads, a tied head weight included) and ``b<block>:grad`` (``zero-grad``: reduce-scatter the block's
gradients), or several blocks joined by ``+`` (an FSDP2 unit, a DeepSpeed prefetch or reduce bucket
spanning blocks: the union of their parameters, a shared tied weight once); :mod:`.gradsync` routes them
here. The FREE of a gathered buffer (:mod:`.memory`) calls
:func:`release_zero3`.
"""

from __future__ import annotations

from typing import Any

import torch

from executor.comm import Pending, all_gather_dim0, flatten, group_rank, reduce_scatter_dim0
from executor.grads import block_parameters
from executor.state import RankState
from simgrid.ir.ops import Collective


def zero3_collective(state: RankState, op: Collective, blocks: tuple[int, ...], group: Any,
                     members: tuple[int, ...]) -> Pending:
    """Gather the named blocks' parameters (``zero-param``) or reduce-scatter their gradients (``zero-grad``)."""
    book = state.book
    shards = list({id(s): s for b in blocks for s in book.zero3_params(b)}.values())
    size = len(members)
    if op.purpose == "zero-param":
        local = torch.cat([s.shard for s in shards]) if shards else torch.zeros(0, device=state.ctx.device)
        full, work = all_gather_dim0(local, group, size)
        state.zero3_handles[op.handle] = blocks

        def scatter_back() -> None:
            per_rank = full.view(size, -1)
            offset = 0
            for s in shards:
                n = s.shard.numel()
                s.param.data = per_rank[:, offset: offset + n].reshape(-1)[: s.numel].view(s.shape).clone()
                offset += n
            for block in blocks:
                state.zero3_live[block] = state.zero3_live.get(block, 0) + 1

        return Pending(handle=op.handle, works=[work], on_complete=scatter_back,
                       note=f"includes the tied embedding ({shards[-1].name})"
                       if len(shards) > len(block_parameters(state.modules, list(blocks))) else "")
    state.finish_blocks(set(blocks))
    pieces = []
    for s in shards:
        g = s.param.grad if s.param.grad is not None else s.shard.new_zeros(s.shape)
        pieces.append(flatten([g], pad_to=size).view(size, -1))
        s.param.grad = None
    flat = torch.cat(pieces, dim=1).reshape(-1) if pieces else torch.zeros(0, device=state.ctx.device)
    getter, work, note = reduce_scatter_dim0(flat, group, size, group_rank(members, state.rank), state.backend)

    def accumulate() -> None:
        mine = getter()
        offset = 0
        for s in shards:
            n = s.shard.numel()
            s.grad += mine[offset: offset + n]
            offset += n

    return Pending(handle=op.handle, works=[work], on_complete=accumulate, note=note)


def release_zero3(state: RankState, block: int) -> None:
    """FREE of a ZeRO-3 gathered buffer: drop the full parameters once no gather of the block is live.

    Segments the executor runs lazily (after a tensor-parallel cut) still read these parameters, so the
    ready ones of every block reading a released parameter run first: the IR's FREE follows that compute.
    """
    live = state.zero3_live.get(block, 0) - 1
    state.zero3_live[block] = live
    if live > 0:
        return
    book = state.book
    released = [s for s in book.zero3_params(block)
                if not any(state.zero3_live.get(b, 0) > 0 for b in state.modules
                           if b != block and any(x is s for x in book.zero3_params(b)))]
    readers = {b for b in state.modules if any(x is s for s in released for x in book.zero3_params(b))}
    state.finish_ready_segments(readers)
    for s in released:
        s.param.data = s.shard.new_empty(0)
