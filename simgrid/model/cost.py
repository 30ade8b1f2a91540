"""Everything the schedule builder needs to cost one sub-block under a layout: :func:`block_cost`.

It composes :mod:`~simgrid.model.flops`, :mod:`~simgrid.model.kernels`,
:mod:`~simgrid.model.activations`, :mod:`~simgrid.model.params` and :mod:`~simgrid.model.comm` for one
micro-batch on one tensor-parallel rank, so that the simulator's compute ops, the memory model and the
program builder's allocations all use one accounting.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from simgrid.layout.spec import Layout, check_layout
from simgrid.model.activations import block_activation_bytes
from simgrid.model.blocks import block_kind
from simgrid.model.comm import TPCollective, block_cp_collectives, block_tp_collectives
from simgrid.model.flops import block_flops
from simgrid.model.kernels import block_kernels
from simgrid.model.moe import EPCollective, moe_collectives
from simgrid.model.params import block_params_on_rank, expert_params_on_rank
from simgrid.model.spec import ModelSpec


@dataclass(frozen=True, kw_only=True)
class BlockCost:
    """Cost of one sub-block for one micro-batch on one tensor-parallel rank under a layout."""

    fwd_flops: float
    """Forward matmul FLOPs."""
    bwd_input_flops: float
    """Backward input-gradient FLOPs (I)."""
    bwd_weight_flops: float
    """Backward weight-gradient FLOPs (W)."""
    recompute_flops: float
    """FLOPs rerun before the backward: full -> the forward (transformer blocks only), selective -> the
    attention core's forward, none -> 0."""
    fwd_hbm_bytes: int
    """HBM bytes of the forward's memory-bound kernels."""
    bwd_hbm_bytes: int
    """HBM bytes of the backward's memory-bound kernels (I and W together)."""
    fwd_kernels: int
    """Kernel launches in the forward."""
    bwd_kernels: int
    """Kernel launches in the backward."""
    gemm_mnk: tuple[int, int, int]
    """(M, N, K) of the dominant GEMM after the tensor-parallel split; zeros if none."""
    activation_bytes: int
    """Bytes saved for the backward under the layout's recompute and sequence parallelism."""
    param_count: int
    """Parameters this tensor-parallel rank holds for the block (tied-head duplicate included under pp)."""
    tp_comm: tuple[TPCollective, ...]
    """Tensor-parallel collectives of the block; empty when tp = 1."""
    cp_comm: tuple[TPCollective, ...] = ()
    """Context-parallel collectives of the block (over the CP group); empty when cp = 1."""
    recompute_hbm_bytes: int = 0
    """HBM bytes of the recompute forward (same rule as ``recompute_flops``)."""
    recompute_kernels: int = 0
    """Kernel launches of the recompute forward."""
    fused_attention_fwd_flops: float = 0.0
    """Of ``fwd_flops``, those inside a fused (FlashAttention) core; 0 with the unfused core."""
    fused_attention_bwd_flops: float = 0.0
    """Of ``bwd_input_flops``, those inside the fused core's backward kernels; 0 with the unfused core."""
    fused_attention_recompute_flops: float = 0.0
    """Of ``recompute_flops``, those inside the fused core (a recompute reruns the core's forward)."""
    expert_param_count: int = 0
    """Of ``param_count``, the routed experts' parameters (synced and ZeRO-sharded over the expert
    data-parallel group); 0 outside MoE sub-blocks."""
    ep_comm: tuple[EPCollective, ...] = ()
    """Expert-parallel collectives (dispatch/combine all-to-alls, expert-TP gathers); empty unless the block is
    a MoE sub-block with ep or etp > 1."""

    @property
    def bwd_flops(self) -> float:
        """Full backward (I + W) FLOPs."""
        return self.bwd_input_flops + self.bwd_weight_flops


def block_cost(model: ModelSpec, layout: Layout, block: int) -> BlockCost:
    """Cost of sub-block ``block`` (numbering of :mod:`simgrid.ir.ops`) for one micro-batch, one tp rank."""
    return _block_cost_cached(model, layout, block)


@lru_cache(maxsize=65536)
def _block_cost_cached(model: ModelSpec, layout: Layout, block: int) -> BlockCost:
    check_layout(model, layout)
    kind, _ = block_kind(model, block)
    flops = block_flops(model, block, micro_batch_size=layout.micro_batch_size, tp=layout.tp,
                        flash_attention=layout.flash_attention, cp=layout.cp, etp=layout.expert_tp)
    kernels = block_kernels(model, layout, block)
    transformer = kind in ("attn", "mlp")
    if layout.recompute == "full" and transformer:
        re_bytes, re_kernels = kernels.fwd_hbm_bytes, kernels.fwd_kernels
    elif layout.recompute == "selective":
        re_bytes, re_kernels = kernels.core_fwd_hbm_bytes, kernels.core_fwd_kernels
    else:
        re_bytes, re_kernels = 0, 0
    activations = block_activation_bytes(
        model, block, micro_batch_size=layout.micro_batch_size, tp=layout.tp,
        sequence_parallel=layout.sequence_parallel, recompute=layout.recompute, dtype_bytes=layout.param_bytes,
        flash_attention=layout.flash_attention, cp=layout.cp, etp=layout.expert_tp,
    )
    # A fused core's FLOPs are priced at the GPU's attention-kernel efficiency (simgrid.costs.compute); the
    # unfused core's batched GEMMs keep the GEMM efficiency plus their s x s operand traffic (kernels.py).
    fused_fwd = flops.attention_core_fwd if layout.flash_attention else 0.0
    fused_bwd = flops.attention_core_bwd if layout.flash_attention else 0.0
    reruns = layout.recompute != "none" and transformer
    return BlockCost(
        fused_attention_fwd_flops=fused_fwd,
        fused_attention_bwd_flops=fused_bwd,
        fused_attention_recompute_flops=fused_fwd if reruns else 0.0,
        fwd_flops=flops.fwd,
        bwd_input_flops=flops.bwd_input,
        bwd_weight_flops=flops.bwd_weight,
        recompute_flops=flops.recompute(layout.recompute, recomputable=transformer),
        fwd_hbm_bytes=kernels.fwd_hbm_bytes,
        bwd_hbm_bytes=kernels.bwd_hbm_bytes,
        fwd_kernels=kernels.fwd_kernels,
        bwd_kernels=kernels.bwd_kernels,
        gemm_mnk=kernels.gemm_mnk,
        activation_bytes=activations,
        param_count=block_params_on_rank(model, layout, block),
        tp_comm=block_tp_collectives(model, layout, block),
        cp_comm=block_cp_collectives(model, layout, block),
        recompute_hbm_bytes=re_bytes,
        recompute_kernels=re_kernels,
        expert_param_count=expert_params_on_rank(model, layout, block),
        ep_comm=moe_collectives(model, layout, block),
    )
