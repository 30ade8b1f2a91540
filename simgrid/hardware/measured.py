"""Measured tables written by calibration on a real machine; they override the cost formulas.

``simgrid-exec calibrate`` (issue 5) times collectives by size and group size, point-to-point transfers
and compute ops at the model's shapes, and stores them in a cluster profile's ``[measured]`` table. The
engine asks these helpers first and falls back to formulas when they return ``None``.

Interpolation rule (sizes): piecewise-linear in bytes between measured sizes of the same kind and group
size; below the smallest size the smallest size's time is used (small messages are latency-bound, so
time barely falls below it); beyond the largest size the last segment's slope is extended (large
messages are bandwidth-bound, so time grows linearly), never with a negative slope. With a single row,
larger sizes scale proportionally from it (pure bandwidth) and smaller ones use its time.

Monotonicity rule: a larger message is never faster, so within one series (a collective kind and group
size, or point-to-point) each row's time must be at least :data:`MONOTONE_FLOOR` times the largest time
measured at a smaller size. The allowance is for measurement, not physics: a synchronous collective timed
in situ takes about twice its barrier-aligned micro-benchmark time on a CPU host (see
``executor.calibrate.merge_insitu_collectives``), and both kinds of row meet in one series. A table that
falls further (times that shrink as sizes grow) is refused: interpolating it yields near-zero or negative
times, hence bubbles above 1 and MFU above 100%.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Literal, get_args

from simgrid.hardware.rules import (
    FieldError,
    check_choice,
    check_int_at_least,
    check_non_negative,
    check_positive,
    check_text,
)

MeasuredCollectiveKind = Literal[
    "all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all", "barrier"
]
COLLECTIVE_KINDS: tuple[str, ...] = get_args(MeasuredCollectiveKind)
MONOTONE_FLOOR = 0.4
"""Smallest allowed ratio of a row's time to the largest time at a smaller size in the same series (see
the module docstring: a 60% allowance for in-situ versus micro-benchmark timings and host noise)."""


@dataclass(frozen=True, kw_only=True)
class CollectiveRow:
    """One measured collective: its kind, group size, payload and time."""

    kind: str
    """Collective name as in ``simgrid.ir.ops.CollectiveKind`` (e.g. ``all_reduce``)."""
    group_size: int
    """Number of ranks in the group (>= 1)."""
    bytes: int
    """Payload per rank in bytes, as the IR op states it (the full tensor for all-reduce)."""
    time_us: float
    """Measured wall time of the collective in microseconds (median over repeats)."""

    def __post_init__(self) -> None:
        check_choice("CollectiveRow", "kind", self.kind, COLLECTIVE_KINDS)
        check_int_at_least("CollectiveRow", "group_size", self.group_size, 1)
        check_int_at_least("CollectiveRow", "bytes", self.bytes, 0)
        check_non_negative("CollectiveRow", "time_us", self.time_us)


@dataclass(frozen=True, kw_only=True)
class P2PRow:
    """One measured point-to-point transfer (send/recv pair)."""

    bytes: int
    """Message size in bytes."""
    time_us: float
    """Measured time from send issue to receive completion in microseconds."""

    def __post_init__(self) -> None:
        check_int_at_least("P2PRow", "bytes", self.bytes, 0)
        check_non_negative("P2PRow", "time_us", self.time_us)


@dataclass(frozen=True, kw_only=True)
class ComputeRow:
    """One measured compute op, keyed by a calibrator-chosen signature."""

    key: str
    """Free-form op signature, e.g. ``"F:layer:mbs=1:seq=128:hidden=64:tp=1"``."""
    time_us: float
    """Measured op time in microseconds."""

    def __post_init__(self) -> None:
        check_text("ComputeRow", "key", self.key)
        check_non_negative("ComputeRow", "time_us", self.time_us)


def _interpolate(points: list[tuple[int, float]], size_bytes: float) -> float:
    """Piecewise-linear time at ``size_bytes`` over points sorted by size (see module docstring)."""
    sizes = [s for s, _ in points]
    if size_bytes <= sizes[0]:
        return points[0][1]
    if len(points) == 1:
        size0, time0 = points[0]
        return time0 * size_bytes / size0 if size0 > 0 else time0
    if size_bytes >= sizes[-1]:
        (s0, t0), (s1, t1) = points[-2], points[-1]
        return t1 + max(0.0, (t1 - t0) / (s1 - s0)) * (size_bytes - s1)
    i = bisect.bisect_right(sizes, size_bytes)
    (s0, t0), (s1, t1) = points[i - 1], points[i]
    return t0 + (t1 - t0) * (size_bytes - s0) / (s1 - s0)


def _check_monotone(table: str, rows: list[tuple[tuple[object, ...], int, float]]) -> None:
    """Refuse a series whose time falls below MONOTONE_FLOOR of the slowest smaller size (module docstring)."""
    slowest: dict[tuple[object, ...], tuple[float, int]] = {}
    for index in sorted(range(len(rows)), key=lambda i: (rows[i][0], rows[i][1])):
        series, size, time_us = rows[index]
        before = slowest.get(series)
        if before is not None and time_us < MONOTONE_FLOOR * before[0]:
            where = f"{series[0]} on {series[1]} ranks, " if series else ""
            raise FieldError(
                f"{table}[{index}].time_us", time_us,
                f"is below {MONOTONE_FLOOR:g} x the {before[0]:g} us measured at {before[1]} bytes ({where}a smaller "
                "size): a larger message cannot be faster; re-run the calibration on a quiet machine",
                owner="MeasuredTables",
            )
        if before is None or time_us > before[0]:
            slowest[series] = (time_us, size)


@dataclass(frozen=True, kw_only=True)
class MeasuredTables:
    """Calibrated times for one machine; each lookup returns ``None`` where nothing was measured."""

    collectives: tuple[CollectiveRow, ...] = ()
    """Collective times by (kind, group size, bytes)."""
    p2p: tuple[P2PRow, ...] = ()
    """Send/recv times by bytes."""
    compute: tuple[ComputeRow, ...] = ()
    """Compute op times by signature."""
    memory_bandwidth_GBps: float | None = None
    """Measured streaming memory bandwidth in GB/s (10^9 bytes/s), if calibrated."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "collectives", tuple(self.collectives))
        object.__setattr__(self, "p2p", tuple(self.p2p))
        object.__setattr__(self, "compute", tuple(self.compute))
        if self.memory_bandwidth_GBps is not None:
            check_positive("MeasuredTables", "memory_bandwidth_GBps", self.memory_bandwidth_GBps)
        seen: set[tuple[object, ...]] = set()
        for i, c in enumerate(self.collectives):
            if (c.kind, c.group_size, c.bytes) in seen:
                raise FieldError(
                    f"collectives[{i}]", (c.kind, c.group_size, c.bytes),
                    "duplicates an earlier row (kind, group_size, bytes); keep one row per size",
                    owner="MeasuredTables",
                )
            seen.add((c.kind, c.group_size, c.bytes))
        for i, p in enumerate(self.p2p):
            if ("p2p", p.bytes) in seen:
                raise FieldError(f"p2p[{i}].bytes", p.bytes, "duplicates an earlier row; keep one row per size",
                                 owner="MeasuredTables")
            seen.add(("p2p", p.bytes))
        _check_monotone("collectives", [((c.kind, c.group_size), c.bytes, c.time_us) for c in self.collectives])
        _check_monotone("p2p", [((), p.bytes, p.time_us) for p in self.p2p])
        for i, r in enumerate(self.compute):
            if ("compute", r.key) in seen:
                raise FieldError(f"compute[{i}].key", r.key, "duplicates an earlier row; keys must be unique",
                                 owner="MeasuredTables")
            seen.add(("compute", r.key))

    def collective_time_us(self, kind: str, group_size: int, size_bytes: float) -> float | None:
        """Measured time of a collective, interpolated in bytes; ``None`` if that kind/group was not measured."""
        points = sorted((c.bytes, c.time_us) for c in self.collectives
                        if c.kind == kind and c.group_size == group_size)
        return _interpolate(points, size_bytes) if points else None

    def p2p_time_us(self, size_bytes: float) -> float | None:
        """Measured send/recv time, interpolated in bytes; ``None`` if no p2p row exists."""
        points = sorted((p.bytes, p.time_us) for p in self.p2p)
        return _interpolate(points, size_bytes) if points else None

    def compute_time_us(self, key: str) -> float | None:
        """Measured time of the compute op with this signature, or ``None``."""
        for row in self.compute:
            if row.key == key:
                return row.time_us
        return None
