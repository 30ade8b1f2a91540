"""Step metrics from the fast loop's aggregates, without a trace row per op.

A layout search needs a step's headline numbers, not its trace. :class:`StepSummary` keeps what
:mod:`simgrid.metrics` reads from the rows (the step's end, the pipeline window, each rank's F/B/I/W/R
seconds and FLOPs, the exposed part of every WAIT that blocked, memory peaks). :func:`summary_trace`
turns it into a trace of a few rows per rank that gives the same sums (the busy seconds of a rank as one
row, its exposed waits as one row per purpose), and :func:`summary_metrics` hands that to
:func:`simgrid.metrics.compute_metrics` itself, so the definitions live in one place.
``tests/engine/test_fast_equivalence.py`` checks the result against the metrics of the full trace.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from simgrid.trace import Trace, TraceRow

if TYPE_CHECKING:
    from simgrid.layout import Layout
    from simgrid.metrics import Metrics
    from simgrid.model.spec import ModelSpec


@dataclass(frozen=True, kw_only=True)
class StepSummary:
    """What the step metrics need from one simulated step."""

    makespan_s: float
    """Step time: the latest end of any op."""
    mode: str
    """Mode used (``symmetric`` or ``full``)."""
    notes: tuple[str, ...]
    """The engine's notes (e.g. why symmetric mode fell back)."""
    weights: Mapping[int, int]
    """Simulated ranks that produced trace rows -> how many ranks each stands for."""
    window_s: tuple[float, float]
    """First start and last end of any F/B/I/W/R op; ``(0, 0)`` without one."""
    busy_s: Mapping[int, float]
    """F/B/I/W/R seconds per rank, in the order ranks first ran one."""
    flops: Mapping[int, float]
    """FLOPs of every compute op each rank ran (one rank, not its replicas)."""
    waits: tuple[tuple[int, str, float, float], ...]
    """(rank, purpose, end_s, exposed_s) of every WAIT that blocked on running communication."""
    peak_memory_bytes: Mapping[int, int] = field(default_factory=dict)
    """Peak device memory per simulated rank."""

    @property
    def peak_bytes(self) -> int:
        """Largest per-rank peak (0 without allocations)."""
        return max(self.peak_memory_bytes.values(), default=0)


def summary_trace(summary: StepSummary) -> Trace:
    """A small trace with the same step metrics as the step's full trace (see the module docstring)."""
    t0, t1 = summary.window_s
    rows: list[TraceRow] = []
    for rank in summary.weights:  # every rank with rows, so ranks() and the weights agree
        rows.append(TraceRow(rank, "compute", "", "OPT", "compute", 0.0, 0.0, flops=summary.flops.get(rank, 0.0)))
    if summary.weights:
        first = next(iter(summary.weights))
        rows.append(TraceRow(first, "compute", "", "OPT", "compute", summary.makespan_s, summary.makespan_s))
    if summary.busy_s:
        first = next(iter(summary.busy_s))
        rows.append(TraceRow(first, "compute", "", "F", "compute", t0, t0))  # pins the window's start
        for rank, busy in summary.busy_s.items():  # F/B/I/W/R ops of a rank never overlap: busy <= t1 - t0
            rows.append(TraceRow(rank, "compute", "", "F", "compute", t1 - busy, t1))
    exposed: dict[tuple[int, str], float] = {}
    for rank, purpose, end, seconds in summary.waits:
        if t0 <= end - seconds and end <= t1:  # inside the window: only the total matters
            exposed[(rank, purpose)] = exposed.get((rank, purpose), 0.0) + seconds
        else:  # straddles or leaves the window: kept as it is, the bubble clips it
            rows.append(TraceRow(rank, "compute", "", "WAIT", purpose, end - seconds, end, exposed_s=seconds))
    for (rank, purpose), seconds in exposed.items():  # one rank's waits never overlap: the sum fits the window
        rows.append(TraceRow(rank, "compute", "", "WAIT", purpose, t1 - seconds, t1, exposed_s=seconds))
    return Trace(rows, meta={"multiplicity": {str(r): w for r, w in summary.weights.items()}})


def summary_metrics(summary: StepSummary, *, model: ModelSpec, layout: Layout, peak_flops_per_gpu: float,
                    memory_capacity_bytes: int, **options: Any) -> Metrics:
    """:func:`simgrid.metrics.compute_metrics` of the step (``options``: its other keyword arguments,
    e.g. ``memory_headroom``), the peak memory being the summary's."""
    from simgrid.metrics import compute_metrics

    return compute_metrics(summary_trace(summary), model=model, layout=layout, peak_flops_per_gpu=peak_flops_per_gpu,
                           peak_memory_bytes=summary.peak_bytes, memory_capacity_bytes=memory_capacity_bytes,
                           **options)
