"""Exact parameter counts per sub-block, for the whole model and for one tensor-parallel rank.

Per layer of a GPT model this gives ``12h^2 + 13h`` and, with the embedding, Narayanan et al. SC'21
section 5.1: ``P = 12 L h^2 (1 + 13/(12h) + (V + s)/(12 L h))`` (plus the final norm, ``2h``, which the
paper's closed form leaves out). Tensor-parallel shares follow Megatron-LM: column-parallel QKV and
MLP-in weights and biases are split, row-parallel out-projection and MLP-out weights are split but their
biases are replicated, norms and learned position embeddings are replicated, and the word embedding and
output layer are split along the vocabulary (Shoeybi et al. 2019, section 3).
"""

from __future__ import annotations

from simgrid.layout.spec import Layout
from simgrid.model.blocks import block_kind, local_kv_heads, local_q_heads, local_vocab, norm_params
from simgrid.model.moe import (
    is_moe_block,
    moe_active_params,
    moe_dense_params,
    moe_expert_params,
    num_moe_layers,
)
from simgrid.model.spec import ModelSpec


def qkv_width(model: ModelSpec, tp: int = 1) -> int:
    """Output width of the fused QKV projection on one tensor-parallel rank (GQA: fewer K/V heads)."""
    if tp == 1:
        return (model.num_heads + 2 * model.kv_heads) * model.head_dim
    return (local_q_heads(model, tp) + 2 * local_kv_heads(model, tp)) * model.head_dim


def mlp_in_width(model: ModelSpec, tp: int = 1) -> int:
    """Output width of the first MLP matrix on one rank: ``f`` or ``2f`` (gate and up) for SwiGLU."""
    return (2 if model.gated_mlp else 1) * model.ffn_size // tp


def attention_params(model: ModelSpec, tp: int = 1) -> int:
    """Attention sub-block: input norm, QKV (with GQA), output projection, biases; one rank's share."""
    h = model.hidden_size
    qkv = qkv_width(model, tp)
    weights = h * qkv + local_q_heads(model, tp) * model.head_dim * h  # QKV, then out-projection (a hd -> h)
    biases = qkv + h if model.bias else 0
    return norm_params(model) + weights + biases


def mlp_params(model: ModelSpec, tp: int = 1) -> int:
    """MLP sub-block: input norm, in (gated: gate + up) and out matrices, biases; one rank's share."""
    h = model.hidden_size
    inner = mlp_in_width(model, tp)
    weights = h * inner + (model.ffn_size // tp) * h
    biases = inner + h if model.bias else 0
    return norm_params(model) + weights + biases


def layer_params(model: ModelSpec, tp: int = 1) -> int:
    """One dense transformer layer (attention + MLP sub-blocks); a MoE layer is :func:`moe_layer_params`."""
    return attention_params(model, tp) + mlp_params(model, tp)


def moe_layer_params(model: ModelSpec) -> int:
    """One MoE layer of the whole model: attention plus norm, router, every expert and the shared expert."""
    return attention_params(model) + moe_dense_params(model) + moe_expert_params(model)


def _layers_params(model: ModelSpec, *, active: bool = False) -> int:
    """Every transformer layer: dense ones at :func:`layer_params`, MoE ones whole (or, ``active``, with only
    the ``k`` experts a token goes through)."""
    moe_layers = num_moe_layers(model)
    dense = (model.num_layers - moe_layers) * layer_params(model)
    if not moe_layers:
        return dense
    moe_mlp = moe_active_params(model) if active else moe_dense_params(model) + moe_expert_params(model)
    return dense + moe_layers * (attention_params(model) + moe_mlp)


def word_embedding_params(model: ModelSpec, tp: int = 1) -> int:
    """The ``V x h`` token embedding matrix (vocabulary-parallel: ``V/tp`` rows per rank)."""
    return local_vocab(model, tp) * model.hidden_size


def embedding_params(model: ModelSpec, tp: int = 1) -> int:
    """Embedding sub-block: word embedding plus learned ``s x h`` positions (replicated over tp)."""
    positions = model.seq_length * model.hidden_size if model.position == "learned" else 0
    return word_embedding_params(model, tp) + positions


def head_params(model: ModelSpec, tp: int = 1) -> int:
    """Head sub-block: final norm plus the output matrix when it is not tied to the embedding."""
    output = 0 if model.tied_embeddings else word_embedding_params(model, tp)
    return norm_params(model) + output


def block_params(model: ModelSpec, block: int) -> int:
    """Parameters of one sub-block of the whole (unsplit) model; tied weights counted in block 0 only."""
    kind, _ = block_kind(model, block)
    if kind == "embed":
        return embedding_params(model)
    if kind == "head":
        return head_params(model)
    if is_moe_block(model, block):
        return moe_dense_params(model) + moe_expert_params(model)
    return attention_params(model) if kind == "attn" else mlp_params(model)


def param_count(model: ModelSpec) -> int:
    """Unique parameters of the model (a tied output matrix counts once); every expert counts."""
    return embedding_params(model) + _layers_params(model) + head_params(model)


def active_param_count(model: ModelSpec) -> int:
    """Parameters one token goes through ("activated" parameters of a MoE model card): the embedding, every
    attention and dense MLP, and per MoE layer its router, shared expert and ``k`` routed experts. Equals
    :func:`param_count` for a dense model."""
    return embedding_params(model) + _layers_params(model, active=True) + head_params(model)


def non_embedding_params(model: ModelSpec) -> int:
    """Parameters outside the word/position embeddings and an untied output matrix (Kaplan et al. 2020)."""
    return _layers_params(model) + norm_params(model)


def matmul_params(model: ModelSpec) -> int:
    """Weights that take part in a matrix multiply per token: every layer matrix plus the output layer.

    This is the ``N`` of the 6N rule used by :func:`simgrid.model.flops.flops_6n_attention`: an embedding
    lookup does no multiply-adds, but the output projection onto the vocabulary is a real ``h x V`` matmul
    whether or not its matrix is tied to the embedding. Biases and norms are included (they are
    parameters), which is why 6N slightly exceeds the matmul-only count of Megatron's eq. 3. A MoE layer
    counts the experts a token goes through (its active parameters), not every expert.
    """
    return _layers_params(model, active=True) + norm_params(model) + word_embedding_params(model)


def block_params_on_rank(model: ModelSpec, layout: Layout, block: int) -> int:
    """Parameters of a sub-block held by one tensor-parallel rank, as Megatron-LM allocates them.

    With pipeline parallelism and tied embeddings the last stage keeps its own copy of the word
    embedding for the output layer, kept equal by an all-reduce of its gradient with the first stage
    (Shoeybi et al. 2019; Megatron-LM ``setup_embeddings_and_output_layer``), so the head block then
    carries ``V/tp x h`` parameters too.
    """
    tp = layout.tp
    kind, _ = block_kind(model, block)
    if kind == "embed":
        return embedding_params(model, tp)
    if kind == "head":
        duplicate = model.tied_embeddings and layout.pp > 1
        return head_params(model, tp) + (word_embedding_params(model, tp) if duplicate else 0)
    if is_moe_block(model, block):
        return moe_dense_params(model, tp) + expert_params_on_rank(model, layout, block)
    return attention_params(model, tp) if kind == "attn" else mlp_params(model, tp)


def expert_params_on_rank(model: ModelSpec, layout: Layout, block: int) -> int:
    """Of :func:`block_params_on_rank`, the routed experts' parameters (``E / ep`` experts split ``1/etp``):
    their gradients sync, and ZeRO shards them, over the expert data-parallel group, not the dense one."""
    if not is_moe_block(model, block):
        return 0
    return moe_expert_params(model, layout.ep, layout.expert_tp)
