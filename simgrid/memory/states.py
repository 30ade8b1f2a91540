"""Model states (weights, gradients, optimizer states) per rank, under ZeRO sharding and offload.

Bytes per parameter (Rajbhandari et al. 2020, ZeRO, section 3.1: mixed-precision Adam keeps 2 + 2 + K
with K = 12 for the fp32 master copy, momentum and variance):

============================  =======  =====  =================================================
optimizer / precision         weights  grads  optimizer states
============================  =======  =====  =================================================
adam, bf16/fp16 (mixed)       2        2      12 = fp32 master 4 + m 4 + v 4 (ZeRO K = 12)
adam, fp32                    4        4      8 = m 4 + v 4 (the weights are the master)
adam-8bit, mixed              2        2      6 = fp32 master 4 + two 1-byte moments (Dettmers et al.
                                              2022, "8-bit Optimizers via Block-wise Quantization";
                                              the per-block scales, 2 fp32 per 2048 values, are ignored)
adam-8bit, fp32               4        4      2 = two 1-byte moments
sgd (momentum), mixed         2        2      8 = fp32 master 4 + momentum 4
sgd (momentum), fp32          4        4      4 = momentum 4
============================  =======  =====  =================================================

fp32 gradients (``Layout.reduce_dtype = "fp32"`` with ZeRO 0-2, mixed precision): 4 bytes per gradient
instead of 2, Megatron-LM's fp32 ``main_grad`` buffers. For bf16 Megatron-LM forces
``accumulate_allreduce_grads_in_fp32 = True`` (megatron/training/arguments.py, core_r0.8.0: "bfloat16 requires
gradient accumulation and all-reduce to be done in fp32") and the DDP grad buffer then has dtype
``torch.float`` (megatron/core/distributed/distributed_data_parallel.py: ``grad_dtype = torch.float if
ddp_config.grad_reduce_in_fp32 else param.dtype``), so the DP all-reduce / reduce-scatter moves 4-byte
gradients too (Table 1 then reads 2 + 4 + 12). ZeRO-3's fp32 reduce (FSDP2) casts only the unsharded gradient
it reduces; its stored gradients stay in the parameter dtype here (:mod:`simgrid.model.zero3_units`).

ZeRO over the ``dp`` replicas (section 5): stage 1 shards the optimizer states, stage 2 also the
gradients, stage 3 also the weights; a shard is ``ceil(bytes / dp)``. A MoE sub-block's routed experts are
already split ``1 / (ep * etp)`` and replicated over the expert data-parallel group only, so ZeRO shards
their states over ``edp`` (Megatron-Core's distributed optimizer over the expert data-parallel group).

Optimizer offload (Ren et al. 2021, ZeRO-Offload, section 4.1): the GPU keeps the working (16-bit)
weights and gradients, sharded as the ZeRO stage says, and no optimizer states; the host keeps the
optimizer states including the fp32 master copy, plus the fp32 gradients CPU-Adam reads (4 bytes/param),
plus, in fp32 training, an fp32 copy of the weights it updates (4 bytes/param); the host part is sharded
over ``dp`` when ZeRO >= 1 (each rank offloads its own partition).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from simgrid.errors import LayoutError
from simgrid.layout.spec import Layout
from simgrid.model.blocks import block_kind, stage_blocks, stages_of_rank
from simgrid.model.cost import block_cost
from simgrid.model.fp8_kernels import (
    FP8_BYTES,
    FP8_WEIGHT_CACHE_BYTES,
    fp8_moe_weight_params,
    fp8_weight_cache_bytes,
    fp8_weight_params,
)
from simgrid.model.moe import is_moe_block
from simgrid.model.spec import ModelSpec

#: Optimizer-state bytes per parameter (master copy included when training in mixed precision).
OPTIMIZER_STATE_BYTES: dict[tuple[str, bool], int] = {
    ("adam", True): 12,
    ("adam", False): 8,
    ("adam-8bit", True): 6,
    ("adam-8bit", False): 2,
    ("sgd", True): 8,
    ("sgd", False): 4,
}
#: Bytes of one fp32 gradient element (Megatron-LM's ``main_grad`` under ``reduce_dtype = "fp32"``).
FP32_GRAD_BYTES = 4
#: Host-side fp32 gradient buffer of an offloaded optimizer (ZeRO-Offload), bytes per parameter.
OFFLOAD_GRAD_BYTES = 4
#: Host-side fp32 weight copy an offloaded optimizer updates when training in fp32, bytes per parameter.
OFFLOAD_FP32_WEIGHT_BYTES = 4


@dataclass(frozen=True, kw_only=True)
class StateBytesPerParam:
    """Bytes each parameter costs before sharding."""

    weights: int
    """Working weights (16-bit in mixed precision, else fp32)."""
    grads: int
    """Gradients in the working dtype, or fp32 under ``reduce_dtype = "fp32"`` with ZeRO 0-2."""
    optimizer: int
    """Optimizer states incl. the fp32 master copy in mixed precision (the ZeRO paper's K)."""
    host: int
    """Host bytes when the optimizer is offloaded (0 otherwise)."""


@dataclass(frozen=True, kw_only=True)
class ModelStates:
    """Weights, gradients and optimizer states of one rank (or of one block on one rank), in bytes."""

    weights_bytes: int
    """Working weights on the GPU."""
    grads_bytes: int
    """Gradients on the GPU."""
    optimizer_bytes: int
    """Optimizer states (with the fp32 master copy) on the GPU; 0 when offloaded."""
    host_bytes: int = 0
    """Bytes kept in host memory by optimizer offload."""

    @property
    def total_bytes(self) -> int:
        """GPU bytes: weights + grads + optimizer states."""
        return self.weights_bytes + self.grads_bytes + self.optimizer_bytes

    def __add__(self, other: ModelStates) -> ModelStates:
        return ModelStates(
            weights_bytes=self.weights_bytes + other.weights_bytes,
            grads_bytes=self.grads_bytes + other.grads_bytes,
            optimizer_bytes=self.optimizer_bytes + other.optimizer_bytes,
            host_bytes=self.host_bytes + other.host_bytes,
        )

    def scaled(self, copies: int) -> ModelStates:
        """The states of ``copies`` identical blocks."""
        return ModelStates(weights_bytes=self.weights_bytes * copies, grads_bytes=self.grads_bytes * copies,
                           optimizer_bytes=self.optimizer_bytes * copies, host_bytes=self.host_bytes * copies)


ZERO_STATES = ModelStates(weights_bytes=0, grads_bytes=0, optimizer_bytes=0)


def state_bytes_per_param(layout: Layout) -> StateBytesPerParam:
    """Unsharded bytes per parameter for the layout's optimizer, precision and offload (table above)."""
    mixed = layout.mixed_precision
    key = (layout.optimizer, mixed)
    if key not in OPTIMIZER_STATE_BYTES:
        raise LayoutError(f"layout: optimizer = {layout.optimizer!r} has no memory rule; use adam, adam-8bit or sgd")
    optimizer = OPTIMIZER_STATE_BYTES[key]
    host = 0
    if layout.offload_optimizer:
        host = optimizer + OFFLOAD_GRAD_BYTES + (0 if mixed else OFFLOAD_FP32_WEIGHT_BYTES)
    fp32_grads = layout.reduce_dtype == "fp32" and layout.zero < 3  # Megatron's fp32 main_grad (docstring)
    grads = FP32_GRAD_BYTES if fp32_grads else layout.param_bytes
    return StateBytesPerParam(weights=layout.param_bytes, grads=grads,
                              optimizer=0 if layout.offload_optimizer else optimizer, host=host)


def model_states_for_params(n_params: float, layout: Layout, *, replicas: int | None = None) -> ModelStates:
    """States of ``n_params`` parameters on one rank under the layout's ZeRO stage over ``replicas`` ranks
    holding the same parameters (default the data-parallel group, ``dp * cp``)."""
    if n_params < 0:
        raise LayoutError(f"parameter count {n_params} must be >= 0")
    per = state_bytes_per_param(layout)
    group = layout.grad_sync_size if replicas is None else replicas

    def shard(total: float, from_stage: int) -> int:
        return math.ceil(total / group) if layout.zero >= from_stage else math.ceil(total)

    return ModelStates(
        weights_bytes=shard(n_params * per.weights, 3),
        grads_bytes=shard(n_params * per.grads, 2),
        optimizer_bytes=shard(n_params * per.optimizer, 1),
        host_bytes=shard(n_params * per.host, 1),
    )


def block_state_bytes(model: ModelSpec, layout: Layout, block: int) -> ModelStates:
    """States of one sub-block on one rank (its tensor-parallel share, ZeRO shard over dp).

    Summing this over the blocks of a pipeline rank gives :func:`stage_state_bytes`; the program builder
    allocates exactly these sizes.
    """
    cost = block_cost(model, layout, block)
    dense = model_states_for_params(cost.param_count - cost.expert_param_count, layout)
    if layout.fp8_recipe != "none":
        # Transformer Engine's cached fp8 weight and its transpose, whole on every rank (not ZeRO-sharded); a MoE
        # sub-block's local experts and shared expert too (GroupedLinear caches one per expert, "weight{i}").
        moe = is_moe_block(model, block)
        params = (fp8_moe_weight_params(model, layout) if moe
                  else fp8_weight_params(model, layout, block_kind(model, block)[0]))
        cache = fp8_weight_cache_bytes(layout) * params if not moe else FP8_WEIGHT_CACHE_BYTES * params
        if layout.fp8_params and not moe:
            # fp8 parameters (Layout.fp8_params): the TE linears' weights are 1-byte Float8Tensors, no 16-bit copy
            # (NeMo builds the model under TE fp8_model_init, megatron_gpt_model.py lines 327-328 at b2eccd2)
            cache -= (layout.param_bytes - FP8_BYTES) * params
        dense = dense + ModelStates(weights_bytes=cache, grads_bytes=0, optimizer_bytes=0)
    if not cost.expert_param_count:
        return dense
    return dense + model_states_for_params(cost.expert_param_count, layout, replicas=layout.edp)


def stage_state_bytes(model: ModelSpec, layout: Layout, pp_rank: int) -> ModelStates:
    """States of one pipeline rank: the sum over the blocks of every model chunk it holds."""
    total = ZERO_STATES
    for stage in stages_of_rank(layout, pp_rank):
        for block, copies in stage_block_groups(model, layout, stage):
            total = total + block_state_bytes(model, layout, block).scaled(copies)
    return total


def model_state_bytes(model: ModelSpec, layout: Layout) -> ModelStates:
    """States of the worst rank: the pipeline rank with the most GPU bytes of model states."""
    return max((stage_state_bytes(model, layout, r) for r in range(layout.pp)), key=lambda s: s.total_bytes)


def stage_block_groups(model: ModelSpec, layout: Layout, stage: int) -> list[tuple[int, int]]:
    """Blocks of a stage as (representative block, copies): sub-blocks of one kind cost the same (attention;
    dense MLP; MoE MLP)."""
    blocks = stage_blocks(model, layout, stage)
    last = 2 * model.num_layers + 1
    groups: list[tuple[int, int]] = []
    if blocks.start == 0:
        groups.append((0, 1))
    layer_blocks = [b for b in blocks if 0 < b < last]
    if layer_blocks:
        # Layer blocks come in (attention, MLP) pairs starting at an odd index.
        groups.append((layer_blocks[0], len(layer_blocks) // 2))
        mlps = layer_blocks[1::2]
        for moe in (False, True):
            kind = [b for b in mlps if is_moe_block(model, b) == moe]
            if kind:
                groups.append((kind[0], len(kind)))
    if blocks.stop == last + 1:
        groups.append((last, 1))
    return groups
