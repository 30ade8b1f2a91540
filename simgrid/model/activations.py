"""Activation bytes each sub-block saves for its backward pass.

Per-tensor accounting of Korthikanti et al. 2022, section 4.1 (16-bit activations, 1-byte dropout masks),
written per tensor so that it generalises to GQA, gated MLPs, fp32 training and models without dropout:

attention sub-block (``T = b*s`` tokens, ``d`` bytes per element, ``hd`` head width)
  norm input ``T h d``; QKV input ``T h d``; Q ``T a hd d``; K and V ``T kv hd d`` each; softmax output
  ``a b s^2 d``; attention-dropout mask ``a b s^2`` and its output ``a b s^2 d``; out-projection input
  ``T a hd d``; residual-dropout mask ``T h``.  For GPT shapes: ``13 sbh + 5 a s^2 b`` bytes.
MLP sub-block
  norm input ``T h d``; first-matrix input ``T h d``; GeLU input ``T f d`` (SwiGLU: gate and up outputs,
  ``2 T f d``); second-matrix input ``T f d``; residual-dropout mask ``T h``.  GPT: ``21 sbh``.

Together ``34 sbh + 5 a s^2 b`` (Table 2, no parallelism). Tensor parallelism splits every tensor that
lives between the column- and row-parallel matmuls (heads, ``f``) by ``t`` and replicates the rest
(``10 sbh + 24 sbh/t``); sequence parallelism also splits the replicated ones (``34 sbh/t``); selective
recompute drops the ``a s^2 b`` tensors; torchtitan's per-op selective checkpointing (``selective-op``) keeps
what :func:`simgrid.model.selective_op.saved_activation_bytes` lists; full recompute keeps only the layer input (``2 sbh``; under
sequence parallelism the stored input is the ``s/t`` shard Megatron keeps, so ``2 sbh/t``). With GQA and
``tp > kv_heads`` each rank stores its one replicated KV head.

Dropout: Korthikanti counts two dropout masks per layer (GPT recipe, dropout 0.1). The Llama recipe
trains without dropout, and ModelSpec has no dropout field, so :func:`uses_dropout` takes the GPT recipe
(biases) to mean dropout on unless the layout states the run's own setting (``Layout.dropout``: MLPerf's GPT-3
trains with dropout 0); with dropout off the masks vanish and the attention probabilities are stored
once (``a b s^2 d``).

Embedding and head (not recomputed by Megatron's full recompute, which checkpoints transformer layers):
the embedding saves its int64 token ids (``8 T`` bytes) and the embedding-dropout mask (``T h``); the head
saves the final-norm input and the output-layer input (``T h d`` each) and, for the loss, the fp32 softmax
of the logits that Megatron's vocabulary-parallel cross entropy keeps (``4 T V/t`` bytes; the 16-bit logits
themselves are freed once cast). Transient peaks inside a kernel (e.g. logits before the cast) are not counted.
"""

from __future__ import annotations

from simgrid.errors import ModelError
from simgrid.layout.spec import CheckpointImpl, Layout, RecomputePolicy
from simgrid.model.blocks import block_kind, local_kv_heads, local_q_heads, local_seq_length, local_vocab
from simgrid.model.moe import is_moe_block, moe_activation_bytes
from simgrid.model.selective_op import saved_activation_bytes
from simgrid.model.spec import ModelSpec

#: Bytes of one dropout mask element (PyTorch stores boolean/uint8 masks).
MASK_BYTES = 1
#: Bytes of one token id (int64).
TOKEN_ID_BYTES = 8
#: The loss keeps its softmax in fp32 (Megatron-LM ``vocab_parallel_cross_entropy``).
LOSS_BYTES = 4
#: FlashAttention saves one fp32 softmax statistic (log-sum-exp) per query row and head.
SOFTMAX_STATS_BYTES = 4


def uses_dropout(model: ModelSpec, layout: Layout | None = None) -> bool:
    """Whether the run applies dropout: the layout's ``dropout`` where it states ``on`` or ``off``, otherwise
    the model's usual recipe, GPT (biases) yes (Megatron-LM's 0.1 defaults), Llama no."""
    if layout is not None and layout.dropout != "auto":
        return layout.dropout == "on"
    return model.bias


def block_activation_bytes(
    model: ModelSpec,
    block: int,
    *,
    micro_batch_size: int = 1,
    tp: int = 1,
    sequence_parallel: bool = False,
    recompute: RecomputePolicy = "none",
    dtype_bytes: int = 2,
    dropout: bool | None = None,
    flash_attention: bool = False,
    cp: int = 1,
    etp: int = 1,
    checkpoint_impl: CheckpointImpl = "reentrant",
    fp8: bool = False,
) -> int:
    """Bytes one sub-block keeps for backward, for one micro-batch on one tensor-parallel rank.

    ``fp8`` (Transformer Engine fp8 autocast, ``Layout.fp8_recipe``; dense sub-blocks without per-op
    checkpointing): each TE linear saves its fp8 input (or its fp8 transpose), 1 byte per element
    (``saved_inputmat`` / ``saved_inputmat_t`` in linear.py lines 287-299 at v1.11; LayerNormLinear saves its fp8
    ``ln_out``, layernorm_linear.py line 318): the QKV, fc1 and fc2 inputs shrink to 1 byte. The out-projection
    input shrinks too behind an unfused core; behind FlashAttention, whose kernel saves its 16-bit output
    ``O`` (the same tensor) itself, the fp8 copy is saved beside it (1 byte more).

    ``checkpoint_impl`` (``recompute = "full"`` only, :mod:`simgrid.model.early_stop`): ``non-reentrant-modules``
    checkpoints the attention and the MLP modules apart, so each sub-block keeps its norm's input and the
    module's input (the norm's output) instead of one layer input; the norm's per-token fp32 statistic is
    not counted. Early stop itself changes nothing here: what it skips is not saved.

    ``cp``: the rank keeps its own ``s / cp`` tokens of every tensor; its attention probabilities are
    ``(s / cp) x s`` (its queries against all keys). The gathered keys and values are not kept: the
    backward gathers them again (see :mod:`simgrid.model.comm`). A MoE sub-block is
    :func:`simgrid.model.moe.moe_activation_bytes` (``etp``: its expert tensor-parallel degree).
    """
    if micro_batch_size <= 0 or tp <= 0 or dtype_bytes <= 0 or cp <= 0:
        raise ModelError(
            f"micro_batch_size = {micro_batch_size}, tp = {tp}, cp = {cp} and dtype_bytes = {dtype_bytes} "
            "must be positive"
        )
    if recompute not in ("none", "selective", "full", "selective-op"):
        raise ModelError(f"recompute = {recompute!r} is not one of none, selective, full, selective-op")
    kind, _ = block_kind(model, block)
    has_dropout = uses_dropout(model) if dropout is None else dropout
    mask = MASK_BYTES if has_dropout else 0
    d = dtype_bytes
    h, s, b = model.hidden_size, local_seq_length(model, cp), micro_batch_size
    tokens = b * s
    # Tensors outside the column/row-parallel pair: replicated over tp unless sequence parallel.
    seq_split = tp if sequence_parallel else 1
    per_rank_hidden = tokens * h // seq_split

    if kind == "embed":
        return TOKEN_ID_BYTES * tokens + per_rank_hidden * mask
    if kind == "head":
        return 2 * per_rank_hidden * d + LOSS_BYTES * tokens * local_vocab(model, tp)
    if recompute == "full" and checkpoint_impl == "non-reentrant-modules":
        return 2 * per_rank_hidden * d
    if recompute == "full":
        # Only the layer input survives; it belongs to the layer's first sub-block.
        return per_rank_hidden * d if kind == "attn" else 0
    if recompute == "selective-op" and not is_moe_block(model, block):
        return saved_activation_bytes(model, block, micro_batch_size=b, tp=tp, cp=cp,
                                      sequence_parallel=sequence_parallel, dtype_bytes=d)
    if is_moe_block(model, block):
        return moe_activation_bytes(model, micro_batch_size=b, tp=tp, cp=cp, etp=etp, dtype_bytes=d,
                                    recompute=recompute, dropout_mask_bytes=mask, fp8=fp8)

    if kind == "attn":
        q_width = local_q_heads(model, tp) * model.head_dim
        kv_width = local_kv_heads(model, tp) * model.head_dim
        replicated = per_rank_hidden * (2 * d + mask)  # norm input, QKV input, residual-dropout mask
        split = tokens * (2 * q_width + 2 * kv_width) * d  # Q, K, V, out-projection input
        core = 0
        if flash_attention:
            # FlashAttention keeps Q, K, V and the output (counted above) plus one fp32 log-sum-exp per row
            # and head (Dao et al. 2022, Algorithm 2, "save L"); its dropout mask is regenerated from the RNG.
            core = local_q_heads(model, tp) * b * s * SOFTMAX_STATS_BYTES
        elif recompute != "selective":
            scores = local_q_heads(model, tp) * b * s * model.seq_length
            # softmax output, dropout mask and dropout output; without dropout the softmax output only.
            core = scores * (2 * d + mask) if has_dropout else scores * d
        if fp8:
            saved_o = flash_attention  # the fused core keeps the 16-bit output; the linear adds its fp8 copy
            replicated -= per_rank_hidden * (d - 1)
            split += tokens * q_width * (1 if saved_o else 1 - d)
        return replicated + split + core

    inner = model.ffn_size // tp
    replicated = per_rank_hidden * (2 * d + mask)  # norm input, first-matrix input, residual-dropout mask
    stored_inner = 3 if model.gated_mlp else 2  # (gate, up,) activation input, second-matrix input
    if fp8:  # first- and second-matrix inputs saved as fp8
        return replicated - per_rank_hidden * (d - 1) + tokens * inner * ((stored_inner - 1) * d + 1)
    return replicated + tokens * inner * stored_inner * d


def layer_activation_bytes(
    model: ModelSpec,
    *,
    micro_batch_size: int = 1,
    tp: int = 1,
    sequence_parallel: bool = False,
    recompute: RecomputePolicy = "none",
    dtype_bytes: int = 2,
    dropout: bool | None = None,
    flash_attention: bool = False,
    cp: int = 1,
) -> int:
    """Bytes one transformer layer (attention + MLP sub-blocks) keeps for backward."""
    return sum(
        block_activation_bytes(model, block, micro_batch_size=micro_batch_size, tp=tp,
                               sequence_parallel=sequence_parallel, recompute=recompute,
                               dtype_bytes=dtype_bytes, dropout=dropout, flash_attention=flash_attention, cp=cp)
        for block in (1, 2)
    )
