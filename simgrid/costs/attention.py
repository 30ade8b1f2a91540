"""Time of a fused attention core (FlashAttention) from the GPU profile's published speed by shape.

The profile's :class:`~simgrid.hardware.attention.AttentionKernelTable` gives TFLOP/s by sequence length,
head dim and direction as the FlashAttention-2/3 papers measured them (benchmark bursts); a long training
phase runs at the sustained clock, so the time is stretched by the GPU's ``sustained_clock_fraction`` as
GEMMs are. The papers count a causal core as half the full ``s x s`` square; the simulator executes the
tiles on or below the diagonal, ``(n + 1) / (2 n)`` of the square (:func:`simgrid.model.flops.causal_tile_fraction`),
so the op's FLOPs are converted to the papers' count before dividing by their speed. A context-parallel
rank attends ``s / cp`` queries to ``s`` keys; its speed is read at the square of the same area,
``sqrt(s_q s_kv)``. Without a table for the kernel the profile's flat ``fused_attention_efficiency`` (or the
GEMM plateau) prices the FLOPs, as before the tables existed.
"""

from __future__ import annotations

import math

from simgrid.errors import SimgridError
from simgrid.hardware import GPUSpec
from simgrid.hardware.attention import ATTENTION_KERNELS, AttentionKernelTable, Direction
from simgrid.model.flops import causal_tile_fraction

TABLE_DTYPES = ("bf16", "fp16")
"""Dtypes the papers benchmarked; others fall back to the flat efficiency at their own peak."""
AUTO = "auto"
"""Layout value that picks the GPU profile's default kernel (``[fused_attention] default``)."""


def attention_table(gpu: GPUSpec, kernel: str = AUTO) -> AttentionKernelTable | None:
    """The table for ``kernel`` (``auto``: the profile's default), or ``None`` when the profile has none."""
    if kernel == AUTO:
        name = gpu.attention_kernel
        return None if name is None else gpu.fused_attention[name]
    if kernel not in ATTENTION_KERNELS:
        raise SimgridError(f"attention kernel {kernel!r} is unknown; use auto or one of {', '.join(ATTENTION_KERNELS)}")
    if gpu.fused_attention and kernel not in gpu.fused_attention:
        raise SimgridError(f"GPU {gpu.name!r} has no {kernel} attention table (it has: "
                           f"{', '.join(sorted(gpu.fused_attention))}); use --attention-kernel auto or one of those")
    return gpu.fused_attention.get(kernel)


def fused_attention_time_s(flops: float, gpu: GPUSpec, *, dtype: str, direction: Direction = "fwd",
                           shape: tuple[int, int, int] = (0, 0, 0), kernel: str = AUTO) -> float:
    """Seconds of ``flops`` (as executed: causal diagonal tiles included) of a fused core of ``shape``
    ``(query tokens, key tokens, head dim)`` per sequence in ``direction``."""
    if flops <= 0:
        return 0.0
    table = attention_table(gpu, kernel)
    s_q, s_kv, head_dim = shape
    if table is None or min(shape) <= 0 or dtype not in TABLE_DTYPES:
        return flops / (gpu.peak_flops(dtype) * gpu.attention_efficiency * gpu.sustained_clock_fraction)
    paper_flops = flops * 0.5 / causal_tile_fraction(s_kv)
    tflops = table.tflops(direction, math.sqrt(s_q * s_kv), head_dim)
    return paper_flops / (tflops * 1e12 * gpu.sustained_clock_fraction)
