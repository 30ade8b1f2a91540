"""Floating-point operations per sub-block and per training iteration.

Counting convention (Narayanan et al. SC'21, section 5.1, eq. 3): only matrix multiplies count; an
``(m x k) @ (k x n)`` product is ``2mnk`` FLOPs. A linear layer's backward is two products of the same
size, one for the input gradient (I) and one for the weight gradient (W). The attention core (``Q K^T``
and ``softmax @ V``, ``4 b s^2 h`` forward with no causal-mask discount, as eq. 3 counts it) has no
weights, so its backward is input-gradient only, twice the forward. Element-wise work (norms, softmax,
dropout, GeLU/SwiGLU, residual adds, bias adds) is memory-bound and is costed as HBM traffic in
:mod:`simgrid.model.kernels`, not here; that is why the per-block sum equals eq. 3 exactly for a GPT shape.

Per-block figures are for one micro-batch of ``b`` sequences on one tensor-parallel rank: Megatron splits
the QKV/MLP-in columns, the out-projection/MLP-out rows, the attention heads and the vocabulary by ``tp``.
"""

from __future__ import annotations

from dataclasses import dataclass

from simgrid.errors import ModelError
from simgrid.layout.spec import RecomputePolicy
from simgrid.model.blocks import block_kind, local_q_heads, local_seq_length, local_vocab
from simgrid.model.moe import is_moe_block, moe_block_flops, num_moe_layers
from simgrid.model.params import matmul_params, mlp_in_width, qkv_width
from simgrid.model.selective_op import recompute_gemms
from simgrid.model.spec import ModelSpec


@dataclass(frozen=True, kw_only=True)
class BlockFlops:
    """FLOPs of one sub-block for one micro-batch on one tensor-parallel rank."""

    fwd: float
    """Forward pass."""
    bwd_input: float
    """Backward, input-gradient part (I)."""
    bwd_weight: float
    """Backward, weight-gradient part (W)."""
    attention_core_fwd: float
    """Forward FLOPs of ``Q K^T`` and ``P V`` (what selective recompute repeats); 0 outside attention."""
    attention_core_bwd: float = 0.0
    """Backward FLOPs of the attention core (all input-gradient, part of ``bwd_input``); 0 outside attention."""
    selective_op_fwd: float = 0.0
    """Forward FLOPs of the linears torchtitan's per-op checkpointing does not save, which its recompute
    reruns (:func:`simgrid.model.selective_op.recompute_gemms`); 0 outside transformer sub-blocks."""

    def recompute(self, policy: RecomputePolicy, *, recomputable: bool) -> float:
        """FLOPs repeated before the backward under a recompute policy.

        Full recompute reruns the whole forward of transformer sub-blocks (Megatron checkpoints layer
        inputs; the embedding and the head are not recomputed, which is why eq. 3's vocabulary term keeps
        its factor 6 under full recompute); selective reruns the attention core only (Korthikanti et al.
        2022, section 5); selective-op reruns the linears torchtitan's per-op policy does not save (never the
        fused core, whose outputs it saves). This is the one rule: the program's recompute ops
        (:func:`simgrid.model.cost.block_cost`) and the iteration count below both read it; ``full`` here is a
        reentrant checkpoint's, and block_cost subtracts the GEMMs a non-reentrant one's early stop skips
        (:mod:`simgrid.model.early_stop`), so executed FLOPs (HFU) follow what runs.
        """
        if policy == "full":
            return self.fwd if recomputable else 0.0
        if policy == "selective":
            return self.attention_core_fwd
        if policy == "selective-op":
            return self.selective_op_fwd if recomputable else 0.0
        return 0.0


#: Rows of a FlashAttention tile (Dao 2023, "FlashAttention-2", section 3: blocks of 64-128 query and key rows;
#: 128 is the forward's query tile at head dim 128).
FLASH_TILE_TOKENS = 128


def causal_tile_fraction(seq_length: int) -> float:
    """Share of the ``s x s`` score tiles a causal FlashAttention kernel computes.

    With ``n = ceil(s / tile)`` tiles per side only the ``n (n + 1) / 2`` tiles on or below the diagonal hold
    unmasked scores; the kernel skips the others (Dao 2023, section 3.1.1, about 1.7-1.8x faster than
    without the mask; its benchmarks count causal attention as half the FLOPs). A decoder-only model is
    causal, so a fused core does ``(n + 1) / (2 n)`` of the unmasked work: 0.53 at s = 2048. The unfused
    core computes every score and masks afterwards, so it gets no such discount.
    """
    n = -(-seq_length // FLASH_TILE_TOKENS)
    return (n + 1) / (2 * n)


def block_flops(model: ModelSpec, block: int, *, micro_batch_size: int = 1, tp: int = 1,
                flash_attention: bool = False, cp: int = 1, etp: int = 1,
                routed_factor: float | None = None) -> BlockFlops:
    """Matmul FLOPs of one sub-block (see module docstring for the convention).

    ``flash_attention``: the backward recomputes ``S = Q K^T`` before ``dV, dP, dQ, dK`` (Dao et al. 2022,
    Algorithm 4; Dao 2023, Algorithm 2), so the core's backward is 10 instead of 8 ``b s^2 h`` per layer, and
    the fused kernel skips the tiles the causal mask hides (:func:`causal_tile_fraction`): these are the
    FLOPs the GPU executes, while the MFU numerator (:func:`model_flops_per_iteration`) keeps eq. 3's count.
    ``cp``: the rank holds ``s / cp`` query tokens that attend to all ``s`` keys (gathered from its context-
    parallel group), so every term is divided by ``cp``, the core's ``s^2`` as ``(s / cp) * s``.
    A MoE sub-block is :func:`simgrid.model.moe.moe_block_flops` (``etp``: expert tensor-parallel degree;
    ``routed_factor``: routed tokens over balanced, default the model's load imbalance).
    """
    if micro_batch_size <= 0 or tp <= 0 or cp <= 0:
        raise ModelError(f"micro_batch_size = {micro_batch_size}, tp = {tp} and cp = {cp} must be positive")
    kind, _ = block_kind(model, block)
    h, s = model.hidden_size, model.seq_length
    s_q = local_seq_length(model, cp)
    tokens = micro_batch_size * s_q
    if kind == "embed":
        return BlockFlops(fwd=0.0, bwd_input=0.0, bwd_weight=0.0, attention_core_fwd=0.0)
    if kind == "head":
        logits = 2.0 * tokens * h * local_vocab(model, tp)
        return BlockFlops(fwd=logits, bwd_input=logits, bwd_weight=logits, attention_core_fwd=0.0)
    if kind == "attn":
        linear = 2.0 * tokens * h * qkv_width(model, tp) + 2.0 * tokens * (local_q_heads(model, tp) * model.head_dim) * h
        # Q K^T and P V: each 2 * s * s * head_dim per local head per sequence (eq. 3's 4 b s^2 h).
        core = 4.0 * micro_batch_size * s_q * s * local_q_heads(model, tp) * model.head_dim
        if flash_attention:
            core *= causal_tile_fraction(s)
        core_bwd = (2.5 if flash_attention else 2.0) * core
        return BlockFlops(fwd=linear + core, bwd_input=linear + core_bwd, bwd_weight=linear,
                          attention_core_fwd=core, attention_core_bwd=core_bwd,
                          selective_op_fwd=_selective_op_fwd(model, block, micro_batch_size, tp, cp))
    if is_moe_block(model, block):
        moe = moe_block_flops(model, micro_batch_size=micro_batch_size, tp=tp, cp=cp, etp=etp,
                              routed_factor=routed_factor)
        return BlockFlops(fwd=moe.fwd, bwd_input=moe.bwd_input, bwd_weight=moe.bwd_weight, attention_core_fwd=0.0)
    linear = 2.0 * tokens * h * mlp_in_width(model, tp) + 2.0 * tokens * (model.ffn_size // tp) * h
    return BlockFlops(fwd=linear, bwd_input=linear, bwd_weight=linear, attention_core_fwd=0.0,
                      selective_op_fwd=_selective_op_fwd(model, block, micro_batch_size, tp, cp))


def _selective_op_fwd(model: ModelSpec, block: int, micro_batch_size: int, tp: int, cp: int) -> float:
    gemms = recompute_gemms(model, block, micro_batch_size=micro_batch_size, tp=tp, cp=cp)
    return float(sum(2 * m * n * k * count for m, n, k, count in gemms))


def model_flops_per_iteration(model: ModelSpec, global_batch: int, *, recompute: RecomputePolicy = "none") -> float:
    """FLOPs of one iteration over ``global_batch`` sequences, summed over all blocks (no tp split).

    With ``recompute="none"`` this is the MFU numerator: for a GPT shape it equals Narayanan et al. SC'21
    eq. 3 without recompute, ``72 B s L h^2 (1 + s/(6h) + V/(12 h L))`` (Korthikanti et al. 2022, section
    6.3); with ``"full"`` it equals eq. 3 as printed, ``96 B s L h^2 (1 + s/(6h) + V/(16 L h))``. For
    gated MLPs and GQA it is the same count with the real matrix shapes. ``"selective"`` adds the attention
    core forward (``4 B s^2 h`` per layer); note Korthikanti's HFU formula adds ``12 B s^2 h`` per layer
    (``s/(3h)`` instead of ``s/(6h)``), more than a rerun of the core forward costs. ``"selective-op"`` adds
    the linears torchtitan's per-op checkpointing reruns (:mod:`simgrid.model.selective_op`). A MoE layer counts the
    ``k`` experts each token is routed to with balanced routing (the load imbalance is not model work).
    """
    if global_batch <= 0:
        raise ModelError(f"global_batch = {global_batch} must be a positive number of sequences")
    total = 0.0
    for block, copies in _distinct_blocks(model):
        f = block_flops(model, block, micro_batch_size=1, routed_factor=1.0)
        kind, _ = block_kind(model, block)
        per_sequence = f.fwd + f.bwd_input + f.bwd_weight + f.recompute(recompute, recomputable=kind in ("attn", "mlp"))
        total += copies * per_sequence
    return total * global_batch


def megatron_eq3_flops(model: ModelSpec, global_batch: int, *, full_recompute: bool = False) -> float:
    """Narayanan et al. SC'21 eq. 3 literally, for GPT shapes (f = 4h, no GQA).

    ``96 B s L h^2 (1 + s/(6h) + V/(16 L h))`` with full recompute (as printed in the paper) and
    ``72 B s L h^2 (1 + s/(6h) + V/(12 h L))`` without (Korthikanti et al. 2022, section 6.3).
    """
    b, s, layers, h, v = global_batch, model.seq_length, model.num_layers, model.hidden_size, model.vocab_size
    if full_recompute:
        return 96.0 * b * s * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))
    return 72.0 * b * s * layers * h * h * (1 + s / (6 * h) + v / (12 * h * layers))


def flops_6n_attention(model: ModelSpec, global_batch: int) -> float:
    """Model FLOPs by Chowdhery et al. 2022 (PaLM), appendix B: ``6N + 12 L h s`` per token.

    ``N`` is :func:`simgrid.model.params.matmul_params`: it excludes the input embedding (and learned
    positions), because a lookup does no multiply-adds, but includes the ``h x V`` output projection,
    which is a real matmul even when tied. ``12 L h s`` is the attention core (``Q K^T`` and ``P V``,
    forward and backward) per token. Against eq. 3 the only difference is the biases and norms in ``6N``.
    """
    if global_batch <= 0:
        raise ModelError(f"global_batch = {global_batch} must be a positive number of sequences")
    tokens = global_batch * model.seq_length
    per_token = 6.0 * matmul_params(model) + 12.0 * model.num_layers * model.hidden_size * model.seq_length
    return per_token * tokens


def _distinct_blocks(model: ModelSpec) -> tuple[tuple[int, int], ...]:
    """(representative block, copies): embedding, attention, dense MLP, MoE MLP and head (layers of one kind
    have the same shapes; a MoE model's dense layers come first)."""
    moe_layers = num_moe_layers(model)
    dense = model.num_layers - moe_layers
    blocks = [(0, 1), (1, model.num_layers)]
    if dense:
        blocks.append((2, dense))
    if moe_layers:
        blocks.append((2 + 2 * dense, moe_layers))
    blocks.append((2 * model.num_layers + 1, 1))
    return tuple(blocks)
