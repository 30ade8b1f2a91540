"""torchtitan's per-op selective activation checkpointing (``recompute = "selective-op"``).

torchtitan wraps every transformer block in a non-reentrant checkpoint whose policy saves the outputs of the
ops in ``_save_list`` and recomputes everything else in the backward (``parallelize_llama.py``:
``no_recompute_list`` at commit 528cab9, April 2024; ``_save_list`` with ``CheckpointPolicy.MUST_SAVE`` at
9dec370, December 2024, and 820504e, June 2025, the versions the dev-set rows cite). The list is
``aten.mm``, SDPA's flash and memory-efficient kernels and ``_c10d_functional.reduce_scatter_tensor``
(plus ``max``/``abs``, which only matter for float8), and the policy skips every second ``mm`` of a block:
a per-block counter (``meta[f"{mode}_mm_count"]``, fresh for every forward and again for the recompute)
saves the 1st, 3rd, 5th, ... matrix multiply. So, in the order torchtitan's Llama block runs them
(``models/llama/model.py``: ``wq, wk, wv`` then ``wo``; ``w2(silu(w1(x)) * w3(x))`` runs ``w1, w3, w2``):

* saved: the outputs of ``wq``, ``wv``, ``w1`` and ``w2`` (mm 1, 3, 5, 7), the attention kernel's outputs
  (the output and its fp32 log-sum-exp per row and head) and, with sequence-parallel tensor parallelism, the
  reduce-scatter outputs after ``wo`` and ``w2``; the checkpoint keeps the block's input;
* recomputed: ``wk``, ``wo`` and ``w3`` (mm 2, 4, 6), both norms, rotary, SiLU and the product, the
  attention output's transpose copy and the first residual add; not the block's last residual add,
  because PyTorch's non-reentrant checkpoint stops recomputing once every tensor the backward needs is
  back (``early_stop=True``, torch/utils/checkpoint.py), and nothing saved comes after ``w2``.

A linear layer with a bias runs ``aten.addmm``, which is not in the list and is not counted by the policy,
so in a model with biases every linear is recomputed and only the attention kernel's outputs are saved. A
non-gated MLP runs ``w1`` (mm 5, saved) and ``w2`` (mm 6, recomputed). The policy needs the fused attention
kernel (the unfused core would be recomputed whole) and, with tp > 1, sequence-parallel norms (what
torchtitan's tensor parallelism runs); :class:`simgrid.layout.Layout` refuses the other combinations.

Under tensor parallelism the all-gathers before ``wq..wv`` and ``w1, w3`` are not saved, so the recompute
gathers the sequence shard again before it reruns ``wk`` / ``w3`` and the backward reuses that tensor: the
lowering issues the sub-block's ``input-regather`` all-gather (:mod:`simgrid.model.comm`) before the recompute
op instead of before the backward (``regathered_by_recompute`` in
:mod:`simgrid.schedules.lower.tensor_parallel`). FSDP2 gathers a layer once for its recompute and backward
(its pre-forward hook does nothing during the backward).

Everything here is per sub-block, one micro-batch, one tensor-parallel rank, like the rest of
:mod:`simgrid.model`.
"""

from __future__ import annotations

from dataclasses import dataclass

from simgrid.model.blocks import block_kind, local_kv_heads, local_q_heads, local_seq_length
from simgrid.model.spec import ModelSpec

#: torchtitan saves the outputs of every other ``mm`` of a block: the 1st, 3rd, 5th, ...
SAVE_EVERY = 2
#: FlashAttention's saved softmax statistic: one fp32 log-sum-exp per query row and head.
LSE_BYTES = 4


@dataclass(frozen=True)
class Linear:
    """One linear layer of a block in torchtitan's forward order, on one tensor-parallel rank."""

    name: str
    """torchtitan's module name (``wq``, ``wk``, ``wv``, ``wo``, ``w1``, ``w3``, ``w2``)."""
    in_width: int
    """Input features on this rank."""
    out_width: int
    """Output features on this rank."""
    saved: bool
    """Whether the policy saves its output (an odd-numbered ``mm``)."""


def block_linears(model: ModelSpec, block: int, *, tp: int = 1) -> tuple[Linear, ...]:
    """The linear layers of an attention or MLP sub-block in forward order, each marked saved or recomputed;
    ``()`` for the embedding and the head (outside the checkpointed blocks)."""
    kind, _ = block_kind(model, block)
    if kind not in ("attn", "mlp"):
        return ()
    h, d = model.hidden_size, model.head_dim
    q, kv = local_q_heads(model, tp) * d, local_kv_heads(model, tp) * d
    f = model.ffn_size // tp
    attention = (("wq", h, q), ("wk", h, kv), ("wv", h, kv), ("wo", q, h))
    mlp = (("w1", h, f), ("w3", h, f), ("w2", f, h)) if model.gated_mlp else (("w1", h, f), ("w2", f, h))
    count = 0
    layers = []
    for part, shapes in (("attn", attention), ("mlp", mlp)):
        for name, n_in, n_out in shapes:
            saved = False
            if not model.bias:  # a biased linear is aten.addmm: neither saved nor counted
                count += 1
                saved = count % SAVE_EVERY == 1
            if part == kind:
                layers.append(Linear(name=name, in_width=n_in, out_width=n_out, saved=saved))
    return tuple(layers)


def saved_activation_bytes(model: ModelSpec, block: int, *, micro_batch_size: int, tp: int, cp: int,
                           sequence_parallel: bool, dtype_bytes: int) -> int:
    """Bytes the policy keeps for one sub-block: the saved linear outputs, the attention kernel's output and
    statistics, the sequence-parallel reduce-scatter outputs, and (attention sub-block) the block input the
    checkpoint holds, a sequence shard under sequence parallelism."""
    kind, _ = block_kind(model, block)
    tokens = micro_batch_size * local_seq_length(model, cp)
    shard = tokens * model.hidden_size * dtype_bytes // (tp if sequence_parallel else 1)
    total = sum(tokens * lin.out_width * dtype_bytes for lin in block_linears(model, block, tp=tp) if lin.saved)
    if kind == "attn":
        heads = local_q_heads(model, tp)
        total += shard  # the checkpoint's input (the layer input)
        total += tokens * heads * model.head_dim * dtype_bytes + tokens * heads * LSE_BYTES
    if sequence_parallel:
        total += shard  # reduce_scatter_tensor after wo / w2 is in the save list
    return total


def recomputed_linears(model: ModelSpec, block: int, *, tp: int = 1) -> tuple[Linear, ...]:
    """The linear layers the backward reruns."""
    return tuple(lin for lin in block_linears(model, block, tp=tp) if not lin.saved)


def recompute_gemms(model: ModelSpec, block: int, *, micro_batch_size: int, tp: int, cp: int
                    ) -> tuple[tuple[int, int, int, int], ...]:
    """The recomputed linears as ``(m, n, k, count)`` GEMMs (:mod:`simgrid.model.gemms`): every token of the
    micro-batch (the projections see the whole sequence; sequence parallelism gathers it first) times the
    layer's weight on this rank."""
    tokens = micro_batch_size * local_seq_length(model, cp)
    return tuple((tokens, lin.out_width, lin.in_width, 1) for lin in recomputed_linears(model, block, tp=tp))
