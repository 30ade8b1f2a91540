"""What the engine asks about time: a small protocol, its cluster implementation, and a duration cache.

The engine never computes a cost itself. It asks a :class:`CostModel` (compute time of an op, closed-form
collective and point-to-point times, the phases of a collective algorithm and the links of a route for
flow mode), and caches the answers: many ops repeat (every micro-batch's forward of a stage is the same
value), so a cache keyed by the op turns millions of cost calls into a few hundred.

:class:`ClusterCostModel` forwards to :mod:`simgrid.costs` and :class:`simgrid.topology.Topology`;
tests pass small hand-written models with known closed forms.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from simgrid.errors import SimgridError
from simgrid.ir import Collective, Compute, Transfer

if TYPE_CHECKING:
    from simgrid.hardware import Cluster
    from simgrid.topology.link import Link


class PhaseLike(Protocol):
    """One step of a collective algorithm: concurrent transfers after a fixed latency."""

    @property
    def transfers(self) -> Sequence[tuple[int, int, float]]:
        """(source rank, destination rank, bytes) moved concurrently."""
        ...

    @property
    def latency_s(self) -> float:
        """Latency paid once per repetition."""
        ...


class CostModel(Protocol):
    """Durations the engine needs, for one cluster."""

    comm_compute_slowdown: float
    """Fraction of compute throughput lost while an NCCL collective of the same rank runs. A model may also
    give ``p2p_compute_slowdown`` and ``copy_engine_compute_slowdown`` (send/receive, copy-engine ring
    exchange; :mod:`simgrid.engine.overlap`); without them the collective's figure applies to those too."""

    def compute_s(self, op: Compute, speed: float) -> float:
        """Seconds ``op`` takes on a GPU (or the host, for ``device='cpu'``) running at ``speed``."""
        ...

    def collective_s(self, op: Collective, ranks: tuple[int, ...]) -> float:
        """Closed-form seconds of a collective over ``ranks`` (all ``op.count`` repetitions)."""
        ...

    def p2p_s(self, nbytes: int, src: int, dst: int) -> float:
        """Closed-form seconds of one point-to-point transfer."""
        ...

    def transfer_s(self, op: Transfer, rank: int) -> float:
        """Seconds of a host <-> device copy on ``rank``."""
        ...

    def phases(self, op: Collective, ranks: tuple[int, ...]) -> Sequence[PhaseLike]:
        """Algorithm steps of the whole op (all ``op.count`` calls), each with an optional ``repeat``."""
        ...

    def route(self, src: int, dst: int) -> tuple[Link, ...]:
        """Links a transfer from ``src`` to ``dst`` crosses."""
        ...


def host_bound_s(gpu_s: float, op: Compute) -> float:
    """Duration of a GPU op whose kernels the host issues in ``op.host_s`` seconds: the GPU cannot run a
    kernel before it is launched, so the op ends no earlier than the host's last launch. The GPU speed
    factor (stragglers) scales ``gpu_s`` only: host dispatch does not slow with the GPU's clock."""
    if not (math.isfinite(op.host_s) and op.host_s >= 0):
        raise SimgridError(f"compute op {op.kind} (stage {op.stage}, micro-batch {op.microbatch}) has host_s = "
                           f"{op.host_s!r}; host issue time must be a finite number of seconds >= 0")
    return gpu_s if op.host_s <= gpu_s else float(op.host_s)


class ClusterCostModel:
    """:class:`CostModel` of a sized cluster, from :mod:`simgrid.costs` and :mod:`simgrid.topology`."""

    def __init__(self, cluster: Cluster, *, dtype: str = "bf16", attention_kernel: str = "auto") -> None:
        from simgrid.costs import overlap_slowdown
        from simgrid.topology import Topology

        self.cluster = cluster
        self.dtype = dtype
        self.attention_kernel = attention_kernel
        self.topology = Topology(cluster)
        self.comm_compute_slowdown = overlap_slowdown(cluster.gpu, "collective")
        self.p2p_compute_slowdown = overlap_slowdown(cluster.gpu, "p2p")
        self.copy_engine_compute_slowdown = overlap_slowdown(cluster.gpu, "copy_engine")
        self.userbuffers_compute_slowdown = overlap_slowdown(cluster.gpu, "userbuffers")

    def compute_s(self, op: Compute, speed: float) -> float:
        from simgrid import costs

        if op.device == "cpu":
            return float(costs.host_compute_time_s(op, self.cluster.node, speed=speed))
        gpu_s = float(costs.compute_time_s(op, self.cluster.gpu, dtype=self.dtype, speed=speed,
                                           attention_kernel=self.attention_kernel))
        return host_bound_s(gpu_s, op)

    def collective_s(self, op: Collective, ranks: tuple[int, ...]) -> float:
        from simgrid import costs

        if len(ranks) <= 1:
            return 0.0
        return float(costs.collective_time_s(op.kind, op.bytes, ranks, self.topology, count=op.count, root=op.root))

    def p2p_s(self, nbytes: int, src: int, dst: int) -> float:
        from simgrid import costs

        return float(costs.p2p_time_s(nbytes, src, dst, self.topology))

    def transfer_s(self, op: Transfer, rank: int) -> float:
        from simgrid import costs

        return float(costs.transfer_time_s(op.bytes, rank, op.direction, self.topology))

    def phases(self, op: Collective, ranks: tuple[int, ...]) -> Sequence[PhaseLike]:
        from simgrid import costs

        if len(ranks) <= 1:
            return []
        out: Sequence[PhaseLike] = costs.collective_phases(op.kind, op.bytes, ranks, self.topology,
                                                          count=op.count, root=op.root)
        return out

    def route(self, src: int, dst: int) -> tuple[Link, ...]:
        return tuple(self.topology.route(src, dst))

    def p2p_class(self, src: int, dst: int) -> Hashable:
        """Optional :class:`CostModel` extra: equal keys mean equal :meth:`p2p_s` for any byte count
        (routes with the same link parameters), so :class:`DurationCache` computes each class once."""
        return self.topology.route_class(src, dst)


class DurationCache:
    """Memoised durations: first by op identity (ops are shared values), then by the fields that
    decide the cost (so the forward of micro-batch 7 reuses micro-batch 0's time, and a collective's
    time is computed once per group, size and count whatever its handle)."""

    def __init__(self, cost: CostModel, groups: Any) -> None:
        self.cost = cost
        self.groups = groups
        self._compute_by_id: dict[tuple[int, float], float] = {}
        self._compute_by_cost: dict[tuple[Any, ...], float] = {}
        self._coll_by_id: dict[int, float] = {}
        self._coll_by_cost: dict[tuple[Any, ...], float] = {}
        self._p2p: dict[tuple[int, int, int], float] = {}
        self._p2p_by_class: dict[tuple[int, Hashable], float] = {}
        self._p2p_class: Callable[[int, int], Hashable] | None = getattr(cost, "p2p_class", None)
        self._xfer: dict[tuple[int, str, int], float] = {}
        self._keep: list[object] = []  # ops whose id() is a cache key stay alive while the cache lives

    def compute(self, op: Compute, speed: float = 1.0) -> float:
        """Seconds of a compute op at ``speed``."""
        key = (id(op), speed)
        d = self._compute_by_id.get(key)
        if d is None:
            # The roofline reads only these fields (simgrid.costs.compute); stage/micro-batch do not matter.
            ckey = (op.kind, op.device, op.flops, op.hbm_bytes, op.gemm_mnk, op.kernels, op.attention_flops,
                    op.gemms, op.accumulate_gemms, op.accumulate_bytes, op.attention_shape, op.host_s, speed,
                    op.gemm_streams, op.fp8_gemms, op.fp8_accumulate_gemms)
            d = self._compute_by_cost.get(ckey)
            if d is None:
                d = self._compute_by_cost[ckey] = self.cost.compute_s(op, speed)
            self._compute_by_id[key] = d
            self._keep.append(op)
        return d

    def collective(self, op: Collective) -> float:
        """Closed-form seconds of a collective on its group."""
        d = self._coll_by_id.get(id(op))
        if d is None:
            ckey = (op.kind, op.group, op.bytes, op.count, op.root)
            d = self._coll_by_cost.get(ckey)
            if d is None:
                d = self._coll_by_cost[ckey] = self.cost.collective_s(op, tuple(self.groups[op.group]))
            self._coll_by_id[id(op)] = d
            self._keep.append(op)
        return d

    def p2p(self, nbytes: int, src: int, dst: int) -> float:
        """Closed-form seconds of a point-to-point transfer (once per route class when the cost model
        has ``p2p_class``: the symmetry check asks about every replica's pipeline transfer)."""
        key = (nbytes, src, dst)
        d = self._p2p.get(key)
        if d is None:
            if self._p2p_class is None:
                d = self.cost.p2p_s(nbytes, src, dst)
            else:
                class_key = (nbytes, self._p2p_class(src, dst))
                d = self._p2p_by_class.get(class_key)
                if d is None:
                    d = self._p2p_by_class[class_key] = self.cost.p2p_s(nbytes, src, dst)
            self._p2p[key] = d
        return d

    def transfer(self, op: Transfer, rank: int) -> float:
        key = (op.bytes, op.direction, rank)
        d = self._xfer.get(key)
        if d is None:
            d = self._xfer[key] = self.cost.transfer_s(op, rank)
        return d
