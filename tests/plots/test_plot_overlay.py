"""plot_overlay: predicted and measured Gantt charts on one time axis with the step-time error."""

from __future__ import annotations

from pathlib import Path

import pytest

from simgrid.plots.canvas import PlotError, new_figure
from simgrid.plots.overlay import plot_overlay
from simgrid.trace import Trace, TraceRow


def _trace(scale: float) -> Trace:
    """Two ranks, F then B per micro-batch (2 micro-batches), and one all-reduce on rank 0."""
    rows = []
    for rank in (0, 1):
        t = 0.0
        for mb in (0, 1):
            rows.append(TraceRow(rank, "compute", "F", "F", "compute", t, t + 1.0 * scale, 0, 1.0, rank, mb))
            t += 1.0 * scale
        for mb in (0, 1):
            rows.append(TraceRow(rank, "compute", "B", "B", "compute", t, t + 2.0 * scale, 0, 2.0, rank, mb))
            t += 2.0 * scale
    rows.append(TraceRow(0, "comm:dp", "all_reduce", "all_reduce", "dp-grad", 6 * scale, 7 * scale, 100))
    return Trace(rows)


def test_panels_share_time_and_title_gives_the_error(tmp_path: Path) -> None:
    """Predicted 6 s vs measured 8 s (7 s compute x 8/6... ) -> error (6*1 + 1 - 8) / 8 = -12.5%."""
    out = tmp_path / "overlay.png"
    fig = plot_overlay(_trace(1.0), _trace(8 / 7), path=out)
    top, bottom = fig.axes
    assert len(top.patches) == 8 and len(bottom.patches) == 8  # 2 ranks x 4 compute ops each
    assert top.get_shared_x_axes().joined(top, bottom)
    title = fig._suptitle.get_text() if fig._suptitle else ""
    assert "predicted 7 s vs measured 8 s" in title
    assert "-12.5%" in title
    assert out.stat().st_size > 0


def test_overlaid_style_on_one_axis_with_comm_bars() -> None:
    """One given ax: both traces in it (8 + 8 compute bars) plus 1 + 1 communication bars."""
    fig = new_figure(figsize=(6, 3))
    ax = fig.add_subplot()
    plot_overlay(_trace(1.0), _trace(1.0), ax=ax, include_comm=True)
    assert len(ax.patches) == 18
    assert fig._suptitle is not None and "+0.0%" in fig._suptitle.get_text()


def test_ranks_must_be_in_both_traces() -> None:
    """A rank missing from one trace is named in the error."""
    with pytest.raises(PlotError, match="rank\\(s\\) \\[3\\] are not in both traces"):
        plot_overlay(_trace(1.0), _trace(1.0), ranks=[3])
