"""ZeRO-1 parameter gathers overlapped with the forward (Megatron-Core --overlap-param-gather) in the engine: the
overlap can only hide data-parallel time that exists, and never makes a step shorter than its compute.

Compute-only time: the rank's compute-stream busy time. With the overlap the gathers run beside the first
micro-batch's forward, which slows that compute (the GPU's comm_compute_slowdown) but cannot make it finish
sooner, so the step approaches the compute-only figure from above and never crosses it.
"""

from __future__ import annotations

import dataclasses

import pytest

from simgrid.layout import Layout
from simgrid.model import get_model
from simgrid.simulation import simulate

MODEL = dataclasses.replace(get_model("llama2-7b"), num_layers=4, seq_length=2048)
CASES = [
    Layout(dp=16, zero=1, flash_attention=True, global_batch_size=32),
    Layout(dp=16, zero=1, flash_attention=True, global_batch_size=64, bucket_policy="megatron"),
    Layout(dp=8, pp=2, zero=1, schedule="1f1b", flash_attention=True, global_batch_size=32,
           bucket_policy="megatron"),
]


def _compute_busy_s(result: object) -> float:
    rows = result.trace.timing_rows  # type: ignore[attr-defined]
    return max(sum(r.end_s - r.start_s for r in rows if r.rank == rank and r.purpose == "compute")
               for rank in {r.rank for r in rows})


@pytest.mark.parametrize("layout", CASES, ids=["dp16", "dp16-megatron", "dp8-pp2-megatron"])
def test_param_gather_overlap_hides_dp_time_but_never_beats_compute(layout: Layout) -> None:
    """Two DGX H100 nodes (the gathers cross InfiniBand): the overlap exposes no more data-parallel time than
    gathering after the optimizer, and the step is never shorter than either run's compute alone."""
    plain = simulate(MODEL, "dgx-h100-ndr", layout)
    over = simulate(MODEL, "dgx-h100-ndr", dataclasses.replace(layout, overlap_param_gather=True))
    assert over.metrics.exposed_comm_s["dp"] <= plain.metrics.exposed_comm_s["dp"] + 1e-9
    assert over.metrics.step_time_s >= _compute_busy_s(plain) - 1e-12
    assert over.metrics.step_time_s >= _compute_busy_s(over) - 1e-12


def test_param_gather_overlap_shortens_a_step_whose_gathers_were_exposed() -> None:
    """Gathering after the optimizer exposes every bucket; beside the next forward most of it hides."""
    layout = CASES[0]
    plain = simulate(MODEL, "dgx-h100-ndr", layout)
    over = simulate(MODEL, "dgx-h100-ndr", dataclasses.replace(layout, overlap_param_gather=True))
    assert plain.metrics.exposed_comm_s["dp"] > 0
    assert over.metrics.exposed_comm_s["dp"] < plain.metrics.exposed_comm_s["dp"]
    assert over.metrics.step_time_s < plain.metrics.step_time_s
