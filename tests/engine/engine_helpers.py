"""Stand-ins shared by the engine tests: a cost model with hand-checkable closed forms, op builders."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from simgrid.ir import Collective, Compute, P2PKey, Recv, Send, Transfer
from simgrid.topology.link import Link


@dataclass(frozen=True)
class StepPhase:
    """A collective step: latency, then concurrent transfers."""

    transfers: tuple[tuple[int, int, float], ...]
    latency_s: float
    repeat: int = 1


class UniformCost:
    """Every GPU computes at ``flops_per_s``; every rank pair has a dedicated link of ``bw`` B/s and
    latency ``lat`` s unless ``route_fn`` maps the pair to other links. Collectives are rings."""

    def __init__(self, *, flops_per_s: float = 1e12, bw: float = 1e9, lat: float = 0.0, slowdown: float = 0.0,
                 p2p_slowdown: float | None = None, copy_engine_slowdown: float | None = None,
                 userbuffers_slowdown: float | None = None, route_fn: Callable[[int, int], tuple[Link, ...]] | None = None) -> None:
        self.flops_per_s = flops_per_s
        self.bw = bw
        self.lat = lat
        self.comm_compute_slowdown = slowdown
        self.p2p_compute_slowdown = p2p_slowdown  # None: as ``slowdown`` (simgrid.engine.overlap.slowdowns)
        self.copy_engine_compute_slowdown = copy_engine_slowdown
        self.userbuffers_compute_slowdown = userbuffers_slowdown
        self.route_fn = route_fn

    def compute_s(self, op: Compute, speed: float) -> float:
        return op.flops / self.flops_per_s / speed

    def collective_s(self, op: Collective, ranks: tuple[int, ...]) -> float:
        n = len(ranks)
        if n == 1:
            return 0.0
        steps = 2 * (n - 1) if op.kind == "all_reduce" else n - 1
        return steps * (op.bytes / n / self.bw + self.lat)

    def p2p_s(self, nbytes: int, src: int, dst: int) -> float:
        return self.lat + nbytes / self.bw

    def transfer_s(self, op: Transfer, rank: int) -> float:
        return op.bytes / self.bw

    def phases(self, op: Collective, ranks: tuple[int, ...]) -> Sequence[StepPhase]:
        n = len(ranks)
        if n == 1:
            return []
        steps = 2 * (n - 1) if op.kind == "all_reduce" else n - 1
        ring = tuple((ranks[i], ranks[(i + 1) % n], op.bytes / n) for i in range(n))
        return [StepPhase(ring, self.lat, steps)]

    def route(self, src: int, dst: int) -> tuple[Link, ...]:
        if self.route_fn is not None:
            return self.route_fn(src, dst)
        return (Link(f"{src}->{dst}", self.bw, self.lat),)


def fwd(flops: float, *, stage: int = 0, mb: int = 0, kind: str = "F") -> Compute:
    """A compute op of ``flops`` FLOPs."""
    return Compute(kind=kind, stage=stage, microbatch=mb, chunk=0, block_start=0, block_end=1,  # type: ignore[arg-type]
                   flops=flops, hbm_bytes=0.0)


def send(peer: int, nbytes: int, handle: str, *, src: int = 0, dst: int = 1, mb: int = 0) -> Send:
    """A forward-activation send."""
    return Send(peer=peer, bytes=nbytes, key=P2PKey(src_stage=src, dst_stage=dst, microbatch=mb, direction="F"),
                handle=handle)


def recv(peer: int, nbytes: int, handle: str, *, src: int = 0, dst: int = 1, mb: int = 0) -> Recv:
    """The receive matching :func:`send`."""
    return Recv(peer=peer, bytes=nbytes, key=P2PKey(src_stage=src, dst_stage=dst, microbatch=mb, direction="F"),
                handle=handle)


def allreduce(group: str, nbytes: int, handle: str, purpose: str = "dp-grad") -> Collective:
    """An all-reduce on ``group``."""
    return Collective(kind="all_reduce", group=group, bytes=nbytes, purpose=purpose, handle=handle)  # type: ignore[arg-type]
