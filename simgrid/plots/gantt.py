"""Pipeline Gantt chart of a trace: ranks as rows, compute coloured by kind, communication beneath.

Each rank gets a band: the compute stream on top (F, B, I, W, R, OPT in the kind colours of
:mod:`simgrid.plots.canvas`), then one thin sub-row per communication kind (tp, cp, ep, pp, dp, other) showing
when that kind of communication was in flight, and a hatched strip where the compute stream sat blocked
in a WAIT. Gaps in the compute row are the bubbles; the bubble fraction (:func:`simgrid.metrics.bubble_fraction`)
is in the title. Bars are drawn with one ``broken_barh`` per (rank, kind), so 8 ranks x 100 micro-batches
stays a few dozen artists; micro-batch numbers are written on compute bars only when wide enough to read.
"""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from simgrid.metrics import bubble_fraction
from simgrid.plots.canvas import PlotError, figure_and_axes, format_seconds, kind_color
from simgrid.trace import COMPUTE_KINDS, Trace, TraceRow, comm_kind

COMM_ROWS = ("tp", "cp", "ep", "pp", "dp", "other")
"""Communication sub-rows under each rank, top to bottom (``ep``: MoE dispatch/combine all-to-alls)."""
COMM_ROW_COLORS = {"tp": "#9edae5", "cp": "#c5b0d5", "ep": "#ff9896", "pp": "#17becf", "dp": "#7f7f7f",
                   "other": "#bcbd22"}

_COMPUTE_HEIGHT = 0.55
_COMM_HEIGHT = 0.065  # six sub-rows must fit under the compute bar before the next rank
_MAX_DEFAULT_RANKS = 32
_MIN_LABEL_PX = 14.0
_MAX_LABELS = 600


def default_ranks(trace: Trace) -> list[int]:
    """Ranks to draw when none are given: all of them up to 32, else one rank per distinct set of
    pipeline stages (the lowest such rank), which for a 3-D layout is one pipeline."""
    ranks = trace.ranks()
    if len(ranks) <= _MAX_DEFAULT_RANKS:
        return ranks
    stages: dict[int, set[int]] = {}
    for row in trace.timing_rows:
        if row.kind in COMPUTE_KINDS and row.stage >= 0:
            stages.setdefault(row.rank, set()).add(row.stage)
    chosen: dict[frozenset[int], int] = {}
    for rank in ranks:
        key = frozenset(stages.get(rank, set()))
        chosen.setdefault(key, rank)
    return sorted(chosen.values())[:_MAX_DEFAULT_RANKS]


def plot_gantt(trace: Trace, *, ranks: Sequence[int] | None = None, title: str | None = None,
               ax: Axes | None = None) -> Figure:
    """Draw the Gantt chart of ``trace`` (see the module docstring); returns the Figure."""
    if not trace.timing_rows:
        raise PlotError("plot_gantt: the trace has no rows to draw")
    chosen = list(ranks) if ranks is not None else default_ranks(trace)
    unknown = sorted(set(chosen) - set(trace.ranks()))
    if unknown:
        raise PlotError(f"plot_gantt: rank(s) {unknown} have no rows in the trace; traced ranks: {trace.ranks()[:16]}")
    fig, axes = figure_and_axes(ax, figsize=(12.0, 1.0 + 0.75 * len(chosen)))
    by_rank: dict[int, list[TraceRow]] = {r: [] for r in chosen}
    for row in trace.timing_rows:
        if row.rank in by_rank:
            by_rank[row.rank].append(row)
    span = max((r.end_s for rows in by_rank.values() for r in rows), default=0.0) or 1.0
    axes_px = fig.get_figwidth() * fig.dpi * 0.85
    labels_left = _MAX_LABELS
    kinds_seen: dict[str, str] = {}
    yticks = []
    for position, rank in enumerate(chosen):
        top = -position  # rank 0 at the top
        yticks.append(top)
        bars: dict[str, list[tuple[float, float]]] = {}
        comm_bars: dict[str, list[tuple[float, float]]] = {}
        wait_bars: list[tuple[float, float]] = []
        for row in by_rank[rank]:
            width = row.end_s - row.start_s
            if row.kind in COMPUTE_KINDS:
                bars.setdefault(row.kind, []).append((row.start_s, width))
                if labels_left and row.kind != "OPT" and width / span * axes_px >= _MIN_LABEL_PX:
                    axes.text(row.start_s + width / 2, top, str(row.microbatch), ha="center", va="center",
                              fontsize=6, color="white", clip_on=True)
                    labels_left -= 1
            elif row.kind == "WAIT":
                wait_bars.append((row.start_s, width))
            else:
                comm_bars.setdefault(comm_kind(row.purpose), []).append((row.start_s, width))
        for kind, segments in bars.items():
            axes.broken_barh(segments, (top - _COMPUTE_HEIGHT / 2, _COMPUTE_HEIGHT), facecolors=kind_color(kind),
                             edgecolors="white", linewidth=0.3)
            kinds_seen[kind] = kind_color(kind)
        if wait_bars:
            axes.broken_barh(wait_bars, (top - _COMPUTE_HEIGHT / 2, _COMPUTE_HEIGHT), facecolors="none",
                             edgecolors="#999999", hatch="////", linewidth=0.0)
            kinds_seen["WAIT (blocked)"] = "none"
        base = top - _COMPUTE_HEIGHT / 2 - 0.02
        for i, name in enumerate(COMM_ROWS):
            comm_segments = comm_bars.get(name)
            if comm_segments:
                y = base - (i + 1) * _COMM_HEIGHT
                axes.broken_barh(comm_segments, (y, _COMM_HEIGHT * 0.85), facecolors=COMM_ROW_COLORS[name],
                                 linewidth=0)
                kinds_seen[f"{name} comm"] = COMM_ROW_COLORS[name]
    axes.set_yticks(yticks, [f"rank {r}" for r in chosen])
    axes.set_ylim(-len(chosen) + 0.4, 0.5)
    axes.set_xlim(0, span * 1.01)
    axes.set_xlabel("time (s)")
    bubble = bubble_fraction(trace)
    heading = title if title is not None else "Pipeline schedule"
    axes.set_title(f"{heading} — step {format_seconds(trace.makespan_s)}, bubble {bubble:.1%}")
    handles = [Patch(facecolor=c, edgecolor="#999999" if c == "none" else c,
                     hatch="////" if c == "none" else None, label=k) for k, c in kinds_seen.items()]
    axes.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False)
    axes.grid(axis="x", linewidth=0.3, alpha=0.5)
    return fig
