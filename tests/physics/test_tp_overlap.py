"""TE tensor-parallel overlap in the engine: it can only hide communication that exists, and never makes a
step shorter than its compute alone.

Compute-only time: with dp = pp = 1 and no overlap, Megatron's TP collectives are synchronous, so no
communication is ever in flight beside a compute op and the rank's compute-stream busy time is the step's
pure compute. Overlap chunks the GEMMs (never fewer waves in total) and slows compute while comm is in
flight, so its step can approach that figure from above, never cross it.
"""

from __future__ import annotations

import dataclasses

import pytest

from simgrid.layout import Layout
from simgrid.model import get_model
from simgrid.simulation import simulate

MODEL = dataclasses.replace(get_model("llama2-7b"), num_layers=4, seq_length=2048)
CASES = [
    Layout(tp=2, sequence_parallel=True, flash_attention=True, global_batch_size=2),
    Layout(tp=4, sequence_parallel=True, flash_attention=True, micro_batch_size=2, global_batch_size=4),
    Layout(tp=8, sequence_parallel=True, flash_attention=False, global_batch_size=2, recompute="full"),
]


def _compute_busy_s(result: object) -> float:
    rows = result.trace.timing_rows  # type: ignore[attr-defined]
    return sum(r.end_s - r.start_s for r in rows if r.rank == 0 and r.purpose == "compute")


@pytest.mark.parametrize("layout", CASES, ids=[f"tp{c.tp}" for c in CASES])
def test_overlap_hides_tp_comm_but_never_beats_compute(layout: Layout) -> None:
    """On H100 NVLink: overlap exposes less TP time, and the step is not shorter than the exposed run's
    compute-only time nor than its own compute. (Whether the step gets shorter depends on the shapes: with
    tp 8 and 256-row chunks the chunked GEMMs lose more than the hidden communication saves.)"""
    plain = simulate(MODEL, "dgx-h100-ndr", layout)
    over = simulate(MODEL, "dgx-h100-ndr", dataclasses.replace(layout, tp_comm_overlap=True))
    compute_only = _compute_busy_s(plain)
    assert plain.metrics.exposed_comm_s["tp"] > 0
    assert over.metrics.exposed_comm_s["tp"] < plain.metrics.exposed_comm_s["tp"]
    assert over.metrics.step_time_s >= compute_only
    assert over.metrics.step_time_s >= _compute_busy_s(over)


@pytest.mark.parametrize("layout", CASES[:2], ids=[f"tp{c.tp}" for c in CASES[:2]])
def test_overlap_shortens_the_step_when_tp_comm_is_exposed(layout: Layout) -> None:
    """With 1024- and 512-row chunks of a 4096-wide model, hiding the TP collectives pays for the chunking."""
    plain = simulate(MODEL, "dgx-h100-ndr", layout)
    over = simulate(MODEL, "dgx-h100-ndr", dataclasses.replace(layout, tp_comm_overlap=True))
    assert over.metrics.step_time_s < plain.metrics.step_time_s


@pytest.mark.parametrize("layout", CASES[:2], ids=[f"tp{c.tp}" for c in CASES[:2]])
def test_overlap_gains_nothing_when_tp_comm_is_free(layout: Layout) -> None:
    """On the ideal cluster communication takes no time: there is nothing to hide, so overlap cannot
    shorten the step (it only splits the GEMMs)."""
    plain = simulate(MODEL, "ideal", layout)
    over = simulate(MODEL, "ideal", dataclasses.replace(layout, tp_comm_overlap=True))
    assert plain.metrics.exposed_comm_s["tp"] == pytest.approx(0.0, abs=1e-12)
    assert over.metrics.step_time_s >= plain.metrics.step_time_s * (1 - 1e-9)
