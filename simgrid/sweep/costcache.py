"""A cost model that remembers its answers across the programs of a layout search.

:class:`~simgrid.engine.costmodel.DurationCache` memoises durations within one program, keyed by group
*name*; the layouts of a search share most of their costs (the same tensor-parallel all-reduce of the
same bytes over the same eight GPUs) but not their group names. :class:`MemoCostModel` sits under the
per-program caches and keys by what decides a cost: the op's fields (every field but its handle, label,
group name, and for compute the position fields stage, micro-batch, chunk and block range, which
``DurationCache`` already treats as cost-free) and the member ranks. A field added to an op later is
part of the key by default, so the memo can only lose hits, never return another op's time.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

from simgrid.engine.costmodel import CostModel, PhaseLike
from simgrid.engine.overlap import slowdowns
from simgrid.ir.ops import Collective, Compute, Transfer

_COMPUTE_POSITION = frozenset({"stage", "microbatch", "chunk", "block_start", "block_end"})
_COMM_NAMES = frozenset({"handle", "label", "group"})


class MemoCostModel:
    """:class:`~simgrid.engine.costmodel.CostModel` that forwards to ``inner`` once per distinct question."""

    def __init__(self, inner: CostModel) -> None:
        self.inner = inner
        self.comm_compute_slowdown = inner.comm_compute_slowdown
        (self.p2p_compute_slowdown, self.copy_engine_compute_slowdown,
         self.userbuffers_compute_slowdown) = slowdowns(inner)[1:]
        self._compute: dict[tuple[Any, ...], float] = {}
        self._collective: dict[tuple[Any, ...], float] = {}
        self._p2p: dict[tuple[Any, ...], float] = {}
        self._transfer: dict[tuple[Any, ...], float] = {}
        self._p2p_class = getattr(inner, "p2p_class", None)

    def compute_s(self, op: Compute, speed: float) -> float:
        key = (speed, *(v for k, v in op.__dict__.items() if k not in _COMPUTE_POSITION))
        d = self._compute.get(key)
        if d is None:
            d = self._compute[key] = self.inner.compute_s(op, speed)
        return d

    def collective_s(self, op: Collective, ranks: tuple[int, ...]) -> float:
        key = (ranks, *(v for k, v in op.__dict__.items() if k not in _COMM_NAMES))
        d = self._collective.get(key)
        if d is None:
            d = self._collective[key] = self.inner.collective_s(op, ranks)
        return d

    def p2p_s(self, nbytes: int, src: int, dst: int) -> float:
        key: tuple[Any, ...] = (nbytes, self._p2p_class(src, dst)) if self._p2p_class else (nbytes, src, dst)
        d = self._p2p.get(key)
        if d is None:
            d = self._p2p[key] = self.inner.p2p_s(nbytes, src, dst)
        return d

    def transfer_s(self, op: Transfer, rank: int) -> float:
        key = (rank, *(v for k, v in op.__dict__.items() if k not in _COMM_NAMES))
        d = self._transfer.get(key)
        if d is None:
            d = self._transfer[key] = self.inner.transfer_s(op, rank)
        return d

    def phases(self, op: Collective, ranks: tuple[int, ...]) -> Sequence[PhaseLike]:
        return self.inner.phases(op, ranks)

    def route(self, src: int, dst: int) -> Any:
        return self.inner.route(src, dst)

    def p2p_class(self, src: int, dst: int) -> Hashable:
        """The inner model's route class (or the pair itself), so per-program caches dedupe as before."""
        return self._p2p_class(src, dst) if self._p2p_class else (src, dst)
