"""Serving plots: latency against load, KV occupancy over time, capacity bars; bad input is a PlotError."""

from __future__ import annotations

from pathlib import Path

import pytest
from matplotlib.figure import Figure

from simgrid.plots import plot_capacity, plot_kv_occupancy, plot_latency_vs_load
from simgrid.plots.canvas import PlotError
from simgrid.serving import LatencyTargets, ServingLayout, capacity_search, poisson_requests, simulate_serving

REQS = poisson_requests(1.0, 30, prompt_tokens=(100, 300), output_tokens=(5, 40), seed=2)


def _at(rate: float):  # type: ignore[no-untyped-def]
    from simgrid.serving import with_poisson_arrivals

    return simulate_serving("llama2-7b", "dgx-a100-hdr", ServingLayout(replicas=2), with_poisson_arrivals(REQS, rate))


def test_latency_vs_load_draws_three_panels_with_targets(tmp_path: Path) -> None:
    """One panel each for TTFT, TPOT and end-to-end; three percentile lines each, plus a target line."""
    fig = plot_latency_vs_load({2.0: _at(2.0), 20.0: _at(20.0)}, targets={"tpot_p99": 0.02},
                               path=tmp_path / "load.png")
    assert isinstance(fig, Figure) and len(fig.axes) == 3
    assert len(fig.axes[0].get_lines()) == 3 and len(fig.axes[1].get_lines()) == 4
    assert (tmp_path / "load.png").stat().st_size > 0
    with pytest.raises(PlotError, match="no results"):
        plot_latency_vs_load({})


def test_kv_occupancy_has_one_line_per_replica(tmp_path: Path) -> None:
    """The KV panel has one step line per replica, in percent; the busy panel above it."""
    fig = plot_kv_occupancy(_at(20.0), path=tmp_path / "kv.svg")
    _busy_ax, kv_ax = fig.axes
    assert len(kv_ax.get_lines()) == 2
    assert max(max(line.get_ydata()) for line in kv_ax.get_lines()) <= 100  # type: ignore[type-var]
    assert (tmp_path / "kv.svg").stat().st_size > 0


def test_capacity_bars_and_bad_suffix(tmp_path: Path) -> None:
    """One bar per layout searched; an unknown file suffix is refused."""
    search = capacity_search("llama2-7b", "dgx-a100-hdr", 2, REQS[:15], LatencyTargets(tpot_p99=0.05))
    fig = plot_capacity(search)
    assert len(fig.axes[0].patches) == len(search.results) == 3
    with pytest.raises(PlotError, match=r"suffix '\.txt'"):
        plot_capacity(search, path=tmp_path / "cap.txt")
