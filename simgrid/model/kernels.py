"""Memory-bound kernels of each sub-block: HBM bytes, kernel launches and the dominant GEMM shape.

Kernels are those of Megatron-LM's GPT layer as Narayanan et al. SC'21 (section 4.2) and Korthikanti et
al. 2022 describe it: fused bias+GeLU, fused bias+dropout+add, fused scale+mask+softmax, unfused attention
core (no FlashAttention, matching the ``a s^2 b`` activations of Korthikanti Table 2); with
``Layout.flash_attention`` the attention core is :func:`_flash_core` instead of :func:`_unfused_core`. Each memory-bound
kernel is charged the bytes of every tensor it reads plus every tensor it writes, once (no cache reuse):

forward                                             backward
  norm: read x, write y                 2E            read dy and x, write dx            3E
  rope on Q, K: read, write             2(Q+K)        same                               2(Q+K)
  softmax (scale+mask fused): r, w      2S            read dP and P, write dS            3S
    Megatron's causal kernel (s <= 4096)  (1 + c)S      (lower triangle read, full write)  (1 + 2c)S
  attention dropout: read, write+mask   S(2d+1)/d     read dY and mask, write dX         S(2d+1)/d
  bias+dropout+residual add:            3E + mask     read dY (and mask), write dX       2E + mask
  bias+GeLU: read, write                2F            read dY and x, write dx            3F
  SwiGLU: read gate, up; write          3F            read dY, gate, up; write two       5F
                                                      residual-branch gradient sum       3E
                                                      bias gradients (column sums): read the output grads
with ``c = (s + 1) / (2 s)``; Megatron-LM's backward also scales dQ and dK by the softmax scale and cats dQ,
dK, dV into the QKV gradient (:func:`_unfused_core`). ``E = T h d`` (divided by ``tp`` under sequence
parallelism), ``S = a_local b s^2 d``, ``F = T f_local d``, ``T = b s`` tokens and ``d`` the element size. Matmul operands are not counted here
(the compute model costs every GEMM by its shape, :mod:`simgrid.model.gemms`, including the unfused attention
core's batched GEMMs and their s x s operands). The embedding is a gather (read + write ``T h d``), a
position add and a dropout; the loss is an fp32 cross entropy over the (vocabulary-parallel) logits, see
:data:`LOSS_FWD_BYTES_PER_LOGIT_EXTRA`. A MoE layer's MLP sub-block is :func:`simgrid.model.moe.moe_traffic`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

from simgrid.layout.spec import Layout
from simgrid.model.activations import MASK_BYTES, SOFTMAX_STATS_BYTES, uses_dropout
from simgrid.model.blocks import block_kind, local_kv_heads, local_q_heads, local_seq_length, local_vocab
from simgrid.model.fp8_kernels import NO_FP8, FP8Traffic, fp8_moe_traffic, fp8_traffic
from simgrid.model.moe import is_moe_block, moe_traffic
from simgrid.model.params import mlp_in_width, qkv_width
from simgrid.model.spec import ModelSpec

#: Bytes per logit, beyond the 16-bit read of the cast, of PyTorch's fp32 cross entropy
#: (``F.cross_entropy(logits.float(), ...)``, torchtitan; ``kernel_fusion`` eager): cast d->4 (write 4), then
#: log-softmax's max (read 4), sum of exponentials (read 4) and output (read 4, write 4) = 20.
LOSS_FWD_BYTES_PER_LOGIT_EXTRA = 20
#: Megatron-LM's vocabulary-parallel cross entropy (``kernel_fusion`` fused: Megatron-LM and Megatron-Core),
#: one pass per tensor op: cast (write 4), max (read 4), max subtracted in place (read 4, write 4), exp in
#: place (8), sum (4) and the softmax normalised in place for the backward, ``exp_logits.div_(sum)`` (8) = 36.
#: Source: megatron/mpu/cross_entropy.py (2021) and megatron/core/tensor_parallel/cross_entropy.py
#: (``calculate_predicted_logits``: ``vocab_parallel_logits -= logits_max``, ``torch.exp(..., out=)``;
#: ``calculate_cross_entropy_loss``: ``exp_logits.div_(sum_exp_logits)``), the unfused default of Megatron-Core
#: r0.8 (``--cross-entropy-loss-fusion`` off).
MEGATRON_LOSS_FWD_BYTES_PER_LOGIT_EXTRA = 36
#: Megatron's backward: subtract the one-hot in place and scale by the loss gradient in place (8), cast back
#: (read 4; the write ``d`` is counted with the cast's 16-bit side).
LOSS_BWD_BYTES_PER_LOGIT_EXTRA = 12
#: PyTorch's backward: ``nll_loss_backward`` zero-fills the whole fp32 gradient before scattering the targets
#: (``grad_input.zero_()`` in aten/src/ATen/native/cuda/Loss.cu, write 4), log-softmax's backward sums the
#: incoming gradient (read 4) then writes ``grad - exp(out) * sum`` (read 4 + 4, write 4), cast back (read 4).
EAGER_LOSS_BWD_BYTES_PER_LOGIT_EXTRA = 24
#: PyTorch's eager cross entropy launches 3 kernels forward: the ``.float()`` cast, ``log_softmax`` as ONE kernel
#: (``host_softmax`` launches a single ``cunn_SoftMaxForward``, or ``cunn_SoftMaxForwardSmem`` when the row fits
#: in shared memory, which computes the row max, the sum of exponentials and the output in one pass over
#: blocks of rows: aten/src/ATen/native/cuda/SoftMax.cu), and ``nll_loss`` (one reduce kernel,
#: aten/src/ATen/native/cuda/Loss.cu). The byte count above keeps the three reads of the unfused kernel (the
#: shared-memory variant reads once, but only rows of up to ~12k fp32 logits fit in 48 KiB).
#: Until session 10 this was 5 (max, exp and sum counted as separate kernels, as Megatron runs them).
EAGER_LOSS_FWD_KERNELS = 3
#: Launches of Megatron's unfused vocab-parallel cross entropy (megatron/core/tensor_parallel/cross_entropy.py,
#: Megatron-LM HEAD d98e8a6 and r0.8 alike; v2.5's megatron/mpu/cross_entropy.py the same, its cast in the caller's ``output.float()``), collectives
#: apart (they are communication ops). Forward 18: ``.float()``, ``max``, ``-= logits_max``, the target mask
#: (``<``, ``>=``, ``|``), ``target.clone() - start`` (2), ``masked_target[target_mask] = 0``, ``arange``, the
#: target gather, ``.clone()``, ``predicted_logits[target_mask] = 0``, ``exp``, ``sum``, ``log``,
#: ``- predicted_logits``, ``div_``. A boolean mask set to a Python scalar is one ``masked_fill_`` (ATen's
#: ``index_put_`` takes its ``canDispatchToMaskedFill`` path: no nonzero, no sync;
#: aten/src/ATen/native/TensorAdvancedIndexing.cpp). Backward 8: ``target_mask.float()``, ``1.0 - ...``,
#: ``arange``, ``grad_2d[arange, target] -= update`` (gather, subtract, index_put), ``mul_`` by the loss
#: gradient, and autograd's cast of the fp32 gradient to the logits' dtype. Until session 10: 7 and 2, the
#: passes over the logits only (their bytes are unchanged: the extra kernels touch token-sized tensors).
MEGATRON_LOSS_KERNELS = (18, 8)


@dataclass(frozen=True, kw_only=True)
class BlockKernels:
    """Memory-bound traffic, launch counts and the main GEMM shape of one sub-block (one tp rank)."""

    fwd_hbm_bytes: int
    """Bytes read + written by the forward's memory-bound kernels."""
    bwd_hbm_bytes: int
    """Bytes read + written by the backward's memory-bound kernels."""
    fwd_kernels: int
    """Kernel launches in the forward, GEMMs included."""
    bwd_kernels: int
    """Kernel launches in the full backward (I and W), GEMMs included."""
    gemm_mnk: tuple[int, int, int]
    """(M, N, K) of the largest GEMM; zeros when the block has none."""
    core_fwd_hbm_bytes: int = 0
    """Forward bytes of the attention core's softmax and dropout (what selective recompute repeats)."""
    core_fwd_kernels: int = 0
    """Forward launches of the attention core: QK^T, softmax, (dropout,) PV; 0 outside attention."""
    residual_fwd_hbm_bytes: int = 0
    """Forward bytes of the block's closing (bias+dropout+) residual add; 0 outside attention and dense MLP
    blocks (what per-op checkpointing does not repeat after an MLP, :mod:`simgrid.model.selective_op`)."""
    norm_fwd_hbm_bytes: int = 0
    """Forward bytes of the block's opening norm (eager RMSNorm's extra passes included); 0 outside attention
    and dense MLP blocks (what a checkpoint of the attention or MLP module alone does not rerun,
    :mod:`simgrid.model.early_stop`)."""
    norm_fwd_kernels: int = 0
    """Forward launches of that norm (1 fused, 8 for eager RMSNorm)."""
    fp8_weight_fwd_hbm_bytes: int = 0
    """Of ``fwd_hbm_bytes``, the share of the once-per-step fp8 weight casts (``Layout.fp8_recipe``,
    :mod:`simgrid.model.fp8_kernels`), which a recompute does not redo; 0 without fp8."""
    fp8_weight_fwd_kernels: int = 0
    """Of ``fwd_kernels``, those casts' launches."""


def block_kernels(model: ModelSpec, layout: Layout, block: int) -> BlockKernels:
    """HBM bytes, launches and GEMM shape of one sub-block for one micro-batch on one tp rank."""
    kind, _ = block_kind(model, block)
    tp, d = layout.tp, layout.param_bytes
    h, b = model.hidden_size, layout.micro_batch_size
    tokens = b * local_seq_length(model, layout.cp)  # this rank's query tokens; keys span the whole sequence
    # GEMMs see the whole sequence (sequence parallelism all-gathers before them); element-wise work on
    # the residual stream runs on the sequence shard.
    hidden = tokens * h * d // (tp if layout.sequence_parallel else 1)
    dropout = uses_dropout(model, layout)
    mask = hidden // d * MASK_BYTES if dropout else 0
    bias = model.bias

    if kind == "embed":
        fwd = 2 * tokens * h * d  # gather: read rows, write
        bwd = 3 * tokens * h * d  # scatter-add into the gradient rows: read dY, read + write rows
        fwd_k, bwd_k = 1 + (2 if tp > 1 else 0), 1  # vocab-parallel masking: build mask, zero rows
        if model.position == "learned":
            fwd += 3 * hidden
            bwd += 3 * hidden
            fwd_k, bwd_k = fwd_k + 1, bwd_k + 1
        if dropout:
            fwd += 2 * hidden + mask
            bwd += 2 * hidden + mask
            fwd_k, bwd_k = fwd_k + 1, bwd_k + 1
        return BlockKernels(fwd_hbm_bytes=fwd, bwd_hbm_bytes=bwd, fwd_kernels=fwd_k, bwd_kernels=bwd_k,
                            gemm_mnk=(0, 0, 0))

    if kind == "head":
        extra = _eager_extra(model, layout, kind)
        logits = tokens * local_vocab(model, tp)
        megatron = layout.kernel_fusion == "fused"
        loss_fwd = MEGATRON_LOSS_FWD_BYTES_PER_LOGIT_EXTRA if megatron else LOSS_FWD_BYTES_PER_LOGIT_EXTRA
        loss_bwd = LOSS_BWD_BYTES_PER_LOGIT_EXTRA if megatron else EAGER_LOSS_BWD_BYTES_PER_LOGIT_EXTRA
        fwd = 2 * hidden + logits * (d + loss_fwd) + extra[0]
        bwd = 3 * hidden + logits * (d + loss_bwd) + extra[1]
        # norm and GEMM / norm backward and 2 GEMMs, then the loss: Megatron's MEGATRON_LOSS_KERNELS; PyTorch's
        # cast, log_softmax, nll_loss (EAGER_LOSS_FWD_KERNELS) / zero-fill, target scatter, log-softmax
        # backward, cast.
        loss_k = MEGATRON_LOSS_KERNELS if megatron else (EAGER_LOSS_FWD_KERNELS, 4)
        fwd_k, bwd_k = 2 + loss_k[0], 3 + loss_k[1]
        return BlockKernels(fwd_hbm_bytes=fwd, bwd_hbm_bytes=bwd, fwd_kernels=fwd_k + extra[2], bwd_kernels=bwd_k + extra[3],
                            gemm_mnk=(tokens, local_vocab(model, tp), h))

    norm_fwd, norm_bwd = 2 * hidden, 3 * hidden
    residual_fwd, residual_bwd, residual_sum = 3 * hidden + mask, 2 * hidden + mask, 3 * hidden
    extra = _eager_extra(model, layout, kind)
    if any(extra):
        base = block_kernels(model, dataclasses.replace(layout, kernel_fusion="fused"), block)
        norm = _eager_extra(model, layout, "head")  # the head's extra is its norm's alone
        return dataclasses.replace(base, fwd_hbm_bytes=base.fwd_hbm_bytes + extra[0],
                                   bwd_hbm_bytes=base.bwd_hbm_bytes + extra[1],
                                   fwd_kernels=base.fwd_kernels + extra[2], bwd_kernels=base.bwd_kernels + extra[3],
                                   norm_fwd_hbm_bytes=base.norm_fwd_hbm_bytes + (norm[0] if base.norm_fwd_kernels else 0),
                                   norm_fwd_kernels=base.norm_fwd_kernels + (norm[2] if base.norm_fwd_kernels else 0))
    if kind == "attn":
        core = _flash_core(model, layout) if layout.flash_attention else _unfused_core(model, layout)
        fwd = norm_fwd + core.fwd_bytes + residual_fwd
        bwd = norm_bwd + core.bwd_bytes + residual_bwd + residual_sum
        # norm, QKV, <core>, out-proj, residual / residual, out-proj I and W, <core backward>, QKV I and W,
        # norm, residual-branch sum.
        fwd_k, bwd_k = 4 + core.fwd_kernels, 1 + 2 + core.bwd_kernels + 2 + 1 + 1
        if model.position == "rope":
            qk = tokens * (local_q_heads(model, tp) + local_kv_heads(model, tp)) * model.head_dim * d
            fwd, bwd, fwd_k, bwd_k = fwd + 2 * qk, bwd + 2 * qk, fwd_k + 1, bwd_k + 1
        if bias:
            bwd += tokens * qkv_width(model, tp) * d + hidden
            bwd_k += 2
        return _with_fp8(BlockKernels(fwd_hbm_bytes=fwd, bwd_hbm_bytes=bwd, fwd_kernels=fwd_k, bwd_kernels=bwd_k,
                                      gemm_mnk=(tokens, qkv_width(model, tp), h), core_fwd_hbm_bytes=core.fwd_bytes,
                                      core_fwd_kernels=core.fwd_kernels, residual_fwd_hbm_bytes=residual_fwd,
                                      norm_fwd_hbm_bytes=norm_fwd, norm_fwd_kernels=1),
                         fp8_traffic(model, layout, kind))

    if is_moe_block(model, block):
        moe = moe_traffic(model, layout, dropout_mask_bytes=MASK_BYTES if dropout else 0)
        return _with_fp8(BlockKernels(fwd_hbm_bytes=moe.fwd_hbm_bytes, bwd_hbm_bytes=moe.bwd_hbm_bytes,
                                      fwd_kernels=moe.fwd_kernels, bwd_kernels=moe.bwd_kernels, gemm_mnk=moe.gemm_mnk),
                         fp8_moe_traffic(model, layout))
    inner = tokens * (model.ffn_size // tp) * d
    act_fwd, act_bwd = (3 * inner, 5 * inner) if model.gated_mlp else (2 * inner, 3 * inner)
    fwd = norm_fwd + act_fwd + residual_fwd
    bwd = norm_bwd + act_bwd + residual_bwd + residual_sum
    fwd_k, bwd_k = 5, 1 + 2 + 1 + 2 + 1 + 1  # norm, fc1, act, fc2, residual / backwards
    if bias:
        bwd += tokens * mlp_in_width(model, tp) * d + hidden
        bwd_k += 2
    return _with_fp8(BlockKernels(fwd_hbm_bytes=fwd, bwd_hbm_bytes=bwd, fwd_kernels=fwd_k, bwd_kernels=bwd_k,
                                  gemm_mnk=(tokens, mlp_in_width(model, tp), h), residual_fwd_hbm_bytes=residual_fwd,
                                  norm_fwd_hbm_bytes=norm_fwd, norm_fwd_kernels=1),
                     fp8_traffic(model, layout, kind))


def _with_fp8(kernels: BlockKernels, f8: FP8Traffic) -> BlockKernels:
    """A sub-block's kernels plus Transformer Engine's fp8 casts (:mod:`simgrid.model.fp8_kernels`)."""
    if f8 == NO_FP8:
        return kernels
    return dataclasses.replace(kernels, fwd_hbm_bytes=kernels.fwd_hbm_bytes + f8.fwd_bytes,
                               bwd_hbm_bytes=kernels.bwd_hbm_bytes + f8.bwd_bytes,
                               fwd_kernels=kernels.fwd_kernels + f8.fwd_kernels,
                               bwd_kernels=kernels.bwd_kernels + f8.bwd_kernels,
                               fp8_weight_fwd_hbm_bytes=f8.weight_fwd_bytes,
                               fp8_weight_fwd_kernels=f8.weight_fwd_kernels)


#: PyTorch-eager bytes per element of torchtitan's RMSNorm (``_norm(x.float()).type_as(x) * weight``,
#: torchtitan/models/norms.py): forward cast 2+4, pow 4+4, mean 4, scale 4+4, cast back 4+2, weight 2+2 = 36;
#: backward through the same chain (weight, cast, scale with its row-sum, pow, the two input-gradient terms
#: summed, cast) about 60. A fused kernel reads and writes once: 4 forward, 6 backward.
EAGER_RMSNORM_BYTES = (36, 60)
#: Eager rotary on each Q and K element (``view_as_complex(x.float())``, complex multiply, ``type_as``;
#: torchtitan/models/llama/model.py apply_rotary_emb): cast 2+4, multiply 4+4, cast 4+2 = 20 each way,
#: against 4 for a fused rotary kernel.
EAGER_ROPE_BYTES = 20


def _eager_extra(model: ModelSpec, layout: Layout, kind: str) -> tuple[int, int, int, int]:
    """Extra (forward bytes, backward bytes, forward launches, backward launches) of PyTorch eager over the
    fused kernels, for one block on one tp rank (torchtitan's Llama code: models/llama/model.py and
    models/norms.py at commits 528cab9 and 9dec370). Zero for ``kernel_fusion = "fused"``."""
    if layout.kernel_fusion == "fused" or kind == "embed":
        return 0, 0, 0, 0
    tp, d = layout.tp, layout.param_bytes
    tokens = layout.micro_batch_size * local_seq_length(model, layout.cp)
    elems = tokens * model.hidden_size // (tp if layout.sequence_parallel else 1)
    fwd = bwd = fwd_k = bwd_k = 0
    if model.norm == "rmsnorm" and layout.kernel_fusion == "eager":  # LayerNorm is one native kernel eagerly
        # forward: x.float(), pow, mean, + eps, rsqrt, multiply, type_as, weight multiply = 8 launches, 7 more
        # than a fused norm (torchtitan/models/norms.py RMSNorm._norm and forward at 528cab9 and 9dec370; HF's
        # LlamaRMSNorm runs the same eight). Until session 10 the forward extra was 6.
        fwd, bwd, fwd_k, bwd_k = (EAGER_RMSNORM_BYTES[0] - 4) * elems, (EAGER_RMSNORM_BYTES[1] - 6) * elems, 7, 10
    if kind == "head":
        return fwd, bwd, fwd_k, bwd_k
    full = tokens * model.hidden_size * d  # the projections' (all-gathered) input and its gradient
    if kind == "attn":
        heads_q, heads_kv = local_q_heads(model, tp), local_kv_heads(model, tp)
        out = tokens * heads_q * model.head_dim * d
        # attention output transpose(1, 2).contiguous() (a copy each way); Q, K and V are separate GEMMs, so
        # autograd sums three input gradients (two adds of read 2, write 1).
        fwd, bwd, fwd_k, bwd_k = fwd + 2 * out, bwd + 2 * out + 6 * full, fwd_k + 1, bwd_k + 3
        if model.position == "rope":
            qk = tokens * (heads_q + heads_kv) * model.head_dim
            extra = (EAGER_ROPE_BYTES - 4) * qk
            fwd, bwd, fwd_k, bwd_k = fwd + extra, bwd + extra, fwd_k + 4, bwd_k + 4
        if heads_q > heads_kv:
            # GQA: repeat_kv's expand + reshape copies K and V out to every query head before SDPA (torchtitan
            # models/llama/model.py at 528cab9 lines 112-120 and 195-196, 9dec370 lines 116 and 201-202; one
            # copy each, read the kv heads, write the query heads); its backward, expand's sum over the
            # repeats, reads the query-head gradients and writes the kv-head ones: one reduction each.
            rep = 2 * tokens * model.head_dim * (heads_q + heads_kv) * d
            fwd, bwd, fwd_k, bwd_k = fwd + rep, bwd + rep, fwd_k + 2, bwd_k + 2
        return fwd, bwd, fwd_k, bwd_k
    if model.gated_mlp:
        inner = tokens * (model.ffn_size // tp) * d
        # silu (r, w) then multiply (2r, w): 5 against 3; backward: two products (3 each) and silu's (3): 9
        # against 5. gate and up are separate GEMMs: one more input-gradient add.
        fwd, bwd, fwd_k, bwd_k = fwd + 2 * inner, bwd + 4 * inner + 3 * full, fwd_k + 1, bwd_k + 3
    return fwd, bwd, fwd_k, bwd_k


class _Core(NamedTuple):
    """HBM bytes and launches of the attention core (between the QKV and the out-projection GEMMs)."""

    fwd_bytes: int
    bwd_bytes: int
    fwd_kernels: int
    bwd_kernels: int


#: Longest sequence Megatron-LM's causal fused softmax (``scaled_upper_triang_masked_softmax``) takes:
#: ``FusedScaleMaskSoftmax.is_kernel_available`` requires ``16 < sk <= 2048`` in the SC'21 code (v2.5,
#: megatron/model/fused_softmax.py line 132) and ``<= 4096`` in the 2022 code (commit 2755bcb87b, line 171).
#: Beyond it Megatron falls back to PyTorch's masked_fill + softmax, priced here as the full-row kernel.
MEGATRON_CAUSAL_SOFTMAX_MAX_SEQ = 4096


def causal_softmax_read_fraction(seq_length: int) -> float:
    """Share of the ``s x s`` scores Megatron-LM's causal fused softmax reads: the kernel for row ``r`` loads
    only its ``r + 1`` unmasked elements (``batch_element_count = local_seq = blockIdx.x + 1`` guards every
    load, megatron/fused_kernels/scaled_upper_triang_masked_softmax.h lines 131-162 forward, 251-292 backward,
    v2.5 and 2022 alike) and writes the whole row (zeros above the diagonal, lines 212-224 and 319), so it
    reads ``s (s + 1) / 2`` of the ``s^2`` elements."""
    return (seq_length + 1) / (2 * seq_length)


def _megatron_causal_softmax(model: ModelSpec, layout: Layout) -> bool:
    """Whether the core's softmax is Megatron-LM's causal fused kernel (fused kernels, 16-bit scores, every
    query against every key of its own sequence: no context parallelism, within the kernel's length limit)."""
    return (layout.kernel_fusion == "fused" and layout.param_bytes == 2 and layout.cp == 1
            and 16 < model.seq_length <= MEGATRON_CAUSAL_SOFTMAX_MAX_SEQ)


def _unfused_core(model: ModelSpec, layout: Layout) -> _Core:
    """QK^T, scale+mask+softmax, (dropout,) PV with the s x s scores in HBM (Megatron-LM SC'21 / 2022).

    Checked against Megatron-LM's ``ParallelAttention.forward`` (megatron/model/transformer.py, v2.5 lines
    188-354; the 2022 ``CoreAttention``, commit 2755bcb87b, is the same sequence) and PyTorch's autograd
    formulas. Forward: ``baddbmm`` (beta 0, the 1/sqrt(d) scale in its epilogue) on views of the QKV output
    (``split_tensor_along_last_dim`` returns strided views and ``view``/``transpose`` feed cuBLAS their strides:
    no copy), the fused scale+mask+softmax, the attention dropout, ``bmm`` with V, and the
    ``permute(2, 0, 1, 3).contiguous()`` copy of the context. Backward: the two ``bmm`` gradients, dropout's
    masked scale, the softmax backward, the two ``baddbmm`` gradients each followed by a multiply by ``alpha``
    (autograd's ``grad.bmm(batch2^T) * alpha``: alpha = 1/norm_factor is never 1), and the ``torch.split``
    backward, a ``cat`` of dQ, dK and dV into the QKV gradient; the context copy's gradient arrives contiguous
    and reaches cuBLAS as a strided view (no copy back).
    """
    d = layout.param_bytes
    heads = local_q_heads(model, layout.tp) * layout.micro_batch_size
    # Under context parallelism the rank's s / cp queries meet all s keys.
    scores = heads * local_seq_length(model, layout.cp) * model.seq_length * d
    # ``context``: one of Q, K, V, O or their gradients, [b * heads, s, head_dim].
    context = heads * local_seq_length(model, layout.cp) * model.head_dim * d
    # The core's batched GEMMs move the s x s operands too (QK^T writes S, PV reads P; backward dP = dO V^T
    # writes dP, dV, dQ and dK read P and dS): that traffic is priced with the GEMMs by their shapes
    # (simgrid.model.gemms, simgrid.costs.gemm: output write in the epilogue, inputs as the memory
    # ceiling), not here. Softmax: read, write (forward); read dP and P, write dS (backward).
    fwd, bwd = 2 * scores, 3 * scores
    # The batched PV output [b, heads, s, d] is permuted to [s, b, heads * d] for the output projection with
    # a copy (``context_layer.permute(2, 0, 1, 3).contiguous()``, v2.5 transformer.py line 338).
    fwd_k, bwd_k = 3 + 1, 2 + 1 + 2  # QK^T, softmax, PV, copy / PV's two GEMMs, softmax, QK^T's two GEMMs
    fwd += 2 * context
    if _megatron_causal_softmax(model, layout):
        read = causal_softmax_read_fraction(model.seq_length)
        fwd += round(scores * (read - 1))  # reads the lower triangle, writes the full row
        bwd += round(2 * scores * (read - 1))  # reads dP and P on the lower triangle, writes dS
    if layout.kernel_fusion == "fused":
        # Megatron-LM's core, whichever softmax runs: baddbmm's backward scales dQ and dK by alpha (read,
        # write each), and split's backward cats dQ, dK and dV into the [s, b, heads * 3d] QKV gradient
        # (read 3, write 3); these are autograd's, so they do not depend on the softmax kernel.
        bwd, bwd_k = bwd + 2 * 2 * context + 6 * context, bwd_k + 2 + 1
    else:
        # Eager PyTorch attention: the context gradient copied back, as the forward.
        bwd, bwd_k = bwd + 2 * context, bwd_k + 1
    if uses_dropout(model, layout):
        drop = scores * (2 * d + MASK_BYTES) // d
        fwd, bwd, fwd_k, bwd_k = fwd + drop, bwd + drop, fwd_k + 1, bwd_k + 1
    return _Core(fwd, bwd, fwd_k, bwd_k)


def _flash_core(model: ModelSpec, layout: Layout) -> _Core:
    """A fused FlashAttention core (Dao et al. 2022; Dao 2023, FA2).

    The core reads Q, K, V and writes the output O and one fp32 log-sum-exp per row and head (forward);
    the backward's pre-pass reads dO and O (``D = rowsum(dO * O)``) and the main kernel reads Q, K, V, O,
    dO and the statistics and writes dQ, dK, dV. The s x s scores stay in on-chip memory, so no term grows
    with s^2, and the attention dropout mask is regenerated from the RNG state instead of stored.
    """
    tp, d = layout.tp, layout.param_bytes
    tokens = layout.micro_batch_size * local_seq_length(model, layout.cp)
    q = tokens * local_q_heads(model, tp) * model.head_dim * d
    # K and V span the whole sequence (gathered over the context-parallel group when cp > 1).
    kv = layout.micro_batch_size * model.seq_length * local_kv_heads(model, tp) * model.head_dim * d
    stats = tokens * local_q_heads(model, tp) * SOFTMAX_STATS_BYTES
    fwd = 2 * q + 2 * kv + stats  # read Q, K, V; write O and the statistics
    bwd = 2 * q + (3 * q + 2 * kv + stats) + (q + 2 * kv)  # pre-pass; main reads; writes dQ, dK, dV
    return _Core(fwd, bwd, 1, 2)  # one fused forward kernel; backward pre-pass and main kernel
