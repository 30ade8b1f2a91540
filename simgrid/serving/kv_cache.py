"""The KV cache: bytes per token, how many tokens fit beside the weights, and block allocation.

Bytes per token and layer on one tensor-parallel rank are ``2 * kv_heads_local * head_dim * bytes``: a key
and a value vector per KV head (Pope et al., "Efficiently Scaling Transformer Inference", MLSys 2023,
section 2; with grouped-query attention only the ``num_kv_heads`` groups are cached, Ainslie et al. 2023).
Megatron's and vLLM's tensor parallelism split KV heads over ranks; when ``tp`` exceeds the KV heads each
rank keeps one head, replicated (:func:`simgrid.model.local_kv_heads`), so GQA stops shrinking the cache
per GPU at ``tp = num_kv_heads``. An fp8 cache (vLLM ``--kv-cache-dtype fp8``, E4M3/E5M2) stores one byte per
element instead of two, halving both the bytes per token and the HBM traffic of reading the cache.

Budget per GPU (vLLM's ``determine_num_available_blocks``): ``memory * memory_utilization`` minus the
stage's weights minus the activation workspace of the largest iteration; each pipeline stage holds only
its own layers' cache, so a replica holds as many tokens as its tightest stage allows. Allocation is in
blocks of ``block_tokens`` (PagedAttention; Kwon et al. SOSP 2023): a request holding ``n`` tokens uses
``ceil(n / block_tokens)`` blocks and wastes at most one partly filled block.
"""

from __future__ import annotations

from dataclasses import dataclass

from simgrid.hardware import GPUSpec
from simgrid.layout.spec import check_layout
from simgrid.model import block_params_on_rank, local_kv_heads, local_vocab, stage_blocks, stage_layers
from simgrid.model.params import mlp_in_width, qkv_width
from simgrid.model.spec import ModelSpec
from simgrid.serving.spec import ServingConfig, ServingError, ServingLayout, model_layout

GIB = 2**30
LOGIT_BYTES = 4
"""The sampler works on fp32 logits (vLLM's ``Sampler`` upcasts before the softmax)."""


def kv_bytes_per_token(model: ModelSpec, *, layers: int, tp: int, kv_bytes: int) -> int:
    """KV-cache bytes one token occupies on one tensor-parallel rank holding ``layers`` layers."""
    return 2 * local_kv_heads(model, tp) * model.head_dim * kv_bytes * layers


def workspace_bytes(model: ModelSpec, layout: ServingLayout, config: ServingConfig, *, tokens: int,
                    last_stage: bool) -> int:
    """Activation memory of the largest iteration on one rank (what vLLM's profiling forward measures).

    The widest moment of a layer: the residual stream and its normalised copy (``2h``) beside the larger of
    the QKV output and the MLP's input projection plus its activation (``2f/tp + f/tp`` when gated), for
    every token of the iteration; the last stage also holds fp32 logits for every sequence. ``tokens`` is the
    token budget: static batching's one-shot prefill of a whole batch can exceed it, and that extra
    workspace is not charged.
    """
    act = 4 if config.activation_dtype == "fp32" else 2
    tp = layout.tp
    widest = max(qkv_width(model, tp), mlp_in_width(model, tp) + model.ffn_size // tp)
    per_token = (2 * model.hidden_size + widest) * act
    logits = config.max_batch_size * local_vocab(model, tp) * LOGIT_BYTES if last_stage else 0
    return tokens * per_token + logits


@dataclass(frozen=True, kw_only=True)
class StageMemory:
    """Memory of one GPU of one pipeline stage."""

    stage: int
    """Pipeline stage index."""
    layers: int
    """Transformer layers on the stage."""
    weight_bytes: int
    """Weights held by one tensor-parallel rank of the stage."""
    workspace_bytes: int
    """Activation workspace of the largest iteration."""
    kv_budget_bytes: int
    """Bytes left for the KV cache (or the configured budget)."""
    kv_bytes_per_token: int
    """KV-cache bytes per token on this rank."""

    @property
    def capacity_tokens(self) -> int:
        """Tokens whose KV cache fits in the budget."""
        return self.kv_budget_bytes // self.kv_bytes_per_token if self.kv_bytes_per_token else 0


@dataclass(frozen=True, kw_only=True)
class KVBudget:
    """KV-cache capacity of one replica."""

    stages: tuple[StageMemory, ...]
    """Memory of each pipeline stage's GPUs."""
    block_tokens: int
    """Tokens per block."""
    memory_bytes: int
    """Device memory of one GPU."""

    @property
    def capacity_blocks(self) -> int:
        """Blocks the replica can hold: the tightest stage decides."""
        return min(s.capacity_tokens for s in self.stages) // self.block_tokens

    @property
    def capacity_tokens(self) -> int:
        """Tokens the replica can hold in whole blocks."""
        return self.capacity_blocks * self.block_tokens

    def blocks_for(self, tokens: int) -> int:
        """Blocks a sequence of ``tokens`` tokens occupies."""
        return -(-tokens // self.block_tokens)


def kv_budget(model: ModelSpec, layout: ServingLayout, config: ServingConfig, gpu: GPUSpec, *,
              max_context: int) -> KVBudget:
    """KV capacity of one replica; refuses a layout whose weights leave no room for the cache."""
    mlayout = model_layout(layout, config)
    check_layout(model, mlayout)
    tokens = config.token_budget(max_context)
    usable = int(gpu.memory_bytes * config.memory_utilization)
    stages = []
    for stage in range(layout.pp):
        layers = len(stage_layers(model, mlayout, stage))
        weights = sum(block_params_on_rank(model, mlayout, b) for b in stage_blocks(model, mlayout, stage))
        weights *= config.weight_bytes
        work = workspace_bytes(model, layout, config, tokens=tokens, last_stage=stage == layout.pp - 1)
        if config.kv_budget_GiB is not None:
            budget = int(config.kv_budget_GiB * GIB)
        else:
            budget = usable - weights - work
            if budget <= 0:
                raise ServingError(
                    f"{model.name} on {gpu.name} with tp {layout.tp}, pp {layout.pp}: stage {stage} needs "
                    f"{weights / GIB:.1f} GiB of weights and {work / GIB:.1f} GiB of activations but "
                    f"{config.memory_utilization:.0%} of the GPU is {usable / GIB:.1f} GiB, leaving nothing for "
                    "the KV cache; raise tp or pp, or use fp8 weights"
                )
        stages.append(StageMemory(stage=stage, layers=layers, weight_bytes=weights, workspace_bytes=work,
                                  kv_budget_bytes=budget,
                                  kv_bytes_per_token=kv_bytes_per_token(model, layers=layers, tp=layout.tp,
                                                                        kv_bytes=config.kv_bytes)))
    return KVBudget(stages=tuple(stages), block_tokens=config.block_tokens, memory_bytes=gpu.memory_bytes)


class BlockPool:
    """Free and used KV blocks of one replica; the server records its occupancy over time."""

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity = capacity_blocks
        self.used = 0

    @property
    def free(self) -> int:
        """Blocks not held by any request."""
        return self.capacity - self.used

    @property
    def occupancy(self) -> float:
        """Share of the blocks in use (0 when the pool is empty)."""
        return self.used / self.capacity if self.capacity else 0.0

    def take(self, blocks: int) -> None:
        """Hand out ``blocks``; the caller checked :attr:`free` first."""
        if blocks > self.free:
            raise AssertionError(f"KV pool over-committed: {blocks} blocks asked, {self.free} free")
        self.used += blocks

    def give_back(self, blocks: int) -> None:
        """Return ``blocks`` to the pool."""
        self.used -= blocks
        if self.used < 0:
            raise AssertionError("KV pool returned more blocks than it handed out")
