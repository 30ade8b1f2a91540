"""ZeRO-2/3 memory: the ALLOC/FREE replay at stage granularity matches block granularity and the analytic
model (simgrid.memory), instead of holding a whole stage's gathered parameters or gradient buckets."""

from __future__ import annotations

import pytest
from schedule_helpers import TINY, replay_peaks

from simgrid.layout.spec import Layout
from simgrid.memory.estimate import estimate_memory
from simgrid.model import get_model
from simgrid.model.spec import ModelSpec
from simgrid.schedules.build import build_program

GiB = 2**30


def _peaks(model: ModelSpec, layout: Layout, granularity: str) -> dict[str, int]:
    program = build_program(model, layout, granularity=granularity)  # type: ignore[arg-type]
    return replay_peaks(program.ranks[0])


ZERO_LAYOUTS = {
    "zero3-depth1": Layout(dp=4, zero=3, global_batch_size=8),
    "zero3-depth2": Layout(dp=4, zero=3, global_batch_size=8, zero3_prefetch_depth=2),
    "zero2": Layout(dp=4, zero=2, global_batch_size=8, bucket_size_MB=0.02),
}


@pytest.mark.parametrize("name", sorted(ZERO_LAYOUTS))
def test_stage_granularity_replays_the_same_comm_peak_as_block_granularity(name: str) -> None:
    """A stage-wide compute op holds the buffers block granularity holds at its worst moment, not the
    whole stage's gathered parameters or every gradient bucket at once."""
    layout = ZERO_LAYOUTS[name]
    block, stage = _peaks(TINY, layout, "block"), _peaks(TINY, layout, "stage")
    assert stage["comm"] == block["comm"]
    # Model-state and activation peaks are equal too; a stage-wide op holds its buffers for the whole
    # op, so the total peak coincides a little more (a few percent on tiny-gpt).
    assert stage["activations"] == block["activations"]
    assert stage["total"] == pytest.approx(block["total"], rel=0.05)
    assert stage["total"] == pytest.approx(estimate_memory(TINY, layout).total_bytes, rel=0.05)


@pytest.mark.parametrize(("model_name", "layout", "before_GiB"), [
    # Reported in the issue: the whole stage was gathered at stage granularity.
    ("llama2-7b", Layout(dp=8, zero=3, global_batch_size=8, recompute="full"), 40.7),
    ("gpt3-175b", Layout(tp=8, dp=128, zero=3, global_batch_size=1024, recompute="full"), 89.1),
    ("llama2-7b", Layout(dp=8, zero=2, global_batch_size=32, recompute="full"), 39.1),
])
def test_stage_granularity_peak_matches_the_analytic_model(model_name: str, layout: Layout,
                                                           before_GiB: float) -> None:
    """Stage-granularity replay of large ZeRO-2/3 runs lands within a few percent of simgrid.memory's
    estimate (ZeRO-3: 1 + prefetch-depth gathered blocks; ZeRO-2: two buckets in flight)."""
    model = get_model(model_name)
    analytic = estimate_memory(model, layout).total_bytes
    stage = _peaks(model, layout, "stage")["total"]
    # The analytic model adds the gathered-parameter and gradient-buffer peaks, which DeepSpeed reaches
    # at different moments (reuse window at the forward/backward turn, two reduce buckets later).
    assert stage == pytest.approx(analytic, rel=0.08 if layout.zero == 3 else 0.05)
    if layout.zero == 3:
        assert stage <= analytic * 1.01
    assert stage < 0.8 * before_GiB * GiB  # the peak reported before this fix


def test_zero3_block_and_stage_peaks_agree_with_the_analytic_model_on_llama2_7b() -> None:
    """Block and stage granularity and the analytic model agree within 8 % (block granularity recomputes
    one sub-block at a time, so its activation peak is slightly lower; the analytic model adds peaks
    that DeepSpeed reaches at different moments)."""
    model, layout = get_model("llama2-7b"), Layout(dp=8, zero=3, global_batch_size=8, recompute="full")
    analytic = estimate_memory(model, layout).total_bytes
    block, stage = _peaks(model, layout, "block"), _peaks(model, layout, "stage")
    assert block["comm"] == stage["comm"]
    assert block["total"] == pytest.approx(analytic, rel=0.08)
    assert stage["total"] == pytest.approx(analytic, rel=0.08)
