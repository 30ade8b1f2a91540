"""Memory over simulated time: replay of ALLOC/FREE, peaks, and the out-of-memory verdict."""

from __future__ import annotations

import pytest
from engine_helpers import UniformCost, fwd

from simgrid.engine import build_timeline, simulate_program
from simgrid.errors import SimulationError
from simgrid.ir import Alloc, Free, Program

GB = 10**9


def _program() -> Program:
    """Weights at t=0, activations allocated after a 1 s forward and freed after a 1 s backward."""
    return Program(ranks=[[
        Alloc(name="w", bytes=4 * GB, category="weights"),
        fwd(1e12),
        Alloc(name="act", bytes=3 * GB, category="activations"),
        fwd(1e12, kind="B"),
        Free(name="act"),
        Alloc(name="g", bytes=2 * GB, category="grads"),
    ]])


def test_allocations_take_effect_at_compute_stream_time() -> None:
    """Events land at 0, 1, 2, 2 s; live totals 4, 7, 4, 6 GB; the peak 7 GB is at 1 s."""
    res = simulate_program(_program(), cost_model=UniformCost(), memory_capacity_bytes=80 * GB)
    timeline = res.memory.timelines[0]
    assert timeline.times_s == (0.0, 1.0, 2.0, 2.0)
    assert timeline.total_bytes == (4 * GB, 7 * GB, 4 * GB, 6 * GB)
    assert timeline.bytes_by_category["activations"] == (0, 3 * GB, 0, 0)
    assert (timeline.peak_bytes, timeline.peak_time_s) == (7 * GB, 1.0)
    assert timeline.peak_by_category["weights"] == 4 * GB and timeline.peak_by_category["activations"] == 3 * GB
    assert res.fits and res.peak_memory_bytes == 7 * GB


def test_a_program_that_exceeds_memory_is_reported_not_crashed() -> None:
    """With 6 GB of device memory the 7 GB peak does not fit: fits is False, the step still completes."""
    res = simulate_program(_program(), cost_model=UniformCost(), memory_capacity_bytes=6 * GB)
    assert res.fits is False
    assert res.memory.peak_bytes == 7 * GB > res.memory.capacity_bytes
    assert res.makespan_s == 2.0


def test_real_layout_that_does_not_fit_is_a_result() -> None:
    """Llama-2 7B with Adam on one 24 GB RTX 4090 needs ~16 bytes/parameter of model state (~108 GB):
    simulate() reports fits = False with a peak above capacity instead of raising."""
    from simgrid.layout import Layout
    from simgrid.simulation import simulate

    result = simulate("llama2-7b", "rtx4090-10gbe", Layout(global_batch_size=1))
    assert result.metrics.fits is False
    assert result.metrics.peak_memory_bytes > 16 * 6.7e9 > result.metrics.memory_capacity_bytes
    assert result.metrics.step_time_s > 0


def test_freeing_an_unknown_buffer_is_an_error() -> None:
    """FREE of a name never allocated is a SimulationError naming the buffer."""
    with pytest.raises(SimulationError, match="FREE name=ghost releases no live buffer"):
        simulate_program(Program(ranks=[[Free(name="ghost")]]), cost_model=UniformCost())


def test_empty_timeline_has_zero_peak() -> None:
    """A rank that allocates nothing peaks at 0 bytes."""
    timeline = build_timeline(3, [])
    assert (timeline.peak_bytes, timeline.times_s, timeline.total_bytes) == (0, (), ())
