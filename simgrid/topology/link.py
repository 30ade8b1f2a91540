"""One direction of one physical link, as the engine shares it between flows.

A :class:`Link` is the unit of contention: every transfer crossing it shares its bandwidth with the
other transfers crossing it at the same time (the engine's flow mode), and a route is the tuple of links
a transfer crosses. Links are values: two links with the same name are the same link.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from simgrid.hardware import LinkSpec

GB = 1e9
"""Bytes per GB (datasheet convention, 10^9), for GB/s -> B/s."""
US = 1e-6
"""Seconds per microsecond."""


@dataclass(frozen=True)
class Link:
    """One direction of a link: what a transfer crossing it gets (achievable rate) and pays (latency)."""

    name: str
    """Unique name, e.g. ``node3/gpu5/nvlink-out`` or ``rail2/leaf0/up``."""
    bandwidth_Bps: float
    """Achievable bandwidth in bytes/s: line rate times the profile's efficiency; ``inf`` when ideal."""
    latency_s: float
    """Latency a transfer pays for crossing this link; a route's latency is the sum over its links."""
    line_rate_Bps: float = field(default=0.0, compare=False)
    """Raw line rate in bytes/s before efficiency (for utilisation plots); 0 when not given."""

    @property
    def raw_bandwidth_Bps(self) -> float:
        """The line rate, or the achievable bandwidth when no line rate was given."""
        return self.line_rate_Bps or self.bandwidth_Bps


def link_from_spec(name: str, spec: LinkSpec, *, latency_us: float, extra_efficiency: float = 1.0,
                   share: float = 1.0) -> Link:
    """A :class:`Link` from a profile's :class:`LinkSpec`.

    ``latency_us`` is the part of the spec's latency this link carries (routes split one traversal's
    latency over their links so that the sum is right); ``extra_efficiency`` multiplies the spec's own
    efficiency (the network's fabric efficiency on NIC links); ``share`` scales the rate for links that
    aggregate several ports (a leaf switch's uplinks) or are divided by oversubscription.
    """
    line_rate = spec.bandwidth_GBps * GB * share
    return Link(
        name=name,
        bandwidth_Bps=line_rate * spec.efficiency * extra_efficiency,
        latency_s=latency_us * US,
        line_rate_Bps=line_rate,
    )


def route_latency_s(route: Iterable[Link]) -> float:
    """Latency of a route: the sum of its links' latencies (0 for an empty, same-rank route)."""
    return sum(link.latency_s for link in route)


def route_bandwidth_Bps(route: Iterable[Link]) -> float:
    """Bandwidth of a lone transfer on a route: its slowest link (``inf`` for an empty route)."""
    return min((link.bandwidth_Bps for link in route), default=float("inf"))
