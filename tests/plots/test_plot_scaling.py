"""plot_scaling: one line per layout family per metric, log2 GPU axis, strong/weak in the title."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from matplotlib.figure import Figure

from simgrid.plots.canvas import PlotError, new_figure
from simgrid.plots.scaling import plot_scaling


def _table(global_batch_grows: bool = False) -> pd.DataFrame:
    rows = []
    for label, mfu in (("dp only", 0.30), ("3D", 0.45)):
        for gpus in (8, 16, 32, 64):
            rows.append({"label": label, "gpus": gpus, "tokens_per_s": 1000.0 * gpus * mfu, "mfu": mfu,
                         "global_batch": gpus * 4 if global_batch_grows else 512})
    return pd.DataFrame(rows)


def test_two_panels_with_a_line_per_layout_plus_ideal(tmp_path: Path) -> None:
    """Throughput panel: 2 layouts + the ideal line; MFU panel: 2 layouts, drawn in percent; PNG saved."""
    out = tmp_path / "scaling.png"
    fig = plot_scaling(_table(), path=out)
    assert isinstance(fig, Figure)
    throughput, mfu = fig.axes
    assert len(throughput.lines) == 3
    assert len(mfu.lines) == 2
    assert list(mfu.lines[1].get_ydata()) == pytest.approx([45.0] * 4)
    assert throughput.get_xscale() == "log"
    assert out.stat().st_size > 0


def test_title_says_strong_or_weak_scaling() -> None:
    """A fixed global batch per series is strong scaling; one growing with the GPUs is weak."""
    strong = plot_scaling(_table(), title="gpt")
    weak = plot_scaling(_table(global_batch_grows=True), title="gpt")
    assert strong._suptitle is not None and "strong scaling" in strong._suptitle.get_text()
    assert weak._suptitle is not None and "weak scaling" in weak._suptitle.get_text()


def test_single_axis_puts_the_second_metric_on_a_twin() -> None:
    """With one given ax, MFU goes to a twin axis (dashed) and no ideal line is added to it."""
    fig = new_figure(figsize=(5, 4))
    ax = fig.add_subplot()
    plot_scaling(_table(), ax=ax, ideal=False)
    assert len(fig.axes) == 2
    assert [line.get_linestyle() for line in fig.axes[1].lines] == ["--", "--"]


def test_missing_column_is_named() -> None:
    """A table without the y column is refused with the column's name."""
    with pytest.raises(PlotError, match="lacks column\\(s\\) \\['mfu'\\]"):
        plot_scaling(_table().drop(columns=["mfu"]))
