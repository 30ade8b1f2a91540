"""Shared plumbing for the plot modules: headless figures, saving, colours and unit formatting.

Figures are built with :class:`matplotlib.figure.Figure` directly, never through ``pyplot``: no global
figure registry to leak from a sweep that draws hundreds of plots, and no GUI backend needed on a
headless server (saving goes through the Agg/SVG canvases). Jupyter still displays a returned Figure.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from simgrid.errors import SimgridError

GIB = 1024**3
"""Bytes in a GiB (memory plots use binary units, as nvidia-smi and PyTorch do)."""

SAVE_FORMATS = (".png", ".svg", ".pdf")
"""File suffixes :func:`save_figure` accepts."""

#: Colour per trace-row kind, shared by the overlay and memory plots (tab10 hues; compute kinds first).
KIND_COLORS: dict[str, str] = {
    "F": "#1f77b4",
    "B": "#d62728",
    "I": "#ff7f0e",
    "W": "#2ca02c",
    "R": "#9467bd",
    "OPT": "#8c564b",
    "SEND": "#17becf",
    "RECV": "#17becf",
    "WAIT": "#c7c7c7",
}
COMM_COLOR = "#7f7f7f"
"""Colour of collective and transfer rows (all-reduce, all-gather, d2h, ...)."""

#: Colour per memory category (estimate breakdowns say ``buffers``, IR timelines say ``comm``).
MEMORY_COLORS: dict[str, str] = {
    "weights": "#1f77b4",
    "grads": "#ff7f0e",
    "optimizer": "#2ca02c",
    "activations": "#d62728",
    "buffers": "#9467bd",
    "comm": "#9467bd",
}
MEMORY_ORDER = ("weights", "grads", "optimizer", "activations", "buffers", "comm")
"""Stacking order of memory categories, bottom to top (static states first, then what varies)."""


class PlotError(SimgridError):
    """A plot's input or output path is unusable."""


def figure_and_axes(ax: Axes | None, *, figsize: tuple[float, float]) -> tuple[Figure, Axes]:
    """``ax`` and its figure, or a fresh headless figure with one axes."""
    if ax is not None:
        fig = ax.get_figure()
        if not isinstance(fig, Figure):
            raise PlotError("plot: the given ax does not belong to a matplotlib Figure")
        return fig, ax
    fig = Figure(figsize=figsize, layout="constrained")
    return fig, fig.add_subplot()


def new_figure(*, figsize: tuple[float, float]) -> Figure:
    """A fresh headless figure with constrained layout (labels never overlap the axes)."""
    return Figure(figsize=figsize, layout="constrained")


def save_figure(fig: Figure, path: str | Path | None, *, dpi: int = 130) -> Path | None:
    """Write ``fig`` to ``path`` (PNG, SVG or PDF by suffix); nothing when ``path`` is ``None``."""
    if path is None:
        return None
    out = Path(path)
    if out.suffix.lower() not in SAVE_FORMATS:
        raise PlotError(
            f"plot: output {str(out)!r} has suffix {out.suffix!r}; use one of {', '.join(SAVE_FORMATS)}"
        )
    if not out.parent.exists():
        raise PlotError(f"plot: cannot write {str(out)!r}: directory {str(out.parent)!r} does not exist")
    fig.savefig(out, dpi=dpi)
    return out


def kind_color(kind: str) -> str:
    """Colour of a trace row kind (collectives and transfers share one grey)."""
    return KIND_COLORS.get(kind, COMM_COLOR)


def memory_color(category: str) -> str:
    """Colour of a memory category (unknown ones get a neutral grey)."""
    return MEMORY_COLORS.get(category, "#bcbd22")


def ordered_categories(categories: Any) -> list[str]:
    """Memory categories in :data:`MEMORY_ORDER`, unknown ones after, alphabetically."""
    names = list(dict.fromkeys(categories))
    known = [c for c in MEMORY_ORDER if c in names]
    return known + sorted(c for c in names if c not in MEMORY_ORDER)


def format_bytes(n: float) -> str:
    """``"79.3 GiB"``, ``"512.0 MiB"``: binary units for memory."""
    for unit, scale in (("TiB", 1024**4), ("GiB", GIB), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def format_seconds(s: float) -> str:
    """``"1.23 s"``, ``"45.6 ms"``, ``"789 us"``: a step or op duration with a readable unit."""
    if abs(s) >= 1:
        return f"{s:.3g} s"
    if abs(s) >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} us"


def field_of(obj: Any, name: str, default: Any = None) -> Any:
    """``obj[name]`` for mappings, ``obj.name`` otherwise (inputs may be dataclasses or JSON dicts)."""
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)
