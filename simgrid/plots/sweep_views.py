"""Pictures of a layout search: the ranked layouts, and throughput over (tp, pp) for one GPU count.

Both read the table of :func:`simgrid.sweep.sweep` (columns dp, tp, pp, vpp, zero, mbs, schedule,
recompute, step_time_s, tokens_per_s, mfu, peak_memory_bytes, fits), or the CSV it was saved to.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import EngFormatter

from simgrid.plots.canvas import PlotError, figure_and_axes, format_bytes, save_figure
from simgrid.plots.scaling import METRIC_LABELS, PERCENT_METRICS

if TYPE_CHECKING:
    import pandas as pd

#: Bar colour per pipeline schedule in the ranking (tab10 hues).
SCHEDULE_COLORS: dict[str, str] = {
    "none": "#7f7f7f",
    "gpipe": "#9467bd",
    "1f1b": "#1f77b4",
    "interleaved-1f1b": "#2ca02c",
    "zb-h1": "#ff7f0e",
    "zbv": "#d62728",
    "interleaved-zb": "#8c564b",
    "looped-bfs": "#e377c2",
    "dualpipev": "#17becf",
}
RANKING_COLUMNS = ("dp", "tp", "pp", "step_time_s")
"""Columns :func:`plot_sweep_ranking` needs at least."""


def layout_label(row: Any) -> str:
    """``tp8 pp8 dp16 v2 z1 mbs1 full sp tpo opg`` for one table row (fields that are absent are skipped); the
    switches are named as ``simgrid sweep``'s table names them (sp: sequence parallel, tpo: TP comm overlap,
    fa: FlashAttention, opg: overlapped param gather), so two layouts that differ only by one stay apart."""
    parts = [f"tp{row['tp']}", f"pp{row['pp']}", f"dp{row['dp']}"]
    if int(row.get("vpp", 1) or 1) > 1:
        parts.append(f"v{row['vpp']}")
    if int(row.get("zero", 0) or 0):
        parts.append(f"z{row['zero']}")
    if "mbs" in row:
        parts.append(f"mbs{row['mbs']}")
    if row.get("recompute") not in (None, "none") and isinstance(row.get("recompute"), str):
        parts.append(str(row["recompute"]))
    for field, short in (("sequence_parallel", "sp"), ("tp_comm_overlap", "tpo"), ("flash_attention", "fa"),
                         ("overlap_param_gather", "opg")):
        if _switched_on(row.get(field, False)):
            parts.append(short)
    return " ".join(parts)


def _switched_on(value: Any) -> bool:
    """A switch column's value: a bool, a number, or the text of one (a CSV read without type inference)."""
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes", "on")
    return bool(value) and value == value  # NaN (a missing cell) is off


def plot_sweep_ranking(
    df: pd.DataFrame,
    top: int = 20,
    *,
    metric: str = "step_time_s",
    title: str | None = None,
    ax: Axes | None = None,
    path: str | Path | None = None,
) -> Figure:
    """Horizontal bars of the best ``top`` layouts (best at the top), coloured by schedule.

    Bar length is ``metric`` (step time by default); each bar is annotated with MFU and peak memory
    when the table has them. Layouts that do not fit in memory are hatched.
    """
    df = df.copy()
    _need(df, list(dict.fromkeys([*RANKING_COLUMNS, metric])), "plot_sweep_ranking")
    if df.empty:
        raise PlotError("plot_sweep_ranking: the sweep table has no rows; nothing was simulated")
    if not isinstance(top, int) or top <= 0:
        raise PlotError(f"plot_sweep_ranking: top = {top!r} must be a positive integer")
    rows = df.head(top)
    records = rows.to_dict("records")
    fig, axis = figure_and_axes(ax, figsize=(10.0, 1.2 + 0.32 * len(records)))
    scale = 100.0 if metric in PERCENT_METRICS else 1.0
    positions = list(range(len(records)))[::-1]  # best at the top
    values = [float(r[metric]) * scale for r in records]
    colors = [SCHEDULE_COLORS.get(str(r.get("schedule", "none")), "#7f7f7f") for r in records]
    hatches = ["//" if r.get("fits", True) is False else "" for r in records]
    bars = axis.barh(positions, values, color=colors, height=0.7)
    for bar, hatch in zip(bars, hatches, strict=True):
        bar.set_hatch(hatch)
    axis.set_yticks(positions, [layout_label(r) for r in records], fontsize="small")
    axis.set_xlabel(METRIC_LABELS.get(metric, metric))
    top_value = max(values) if values else 1.0
    for pos, value, record in zip(positions, values, records, strict=True):
        notes = []
        if "mfu" in record and _finite(record["mfu"]):
            notes.append(f"MFU {100 * float(record['mfu']):.1f}%")
        if "peak_memory_bytes" in record and _finite(record["peak_memory_bytes"]):
            notes.append(format_bytes(float(record["peak_memory_bytes"])))
        if notes:
            axis.text(value + 0.01 * top_value, pos, "  ".join(notes), va="center", fontsize="x-small")
    axis.set_xlim(0, top_value * 1.35)
    axis.set_ylim(-0.6, len(records) - 0.4)
    used = list(dict.fromkeys(str(r.get("schedule", "none")) for r in records))
    handles = [Patch(color=SCHEDULE_COLORS.get(s, "#7f7f7f"), label=s) for s in used]
    if any(hatches):
        handles.append(Patch(facecolor="white", edgecolor="black", hatch="//", label="does not fit"))
    axis.legend(handles=handles, fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), title="schedule")
    axis.grid(True, axis="x", alpha=0.3)
    axis.set_title(title or f"Best {len(records)} of {len(df)} layouts ({_world(df)} GPUs)")
    save_figure(fig, path)
    return fig


def plot_tp_pp_heatmap(
    df: pd.DataFrame,
    metric: str = "tokens_per_s",
    *,
    gpus: int | None = None,
    title: str | None = None,
    ax: Axes | None = None,
    path: str | Path | None = None,
) -> Figure:
    """Heat map of the best ``metric`` over (tp, pp) for one GPU count; empty cells had no layout.

    "Best" is the maximum for throughput-like metrics and the minimum for ``step_time_s`` and
    ``peak_memory_bytes``. Only layouts that fit count when the table has a ``fits`` column.
    """
    if metric in TEXT_COLUMNS or metric in ("fits", "sequence_parallel", "flash_attention"):
        raise PlotError(f"plot_tp_pp_heatmap: metric {metric!r} is not a numeric column; use e.g. tokens_per_s, "
                        "step_time_s, mfu or peak_memory_bytes")
    df = df.copy()
    _need(df, ["tp", "pp", "dp", metric], "plot_tp_pp_heatmap")
    data = df.assign(_gpus=df["dp"] * df["tp"] * df["pp"])
    counts = sorted(int(g) for g in data["_gpus"].unique())
    if gpus is None:
        if len(counts) > 1:
            raise PlotError(
                f"plot_tp_pp_heatmap: the table mixes GPU counts {counts}; pass gpus= to pick one"
            )
        gpus = counts[0] if counts else 0
    data = data[data["_gpus"] == gpus]
    if "fits" in data.columns:
        data = data[data["fits"].astype(bool)]
    if data.empty:
        raise PlotError(f"plot_tp_pp_heatmap: no layout that fits on {gpus} GPUs in the table; available {counts}")
    lower_is_better = metric in ("step_time_s", "peak_memory_bytes")
    grouped = data.groupby(["tp", "pp"])[metric]
    best = (grouped.min() if lower_is_better else grouped.max()).unstack("pp")
    tps = sorted(int(t) for t in data["tp"].unique())
    pps = sorted(int(p) for p in data["pp"].unique())
    best = best.reindex(index=tps, columns=pps)
    fig, axis = figure_and_axes(ax, figsize=(1.0 + 0.9 * len(pps) + 2.0, 1.2 + 0.6 * len(tps)))
    scale = 100.0 if metric in PERCENT_METRICS else 1.0
    grid = best.to_numpy(dtype=float) * scale
    cmap = "viridis_r" if lower_is_better else "viridis"
    image = axis.imshow(grid, cmap=cmap, aspect="auto", origin="lower")
    axis.set_xticks(range(len(pps)), [str(p) for p in pps])
    axis.set_yticks(range(len(tps)), [str(t) for t in tps])
    axis.set_xlabel("pipeline parallel (pp)")
    axis.set_ylabel("tensor parallel (tp)")
    finite = [v for v in grid.flat if _finite(v)]
    mid = (min(finite) + max(finite)) / 2 if finite else 0.0
    for i in range(len(tps)):
        for j in range(len(pps)):
            value = grid[i, j]
            if _finite(value):
                dark = (value < mid) != lower_is_better
                axis.text(j, i, _short_number(value), ha="center", va="center", fontsize="x-small",
                          color="white" if dark else "black")
            else:
                axis.text(j, i, "–", ha="center", va="center", color="grey")
    colorbar = fig.colorbar(image, ax=axis, label=METRIC_LABELS.get(metric, metric))
    if metric not in PERCENT_METRICS:
        colorbar.formatter = EngFormatter(sep="")
        colorbar.update_ticks()
    axis.set_title(title or f"Best {METRIC_LABELS.get(metric, metric)} by (tp, pp), {gpus} GPUs")
    save_figure(fig, path)
    return fig


#: Columns that hold layout degrees and counts: positive integers (``zero`` may be 0).
INTEGER_COLUMNS = ("dp", "tp", "pp", "cp", "vpp", "zero", "mbs", "gpus")
#: Columns of :func:`simgrid.sweep.sweep`'s table that hold measurements: finite numbers.
NUMBER_COLUMNS = ("step_time_s", "tokens_per_s", "mfu", "hfu", "tflops_per_gpu", "bubble_fraction",
                  "peak_memory_bytes", "memory_capacity_bytes", "exposed_tp_s", "exposed_cp_s", "exposed_pp_s",
                  "exposed_dp_s")
MAX_CELL = 1e30
"""Largest magnitude a number in a sweep table may have: no time, rate or size comes near it, and drawing
values near the float limit overflows the axes."""
#: Columns that hold True or False.
BOOL_COLUMNS = ("fits", "sequence_parallel", "flash_attention")
#: Columns that hold names, not numbers.
TEXT_COLUMNS = ("schedule", "recompute", "model", "cluster", "note", "error")


def _need(df: pd.DataFrame, columns: list[str], who: str) -> None:
    """The columns exist, and every known column holds what it should: finite numbers (integers >= 1 for
    degrees, ``zero`` from 0), True/False in the flags; one line naming the column, row and value otherwise.
    Columns the sweep does not write are left alone, except the ones named in ``columns``."""
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise PlotError(f"{who}: the sweep table lacks column(s) {missing}; it has {list(df.columns)}")
    for column in df.columns:
        if column in INTEGER_COLUMNS or column in NUMBER_COLUMNS or (column in columns and column not in TEXT_COLUMNS):
            _check_numeric(df, column, who)
        elif column in ("schedule", "recompute"):
            from simgrid.layout import RECOMPUTE_POLICIES, SCHEDULES

            known = SCHEDULES if column == "schedule" else RECOMPUTE_POLICIES
            bad = [v for v in df[column] if v not in known]
            if bad:
                raise PlotError(f"{who}: column {column!r} holds {_shown(bad[0])}; expected one of {', '.join(known)}")
        elif column in BOOL_COLUMNS and str(df[column].dtype) != "bool":
            bad = [v for v in df[column] if not isinstance(v, bool) and str(v) not in ("True", "False")]
            if bad or df[column].isna().any():
                raise PlotError(f"{who}: column {column!r} must hold True or False, found "
                                f"{_shown((bad or [None])[0])}")
            df[column] = df[column].map(lambda v: v is True or str(v) == "True")


def _check_numeric(df: pd.DataFrame, column: str, who: str) -> None:
    import numpy as np
    import pandas as pd

    values = pd.to_numeric(df[column], errors="coerce")
    numbers = values.to_numpy(dtype=float, na_value=np.nan)
    finite = np.isfinite(numbers) & (np.abs(np.nan_to_num(numbers)) <= MAX_CELL)
    if not finite.all():
        row = int(np.flatnonzero(~finite)[0])
        raise PlotError(f"{who}: column {column!r} must hold finite numbers up to {MAX_CELL:g}; row {row + 1} has "
                        f"{_shown(df[column].iloc[row])}; fix or drop that row")
    if column in NUMBER_COLUMNS and (values < 0).any():
        row = int(np.flatnonzero((values < 0).to_numpy())[0])
        raise PlotError(f"{who}: column {column!r} must hold numbers >= 0 (times, rates, fractions, sizes); "
                        f"row {row + 1} has {_shown(df[column].iloc[row])}")
    if column in INTEGER_COLUMNS:
        floor = 0 if column == "zero" else 1
        bad = (values % 1 != 0) | (values < floor) | (values > 2**53)
        if bad.any():
            row = int(np.flatnonzero(bad.to_numpy())[0])
            raise PlotError(f"{who}: column {column!r} must hold integers >= {floor}; row {row + 1} has "
                            f"{_shown(df[column].iloc[row])}")
    df[column] = values


def _shown(value: Any) -> str:
    item = getattr(value, "item", None)  # numpy scalars print as np.float64(nan); show the plain value
    text = repr(item() if callable(item) else value)
    return text if len(text) <= 40 else f"{text[:30]}... ({len(text)} characters)"


def _world(df: pd.DataFrame) -> str:
    counts = sorted({int(v) for v in (df["dp"] * df["tp"] * df["pp"]).unique()})
    return "/".join(str(c) for c in counts)


def _finite(value: Any) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def _short_number(value: float) -> str:
    for suffix, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"
