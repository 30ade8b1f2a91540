"""Step metrics straight from the fast loop's aggregates, without a trace row per op.

A layout search needs a step's headline numbers, not its trace. :func:`simgrid.metrics.compute_metrics`
derives them from the rows; :class:`StepSummary` keeps only what those derivations read (the pipeline
window, each rank's F/B/I/W/R seconds, the WAITs that blocked, executed FLOPs, memory peaks), collected
in trace order so that every sum adds the same numbers in the same order. :func:`summary_metrics` then
applies the definitions of :mod:`simgrid.metrics` to them. ``tests/engine/test_fast_equivalence.py``
checks that both routes give the same :class:`~simgrid.metrics.Metrics`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from simgrid.metrics import COMM_KINDS, Metrics
from simgrid.trace import comm_kind

if TYPE_CHECKING:
    from simgrid.layout import Layout
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
    waits: tuple[tuple[int, str, float, float], ...]
    """(rank, purpose, end_s, exposed_s) of every WAIT that blocked on running communication."""
    executed_flops: float
    """FLOPs of every executed compute op, replicas included."""
    peak_memory_bytes: Mapping[int, int] = field(default_factory=dict)
    """Peak device memory per simulated rank."""

    @property
    def peak_bytes(self) -> int:
        """Largest per-rank peak (0 without allocations)."""
        return max(self.peak_memory_bytes.values(), default=0)


def bubble_fraction(summary: StepSummary) -> float:
    """:func:`simgrid.metrics.bubble_fraction` from a summary."""
    t0, t1 = summary.window_s
    span = t1 - t0
    if span <= 0:
        return 0.0
    used = dict(summary.busy_s)
    for rank, _, end, exposed in summary.waits:
        if rank in used:
            lo, hi = max(end - exposed, t0), min(end, t1)
            if hi > lo:
                used[rank] += hi - lo
    weights = summary.weights
    total_weight = sum(weights[r] for r in used)
    busy = sum(weights[r] * t for r, t in used.items())
    return max(0.0, 1.0 - busy / (total_weight * span))


def exposed_comm_by_kind(summary: StepSummary) -> dict[str, float]:
    """:func:`simgrid.metrics.exposed_comm_by_kind` from a summary."""
    weights = summary.weights
    total_weight = sum(weights.values())
    out = dict.fromkeys(COMM_KINDS, 0.0)
    if not total_weight:
        return out
    for rank, purpose, _, exposed in summary.waits:
        kind = comm_kind(purpose)
        if kind in out:
            out[kind] += exposed * weights[rank]
    return {k: v / total_weight for k, v in out.items()}


def summary_metrics(summary: StepSummary, *, model: ModelSpec, layout: Layout, peak_flops_per_gpu: float,
                    memory_capacity_bytes: int) -> Metrics:
    """The :class:`~simgrid.metrics.Metrics` :func:`simgrid.metrics.compute_metrics` gives for the same step."""
    from simgrid.model import model_flops_per_iteration

    world = layout.world_size
    step = summary.makespan_s
    model_flops = model_flops_per_iteration(model, layout.gbs)
    hw_flops = summary.executed_flops
    per_gpu = (lambda flops: flops / step / world) if step > 0 else (lambda flops: 0.0)
    model_rate, hw_rate = per_gpu(model_flops), per_gpu(hw_flops)
    peak = summary.peak_bytes
    return Metrics(
        step_time_s=step,
        tokens_per_s=layout.gbs * model.seq_length / step if step > 0 else 0.0,
        tflops_per_gpu=model_rate / 1e12,
        hw_tflops_per_gpu=hw_rate / 1e12,
        mfu=model_rate / peak_flops_per_gpu,
        hfu=hw_rate / peak_flops_per_gpu,
        bubble_fraction=bubble_fraction(summary),
        exposed_comm_s=exposed_comm_by_kind(summary),
        peak_memory_bytes=int(peak),
        memory_capacity_bytes=int(memory_capacity_bytes),
        fits=peak <= memory_capacity_bytes,
        world_size=world,
    )
