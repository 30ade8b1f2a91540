"""The check an fp8 layout (``Layout.fp8_recipe``) must pass beyond its own fields, against the hardware.

* :func:`check_fp8_gpu`: the GPU has fp8 tensor cores (a ``peak_tflops.fp8`` in its profile: Hopper and later,
  Ada). Every entry point that pairs a layout with hardware calls it before doing any work:
  :func:`simgrid.simulation.simulate`, :func:`simgrid.memory.estimate_memory` (``simgrid memory --gpu`` /
  ``--cluster``, and its suggestions), :func:`simgrid.sweep.enumerate_layout_space` and
  :func:`simgrid.sweep.sweep_layouts` (``simgrid sweep``). Without it an A100 fp8 run failed late (simulate) or
  never (memory), or the sweep reported every layout as a profile failure.

MoE models need no check of their own: since session 14 their routed experts run in fp8 through Transformer
Engine's ``GroupedLinear`` (forward, dgrad and wgrad: grouped_linear.py lines 155, 346 and 396 at TE v1.11), with
per-expert input and gradient cast-transposes (lines 104, 315), per-expert cached fp8 weights (lines 739-746) and
the tokens per expert padded to a multiple of 16 (``Fp8Padding``, fp8_padding.py line 106; Megatron-Core
experts.py lines 636-658 at core_r0.10.0), while the router GEMM (router.py line 59,
``torch.nn.functional.linear``), the permutation and the all-to-alls stay 16-bit
(:func:`simgrid.model.gemms.moe_gemms`, :func:`simgrid.model.fp8_kernels.fp8_moe_traffic`; docs/design.md,
"MoE + fp8 (session 14)").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from simgrid.errors import LayoutError


def check_fp8_gpu(fp8_recipe: str, gpu: Any) -> None:
    """Refuse ``fp8_recipe`` (``Layout.fp8_recipe``) on ``gpu`` (a GPU profile: ``name``, ``peak_tflops``) when
    the GPU states its peak rates and fp8 is not among them; ``gpu`` None (no hardware given) or an object without
    ``peak_tflops`` (a memory-only stand-in, :class:`simgrid.memory.GPULike`) passes."""
    peaks = getattr(gpu, "peak_tflops", None)
    if fp8_recipe == "none" or not isinstance(peaks, Mapping) or "fp8" in peaks:
        return
    raise LayoutError(
        f"layout: fp8_recipe = {fp8_recipe!r} needs fp8 tensor cores, but GPU {getattr(gpu, 'name', gpu)!r} has no "
        "fp8 peak rate (Hopper and later have one); use --fp8 none (fp8_recipe 'none') or an fp8 GPU such as h100-sxm"
    )

