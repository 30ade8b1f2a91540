"""The matrix multiplies of each sub-block, by shape: what the GPU cost model prices one by one.

A linear layer ``Y = X W`` over ``T`` tokens (``T x h_in`` by ``h_in x h_out``) is one forward GEMM
``(T, h_out, h_in)`` and two backward ones (``m, n, k`` of an ``(m x k) @ (k x n)`` product): the input
gradient ``dX = dY W^T`` ``(T, h_in, h_out)`` (I) and the weight gradient ``dW = X^T dY``
``(h_in, h_out, T)`` (W). Megatron-LM's layer (Narayanan et al. SC'21, section 4.2; Shoeybi et al. 2019,
Fig. 3) has a fused QKV projection, the attention output projection, the MLP's first matrix (gate and up
fused for SwiGLU, as Megatron-Core's ``linear_fc1``) and second matrix, and the vocabulary projection of
the head, each split by ``tp`` (columns of QKV and fc1, rows of the output projection and fc2, vocabulary
rows). Under sequence parallelism the GEMMs still see all ``T`` tokens (the input is all-gathered first).

The unfused attention core is two batched GEMMs per head and sequence (``b * heads`` batch members):
``S = Q K^T`` ``(s_q, s_kv, d)`` and ``O = P V`` ``(s_q, d, s_kv)``; its backward is four:
``dV = P^T dO`` ``(s_kv, d, s_q)``, ``dP = dO V^T`` ``(s_q, s_kv, d)``, ``dQ = dS K`` ``(s_q, d, s_kv)`` and
``dK = dS^T Q`` ``(s_kv, d, s_q)``. A batched GEMM is one launch whose grid holds every member's tiles, so
it is listed as one GEMM stacked along ``m`` (``b * heads * s_q`` rows): the same tiles and waves, the same
output and ``s x s`` operand traffic; only the small ``s x d`` operand is counted once instead of per member
(a few percent of the traffic). ``count`` in a ``(m, n, k, count)`` entry is always separate launches, one
after another, so an op that merges equal GEMMs of several layers costs what the layers' own ops cost. Their ``s x s`` operands are what makes them slow (small inner
dimension ``d``, or an ``s x s`` input read from HBM), which the GEMM cost model charges by shape. A fused
(FlashAttention) core has no GEMM here: its FLOPs are priced by the attention-kernel table.

Under Megatron-LM's gradient accumulation fusion (``Layout.grad_accumulation_fusion``) the weight-gradient
GEMMs do not write a fresh gradient: they accumulate into ``main_grad`` (beta = 1), so their epilogue reads and
writes a ``main_grad`` element (:func:`wgrad_accumulate_bytes` each way; ``BlockGemms.wgrad_accumulate_bytes``,
priced by :mod:`simgrid.costs.gemm`).

The FLOPs of every list sum exactly to :func:`simgrid.model.flops.block_flops` (a test checks it).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from simgrid.layout.spec import Layout
from simgrid.model.blocks import block_kind, local_q_heads, local_seq_length, local_vocab
from simgrid.model.moe import (
    fc1_width,
    is_moe_block,
    moe_spec,
    padded_tokens_per_local_expert,
    routed_tokens,
)
from simgrid.model.params import mlp_in_width, qkv_width
from simgrid.model.spec import ModelSpec

Gemm = tuple[int, int, int, int]
"""``(m, n, k, count)``: ``count`` products ``(m x k) @ (k x n)``, launched one after another."""


@dataclass(frozen=True, kw_only=True)
class BlockGemms:
    """GEMMs of one sub-block for one micro-batch on one tensor-parallel rank, by pass."""

    fwd: tuple[Gemm, ...]
    """Forward."""
    bwd_input: tuple[Gemm, ...]
    """Input-gradient backward (I), the unfused attention core's backward included."""
    bwd_weight: tuple[Gemm, ...]
    """Weight-gradient backward (W)."""
    core_fwd: tuple[Gemm, ...] = ()
    """The unfused attention core's forward GEMMs (what selective recompute reruns)."""
    wgrad_accumulate_bytes: int = 0
    """Bytes per element of the ``main_grad`` buffer the weight-gradient GEMMs accumulate into (their epilogue
    reads C and writes D, this many bytes each); 0: they write a fresh output in the compute dtype."""
    unquantized: frozenset[tuple[int, int, int]] = frozenset()
    """Shapes that stay 16-bit under fp8 beyond the attention core: a MoE sub-block's router and shared-expert
    gate (:func:`moe_gemms`)."""


MAIN_GRAD_FP32_BYTES = 4
"""Bytes of an fp32 ``main_grad`` element."""
MAIN_GRAD_16BIT_BYTES = 2
"""Bytes of a 16-bit ``main_grad`` element (Megatron-LM keeps the parameter dtype without fp32 accumulation)."""


def wgrad_accumulate_bytes(layout: Layout) -> int:
    """Bytes per ``main_grad`` element the weight-gradient GEMMs read and write (each) when they accumulate into it,
    0 when they write a fresh gradient. Megatron-Core (f2e5db4) allocates ``main_grad`` in fp32 when
    ``accumulate_allreduce_grads_in_fp32`` (forced for bf16; ``reduce_dtype = "fp32"`` here), else in the
    parameter dtype (megatron/core/distributed/distributed_data_parallel.py line 108), and its fused wgrad GEMM
    accumulates into either (megatron/core/tensor_parallel/layers.py lines 490-500: ``wgrad_gemm_accum_fp32`` /
    ``wgrad_gemm_accum_fp16``; Transformer Engine's linear passes ``out=main_grad``, ``accumulate=True``,
    ``out_dtype=main_grad.dtype``)."""
    if not layout.grad_accumulation_fusion:
        return 0
    fp32 = layout.reduce_dtype == "fp32" or layout.precision == "fp32"
    return MAIN_GRAD_FP32_BYTES if fp32 else MAIN_GRAD_16BIT_BYTES


def fp8_gemm_shapes(gemms: BlockGemms, layout: Layout, kind: str) -> frozenset[tuple[int, int, int]]:
    """``(m, n, k)`` of the sub-block's GEMMs that run in fp8 under ``layout.fp8_recipe`` (empty without it).

    Megatron-Core's transformer layer spec builds QKV and fc1 as Transformer Engine ``LayerNormLinear``
    (``TELayerNormColumnParallelLinear``) and the attention output projection and fc2 as TE ``Linear``
    (``TERowParallelLinear``): megatron/core/models/gpt/gpt_layer_specs.py lines 75-77 and 150-151 at core_r0.9.0.
    Under ``fp8_autocast`` each runs its forward, input-gradient and weight-gradient GEMM through ``fp8_gemm``
    (transformer_engine/pytorch/module/linear.py lines 206, 455 and 524 at v1.11; layernorm_linear.py likewise).
    The vocabulary projection is Megatron's own ``tensor_parallel.ColumnParallelLinear`` (gpt_model.py line 140),
    the embedding no GEMM, and the attention core (``TEDotProductAttention``) runs in fp8 only with the recipe's
    ``fp8_dpa``, off by default (transformer_engine/common/recipe/__init__.py line 106): those stay 16-bit. A core
    GEMM of the same shape as a linear one (never in a real model: it would need head dim = hidden) stays
    16-bit. A MoE sub-block's routed experts (TE ``GroupedLinear``: ``fp8_grouped_gemm`` in forward, dgrad and wgrad,
    grouped_linear.py lines 155, 346 and 396 at v1.11) and shared expert (TE linears, gpt_layer_specs.py lines
    264-267 at core_r0.10.0) run in fp8; its router and gate stay 16-bit (``BlockGemms.unquantized``). A routed
    GEMM of the same shape as the router stays 16-bit too (shape routing; never in a real model)."""
    if layout.fp8_recipe == "none" or kind not in ("attn", "mlp"):
        return frozenset()
    core = {g[:3] for g in gemms.core_fwd} | ({g[:3] for g in gemms.bwd_input[1:-1]} if kind == "attn" else set())
    linear = {g[:3] for g in (*gemms.fwd, *gemms.bwd_input, *gemms.bwd_weight)} - core - gemms.unquantized
    return frozenset(linear)


def _linear(tokens: int, h_in: int, h_out: int) -> tuple[Gemm, Gemm, Gemm]:
    """Forward, input-gradient and weight-gradient GEMMs of a ``h_in -> h_out`` linear layer."""
    return (tokens, h_out, h_in, 1), (tokens, h_in, h_out, 1), (h_in, h_out, tokens, 1)


def moe_gemms(model: ModelSpec, layout: Layout) -> BlockGemms:
    """Every GEMM of a MoE sub-block, shape by shape.

    Router ``(T_r, E, h)`` and the shared-expert gate ``(T_r, 1, h)`` on the rank's sequence shard; the shared
    expert as a dense MLP over the gathered ``T`` tokens split over tp. The routed experts' grouped GEMMs are
    listed stacked, as :attr:`simgrid.model.moe.MoETraffic.gemm_mnk` (a grouped kernel fills its waves with the
    tiles of every local expert): forward and input gradient with the ``E / ep`` experts' rows stacked along
    ``m``, the weight gradients (one ``h x n`` output per expert, inner dimension the expert's tokens) with the
    experts' outputs stacked along ``m``. Their FLOPs are :func:`simgrid.model.moe.moe_block_flops`' up to the
    rounding of tokens per expert (and, under fp8, the padding of each expert's tokens to a multiple of 16, which
    the GPU does compute). The router and gate are ``torch.nn.functional.linear`` in Megatron-Core (router.py line
    59, shared_experts.py line 87 at core_r0.10.0), never fp8 under Transformer Engine: ``unquantized``.
    """
    moe, h = moe_spec(model), model.hidden_size
    t_r = routed_tokens(model, layout.micro_batch_size, layout.tp, layout.cp)
    local = moe.num_experts // layout.ep
    m_e = padded_tokens_per_local_expert(model, layout)
    n1 = fc1_width(model, moe.expert_ffn_hidden_size) // layout.expert_tp
    f_l = moe.expert_ffn_hidden_size // layout.expert_tp
    router = _linear(t_r, h, moe.num_experts)
    gate = _linear(t_r, h, 1) if moe.shared_expert_gate else None
    rows = local * m_e
    fc1 = ((rows, n1, h, 1), (rows, h, n1, 1), (local * h, n1, m_e, 1))
    fc2 = ((rows, h, f_l, 1), (rows, f_l, h, 1), (local * f_l, h, m_e, 1))
    parts = [router, *([gate] if gate else []), fc1, fc2]
    if moe.shared_expert_ffn_hidden_size:
        tokens = layout.micro_batch_size * local_seq_length(model, layout.cp)
        f_s = moe.shared_expert_ffn_hidden_size
        parts += [_linear(tokens, h, fc1_width(model, f_s) // layout.tp), _linear(tokens, f_s // layout.tp, h)]
    return BlockGemms(fwd=tuple(p[0] for p in parts), bwd_input=tuple(p[1] for p in reversed(parts)),
                      bwd_weight=tuple(p[2] for p in reversed(parts)),
                      wgrad_accumulate_bytes=wgrad_accumulate_bytes(layout),
                      unquantized=frozenset(g[:3] for g in (*router, *(gate or ()))))


def block_gemms(model: ModelSpec, layout: Layout, block: int) -> BlockGemms:
    """The GEMMs of sub-block ``block`` (numbering of :mod:`simgrid.ir.ops`). Blocks of one kind share one
    (cached) object, so the lists of a stage's equal layers are the same tuples."""
    kind, _ = block_kind(model, block)
    return _kind_gemms(model, layout, kind, is_moe_block(model, block))


@lru_cache(maxsize=16384)
def _kind_gemms(model: ModelSpec, layout: Layout, kind: str, moe: bool) -> BlockGemms:
    tp, h = layout.tp, model.hidden_size
    s_q = local_seq_length(model, layout.cp)
    tokens = layout.micro_batch_size * s_q
    if kind == "embed":
        return BlockGemms(fwd=(), bwd_input=(), bwd_weight=())
    if moe:  # router, gate, grouped experts (stacked) and shared expert
        return moe_gemms(model, layout)
    acc = wgrad_accumulate_bytes(layout)
    if kind == "head":
        f, i, w = _linear(tokens, h, local_vocab(model, tp))
        return BlockGemms(fwd=(f,), bwd_input=(i,), bwd_weight=(w,), wgrad_accumulate_bytes=acc)
    if kind == "mlp":
        f1, i1, w1 = _linear(tokens, h, mlp_in_width(model, tp))
        f2, i2, w2 = _linear(tokens, model.ffn_size // tp, h)
        return BlockGemms(fwd=(f1, f2), bwd_input=(i2, i1), bwd_weight=(w2, w1), wgrad_accumulate_bytes=acc)
    fq, iq, wq = _linear(tokens, h, qkv_width(model, tp))
    fo, io, wo = _linear(tokens, h // tp, h)
    core: tuple[Gemm, ...] = ()
    core_bwd: tuple[Gemm, ...] = ()
    if not layout.flash_attention:
        s_kv, d = model.seq_length, model.head_dim
        heads = layout.micro_batch_size * local_q_heads(model, tp)
        q_rows, kv_rows = heads * s_q, heads * s_kv  # every (sequence, head) member stacked along m
        core = ((q_rows, s_kv, d, 1), (q_rows, d, s_kv, 1))
        core_bwd = ((kv_rows, d, s_q, 1), (q_rows, s_kv, d, 1), (q_rows, d, s_kv, 1), (kv_rows, d, s_q, 1))
    return BlockGemms(fwd=(fq, *core, fo), bwd_input=(io, *core_bwd, iq), bwd_weight=(wo, wq), core_fwd=core,
                      wgrad_accumulate_bytes=acc)
