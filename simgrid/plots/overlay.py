"""Predicted against measured: the simulator's and the executor's traces of one step, on one time axis.

Both traces have the same rows (:mod:`simgrid.trace`), so the picture is two Gantt charts of the compute
stream per rank, stacked with a shared time axis (``style="panels"``), or both in one chart with the
prediction in the upper half of each rank's row and the measurement in the lower half
(``style="overlaid"``). The title gives both step times and the relative error of the prediction,
``(predicted - measured) / measured``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from simgrid.plots.canvas import PlotError, format_seconds, kind_color, new_figure, save_figure

if TYPE_CHECKING:
    import pandas as pd

OverlayStyle = Literal["panels", "overlaid"]

#: Legend names of the row kinds drawn.
KIND_NAMES: dict[str, str] = {
    "F": "forward",
    "B": "backward",
    "I": "input-grad backward",
    "W": "weight-grad backward",
    "R": "recompute",
    "OPT": "optimizer",
    "WAIT": "waiting",
}


def trace_frame(trace: Any) -> pd.DataFrame:
    """A trace's rows as a DataFrame (accepts a :class:`simgrid.trace.Trace`, a result or a DataFrame)."""
    import pandas as pd

    source = getattr(trace, "trace", trace)  # a SimulationResult carries its Trace
    if isinstance(source, pd.DataFrame):
        df = source
    elif callable(getattr(source, "to_dataframe", None)):
        df = source.to_dataframe()
    else:
        raise PlotError(f"plot: expected a simgrid Trace or a DataFrame of trace rows, got {type(trace).__name__}")
    missing = [c for c in ("rank", "stream", "kind", "start_s", "end_s") if c not in df.columns]
    if missing:
        raise PlotError(f"plot: the trace lacks column(s) {missing}")
    return df


def step_time_s(df: pd.DataFrame) -> float:
    """Makespan of a trace table: the latest end minus the earliest start (0 when empty)."""
    if df.empty:
        return 0.0
    return float(df["end_s"].max() - df["start_s"].min())


def plot_overlay(
    predicted_trace: Any,
    measured_trace: Any,
    *,
    ranks: Iterable[int] | None = None,
    style: OverlayStyle = "panels",
    include_comm: bool = False,
    title: str | None = None,
    ax: Axes | Sequence[Axes] | None = None,
    path: str | Path | None = None,
) -> Figure:
    """Gantt charts of a predicted and a measured step on a shared time axis, error in the title.

    ``ranks`` picks ranks (default: those in both traces, up to 16). ``include_comm`` adds the
    communication streams as thin grey bars under each rank's compute bars. ``ax`` is two Axes for
    panels or one Axes (which implies the overlaid style).
    """
    pred = trace_frame(predicted_trace)
    meas = trace_frame(measured_trace)
    chosen = _ranks(pred, meas, ranks)
    t_pred, t_meas = step_time_s(pred), step_time_s(meas)
    if isinstance(ax, Axes):
        style = "overlaid"
    if style not in ("panels", "overlaid"):
        raise PlotError(f"plot_overlay: style = {style!r}; use 'panels' or 'overlaid'")
    fig, axes = _axes_for(style, ax, len(chosen))
    kinds: set[str] = set()
    if style == "panels":
        for axis, df, name in ((axes[0], pred, "predicted"), (axes[1], meas, "measured")):
            kinds |= _draw_gantt(axis, df, chosen, offset=0.0, height=0.8, include_comm=include_comm)
            axis.set_ylabel(f"{name}\nrank")
        axes[0].sharex(axes[1])
        axes[0].tick_params(labelbottom=False)
    else:
        axis = axes[0]
        kinds |= _draw_gantt(axis, pred, chosen, offset=0.2, height=0.38, include_comm=include_comm)
        kinds |= _draw_gantt(axis, meas, chosen, offset=-0.2, height=0.38, include_comm=include_comm,
                             alpha=0.55, hatch="..")
        axis.set_ylabel("rank (upper: predicted, lower: measured)")
    for axis in axes:
        axis.set_yticks(range(len(chosen)), [str(r) for r in chosen])
        axis.set_ylim(len(chosen) - 0.5, -0.5)  # rank 0 on top, as in Perfetto
        axis.set_xlim(0, max(t_pred, t_meas, 1e-12) * 1.02)
        axis.grid(True, axis="x", alpha=0.3)
    axes[-1].set_xlabel("time in step (s)")
    handles = [Patch(color=kind_color(k), label=KIND_NAMES.get(k, k)) for k in _legend_order(kinds)]
    if include_comm:
        handles.append(Patch(color=kind_color("comm"), label="communication"))
    if style == "overlaid":
        handles.append(Patch(facecolor="white", edgecolor="grey", hatch="..", label="measured (lower bar)"))
    axes[0].legend(handles=handles, fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    error = (t_pred - t_meas) / t_meas if t_meas > 0 else float("nan")
    heading = (
        f"predicted {format_seconds(t_pred)} vs measured {format_seconds(t_meas)} "
        f"(error {100 * error:+.1f}%)"
    )
    fig.suptitle(f"{title}: {heading}" if title else heading)
    save_figure(fig, path)
    return fig


def _draw_gantt(axis: Axes, df: pd.DataFrame, ranks: list[int], *, offset: float, height: float,
                include_comm: bool, alpha: float = 1.0, hatch: str | None = None) -> set[str]:
    """One barh call per kind on the compute stream (plus comm streams); returns the kinds drawn."""
    row_of = {rank: i for i, rank in enumerate(ranks)}
    t0 = float(df["start_s"].min()) if not df.empty else 0.0
    part = df[df["rank"].isin(row_of)]
    compute = part[part["stream"] == "compute"]
    kinds: set[str] = set()
    for kind, group in compute.groupby("kind", sort=False):
        y = [row_of[int(r)] - offset for r in group["rank"]]
        axis.barh(y, group["end_s"] - group["start_s"], left=group["start_s"] - t0, height=height,
                  color=kind_color(str(kind)), alpha=alpha, hatch=hatch, edgecolor="white", linewidth=0.3)
        kinds.add(str(kind))
    if include_comm:
        comm = part[part["stream"] != "compute"]
        if not comm.empty:
            y = [row_of[int(r)] - offset + height * 0.45 for r in comm["rank"]]
            axis.barh(y, comm["end_s"] - comm["start_s"], left=comm["start_s"] - t0, height=height * 0.15,
                      color=kind_color("comm"), alpha=alpha)
    return kinds


def _ranks(pred: pd.DataFrame, meas: pd.DataFrame, ranks: Iterable[int] | None) -> list[int]:
    common = sorted(set(int(r) for r in pred["rank"].unique()) & set(int(r) for r in meas["rank"].unique()))
    if ranks is None:
        if not common:
            raise PlotError("plot_overlay: the predicted and measured traces share no rank")
        return common[:16]
    chosen = [int(r) for r in ranks]
    missing = [r for r in chosen if r not in common]
    if missing:
        raise PlotError(f"plot_overlay: rank(s) {missing} are not in both traces; common ranks: {common}")
    return chosen


def _axes_for(style: OverlayStyle, ax: Axes | Sequence[Axes] | None, n_ranks: int) -> tuple[Figure, list[Axes]]:
    if ax is None:
        per_panel = 0.8 + 0.4 * n_ranks
        if style == "panels":
            fig = new_figure(figsize=(10.0, 2 * per_panel + 1.0))
            return fig, [fig.add_subplot(2, 1, 1), fig.add_subplot(2, 1, 2)]
        fig = new_figure(figsize=(10.0, per_panel * 1.4 + 1.0))
        return fig, [fig.add_subplot()]
    axes = [ax] if isinstance(ax, Axes) else list(ax)
    if len(axes) != (2 if style == "panels" else 1):
        raise PlotError(f"plot_overlay: style {style!r} needs {2 if style == 'panels' else 1} axes, got {len(axes)}")
    owner = axes[0].get_figure()
    if not isinstance(owner, Figure):
        raise PlotError("plot_overlay: the given ax does not belong to a matplotlib Figure")
    return owner, axes


def _legend_order(kinds: set[str]) -> list[str]:
    order = list(KIND_NAMES)
    return [k for k in order if k in kinds] + sorted(k for k in kinds if k not in KIND_NAMES)
