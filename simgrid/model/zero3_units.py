"""ZeRO-3 as frameworks implement it: DeepSpeed ZeRO stage 3 and PyTorch FSDP2, with their defaults.

The two differ in what they gather at once, how far ahead, when they release, and how they bucket
gradient reductions. :mod:`simgrid.schedules.lower.zero3` turns these settings into IR ops and
:mod:`simgrid.memory.buffers` sizes their buffers; nothing here is a cost factor. The module lives with
the model because what it needs is the model's tensor inventory per sub-block.

DeepSpeed ZeRO-3 (Rajbhandari et al. 2020, section 5.3; the code: ``deepspeed/runtime/zero/
partitioned_param_coordinator.py`` and ``config.py`` at deepspeedai/DeepSpeed 1b88ac3): hooks on every
module that owns parameters fetch that module's partitioned parameters (one coalesced all-gather),
then prefetch the parameters of the next modules in the recorded trace until at least
``stage3_prefetch_bucket_size`` = 5e7 elements are in flight, never beyond ``stage3_max_live_parameters``
= 1e9 resident. After a module runs, its parameters are released unless the trace uses them again
within ``stage3_max_reuse_distance`` = 1e9 elements. Tensors under ``stage3_param_persistence_threshold``
= 1e5 elements (norms, biases) are never partitioned. Gradients go into a bucket of
``reduce_bucket_size`` = 5e8 elements, reduce-scattered when the next gradient would overflow it.
Modules are Megatron's: fused QKV and output projection in attention, the two MLP matrices (SwiGLU's
gate and up fused), the word and the learned position embedding, the output layer.

PyTorch FSDP2 (``torch.distributed.fsdp.fully_shard``; docs of ``fully_shard``, torch 2.6+, and
Zhao et al. 2023, "PyTorch FSDP", VLDB, section 3.3): the user applies ``fully_shard`` to every
transformer block and to the root model, as torchtitan does, so a gather unit is one layer (its
attention and MLP sub-blocks) and the root unit holds the embedding, the final norm and the output
layer. One all-gather per unit; the next unit's all-gather is issued while the current one computes
(implicit forward prefetch, explicit backward prefetch of one module), at most two units unsharded at a
time (the rate limiter). ``reshard_after_forward=True`` by default, so the backward gathers every layer
again; the root is not resharded after forward (FSDP2 keeps it: its backward starts right away).
Each unit's gradients are reduce-scattered when its backward finishes, in the dtype of
``MixedPrecisionPolicy(reduce_dtype=...)``: ``None`` (PyTorch's default) reduces in the parameter dtype
(16-bit under mixed precision); torchtitan passes ``float32`` (``training.mixed_precision_reduce`` default
"float32", torchtitan/config_manager.py; ``reduce_dtype=TORCH_DTYPE_MAP[...]`` in parallelize_llama.py at
528cab9, 9dec370 and 820504e), so each gradient is cast up and the reduce-scatter moves 4 bytes per
element (``Layout.reduce_dtype``, :func:`reduce_bytes_per_param`).

Both gather every micro-batch and reduce-scatter every micro-batch (neither skips gradient sync under
accumulation by default), and both run all-gathers and reduce-scatters through one process group, whose
NCCL stream serialises them.
"""

from __future__ import annotations

from dataclasses import dataclass

from simgrid.layout.spec import FP32_BYTES, Layout
from simgrid.model import params
from simgrid.model.blocks import block_kind
from simgrid.model.spec import ModelSpec

ZERO_IMPLS: tuple[str, ...] = ("deepspeed", "fsdp2")
"""Named ZeRO-3 implementations (``Layout.zero_impl``, CLI ``--zero-impl``)."""


@dataclass(frozen=True, kw_only=True)
class DeepSpeedZero3:
    """DeepSpeed's ZeRO stage 3 settings (defaults of ``DeepSpeedZeroConfig``)."""

    prefetch_bucket_numel: int = 50_000_000
    """``stage3_prefetch_bucket_size``: elements fetched ahead of use (5e7)."""
    max_live_numel: int = 1_000_000_000
    """``stage3_max_live_parameters``: elements resident before prefetching stops (1e9)."""
    max_reuse_numel: int = 1_000_000_000
    """``stage3_max_reuse_distance``: a module used again within this many elements is kept (1e9)."""
    persistence_numel: int = 100_000
    """``stage3_param_persistence_threshold``: smaller tensors are never partitioned (1e5)."""
    reduce_bucket_numel: int = 500_000_000
    """``reduce_bucket_size``: gradient elements reduce-scattered at once (5e8)."""


@dataclass(frozen=True, kw_only=True)
class Fsdp2:
    """PyTorch FSDP2's behaviour under ``fully_shard`` per transformer block plus the root."""

    reshard_after_forward: bool = True
    """``fully_shard(reshard_after_forward=True)``: free a layer after its forward, gather it again in the
    backward (the root module is never resharded after forward)."""


DEEPSPEED = DeepSpeedZero3()
FSDP2 = Fsdp2()


def reduce_bytes_per_param(layout: Layout) -> int:
    """Bytes per gradient element a ZeRO-3 reduce-scatter moves: 4 with FSDP2's fp32 ``reduce_dtype``,
    else the gradient's own dtype (the parameter dtype, ``Layout.param_bytes``)."""
    if layout.zero == 3 and layout.zero_impl == "fsdp2" and layout.reduce_dtype == "fp32":
        return FP32_BYTES  # FSDP2 ``reduce_dtype=torch.float32``
    return layout.param_bytes


def _linear(weight: int, bias: int) -> list[int]:
    return [weight, bias] if bias else [weight]


def block_modules(model: ModelSpec, layout: Layout, block: int) -> list[tuple[str, list[int]]]:
    """The parameter-owning modules of a sub-block on one tensor-parallel rank, in forward order:
    (name, element counts of its tensors). Megatron's module split (fused QKV, fused gate/up)."""
    tp = layout.tp
    kind, _ = block_kind(model, block)
    h = model.hidden_size
    norm = [params.norm_params(model)]
    if kind == "embed":
        mods = [("word", [params.word_embedding_params(model, tp)])]
        if model.position == "learned":
            mods.append(("position", [model.seq_length * h]))
        return mods
    if kind == "head":
        mods = [("norm", norm)]
        if not model.tied_embeddings or layout.pp > 1:
            mods.append(("output", [params.word_embedding_params(model, tp)]))
        return mods
    if kind == "attn":
        qkv = params.qkv_width(model, tp)
        return [("norm", norm), ("qkv", _linear(h * qkv, qkv if model.bias else 0)),
                ("proj", _linear((h // tp) * h, h if model.bias else 0))]
    inner = params.mlp_in_width(model, tp)
    return [("norm", norm), ("fc1", _linear(h * inner, inner if model.bias else 0)),
            ("fc2", _linear((model.ffn_size // tp) * h, h if model.bias else 0))]


def partitioned_modules(model: ModelSpec, layout: Layout, block: int) -> list[tuple[str, int]]:
    """DeepSpeed: (module key, partitioned elements) of a block's modules that have any partitioned
    tensor; tensors under the persistence threshold stay whole on every rank and are never gathered.

    The head of a tied model (pp = 1) reuses the word embedding module: key ``b0:word``. A block with
    no tensor of its own over the threshold is one module ``b<block>:whole`` of all its elements."""
    out: list[tuple[str, int]] = []
    threshold = DEEPSPEED.persistence_numel
    modules = block_modules(model, layout, block)
    for name, tensors in modules:
        numel = sum(t for t in tensors if t >= threshold)
        if numel:
            out.append((f"b{block}:{name}", numel))
    kind, _ = block_kind(model, block)
    tied = kind == "head" and model.tied_embeddings and layout.pp == 1
    word = params.word_embedding_params(model, layout.tp)
    shared = tied and word >= threshold
    if not out:
        # Every tensor of its own is under the threshold (a toy model, or a tied head's final norm): DeepSpeed
        # would not partition the block, but the executor shards every parameter, so the block (a few KB) is
        # gathered whole, once per use; a large tied word embedding stays the shared module ``b0:word``.
        out.append((f"b{block}:whole", sum(sum(t) for _, t in modules) + (word if tied and not shared else 0)))
    if shared:
        out.append(("b0:word", word))
    return out


def fsdp2_unit(model: ModelSpec, block: int) -> tuple[int, ...]:
    """FSDP2: the blocks of the gather unit that holds ``block`` (its layer, or the root)."""
    kind, layer = block_kind(model, block)
    if kind in ("embed", "head"):
        return (0, 2 * model.num_layers + 1)
    return (1 + 2 * layer, 2 + 2 * layer)


def tied_head_params(model: ModelSpec, layout: Layout, block: int) -> int:
    """Parameters the head block reads but does not own: the tied word embedding, when the head shares
    the embedding block's matrix on the same rank (pp = 1; with pp > 1 the head's cost already counts
    Megatron's duplicate copy). ZeRO-3 gathers it with the head and reduce-scatters its gradient there."""
    head = 2 * model.num_layers + 1
    if block != head or not model.tied_embeddings or layout.pp > 1:
        return 0
    return params.word_embedding_params(model, layout.tp)


def unit_params(model: ModelSpec, layout: Layout, blocks: tuple[int, ...]) -> int:
    """Parameters an FSDP2 unit gathers: its blocks' own, the tied embedding once (the root holds both
    the embedding and the head that reads it)."""
    own = sum(params.block_params_on_rank(model, layout, b) for b in blocks)
    return own + (0 if 0 in blocks else sum(tied_head_params(model, layout, b) for b in blocks))
