"""Device memory over simulated time, replayed from a program's Alloc/Free ops.

The engine records, per simulated rank, each allocation and release at the simulated time the compute
stream reaches it (IR semantics: memory ops take effect in compute-stream order). This module turns
those events into a timeline of live bytes per category, the peak, and an out-of-memory verdict against
the GPU's capacity. Exceeding capacity is a result (``fits = False``), never an exception: a planner
wants to see by how much a layout misses.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from simgrid.ir import MEMORY_CATEGORIES

MemoryEvent = tuple[float, int, str]
"""(time_s, signed byte change, category) of one Alloc (+) or Free (-)."""


@dataclass(frozen=True, kw_only=True)
class MemoryTimeline:
    """Live device memory of one rank after every allocation and release."""

    rank: int
    """Global rank."""
    events: tuple[MemoryEvent, ...]
    """(time_s, signed bytes, category) of every Alloc/Free, in program order."""
    peak_bytes: int
    """Largest total of live bytes over the step."""
    peak_time_s: float
    """When the peak was first reached."""
    peak_by_category: Mapping[str, int] = field(default_factory=dict)
    """Live bytes per category at the moment of the peak."""

    @property
    def times_s(self) -> tuple[float, ...]:
        """Time of each event (non-decreasing)."""
        return tuple(e[0] for e in self.events)

    @cached_property
    def bytes_by_category(self) -> Mapping[str, tuple[int, ...]]:
        """Live bytes per category after each event (one value per entry of ``times_s``); built on
        first use, since a full-mode run has a thousand ranks whose timelines nobody plots."""
        categories = _categories(self.events)
        live = dict.fromkeys(categories, 0)
        columns: dict[str, list[int]] = {c: [] for c in categories}
        for _, delta, cat in self.events:
            live[cat] += delta
            for c in categories:
                columns[c].append(live[c])
        return {c: tuple(v) for c, v in columns.items()}

    @property
    def total_bytes(self) -> tuple[int, ...]:
        """Live bytes over all categories after each event."""
        total, out = 0, []
        for _, delta, _ in self.events:
            total += delta
            out.append(total)
        return tuple(out)


@dataclass(frozen=True, kw_only=True)
class MemoryReport:
    """Per-rank memory timelines, their peaks and the verdict against device capacity."""

    timelines: Mapping[int, MemoryTimeline]
    """Timeline of every simulated rank (in symmetric mode, replicas share their representative's)."""
    capacity_bytes: int
    """Device memory of one GPU."""

    @property
    def peak_bytes(self) -> int:
        """Largest peak over all ranks (0 when the program allocates nothing)."""
        return max(self._peaks().values(), default=0)

    @property
    def peak_rank(self) -> int | None:
        """A rank whose peak is the largest (the lowest such rank); ``None`` without timelines."""
        if not self.timelines:
            return None
        peaks = self._peaks()
        return max(sorted(self.timelines), key=lambda r: peaks[r])

    @property
    def fits(self) -> bool:
        """Every rank's peak is within the device capacity."""
        return self.peak_bytes <= self.capacity_bytes

    def peak_by_rank(self) -> dict[int, int]:
        """Peak bytes of each simulated rank."""
        peaks = self._peaks()
        return {r: peaks[r] for r in sorted(self.timelines)}

    def _peaks(self) -> Mapping[int, int]:
        if isinstance(self.timelines, LazyTimelines):  # peaks known without building a timeline
            return self.timelines.peak_bytes_by_rank
        return {r: t.peak_bytes for r, t in self.timelines.items()}


class LazyTimelines(Mapping[int, MemoryTimeline]):
    """Rank -> :class:`MemoryTimeline`, each built from ``events_of(rank)`` the first time it is read.

    A full-mode step has thousands of ranks whose timelines nobody draws: the engine keeps what replays
    them (the time of each Alloc/Free) and their peaks, which the fit verdict needs, and this mapping
    makes a rank's events and timeline only when asked.
    """

    def __init__(self, events_of: Callable[[int], Sequence[MemoryEvent]], peak_bytes_by_rank: Mapping[int, int]) -> None:
        self._events_of = events_of
        self.peak_bytes_by_rank: Mapping[int, int] = dict(sorted(peak_bytes_by_rank.items()))
        """Each rank's peak (what :func:`build_timeline` would find), without building its timeline."""
        self._built: dict[int, MemoryTimeline] = {}

    def __getitem__(self, rank: int) -> MemoryTimeline:
        found = self._built.get(rank)
        if found is None:
            if rank not in self.peak_bytes_by_rank:
                raise KeyError(rank)
            found = self._built[rank] = build_timeline(rank, self._events_of(rank))
        return found

    def __iter__(self) -> Iterator[int]:
        return iter(self.peak_bytes_by_rank)

    def __len__(self) -> int:
        return len(self.peak_bytes_by_rank)

    def __contains__(self, rank: object) -> bool:
        return rank in self.peak_bytes_by_rank

    def __getstate__(self) -> dict[str, object]:
        # The event source is a closure over the engine's records: pickle the built timelines instead
        # (unpickling's default, ``__dict__.update(state)``, restores them; every rank is then built).
        return {"_events_of": None, "peak_bytes_by_rank": self.peak_bytes_by_rank,
                "_built": {r: self[r] for r in self.peak_bytes_by_rank}}


def _categories(events: Sequence[MemoryEvent]) -> list[str]:
    categories = list(MEMORY_CATEGORIES)
    for cat in {e[2] for e in events}:
        if cat not in categories:
            categories.append(cat)
    return categories


def build_timeline(rank: int, events: Sequence[MemoryEvent]) -> MemoryTimeline:
    """Replay one rank's events (in program order) into a :class:`MemoryTimeline`."""
    total = peak = 0
    peak_index = -1
    for index, (_, delta, _) in enumerate(events):
        total += delta
        if total > peak:
            peak, peak_index = total, index
    split = dict.fromkeys(_categories(events), 0)
    for _, delta, cat in events[: peak_index + 1]:
        split[cat] += delta
    return MemoryTimeline(
        rank=rank,
        events=tuple(events),
        peak_bytes=peak,
        peak_time_s=events[peak_index][0] if peak_index >= 0 else 0.0,
        peak_by_category=split,
    )


def build_report(events_by_rank: Mapping[int, Sequence[MemoryEvent]], capacity_bytes: int) -> MemoryReport:
    """Timelines of every rank and the capacity verdict."""
    return MemoryReport(
        timelines={r: build_timeline(r, ev) for r, ev in sorted(events_by_rank.items())},
        capacity_bytes=int(capacity_bytes),
    )
