"""simgrid.plots.plot_gantt: headless, readable, bubbles in the title."""

from __future__ import annotations

import time
from pathlib import Path

import matplotlib
import pytest
from matplotlib.figure import Figure

from simgrid.plots import plot_gantt
from simgrid.plots.canvas import PlotError
from simgrid.trace import Trace, TraceRow

matplotlib.use("Agg")


def _pipeline_trace(p: int, m: int) -> Trace:
    """A GPipe-shaped trace: forward of mb i on rank r at [i + r, i + r + 1), backwards after."""
    rows = []
    for r in range(p):
        for i in range(m):
            rows.append(TraceRow(r, "compute", f"{r}F{i}", "F", "compute", i + r, i + r + 1, 0, 1.0, r, i))
            start = m + p - 1 + i + (p - 1 - r)
            rows.append(TraceRow(r, "compute", f"{r}B{i}", "B", "compute", start, start + 1, 0, 2.0, r, i))
            rows.append(TraceRow(r, f"p2p:{r + 1}", "SEND", "SEND", "pp", i + r + 1, i + r + 1.1, 10))
        rows.append(TraceRow(r, "comm:dp", "AR", "all_reduce", "dp-grad", 2 * (m + p - 1), 2 * (m + p), 10))
    return Trace(rows)


def test_gantt_title_has_the_bubble_fraction(tmp_path: Path) -> None:
    """GPipe with p = 4, m = 8 idles (p-1)/(m+p-1) = 3/11 = 27.3%: the title says so; PNG saves."""
    fig = plot_gantt(_pipeline_trace(4, 8), title="GPipe")
    assert isinstance(fig, Figure)
    title = fig.axes[0].get_title()
    assert "GPipe" in title and "bubble 27.3%" in title
    fig.savefig(tmp_path / "g.png")
    assert (tmp_path / "g.png").stat().st_size > 1000


def test_gantt_draws_one_row_per_rank() -> None:
    """Ranks become y ticks in order; a subset can be chosen."""
    fig = plot_gantt(_pipeline_trace(4, 2), ranks=[2, 0])
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["rank 2", "rank 0"]


def test_gantt_is_fast_and_readable_for_8_ranks_by_100_microbatches(tmp_path: Path) -> None:
    """8 x 100 micro-batches draws in a few seconds and skips labels too small to read."""
    started = time.perf_counter()
    fig = plot_gantt(_pipeline_trace(8, 100))
    fig.savefig(tmp_path / "big.png")
    assert time.perf_counter() - started < 20
    assert len(fig.axes[0].texts) <= 600


def test_gantt_of_unknown_rank_is_an_error() -> None:
    """Asking for a rank the trace does not have names it."""
    with pytest.raises(PlotError, match=r"rank\(s\) \[9\] have no rows"):
        plot_gantt(_pipeline_trace(2, 2), ranks=[9])


def test_gantt_of_empty_trace_is_an_error() -> None:
    """An empty trace cannot be drawn."""
    with pytest.raises(PlotError, match="no rows"):
        plot_gantt(Trace())


def test_default_ranks_pick_one_rank_per_pipeline_stage_in_large_traces() -> None:
    """With more than 32 traced ranks, the chart shows the lowest rank of each distinct stage set."""
    from simgrid.plots import default_ranks

    rows = [TraceRow(r, "compute", "F", "F", "compute", 0, 1, 0, 1.0, r // 8, 0) for r in range(64)]
    assert default_ranks(Trace(rows)) == [0, 8, 16, 24, 32, 40, 48, 56]
    assert default_ranks(_pipeline_trace(4, 2)) == [0, 1, 2, 3]
