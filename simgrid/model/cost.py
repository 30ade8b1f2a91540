"""Everything the schedule builder needs to cost one sub-block under a layout: :func:`block_cost`.

It composes :mod:`~simgrid.model.flops`, :mod:`~simgrid.model.kernels`,
:mod:`~simgrid.model.activations`, :mod:`~simgrid.model.params` and :mod:`~simgrid.model.comm` for one
micro-batch on one tensor-parallel rank, so that the simulator's compute ops, the memory model and the
program builder's allocations all use one accounting.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

from simgrid.layout.spec import Layout, check_layout
from simgrid.model.activations import block_activation_bytes, uses_dropout
from simgrid.model.blocks import block_kind, local_seq_length
from simgrid.model.comm import TPCollective, block_cp_collectives, block_tp_collectives
from simgrid.model.early_stop import skipped_by_early_stop
from simgrid.model.flops import BlockFlops, block_flops
from simgrid.model.gemms import BlockGemms, Gemm, block_gemms, fp8_gemm_shapes
from simgrid.model.kernels import BlockKernels, block_kernels
from simgrid.model.moe import EPCollective, moe_collectives
from simgrid.model.params import block_params_on_rank, expert_params_on_rank
from simgrid.model.selective_op import recompute_gemms
from simgrid.model.spec import ModelSpec

GRAD_ACCUM_BYTES_PER_PARAM = 6
"""HBM bytes per parameter per micro-batch spent landing a weight gradient in its accumulation buffer, beyond
the weight-gradient GEMM's own 16-bit output: Megatron-LM adds it into ``main_grad`` (``main_grad.add_(grad)``
in its DDP hook: read 2 + read 2 + write 2 in fp16) or, with gradient-accumulation fusion, has the GEMM read
and write the fp32 ``main_grad`` (8 instead of 2); PyTorch autograd accumulates ``grad += new`` from the
second micro-batch (read 2 + 2, write 2) and FSDP2 casts the gradient to its fp32 reduce dtype before the
reduce-scatter (read 2, write 4). Each is 6 bytes per parameter. Under gradient accumulation fusion
(``Layout.grad_accumulation_fusion``) the parameters of the weight-gradient GEMMs pay none of it: their GEMM
epilogue reads and writes ``main_grad`` instead (``BlockCost.wgrad_accumulate_bytes``, priced by
:mod:`simgrid.costs.gemm`); only the others (norms, biases, embedding) keep it."""


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
    """FLOPs rerun before the backward: full -> the forward (transformer blocks only; a non-reentrant checkpoint
    less the GEMMs its early stop skips, :mod:`simgrid.model.early_stop`), selective -> the
    attention core's forward, selective-op -> the linears torchtitan's policy does not save
    (:mod:`simgrid.model.selective_op`), none -> 0."""
    fwd_hbm_bytes: int
    """HBM bytes of the forward's memory-bound kernels."""
    bwd_hbm_bytes: int
    """HBM bytes of the backward's memory-bound kernels (I and W together), the gradient accumulation's
    :data:`GRAD_ACCUM_BYTES_PER_PARAM` per parameter included."""
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
    fwd_gemms: tuple[Gemm, ...] = ()
    """Every forward matrix multiply as ``(m, n, k, count)`` (:mod:`simgrid.model.gemms`)."""
    bwd_input_gemms: tuple[Gemm, ...] = ()
    """Input-gradient (I) matrix multiplies."""
    bwd_weight_gemms: tuple[Gemm, ...] = ()
    """Weight-gradient (W) matrix multiplies."""
    wgrad_accumulate_bytes: int = 0
    """Bytes per element of the ``main_grad`` the weight-gradient GEMMs accumulate into (read and write each;
    :func:`simgrid.model.gemms.wgrad_accumulate_bytes`); 0: they write a fresh gradient."""
    recompute_gemms: tuple[Gemm, ...] = ()
    """Matrix multiplies the recompute forward reruns (same rule as ``recompute_flops``)."""
    attention_shape: tuple[int, int, int] = (0, 0, 0)
    """``(query tokens, key tokens, head dim)`` of the fused attention core; zeros without one."""
    fp8_gemm_shapes: frozenset[tuple[int, int, int]] = frozenset()
    """``(m, n, k)`` of the GEMMs above that run in fp8 (Transformer Engine's linear layers under
    ``Layout.fp8_recipe``, :func:`simgrid.model.gemms.fp8_gemm_shapes`); empty: all in the layout's precision."""
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
    activations = block_activation_bytes(
        model, block, micro_batch_size=layout.micro_batch_size, tp=layout.tp,
        sequence_parallel=layout.sequence_parallel, recompute=layout.recompute, dtype_bytes=layout.param_bytes,
        flash_attention=layout.flash_attention, cp=layout.cp, etp=layout.expert_tp,
        checkpoint_impl=layout.checkpoint_impl, fp8=layout.fp8_recipe != "none",
        dropout=uses_dropout(model, layout),
    )
    # A fused core's FLOPs are priced at the GPU's attention-kernel efficiency (simgrid.costs.compute); the
    # unfused core's batched GEMMs keep the GEMM efficiency plus their s x s operand traffic (kernels.py).
    fused_fwd = flops.attention_core_fwd if layout.flash_attention else 0.0
    fused_bwd = flops.attention_core_bwd if layout.flash_attention else 0.0
    params = block_params_on_rank(model, layout, block)
    gemms = block_gemms(model, layout, block)
    rerun = _rerun(model, layout, block, kind, flops, kernels, gemms, fused_fwd)
    shape = (local_seq_length(model, layout.cp), model.seq_length, model.head_dim) if fused_fwd else (0, 0, 0)
    return BlockCost(
        fwd_gemms=gemms.fwd,
        bwd_input_gemms=gemms.bwd_input,
        bwd_weight_gemms=gemms.bwd_weight,
        wgrad_accumulate_bytes=gemms.wgrad_accumulate_bytes,
        recompute_gemms=rerun.gemms,
        attention_shape=shape,
        fp8_gemm_shapes=fp8_gemm_shapes(gemms, layout, kind),
        fused_attention_fwd_flops=fused_fwd,
        fused_attention_bwd_flops=fused_bwd,
        fused_attention_recompute_flops=rerun.fused_attention_flops,
        fwd_flops=flops.fwd,
        bwd_input_flops=flops.bwd_input,
        bwd_weight_flops=flops.bwd_weight,
        recompute_flops=rerun.flops,
        fwd_hbm_bytes=kernels.fwd_hbm_bytes,
        bwd_hbm_bytes=kernels.bwd_hbm_bytes + GRAD_ACCUM_BYTES_PER_PARAM * _separately_accumulated(params, gemms),
        fwd_kernels=kernels.fwd_kernels,
        bwd_kernels=kernels.bwd_kernels,
        gemm_mnk=kernels.gemm_mnk,
        activation_bytes=activations,
        param_count=params,
        tp_comm=block_tp_collectives(model, layout, block),
        cp_comm=block_cp_collectives(model, layout, block),
        recompute_hbm_bytes=rerun.hbm_bytes,
        recompute_kernels=rerun.kernels,
        expert_param_count=expert_params_on_rank(model, layout, block),
        ep_comm=moe_collectives(model, layout, block),
    )


def _separately_accumulated(params: int, gemms: BlockGemms) -> int:
    """Parameters whose gradient a separate kernel lands in its buffer: all of them, or under gradient
    accumulation fusion those no weight-gradient GEMM accumulates itself (its ``m x n`` output is the weight)."""
    if not gemms.wgrad_accumulate_bytes:
        return params
    return max(0, params - sum(m * n * count for m, n, _, count in gemms.bwd_weight))


class _Rerun(NamedTuple):
    """What the recompute before one sub-block's backward reruns (the ``recompute_*`` fields of BlockCost)."""

    flops: float
    hbm_bytes: int
    kernels: int
    gemms: tuple[Gemm, ...]
    fused_attention_flops: float
    """Of ``flops``, those inside the fused attention core."""


_NO_RERUN = _Rerun(0.0, 0, 0, (), 0.0)


def _rerun(model: ModelSpec, layout: Layout, block: int, kind: str, flops: BlockFlops, kernels: BlockKernels,
           gemms: BlockGemms, fused_fwd: float) -> _Rerun:
    """The one place the recompute policies differ. The embedding and the head are never recomputed
    (Megatron checkpoints transformer-layer inputs); ``selective`` needs no such test, since only an attention
    sub-block has a core to rerun.

    - ``full``: the sub-block's whole forward (Megatron-LM's reentrant activation checkpointing), less what a
      non-reentrant checkpoint's early stop skips (:mod:`simgrid.model.early_stop`, ``Layout.checkpoint_impl``).
    - ``selective``: the attention core only (Korthikanti et al. 2022, section 5): its FLOPs, kernels and the
      traffic on the ``s x s`` scores.
    - ``selective-op``: the GEMMs torchtitan's per-op checkpointing does not save, and the element-wise work
      around them (:mod:`simgrid.model.selective_op`); it saves the fused attention kernel's outputs, so the
      core is never rerun.
    """
    transformer = kind in ("attn", "mlp")
    # The FLOPs come from BlockFlops.recompute, the rule model_flops_per_iteration also counts with.
    rerun_flops = flops.recompute(layout.recompute, recomputable=transformer)
    if layout.recompute == "full" and transformer:
        skip = skipped_by_early_stop(model, layout, block, kernels)
        re_gemms = gemms.fwd[:-1] if skip.last_gemm else gemms.fwd  # the output projection is listed last
        dropped = sum(2.0 * m * n * k * count for m, n, k, count in gemms.fwd[len(re_gemms):])
        # Under fp8 the recompute reuses the step's cached fp8 weights (is_first_microbatch is False by then).
        return _Rerun(rerun_flops - dropped, kernels.fwd_hbm_bytes - skip.hbm_bytes - kernels.fp8_weight_fwd_hbm_bytes,
                      kernels.fwd_kernels - skip.kernels - kernels.fp8_weight_fwd_kernels, re_gemms, fused_fwd)
    if layout.recompute == "selective":
        return _Rerun(rerun_flops, kernels.core_fwd_hbm_bytes, kernels.core_fwd_kernels, gemms.core_fwd,
                      fused_fwd if transformer else 0.0)
    if layout.recompute == "selective-op" and transformer:
        re_gemms = recompute_gemms(model, block, micro_batch_size=layout.micro_batch_size, tp=layout.tp, cp=layout.cp)
        hbm_bytes, launches = _selective_op_traffic(model, layout, kind, kernels, len(gemms.fwd), len(re_gemms))
        return _Rerun(rerun_flops, hbm_bytes, launches, re_gemms, 0.0)
    return _NO_RERUN


def _selective_op_traffic(model: ModelSpec, layout: Layout, kind: str, kernels: BlockKernels, fwd_gemms: int,
                          rerun_gemms: int) -> tuple[int, int]:
    """(HBM bytes, launches) of a per-op-checkpointed sub-block's recompute (:mod:`simgrid.model.selective_op`).

    Attention: the whole forward's element-wise work (norm, rotary, the output transpose, the residual add that
    the MLP's norm needs) but not the fused attention kernel, whose outputs are saved. MLP: the norm and the
    activation product, not the block's last residual add (the non-reentrant checkpoint stops once every
    tensor the backward needs is back, and nothing after ``w2`` is needed). Launches: the forward's, less the
    saved GEMMs and, for attention, the fused kernel, for the MLP the residual add.
    """
    # The forward's GEMM launches not repeated (torchtitan's separate wq/wk/wv and w1/w3 are one fused GEMM
    # each in simgrid.model.gemms, so this counts launches, never below zero).
    saved_gemms = max(fwd_gemms - rerun_gemms, 0)
    if kind == "attn":
        return (kernels.fwd_hbm_bytes - kernels.core_fwd_hbm_bytes,
                kernels.fwd_kernels - kernels.core_fwd_kernels - saved_gemms)
    return kernels.fwd_hbm_bytes - kernels.residual_fwd_hbm_bytes, kernels.fwd_kernels - 1 - saved_gemms
