"""Human-readable units for CLI reports."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from simgrid.layout import Layout


def gib(nbytes: float) -> str:
    """Bytes as GiB with two decimals (``inf`` stays readable)."""
    if math.isinf(nbytes):
        return "unlimited"
    return f"{nbytes / 2**30:.2f} GiB"


def seconds(value: float) -> str:
    """A duration with a unit that keeps 3-4 significant digits."""
    if value >= 1:
        return f"{value:.3f} s"
    if value >= 1e-3:
        return f"{value * 1e3:.3f} ms"
    return f"{value * 1e6:.1f} us"


def percent(fraction: float) -> str:
    """A fraction as a percentage with one decimal."""
    return f"{fraction * 100:.1f}%"


def describe_layout(lay: Layout) -> str:
    """One line naming a layout's degrees, batch, schedule and switches (reports and plot titles)."""
    parts = [f"dp {lay.dp}", f"tp {lay.tp}", f"pp {lay.pp}"] + ([f"cp {lay.cp}"] if lay.cp > 1 else [])
    if lay.ep > 1 or lay.etp is not None:
        parts.append(f"ep {lay.ep}, etp {lay.expert_tp}")
    if lay.vpp > 1:
        parts.append(f"vpp {lay.vpp}")
    parts += [f"mbs {lay.micro_batch_size}", f"gbs {lay.gbs} (m = {lay.num_microbatches})", f"{lay.schedule}"]
    if lay.zero:
        impl = lay.zero_impl + (", fp32 reduce" if lay.reduce_dtype == "fp32" else "")
        parts.append(f"ZeRO-{lay.zero}" + (f" ({impl})" if lay.zero == 3 else ""))
    if lay.reduce_dtype == "fp32" and lay.zero < 3:
        parts.append("fp32 grads")  # Megatron-LM's fp32 main_grad (simgrid.memory.states)
    if lay.recompute != "none":
        parts.append(f"recompute {lay.recompute}")
    if lay.sequence_parallel:
        parts.append("SP")
    if lay.tp_comm_overlap:
        parts.append("TP comm overlap")
    if lay.tp_async_grad_comm:
        parts.append("async TP grad comm")
    if lay.grad_accumulation_fusion:
        parts.append("wgrad accumulation fusion")
    if lay.overlap_param_gather:
        parts.append("param gather overlap")
    if lay.fp8_params:
        parts.append("fp8 params")
    if lay.flash_attention:
        parts.append("flash attention")
    return ", ".join(parts)
