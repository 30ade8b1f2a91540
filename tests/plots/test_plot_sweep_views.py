"""Sweep views: ranked layouts as bars, and the best metric over (tp, pp) as a heat map."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from simgrid.plots.canvas import PlotError
from simgrid.plots.sweep_views import layout_label, plot_sweep_ranking, plot_tp_pp_heatmap


def _sweep() -> pd.DataFrame:
    rows = []
    # Four 16-GPU layouts and one single-GPU layout (tp 1, pp 1, dp 1).
    for tp, pp, step, fits in ((8, 2, 10.0, True), (4, 4, 12.0, True), (8, 2, 11.0, True), (2, 8, 9.0, False),
                              (1, 1, 20.0, True)):
        rows.append({"dp": 1, "tp": tp, "pp": pp, "vpp": 1, "zero": 1,
                     "mbs": 1, "schedule": "1f1b" if pp > 1 else "none", "recompute": "full",
                     "step_time_s": step, "tokens_per_s": 1000 / step, "mfu": 0.5, "peak_memory_bytes": 2**30,
                     "fits": fits})
    return pd.DataFrame(rows)


def test_ranking_draws_top_bars_best_on_top(tmp_path: Path) -> None:
    """top=3 gives 3 bars; the top bar is the first row; the one that does not fit is hatched."""
    df = _sweep()
    out = tmp_path / "ranking.png"
    fig = plot_sweep_ranking(df.iloc[[3, 0, 2, 1]], top=3, path=out)
    ax = fig.axes[0]
    assert len(ax.patches) == 3
    top_bar = max(ax.patches, key=lambda p: p.get_y())
    assert top_bar.get_width() == pytest.approx(9.0)
    assert top_bar.get_hatch() == "//"
    labels = dict(zip(ax.get_yticks(), [t.get_text() for t in ax.get_yticklabels()], strict=True))
    assert labels[max(labels)] == "tp2 pp8 dp1 z1 mbs1 full"
    assert out.stat().st_size > 0


def test_heatmap_keeps_the_best_fitting_value_per_cell(tmp_path: Path) -> None:
    """(tp 8, pp 2) has 10 s and 11 s: the cell shows the faster (100 tokens/s); the non-fitting
    (2, 8) row is left out, and an absent combination is NaN."""
    df = _sweep()
    df = df[df["dp"] * df["tp"] * df["pp"] == 16]
    fig = plot_tp_pp_heatmap(df, path=tmp_path / "heat.png")
    image = fig.axes[0].images[0]
    grid = np.asarray(image.get_array(), dtype=float)
    # rows tp = [4, 8], columns pp = [2, 4] (tp 2 only appears in the non-fitting row)
    assert grid.shape == (2, 2)
    assert grid[1, 0] == pytest.approx(100.0)
    assert grid[0, 1] == pytest.approx(1000 / 12)
    assert np.isnan(grid[0, 0]) and np.isnan(grid[1, 1])


def test_heatmap_refuses_mixed_gpu_counts_without_a_choice() -> None:
    """Rows for 16 and 1 GPUs need gpus= to pick one."""
    with pytest.raises(PlotError, match="mixes GPU counts \\[1, 16\\]; pass gpus="):
        plot_tp_pp_heatmap(_sweep())


def test_layout_label_lists_nondefault_fields() -> None:
    """vpp and ZeRO appear only when not 1/0; sequence parallel adds 'sp'."""
    row = {"tp": 8, "pp": 8, "dp": 16, "vpp": 2, "zero": 0, "mbs": 1, "recompute": "none",
           "sequence_parallel": True}
    assert layout_label(row) == "tp8 pp8 dp16 v2 mbs1 sp"


def test_layout_label_names_the_overlap_switches_as_the_sweep_table_does() -> None:
    """The sweep's CSV/table mark TP comm overlap 'tpo', FlashAttention 'fa' and the overlapped ZeRO-1 param
    gather 'opg'; the plot label does too, so a layout and its overlapped twin get different bars. A CSV cell
    read as text ('False') is off."""
    base = {"tp": 4, "pp": 2, "dp": 8, "zero": 1, "mbs": 1, "recompute": "none", "sequence_parallel": True}
    assert layout_label({**base, "tp_comm_overlap": True, "overlap_param_gather": True, "flash_attention": True}) \
        == "tp4 pp2 dp8 z1 mbs1 sp tpo fa opg"
    assert layout_label({**base, "tp_comm_overlap": False, "overlap_param_gather": "False"}) == "tp4 pp2 dp8 z1 mbs1 sp"
    assert layout_label({**base, "tp_comm_overlap": "True", "overlap_param_gather": float("nan")}) \
        == "tp4 pp2 dp8 z1 mbs1 sp tpo"
