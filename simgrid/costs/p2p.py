"""Point-to-point (pipeline send/recv) and host <-> device transfer times on an idle route.

Both are one alpha-beta step (Hockney 1994): ``latency of the route + bytes / slowest link``. A route's
latency is the sum of its links' latencies (see :mod:`simgrid.topology.topology`), its bandwidth the
achievable rate of its slowest link. The engine's flow mode shares links between concurrent transfers;
these closed forms are the lone-transfer times and what the fast mode uses.

Measured tables: a calibrated profile's ``p2p`` rows (send/recv time by size) replace the formula for
GPU-to-GPU transfers; host copies have no measured table and always use the formula.
"""

from __future__ import annotations

from simgrid.errors import SimgridError
from simgrid.topology import HostDirection, Topology, route_bandwidth_Bps, route_latency_s
from simgrid.topology.link import Link


def _check_bytes(nbytes: float) -> None:
    if nbytes < 0:
        raise SimgridError(f"nbytes = {nbytes!r} must be >= 0")


def route_time_s(nbytes: float, route: tuple[Link, ...]) -> float:
    """Lone-transfer time over a route: its latency plus bytes over its slowest link."""
    if not route:
        return 0.0
    bandwidth = route_bandwidth_Bps(route)
    return route_latency_s(route) + (nbytes / bandwidth if nbytes > 0 else 0.0)


def p2p_time_s(nbytes: float, src: int, dst: int, topo: Topology) -> float:
    """Seconds to send ``nbytes`` from rank ``src`` to rank ``dst`` (0 when they are the same rank)."""
    _check_bytes(nbytes)
    route = topo.route(src, dst)
    if not route:
        return 0.0
    measured = topo.cluster.spec.measured
    if measured is not None:
        t_us = measured.p2p_time_us(nbytes)
        if t_us is not None:
            return t_us * 1e-6
    return route_time_s(nbytes, route)


def transfer_time_s(nbytes: float, rank: int, direction: HostDirection, topo: Topology) -> float:
    """Seconds to copy ``nbytes`` between rank's GPU and host memory over PCIe (``d2h`` or ``h2d``)."""
    _check_bytes(nbytes)
    return route_time_s(nbytes, topo.host_route(rank, direction))
