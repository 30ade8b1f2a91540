"""Scaling curves: throughput and MFU against GPU count, one line per layout family.

Input is a table with one row per (configuration, GPU count), e.g. built from several
:func:`simgrid.simulation.simulate` runs. Strong scaling keeps the global batch fixed as GPUs are added; weak
scaling grows it with them (Megatron SC'21 Table 1 is weak scaling). The title says which, either as
given or inferred from a ``global_batch`` column.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter, FuncFormatter

from simgrid.plots.canvas import PlotError, new_figure, save_figure

if TYPE_CHECKING:
    import pandas as pd

ScalingKind = Literal["strong", "weak", "auto"]

#: Axis labels of well-known metric columns (others are shown by column name).
METRIC_LABELS: dict[str, str] = {
    "tokens_per_s": "throughput (tokens/s)",
    "mfu": "MFU (%)",
    "hfu": "HFU (%)",
    "tflops_per_gpu": "model TFLOP/s per GPU",
    "hw_tflops_per_gpu": "hardware TFLOP/s per GPU",
    "step_time_s": "step time (s)",
    "bubble_fraction": "pipeline bubble (%)",
    "gpus": "GPUs",
}
#: Metrics stored as fractions and drawn as percentages.
PERCENT_METRICS = frozenset({"mfu", "hfu", "bubble_fraction"})


def plot_scaling(
    df: pd.DataFrame,
    x: str = "gpus",
    y: str | Sequence[str] = ("tokens_per_s", "mfu"),
    by: str | None = "label",
    *,
    scaling: ScalingKind = "auto",
    ideal: bool = True,
    title: str | None = None,
    ax: Axes | Sequence[Axes] | None = None,
    path: str | Path | None = None,
) -> Figure:
    """Draw ``y`` against ``x`` (log2 axis), one line per value of ``by``; one panel per metric.

    ``ax`` may be one Axes per metric, or a single Axes (a second metric then goes on a twin axis
    with dashed lines). ``ideal`` adds a dotted linear-scaling line through the smallest run of the
    first series on the throughput panel. Saved to ``path`` when given.
    """
    metrics = [y] if isinstance(y, str) else list(y)
    _check_columns(df, [x, *metrics, *([by] if by else [])])
    if df.empty:
        raise PlotError("plot_scaling: the table has no rows; give one row per (layout, GPU count)")
    kind = _scaling_kind(df, x, by, scaling)
    fig, axes, dashed_second = _axes_for(metrics, ax)
    groups = list(df.groupby(by, sort=False)) if by else [("", df)]
    for metric, axis, dashed in zip(metrics, axes, [False, dashed_second], strict=False):
        scale = 100.0 if metric in PERCENT_METRICS else 1.0
        for label, group in groups:
            group = group.sort_values(x)
            axis.plot(
                group[x], group[metric] * scale, marker="o", linestyle="--" if dashed else "-",
                label=f"{label} ({metric})" if dashed_second else str(label),
            )
        if ideal and metric == "tokens_per_s" and not dashed:
            first = groups[0][1].sort_values(x)
            x0, y0 = float(first[x].iloc[0]), float(first[metric].iloc[0])
            xs = sorted(df[x].unique())
            axis.plot(xs, [y0 * v / x0 for v in xs], linestyle=":", color="grey", label="ideal (linear)")
        axis.set_xscale("log", base=2)
        axis.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        axis.set_xticks(sorted(df[x].unique()))
        axis.set_xlabel(METRIC_LABELS.get(x, x))
        axis.set_ylabel(METRIC_LABELS.get(metric, metric))
        axis.grid(True, which="major", alpha=0.3)
        if metric in PERCENT_METRICS:
            axis.set_ylim(bottom=0)
        else:
            # 1.2M rather than 1200000: throughput spans orders of magnitude over a scaling study.
            axis.yaxis.set_major_formatter(EngFormatter(sep=""))
        if not dashed_second:
            axis.legend(fontsize="small")
    if dashed_second:
        handles, labels = [], []
        for axis in axes:
            h, lab = axis.get_legend_handles_labels()
            handles += h
            labels += lab
        axes[0].legend(handles, labels, fontsize="small")
    heading = title or "Scaling"
    if kind != "auto":
        heading = f"{heading} ({kind} scaling: global batch {'fixed' if kind == 'strong' else 'grows with GPUs'})"
    fig.suptitle(heading)
    save_figure(fig, path)
    return fig


def _axes_for(metrics: list[str], ax: Axes | Sequence[Axes] | None) -> tuple[Figure, list[Axes], bool]:
    """Axes to draw each metric on, and whether the second metric shares a twin axis."""
    if ax is None:
        fig = new_figure(figsize=(5.5 * len(metrics), 4.2))
        axes = [fig.add_subplot(1, len(metrics), i + 1) for i in range(len(metrics))]
        return fig, axes, False
    if isinstance(ax, Axes):
        fig = _figure_of(ax)
        if len(metrics) == 1:
            return fig, [ax], False
        if len(metrics) == 2:
            return fig, [ax, ax.twinx()], True
        raise PlotError(f"plot_scaling: one ax cannot show {len(metrics)} metrics; pass {len(metrics)} axes")
    axes = list(ax)
    if len(axes) != len(metrics):
        raise PlotError(f"plot_scaling: got {len(axes)} axes for {len(metrics)} metrics {metrics}; pass one per metric")
    return _figure_of(axes[0]), axes, False


def _figure_of(ax: Axes) -> Figure:
    fig = ax.get_figure()
    if not isinstance(fig, Figure):
        raise PlotError("plot_scaling: the given ax does not belong to a matplotlib Figure")
    return fig


def _scaling_kind(df: pd.DataFrame, x: str, by: str | None, scaling: ScalingKind) -> ScalingKind:
    """The requested kind, or inferred: a constant ``global_batch`` per series means strong scaling."""
    if scaling in ("strong", "weak"):
        return scaling
    if scaling != "auto":
        raise PlotError(f"plot_scaling: scaling = {scaling!r}; use 'strong', 'weak' or 'auto'")
    if "global_batch" not in df.columns:
        return "auto"
    groups = [g for _, g in df.groupby(by, sort=False)] if by else [df]
    if all(g["global_batch"].nunique() == 1 for g in groups):
        return "strong"
    if all(g.sort_values(x)["global_batch"].is_monotonic_increasing for g in groups):
        return "weak"
    return "auto"


def _check_columns(df: pd.DataFrame, columns: list[str]) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise PlotError(f"plot_scaling: the table lacks column(s) {missing}; it has {list(df.columns)}")
