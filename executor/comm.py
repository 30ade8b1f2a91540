"""Asynchronous collectives and point-to-point transfers on real tensors, finished at the IR's WAIT.

Every communication op is issued with ``async_op=True`` and registered under its IR handle together with a
*completion* callback that consumes the result (e.g. unflattens a reduced bucket into gradients). The
interpreter calls :meth:`Pending.finish` at the matching WAIT. gloo has no ``reduce_scatter``; it is
performed as an all-reduce of the full buffer followed by taking this rank's shard (the trace row says
so), which is also how gloo's cost must be measured by calibration.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from simgrid.errors import ProgramError

# torch >= 2.10 renamed the tensor forms (the old names warn); older versions only have the old names.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def all_gather_single(output: torch.Tensor, input_: torch.Tensor, group: Any = None) -> None:
    """Synchronous all-gather of ``input_`` into ``output`` (concatenated along dimension 0)."""
    _all_gather_single(output, input_, group=group)


@dataclass
class Pending:
    """One issued asynchronous communication."""

    handle: str
    """IR handle."""
    works: list[Any]
    """torch.distributed work objects (empty for ops that completed at issue)."""
    on_complete: Callable[[], None] | None = None
    """Consumes the result once every work has finished."""
    issued_s: float = field(default_factory=time.perf_counter)
    """Host time at issue."""
    completed_s: float | None = None
    """Host time at which completion was first observed."""
    note: str = ""
    """How the op was really performed (e.g. reduce-scatter via all-reduce)."""

    def poll(self) -> None:
        """Record the completion time if every work has finished (cheap, non-blocking)."""
        if self.completed_s is None and all(w.is_completed() for w in self.works):
            self.completed_s = time.perf_counter()

    def finish(self) -> float:
        """Block until done, run the completion, return the completion time."""
        for work in self.works:
            work.wait()
        if self.completed_s is None:
            self.completed_s = time.perf_counter()
        if self.on_complete is not None:
            self.on_complete()
            self.on_complete = None
        return self.completed_s


def group_rank(members: tuple[int, ...], rank: int) -> int:
    """Index of a global rank inside a group's member list."""
    try:
        return members.index(rank)
    except ValueError:
        raise ProgramError(f"rank {rank} is not a member of group {members}") from None


def all_reduce(tensor: torch.Tensor, group: Any, *, op: Any = None) -> Any:
    """In-place asynchronous all-reduce (sum unless ``op`` is given)."""
    return dist.all_reduce(tensor, op=op or dist.ReduceOp.SUM, group=group, async_op=True)


def all_gather_dim0(shard: torch.Tensor, group: Any, size: int) -> tuple[torch.Tensor, Any]:
    """Asynchronous all-gather concatenating shards along dimension 0; returns (output, work)."""
    out = torch.empty((shard.shape[0] * size, *shard.shape[1:]), dtype=shard.dtype, device=shard.device)
    work = _all_gather_single(out, shard.contiguous(), group=group, async_op=True)
    return out, work


def all_to_all_rows(rows: torch.Tensor, send_splits: list[int], recv_splits: list[int], group: Any
                    ) -> tuple[torch.Tensor, Any]:
    """Asynchronous all-to-all of the rows of ``rows`` (dimension 0) with uneven splits: rows
    ``send_splits[i]`` go to member ``i``, ``recv_splits[i]`` rows arrive from member ``i`` (gloo and NCCL
    both implement ``all_to_all_single`` with split sizes); returns (received rows, work)."""
    out = rows.new_empty((sum(recv_splits), *rows.shape[1:]))
    work = dist.all_to_all_single(out, rows.contiguous(), recv_splits, send_splits, group=group, async_op=True)
    return out, work


def all_to_all_counts(counts: torch.Tensor, group: Any) -> torch.Tensor:
    """Synchronous all-to-all of equal slices of an int64 vector (member ``i`` gets slice ``i``): how a MoE
    dispatcher tells each peer how many tokens it will send for each of the peer's experts."""
    out = torch.empty_like(counts)
    dist.all_to_all_single(out, counts.contiguous(), group=group)
    return out


def reduce_scatter_dim0(full: torch.Tensor, group: Any, size: int, index: int, backend: str
                        ) -> tuple[Callable[[], torch.Tensor], Any, str]:
    """Asynchronous reduce-scatter along dimension 0: (result getter, work, note).

    gloo lacks ``reduce_scatter_tensor``: all-reduce the whole buffer, then keep this rank's slice.
    """
    if full.shape[0] % size:
        raise ProgramError(f"reduce-scatter of {tuple(full.shape)} over {size} ranks: dimension 0 not divisible")
    step = full.shape[0] // size
    if backend == "nccl":
        out = torch.empty((step, *full.shape[1:]), dtype=full.dtype, device=full.device)
        work = _reduce_scatter_single(out, full.contiguous(), group=group, async_op=True)
        return (lambda: out), work, ""
    buf = full.contiguous().clone()
    work = dist.all_reduce(buf, group=group, async_op=True)
    getter = _ShardOfReduced(buf, index * step, (index + 1) * step)
    return getter, work, "reduce_scatter via all_reduce (gloo)"


class _ShardOfReduced:
    """This rank's slice of an all-reduced buffer; ``full`` keeps the whole reduced buffer reachable."""

    def __init__(self, full: torch.Tensor, start: int, stop: int) -> None:
        self.full = full
        self.start, self.stop = start, stop

    def __call__(self) -> torch.Tensor:
        return self.full[self.start: self.stop]


def flatten(tensors: list[torch.Tensor], pad_to: int = 1) -> torch.Tensor:
    """Concatenate flattened tensors, zero-padded to a multiple of ``pad_to`` elements."""
    flat = torch.cat([t.reshape(-1) for t in tensors]) if tensors else torch.zeros(0)
    extra = (-flat.numel()) % pad_to
    if extra:
        flat = torch.cat([flat, flat.new_zeros(extra)])
    return flat


def unflatten_into(flat: torch.Tensor, shapes: list[torch.Size]) -> list[torch.Tensor]:
    """Split a flat buffer back into tensors of the given shapes (padding ignored)."""
    out: list[torch.Tensor] = []
    offset = 0
    for shape in shapes:
        n = 1
        for d in shape:
            n *= d
        out.append(flat[offset: offset + n].view(shape))
        offset += n
    return out
