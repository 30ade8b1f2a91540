"""Communication buffers a rank keeps besides model states and activations.

What we count (each a fixed-size buffer the program builder allocates with category ``comm``):

* ``dp-buckets``: with data parallelism (dp > 1) and ZeRO 0-2, two gradient buckets of
  ``bucket_size_MB`` MiB: one being all-reduced (or reduce-scattered) while the next fills, as DeepSpeed's
  double-buffered reduce bucket and overlapped DDP do (PyTorch DDP's ``bucket_cap_mb`` is in MiB). The
  gradients themselves are counted as grads, assuming they live in the bucket storage
  (``gradient_as_bucket_view`` / Megatron's contiguous grad buffer). Capped at the rank's gradient bytes.
  Not with ``bucket_policy = "megatron"`` and ZeRO 0-1: Megatron-Core's buckets are views into its one
  contiguous ``ParamAndGradBuffer.grad_data`` (megatron/core/distributed/param_and_grad_buffer.py, core_r0.8.0:
  ``_get`` returns ``self.grad_data[start:end].view(shape)`` for each bucket's ``grad_data``), which the
  gradients (counted as grads, the unsharded fp32 ``main_grad`` under ZeRO 0-1) already are: no extra bytes.
* ``zero3-gather`` and ``zero3-grads``: with ZeRO-3, gathered (tensor-parallel shares of) weights and
  unsharded gradient buffers, as the implementation holds them (simgrid.model.zero3_units).
  FSDP2: the root unit (embedding, final norm, output layer: kept from the forward to the end of the
  backward) plus the layer in use and ``zero3_prefetch_depth`` prefetched layers; gradients of the root
  and of two layers (one reducing, one filling). DeepSpeed: the modules kept for reuse within
  ``stage3_max_reuse_distance`` plus the prefetch bucket and the largest module (capped at the rank's
  partitioned parameters); two reduce buckets of gradients.
* ``pp-p2p``: with pipeline parallelism, one activation and one gradient tensor in transit
  (:func:`simgrid.model.p2p_bytes` each), the receive buffers of the pipeline sends.
* ``ep-dispatch``: MoE with ep or etp > 1, the all-to-all dispatcher's permuted send buffer and received
  tokens of one MoE sub-block (:func:`simgrid.model.moe.dispatcher_buffer_bytes`; one block at a time, as the
  program allocates them).
* ``edp-buckets``: MoE with expert data parallelism (edp > 1), two expert-gradient buckets in flight, capped
  at the rank's expert gradient bytes, as ``dp-buckets`` for the dense gradients.

Not counted: the CUDA context, allocator fragmentation, cuBLAS workspaces and transient all-gathered
inputs of sequence parallelism.
"""

from __future__ import annotations

import dataclasses

from simgrid.layout.spec import Layout
from simgrid.memory.states import block_state_bytes, stage_block_groups, stage_state_bytes, state_bytes_per_param
from simgrid.model.blocks import p2p_bytes, stages_of_rank
from simgrid.model.cost import block_cost
from simgrid.model.moe import dispatcher_buffer_bytes
from simgrid.model.spec import ModelSpec
from simgrid.model.zero3_units import (
    DEEPSPEED,
    fsdp2_unit,
    partitioned_modules,
    reduce_bytes_per_param,
    tied_head_params,
    unit_params,
)

#: Buckets in flight for overlapped gradient sync (one reducing, one filling).
DP_BUCKETS_IN_FLIGHT = 2
#: Bytes in the "MB" of ``bucket_size_MB`` (PyTorch DDP ``bucket_cap_mb`` is MiB).
BYTES_PER_BUCKET_MB = 1024 * 1024


def comm_buffer_bytes(model: ModelSpec, layout: Layout, pp_rank: int = 0) -> dict[str, int]:
    """Communication buffers of one rank of pipeline rank ``pp_rank``, by purpose (see module docstring)."""
    buffers: dict[str, int] = {}
    views = layout.bucket_policy == "megatron" and layout.zero < 2  # buckets view the grad buffer (docstring)
    if layout.grad_sync_size > 1 and layout.zero < 3 and not views:
        grads = stage_state_bytes(model, layout, pp_rank).grads_bytes
        bucket = int(layout.bucket_size_MB * BYTES_PER_BUCKET_MB)
        buffers["dp-buckets"] = min(DP_BUCKETS_IN_FLIGHT * bucket, grads)
    if layout.zero == 3 and layout.grad_sync_size > 1:
        buffers.update(_zero3_buffers(model, layout))
    if layout.pp > 1:
        buffers["pp-p2p"] = 2 * p2p_bytes(model, layout)
    dispatch = dispatcher_buffer_bytes(model, layout)
    if dispatch:
        buffers["ep-dispatch"] = dispatch
    if model.moe is not None and layout.edp > 1:
        expert_grads = sum(
            block_cost(model, layout, block).expert_param_count * copies
            for stage in stages_of_rank(layout, pp_rank)
            for block, copies in stage_block_groups(model, layout, stage)
        ) * state_bytes_per_param(layout).grads
        if expert_grads:
            bucket = int(layout.bucket_size_MB * BYTES_PER_BUCKET_MB)
            buffers["edp-buckets"] = min(DP_BUCKETS_IN_FLIGHT * bucket, expert_grads)
    return buffers


def zero3_grad_bytes(model: ModelSpec, layout: Layout, blocks: tuple[int, ...]) -> int:
    """Unsharded gradient bytes of the blocks of one ZeRO-3 reduce-scatter (a tied embedding's once), in the
    reduce dtype: FSDP2 with ``reduce_dtype = "fp32"`` casts the gradients to fp32 before it reduces
    (:func:`simgrid.model.zero3_units.reduce_bytes_per_param`)."""
    unsharded = dataclasses.replace(layout, zero=min(layout.zero, 1))
    own = sum(block_state_bytes(model, unsharded, b).grads_bytes for b in blocks)
    grad_bytes = state_bytes_per_param(unsharded).grads  # the dtype ``own`` was counted in
    tied = 0 if 0 in blocks else sum(tied_head_params(model, layout, b) for b in blocks)
    return int((own + tied * grad_bytes) * reduce_bytes_per_param(layout) // grad_bytes)


def _zero3_buffers(model: ModelSpec, layout: Layout) -> dict[str, int]:
    """Gathered-parameter and gradient buffers of ZeRO-3 (pp = 1: one stage holds every block)."""
    blocks = tuple(range(2 * model.num_layers + 2))
    grad_bytes = state_bytes_per_param(layout).grads
    if layout.zero_impl == "fsdp2":
        root = fsdp2_unit(model, 0)
        layers = {fsdp2_unit(model, b) for b in blocks} - {root}
        largest = max((unit_params(model, layout, u) for u in layers), default=0)
        largest_grads = max((zero3_grad_bytes(model, layout, u) for u in layers), default=0)
        gather = (unit_params(model, layout, root) + (1 + layout.zero3_prefetch_depth) * largest) * layout.param_bytes
        return {"zero3-gather": gather, "zero3-grads": zero3_grad_bytes(model, layout, root) + 2 * largest_grads}
    modules = list(dict(m for b in blocks for m in partitioned_modules(model, layout, b)).values())  # tied once
    window = DEEPSPEED.max_reuse_numel + DEEPSPEED.prefetch_bucket_numel + max(modules, default=0)
    total_grads = zero3_grad_bytes(model, layout, blocks)
    return {"zero3-gather": min(sum(modules), window) * layout.param_bytes,
            "zero3-grads": min(total_grads, 2 * DEEPSPEED.reduce_bucket_numel * grad_bytes)}
