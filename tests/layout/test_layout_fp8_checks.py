"""``simgrid.layout.fp8_checks``: an fp8 layout on a GPU without fp8 tensor cores is a one-line LayoutError naming
the field, the value and the fix, raised by every Python entry point that pairs a layout with hardware (simulate,
estimate_memory, sweep, enumerate_layout_space, sweep_layouts) before any work; fp8 on a MoE model is accepted
(priced since session 14, refused before)."""

from __future__ import annotations

import dataclasses

import pytest

from simgrid.errors import LayoutError
from simgrid.hardware import load_cluster, load_gpu
from simgrid.layout import Layout, check_fp8_gpu, check_layout
from simgrid.memory import estimate_memory
from simgrid.model import get_model
from simgrid.simulation import simulate
from simgrid.sweep import SweepConstraints, enumerate_layout_space, sweep, sweep_layouts

NO_FP8 = r"fp8_recipe = 'delayed' needs fp8 tensor cores, but GPU 'a100-80gb-sxm' has no fp8 peak rate .*--fp8 none"
TINY = Layout(dp=2, micro_batch_size=2, global_batch_size=4, fp8_recipe="delayed")


@dataclasses.dataclass(frozen=True)
class _MemoryOnlyGPU:
    """A memory-only stand-in (``simgrid.memory.GPULike``): it states no peak rates."""

    name: str = "stand-in"
    memory_bytes: int = 80 * 2**30


def test_gpu_check_refuses_only_a_gpu_that_states_peaks_without_fp8() -> None:
    a100, h100 = load_gpu("a100-80gb-sxm"), load_gpu("h100-sxm")
    with pytest.raises(LayoutError, match=NO_FP8):
        check_fp8_gpu("delayed", a100)
    check_fp8_gpu("none", a100)
    check_fp8_gpu("delayed", h100)
    check_fp8_gpu("current", None)
    check_fp8_gpu("current", _MemoryOnlyGPU())


def test_moe_model_with_fp8_passes_check_layout() -> None:
    moe = get_model("tiny-moe")
    for recipe in ("none", "delayed", "current"):
        check_layout(moe, Layout(dp=2, fp8_recipe=recipe))


def test_moe_with_fp8_on_a100_is_still_refused() -> None:
    with pytest.raises(LayoutError, match=NO_FP8):
        simulate("tiny-moe", "dgx-a100-hdr", TINY)


def test_simulate_refuses_fp8_on_a100_before_building() -> None:
    with pytest.raises(LayoutError, match=NO_FP8):
        simulate("tiny-gpt", "dgx-a100-hdr", TINY)
    with pytest.raises(LayoutError, match=NO_FP8):
        simulate("tiny-gpt", load_cluster("dgx-a100-hdr", gpus=2), TINY)


def test_estimate_memory_refuses_fp8_on_a100_and_keeps_the_gpu_free_estimate() -> None:
    model = get_model("tiny-gpt")
    with pytest.raises(LayoutError, match=NO_FP8):
        estimate_memory(model, TINY, load_gpu("a100-80gb-sxm"))
    assert estimate_memory(model, TINY).capacity_bytes is None
    assert estimate_memory(model, TINY, load_gpu("h100-sxm")).fits


def test_sweep_entry_points_refuse_fp8_up_front() -> None:
    model = get_model("tiny-gpt")
    fp8 = SweepConstraints(recipe=(("fp8_recipe", "delayed"),))
    a100 = load_cluster("dgx-a100-hdr", gpus=2)
    with pytest.raises(LayoutError, match=NO_FP8):
        enumerate_layout_space(model, a100, gpus=2, global_batch=4, constraints=fp8)
    with pytest.raises(LayoutError, match=NO_FP8):
        sweep(model, "dgx-a100-hdr", 2, 4, constraints=fp8, workers=1, progress=False)
    with pytest.raises(LayoutError, match=NO_FP8):
        sweep_layouts(model, "dgx-a100-hdr", 2, [TINY], workers=1, progress=False)
    assert enumerate_layout_space(get_model("tiny-moe"), load_cluster("dgx-h100-ndr", gpus=2), gpus=2, global_batch=4,
                                  constraints=SweepConstraints(recipe=(("fp8_recipe", "current"),))).layouts
    assert enumerate_layout_space(model, load_cluster("dgx-h100-ndr", gpus=2), gpus=2, global_batch=4,
                                  constraints=fp8).layouts
