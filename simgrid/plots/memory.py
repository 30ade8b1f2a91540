"""Memory pictures: a stacked per-rank (or per-stage) breakdown against capacity, and memory over time.

The breakdown reads :class:`simgrid.memory.MemoryEstimate` values (or plain ``{category: bytes}``
mappings); the timeline reads the engine's per-rank :class:`simgrid.engine.memory.MemoryTimeline`
(through a ``MemoryReport``, a simulation result or a saved trace) or plain ``(time_s, bytes)`` series.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from simgrid.plots.canvas import (
    GIB,
    PlotError,
    field_of,
    figure_and_axes,
    format_bytes,
    memory_color,
    ordered_categories,
    save_figure,
)

Series = tuple[Sequence[float], Sequence[float]]
"""(times in seconds, live bytes) of one rank."""


def plot_memory_breakdown(
    estimates: Any,
    capacity_bytes: float | None = None,
    *,
    title: str | None = None,
    ax: Axes | None = None,
    path: str | Path | None = None,
) -> Figure:
    """Stacked bars (GiB) of weights/grads/optimizer/activations/buffers per rank or stage, and capacity.

    ``estimates`` is a mapping label -> estimate, a sequence of estimates (labelled ``rank 0``...), or
    one estimate whose ``per_stage`` entries become the bars. An estimate is a ``MemoryEstimate`` (its
    ``breakdown`` is used) or a ``{category: bytes}`` mapping. ``capacity_bytes`` defaults to the
    estimates' own ``capacity_bytes``. Bars above capacity are labelled ``OOM``.
    """
    bars = _breakdowns(estimates)
    if not bars:
        raise PlotError("plot_memory_breakdown: no estimates to draw; pass a mapping label -> estimate")
    if capacity_bytes is None:
        capacity_bytes = _capacity_of(estimates)
    fig, axis = figure_and_axes(ax, figsize=(max(5.0, 0.7 * len(bars) + 3.0), 4.5))
    labels = list(bars)
    categories = ordered_categories(c for b in bars.values() for c in b)
    bottoms = [0.0] * len(labels)
    for category in categories:
        heights = [bars[label].get(category, 0.0) / GIB for label in labels]
        axis.bar(labels, heights, bottom=bottoms, color=memory_color(category), label=category, width=0.7)
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    if capacity_bytes:
        cap = capacity_bytes / GIB
        axis.axhline(cap, color="black", linestyle="--", linewidth=1.2, label=f"capacity {format_bytes(capacity_bytes)}")
        for i, total in enumerate(bottoms):
            if total > cap:
                axis.annotate("OOM", (i, total), ha="center", va="bottom", color="#d62728", fontweight="bold")
        axis.set_ylim(0, max(max(bottoms), cap) * 1.15)
    axis.set_ylabel("memory per GPU (GiB)")
    axis.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    if len(labels) > 8:
        axis.tick_params(axis="x", labelrotation=45)
    peak = max(bottoms) * GIB
    axis.set_title(title or f"Memory breakdown (peak {format_bytes(peak)})")
    axis.grid(True, axis="y", alpha=0.3)
    save_figure(fig, path)
    return fig


def plot_memory_timeline(
    trace_or_timeline: Any,
    ranks: Iterable[int] | None = None,
    *,
    capacity_bytes: float | None = None,
    title: str | None = None,
    ax: Axes | None = None,
    path: str | Path | None = None,
) -> Figure:
    """Live device memory (GiB) over the step, one step line per rank, with the capacity if known.

    Accepts a ``MemoryReport`` (``.timelines``), a simulation result or trace carrying one, a mapping
    rank -> ``MemoryTimeline`` or -> ``(times_s, bytes)``, or a DataFrame with ``rank, time_s, bytes``.
    ``ranks`` picks which ranks to draw (default: all, up to 16).
    """
    series = memory_series(trace_or_timeline)
    if not series:
        raise PlotError(
            "plot_memory_timeline: the input holds no memory timeline; simulate with memory tracking or "
            "pass {rank: (times_s, bytes)}"
        )
    chosen = sorted(series) if ranks is None else list(ranks)
    unknown = [r for r in chosen if r not in series]
    if unknown:
        raise PlotError(f"plot_memory_timeline: rank(s) {unknown} have no timeline; available: {sorted(series)}")
    if ranks is None and len(chosen) > 16:
        chosen = chosen[:16]
    if capacity_bytes is None:
        capacity_bytes = _capacity_of(trace_or_timeline)
    fig, axis = figure_and_axes(ax, figsize=(8.0, 4.2))
    peak_overall = 0.0
    for rank in chosen:
        times, values = series[rank]
        peak = max(values, default=0.0)
        peak_overall = max(peak_overall, peak)
        axis.step(list(times), [v / GIB for v in values], where="post",
                  label=f"rank {rank} (peak {format_bytes(peak)})")
    if capacity_bytes:
        axis.axhline(capacity_bytes / GIB, color="black", linestyle="--", linewidth=1.2,
                     label=f"capacity {format_bytes(capacity_bytes)}")
    axis.set_xlabel("time in step (s)")
    axis.set_ylabel("live memory (GiB)")
    axis.set_ylim(bottom=0)
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    axis.set_title(title or f"Memory over time (peak {format_bytes(peak_overall)})")
    save_figure(fig, path)
    return fig


def memory_series(source: Any) -> dict[int, Series]:
    """Per-rank ``(times_s, total live bytes)`` from any of the inputs :func:`plot_memory_timeline` takes."""
    import pandas as pd

    if isinstance(source, pd.DataFrame):
        needed = ["rank", "time_s", "bytes"]
        missing = [c for c in needed if c not in source.columns]
        if missing:
            raise PlotError(f"plot_memory_timeline: the table lacks column(s) {missing}; needs {needed}")
        return {
            int(rank): (list(g["time_s"]), [float(b) for b in g["bytes"]])
            for rank, g in source.sort_values(["rank", "time_s"], kind="mergesort").groupby("rank")
        }
    timelines = _timelines_of(source)
    if timelines is None:
        raise PlotError(
            f"plot_memory_timeline: cannot read a memory timeline from {type(source).__name__}; pass a "
            "MemoryReport, a simulation result, a trace with one, or {rank: (times_s, bytes)}"
        )
    return {int(rank): _series_of(tl, rank) for rank, tl in timelines.items()}


# -- helpers -----------------------------------------------------------------------------------------


def _timelines_of(source: Any) -> Mapping[Any, Any] | None:
    """The rank -> timeline mapping inside ``source``, wherever the producer put it."""
    if not isinstance(source, Mapping) and getattr(source, "times_s", None) is not None:
        return {int(getattr(source, "rank", 0)): source}  # one rank's MemoryTimeline
    if isinstance(source, Mapping):
        if "timelines" in source and isinstance(source["timelines"], Mapping):
            return source["timelines"]
        if "memory_timeline" in source or "memory" in source:
            return _timelines_of(source.get("memory_timeline", source.get("memory")))
        return source
    for name in ("timelines", "memory_timelines", "memory_timeline", "memory"):
        value = getattr(source, name, None)
        if callable(value):
            value = value()
        if value is not None:
            return value if isinstance(value, Mapping) and name != "memory" else _timelines_of(value)
    meta = getattr(source, "meta", None)
    if isinstance(meta, Mapping) and ("memory_timeline" in meta or "memory" in meta):
        return _timelines_of(meta)
    return None


def _series_of(timeline: Any, rank: Any) -> Series:
    if isinstance(timeline, tuple | list) and len(timeline) == 2 and not isinstance(timeline[0], int | float):
        times, values = timeline
        return list(times), [float(v) for v in values]
    times = field_of(timeline, "times_s")
    if times is not None:
        totals = field_of(timeline, "total_bytes")
        if totals is None:
            by_cat = field_of(timeline, "bytes_by_category") or {}
            totals = [sum(vals) for vals in zip(*by_cat.values(), strict=True)] if by_cat else [0] * len(times)
        return list(times), [float(v) for v in totals]
    if isinstance(timeline, Sequence) and all(isinstance(p, Sequence) and len(p) == 2 for p in timeline):
        return [float(p[0]) for p in timeline], [float(p[1]) for p in timeline]
    raise PlotError(f"plot_memory_timeline: rank {rank}: cannot read times and bytes from {type(timeline).__name__}")


def _breakdowns(estimates: Any) -> dict[str, dict[str, float]]:
    """Label -> {category: bytes} for every bar."""
    if isinstance(estimates, Mapping) and not _is_breakdown(estimates):
        return {str(label): _breakdown_of(est) for label, est in estimates.items()}
    per_stage = field_of(estimates, "per_stage")
    if per_stage:
        items = per_stage.items() if isinstance(per_stage, Mapping) else enumerate(per_stage)
        return {f"pp rank {k}": _breakdown_of(v) for k, v in items}
    if isinstance(estimates, Sequence) and not isinstance(estimates, str):
        return {f"rank {i}": _breakdown_of(est) for i, est in enumerate(estimates)}
    return {"": _breakdown_of(estimates)}


def _is_breakdown(value: Mapping[Any, Any]) -> bool:
    return bool(value) and all(isinstance(v, int | float) for v in value.values())


def _breakdown_of(estimate: Any) -> dict[str, float]:
    if isinstance(estimate, Mapping) and _is_breakdown(estimate):
        return {str(k): float(v) for k, v in estimate.items()}
    breakdown = field_of(estimate, "breakdown")
    if isinstance(breakdown, Mapping):
        return {str(k): float(v) for k, v in breakdown.items()}
    # A per-stage entry (simgrid.memory.StageMemory) names each category ``<category>_bytes``.
    fields = {c: field_of(estimate, f"{c}_bytes") for c in ("weights", "grads", "optimizer", "activations", "buffers")}
    if all(isinstance(v, int | float) for v in fields.values()):
        return {c: float(v) for c, v in fields.items()}
    raise PlotError(
        f"plot_memory_breakdown: cannot read a breakdown from {type(estimate).__name__}; pass a "
        "MemoryEstimate or a {category: bytes} mapping"
    )


def _capacity_of(source: Any) -> float | None:
    for name in ("capacity_bytes", "memory_capacity_bytes"):
        value = field_of(source, name)
        if isinstance(value, int | float) and value > 0:
            return float(value)
    if isinstance(source, Mapping):
        for value in source.values():
            cap = field_of(value, "capacity_bytes")
            if isinstance(cap, int | float) and cap > 0:
                return float(cap)
    meta = getattr(source, "meta", None)
    if isinstance(meta, Mapping):
        return _capacity_of(meta)
    return None
