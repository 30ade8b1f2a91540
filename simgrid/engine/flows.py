"""Flow-level network model: transfers share link bandwidth max-min fairly.

Every active transfer is a flow over the links of its route. Rates are the max-min fair allocation
(progressive filling: repeatedly saturate the most contended link and freeze the flows crossing it;
Bertsekas & Gallager, *Data Networks*, 2nd ed., section 6.5.2), recomputed whenever a flow starts or
ends, so traffic meeting on a NIC slows every flow crossing it. Between changes each flow progresses
linearly; one pending SimPy timeout marks the next completion (a version number invalidates older ones).
Links with infinite bandwidth never constrain a flow; a flow with only such links (or an empty route,
or no bytes) completes at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import simpy

if TYPE_CHECKING:
    from simgrid.topology.link import Link

# A flow counts as finished when this fraction of its bytes is left: float residue of rate * time.
_DONE_FRACTION = 1e-9


class _Flow:
    __slots__ = ("done", "left", "links", "rate", "size")

    def __init__(self, links: tuple[str, ...], size: float, done: Callable[[], None]) -> None:
        self.links = links
        self.size = size
        self.left = size
        self.rate = 0.0
        self.done = done


class FlowNetwork:
    """Active flows on named links with max-min fair rates, driven by a SimPy environment."""

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.capacity_Bps: dict[str, float] = {}
        """Bandwidth of every link seen so far, by name."""
        self.bytes_by_link: dict[str, float] = {}
        """Bytes carried by every link so far (for utilisation)."""
        self._flows: list[_Flow] = []
        self._last_s = 0.0
        self._version = 0

    @property
    def active_flows(self) -> int:
        """Flows currently in progress."""
        return len(self._flows)

    def start(self, route: tuple[Link, ...], nbytes: float, done: Callable[[], None]) -> None:
        """Begin a transfer of ``nbytes`` over ``route``; ``done()`` is called when it completes."""
        self.start_all([(route, nbytes)], done)

    def start_all(self, transfers: list[tuple[tuple[Link, ...], float]], done: Callable[[], None]) -> None:
        """Begin several transfers at once (one rate recomputation); ``done()`` when the last completes."""
        flows = []
        for route, nbytes in transfers:
            names = []
            for link in route:
                self.capacity_Bps.setdefault(link.name, link.bandwidth_Bps)
                self.bytes_by_link[link.name] = self.bytes_by_link.get(link.name, 0.0) + nbytes
                if not math.isinf(link.bandwidth_Bps):
                    names.append(link.name)
            if nbytes > 0 and names:
                flows.append((tuple(names), float(nbytes)))
        if not flows:
            self.env.timeout(0).callbacks.append(lambda _e: done())
            return
        left = [len(flows)]

        def one_done() -> None:
            left[0] -= 1
            if left[0] == 0:
                done()

        self._advance()
        for links, size in flows:
            self._flows.append(_Flow(links, size, one_done))
        self._reallocate()
        self._arm()

    def rates(self) -> list[float]:
        """Current rate of every active flow (bytes/s), in start order (for tests and diagnostics)."""
        return [f.rate for f in self._flows]

    # -- internals ---------------------------------------------------------------------------------
    def _advance(self) -> None:
        now = self.env.now
        dt = now - self._last_s
        if dt > 0:
            for f in self._flows:
                f.left -= f.rate * dt
        self._last_s = now

    def _reallocate(self) -> None:
        """Max-min fair rates by progressive filling."""
        remaining: dict[str, float] = {}
        crossing: dict[str, list[_Flow]] = {}
        for f in self._flows:
            f.rate = -1.0  # not yet frozen
            for name in f.links:
                crossing.setdefault(name, []).append(f)
                remaining[name] = self.capacity_Bps[name]
        unfrozen = {name: len(fs) for name, fs in crossing.items()}
        while unfrozen:
            bottleneck = min(unfrozen, key=lambda n: remaining[n] / unfrozen[n])
            share = remaining[bottleneck] / unfrozen[bottleneck]
            for f in crossing[bottleneck]:
                if f.rate >= 0:
                    continue
                f.rate = share
                for name in f.links:
                    remaining[name] -= share
                    unfrozen[name] -= 1
                    if unfrozen[name] == 0:
                        del unfrozen[name]

    def _arm(self) -> None:
        self._version += 1
        if not self._flows:
            return
        version = self._version
        delay = min(f.left / f.rate for f in self._flows)
        self.env.timeout(max(delay, 0.0)).callbacks.append(lambda _e: self._on_timer(version))

    def _on_timer(self, version: int) -> None:
        if version != self._version:
            return  # superseded by a later start or completion
        self._advance()
        finished = [f for f in self._flows if f.left <= _DONE_FRACTION * f.size]
        if not finished:  # float residue: the earliest flow is a hair short; finish it now
            finished = [min(self._flows, key=lambda f: f.left / f.rate)]
        done_ids = {id(f) for f in finished}
        self._flows = [f for f in self._flows if id(f) not in done_ids]
        self._reallocate()
        self._arm()
        for f in finished:
            f.done()
