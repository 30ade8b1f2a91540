"""Serving pictures: latency against load, KV-cache occupancy and GPU busy over time, and a capacity search.

* :func:`plot_latency_vs_load`: TTFT, TPOT and end-to-end latency percentiles (p50, p90, p99) against the
  arrival rate, from several :class:`~simgrid.serving.ServingResult` (one per rate), with target lines;
* :func:`plot_kv_occupancy`: the share of KV blocks in use on each replica over time, and above it the
  share of GPUs busy, from one result;
* :func:`plot_capacity`: output tokens/s per GPU at capacity for each layout of a capacity search.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from matplotlib.figure import Figure

from simgrid.plots.canvas import PlotError, new_figure, save_figure

if TYPE_CHECKING:
    from simgrid.serving.capacity import CapacitySearch
    from simgrid.serving.simulate import ServingResult

_PANELS = (("ttft", "time to first token"), ("tpot", "time per output token"), ("e2e", "end-to-end latency"))
_STYLES = (("p50", "-", "o"), ("p90", "--", "s"), ("p99", ":", "^"))


def plot_latency_vs_load(results: Mapping[float, ServingResult] | Sequence[tuple[float, ServingResult]], *,
                         targets: Mapping[str, float] | None = None, title: str | None = None,
                         path: str | Path | None = None) -> Figure:
    """Latency percentiles against the arrival rate (requests/s); one panel per latency.

    ``results`` maps each rate to its result; ``targets`` (e.g. ``{"ttft_p90": 0.5}``) draws a horizontal
    line on the matching panel. An infinite rate (every request at time 0) is drawn at the offline
    throughput the run achieved.
    """
    pairs = sorted(results.items() if isinstance(results, Mapping) else results, key=lambda p: p[0])
    if not pairs:
        raise PlotError("plot_latency_vs_load: no results; pass one ServingResult per arrival rate")
    rates = [r if math.isfinite(r) else res.metrics.requests_per_s for r, res in pairs]
    fig = new_figure(figsize=(13.5, 4.0))
    axes = [fig.add_subplot(1, 3, i + 1) for i in range(3)]
    for axis, (kind, label) in zip(axes, _PANELS, strict=True):
        for pct, style, marker in _STYLES:
            values = [getattr(getattr(res.metrics, kind), pct) for _, res in pairs]
            axis.plot(rates, values, linestyle=style, marker=marker, label=pct)
        for name, limit in (targets or {}).items():
            if name.startswith(kind + "_"):
                axis.axhline(limit, color="red", linewidth=1, label=f"target {name.split('_')[1]}")
        axis.set_xlabel("arrival rate (requests/s)")
        axis.set_ylabel(f"{label} (s)")
        axis.set_ylim(bottom=0)
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize="small")
    first = pairs[0][1]
    fig.suptitle(title or f"{first.model.name} on {first.cluster_name}, {first.run.layout.label()}: latency vs load")
    save_figure(fig, path)
    return fig


def plot_kv_occupancy(result: ServingResult, *, bins: int = 100, title: str | None = None,
                      path: str | Path | None = None) -> Figure:
    """KV-cache occupancy of every replica over time (bottom) and the share of GPUs busy (top)."""
    from simgrid.serving.metrics import busy_series, kv_occupancy_series

    run = result.run
    if not run.records:
        raise PlotError("plot_kv_occupancy: the run served no requests")
    fig = new_figure(figsize=(9.0, 5.5))
    busy_ax, kv_ax = fig.subplots(2, 1, sharex=True, height_ratios=(1, 2))
    centres, busy = busy_series(run, bins=bins)
    busy_ax.fill_between(centres, [100 * b for b in busy], step="mid", alpha=0.5, color="#1f77b4")
    busy_ax.set_ylabel("GPUs busy (%)")
    busy_ax.set_ylim(0, 105)
    busy_ax.grid(True, alpha=0.3)
    end = max(r.done_s for r in run.records)
    for replica in range(len(run.kv_timeline)):
        times, share = kv_occupancy_series(run, replica)
        kv_ax.step([*times, end], [100 * s for s in [*share, share[-1]]], where="post", label=f"replica {replica}")
    kv_ax.set_ylabel("KV blocks in use (%)")
    kv_ax.set_xlabel("time (s)")
    kv_ax.set_ylim(0, 105)
    kv_ax.grid(True, alpha=0.3)
    if len(run.kv_timeline) <= 8:
        kv_ax.legend(fontsize="small")
    tokens = run.kv_blocks_per_replica * run.budget.block_tokens
    fig.suptitle(title or f"{result.model.name}, {run.layout.label()}: KV cache ({tokens:,} tokens per replica) "
                          "and GPU busy over time")
    save_figure(fig, path)
    return fig


def plot_capacity(search: CapacitySearch, *, title: str | None = None, path: str | Path | None = None) -> Figure:
    """Output tokens/s per GPU at capacity of each layout; infeasible layouts sit at zero, labelled why."""
    if not search.results:
        raise PlotError("plot_capacity: the search has no layouts")
    fig = new_figure(figsize=(max(6.0, 0.8 * len(search.results) + 2.0), 4.2))
    axis = fig.add_subplot()
    labels = [r.layout.label() for r in search.results]
    values = [r.tokens_per_s_per_gpu for r in search.results]
    bars = axis.bar(labels, values, color=["#2ca02c" if r.feasible else "#c7c7c7" for r in search.results])
    top = max(values) if any(values) else 1.0
    for bar, res in zip(bars, search.results, strict=True):
        if not res.feasible:
            axis.text(bar.get_x() + bar.get_width() / 2, 0.02 * top, "misses targets" if res.metrics else "does not fit",
                      rotation=90, ha="center", va="bottom", fontsize="small", color="#7f7f7f")
    axis.set_ylabel("output tokens/s per GPU at capacity")
    axis.tick_params(axis="x", rotation=45)
    axis.grid(True, axis="y", alpha=0.3)
    targets = ", ".join(f"{name} {value:g} s" for name, value in search.targets.items())
    fig.suptitle(title or f"capacity on {search.gpus} GPUs ({targets})")
    save_figure(fig, path)
    return fig
