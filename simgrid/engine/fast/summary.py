"""Step metrics from the fast loop's aggregates, without a trace row per op.

A layout search needs a step's headline numbers, not its trace. :class:`StepSummary` keeps what
:mod:`simgrid.metrics` reads from the rows: the loop's :class:`~simgrid.trace.TraceAggregates` (the same
reductions, in the same order, that :func:`simgrid.trace.aggregate_rows` makes over the full trace) and
the memory peaks. :func:`summary_metrics` hands them to :func:`simgrid.metrics.metrics_from_aggregates`,
the function :func:`simgrid.metrics.compute_metrics` itself ends in, so the numbers are those of the
full trace bit for bit (``tests/engine/test_fast_equivalence.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from simgrid.trace import TraceAggregates

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
    aggregates: TraceAggregates
    """What the metrics read from the step's trace rows."""
    peak_memory_bytes: Mapping[int, int] = field(default_factory=dict)
    """Peak device memory per simulated rank."""

    @property
    def weights(self) -> Mapping[int, int]:
        """Simulated ranks that produced trace rows -> how many ranks each stands for."""
        return self.aggregates.weights

    @property
    def peak_bytes(self) -> int:
        """Largest per-rank peak (0 without allocations)."""
        return max(self.peak_memory_bytes.values(), default=0)


def summary_metrics(summary: StepSummary, *, model: ModelSpec, layout: Layout, peak_flops_per_gpu: float,
                    memory_capacity_bytes: int, **options: Any) -> Metrics:
    """:func:`simgrid.metrics.compute_metrics` of the step (``options``: its other keyword arguments,
    e.g. ``memory_headroom``), the peak memory being the summary's."""
    from simgrid.metrics import metrics_from_aggregates

    return metrics_from_aggregates(summary.aggregates, model=model, layout=layout,
                                   peak_flops_per_gpu=peak_flops_per_gpu, peak_memory_bytes=summary.peak_bytes,
                                   memory_capacity_bytes=memory_capacity_bytes, **options)
