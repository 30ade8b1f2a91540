"""Memory plots: stacked breakdown per rank/stage against capacity, and memory over time per rank."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from simgrid.plots.canvas import PlotError
from simgrid.plots.memory import plot_memory_breakdown, plot_memory_timeline

GIB = 1024**3


def test_breakdown_stacks_one_bar_per_category_and_rank(tmp_path: Path) -> None:
    """3 ranks x 5 categories = 15 bars; capacity line at 80 GiB; totals 71, 91, 111 GiB -> two OOM labels."""
    estimates = {
        f"rank {r}": {"weights": 10 * GIB, "grads": 10 * GIB, "optimizer": 30 * GIB,
                      "activations": (20 + 20 * r) * GIB, "buffers": GIB}
        for r in range(3)
    }
    out = tmp_path / "breakdown.png"
    fig = plot_memory_breakdown(estimates, 80 * GIB, path=out)
    ax = fig.axes[0]
    assert len(ax.patches) == 15
    tops = sorted({round(p.get_y() + p.get_height(), 6) for p in ax.patches})
    assert tops[-1] == pytest.approx(111.0)  # rank 2: 10 + 10 + 30 + 60 + 1 GiB
    assert [line.get_ydata()[0] for line in ax.lines] == [80.0]
    assert [t.get_text() for t in ax.texts] == ["OOM", "OOM"]  # ranks 1 and 2 exceed 80 GiB
    assert [t.xy[0] for t in ax.texts] == [1, 2]
    assert out.stat().st_size > 0


def test_breakdown_reads_per_stage_entries_of_an_estimate() -> None:
    """An object with per_stage entries named <category>_bytes gives one bar group per pipeline rank."""

    class Stage:
        def __init__(self, act: int) -> None:
            self.weights_bytes, self.grads_bytes, self.optimizer_bytes = GIB, GIB, 2 * GIB
            self.activations_bytes, self.buffers_bytes = act, 0

    class Estimate:
        per_stage = (Stage(4 * GIB), Stage(2 * GIB))
        capacity_bytes = 16 * GIB

    fig = plot_memory_breakdown(Estimate())
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["pp rank 0", "pp rank 1"]
    assert [line.get_ydata()[0] for line in ax.lines] == [16.0]


def test_timeline_draws_one_step_line_per_rank_and_capacity(tmp_path: Path) -> None:
    """Two ranks as (times, bytes) series plus a capacity line; the peak is in the legend."""
    series = {0: ([0.0, 1.0, 2.0], [GIB, 3 * GIB, GIB]), 1: ([0.0, 1.5], [2 * GIB, 0])}
    out = tmp_path / "timeline.svg"
    fig = plot_memory_timeline(series, capacity_bytes=4 * GIB, path=out)
    ax = fig.axes[0]
    assert len(ax.lines) == 3
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[0] == "rank 0 (peak 3.0 GiB)"
    assert out.read_text().startswith("<?xml")


def test_timeline_accepts_a_table_and_a_rank_subset() -> None:
    """A DataFrame with rank/time_s/bytes works; ranks= keeps only the named ranks."""
    df = pd.DataFrame({"rank": [0, 0, 1, 1], "time_s": [0, 1, 0, 1], "bytes": [1, 2, 3, 4]})
    fig = plot_memory_timeline(df, ranks=[1])
    assert len(fig.axes[0].lines) == 1


def test_timeline_unknown_rank_and_missing_timeline_are_errors() -> None:
    """Asking for a rank without a timeline, or passing something without one, names the problem."""
    with pytest.raises(PlotError, match="rank\\(s\\) \\[5\\] have no timeline"):
        plot_memory_timeline({0: ([0.0], [1.0])}, ranks=[5])
    with pytest.raises(PlotError, match="cannot read a memory timeline from int"):
        plot_memory_timeline(42)
