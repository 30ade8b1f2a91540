"""Communication buffers a rank keeps besides model states and activations.

What we count (each a fixed-size buffer the program builder allocates with category ``comm``):

* ``dp-buckets``: with data parallelism (dp > 1) and ZeRO 0-2, two gradient buckets of
  ``bucket_size_MB`` MiB: one being all-reduced (or reduce-scattered) while the next fills, as DeepSpeed's
  double-buffered reduce bucket and overlapped DDP do (PyTorch DDP's ``bucket_cap_mb`` is in MiB). The
  gradients themselves are counted as grads, assuming they live in the bucket storage
  (``gradient_as_bucket_view`` / Megatron's contiguous grad buffer). Capped at the rank's gradient bytes.
* ``zero3-gather``: with ZeRO-3, the full (tensor-parallel share of the) weights of the block in use plus
  ``zero3_prefetch_depth`` prefetched blocks, gathered from their shards (Rajbhandari et al. 2020, section
  5.3); we size each slot by the largest block of the rank.
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

from simgrid.layout.spec import Layout
from simgrid.memory.states import stage_block_groups, stage_state_bytes
from simgrid.model.blocks import p2p_bytes, stages_of_rank
from simgrid.model.cost import block_cost
from simgrid.model.moe import dispatcher_buffer_bytes
from simgrid.model.spec import ModelSpec

#: Buckets in flight for overlapped gradient sync (one reducing, one filling).
DP_BUCKETS_IN_FLIGHT = 2
#: Bytes in the "MB" of ``bucket_size_MB`` (PyTorch DDP ``bucket_cap_mb`` is MiB).
BYTES_PER_BUCKET_MB = 1024 * 1024


def comm_buffer_bytes(model: ModelSpec, layout: Layout, pp_rank: int = 0) -> dict[str, int]:
    """Communication buffers of one rank of pipeline rank ``pp_rank``, by purpose (see module docstring)."""
    buffers: dict[str, int] = {}
    if layout.grad_sync_size > 1 and layout.zero < 3:
        grads = stage_state_bytes(model, layout, pp_rank).grads_bytes
        bucket = int(layout.bucket_size_MB * BYTES_PER_BUCKET_MB)
        buffers["dp-buckets"] = min(DP_BUCKETS_IN_FLIGHT * bucket, grads)
    if layout.zero == 3 and layout.grad_sync_size > 1:
        largest = max(
            block_cost(model, layout, block).param_count
            for stage in stages_of_rank(layout, pp_rank)
            for block, _ in stage_block_groups(model, layout, stage)
        )
        buffers["zero3-gather"] = (1 + layout.zero3_prefetch_depth) * largest * layout.param_bytes
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
        ) * layout.param_bytes
        if expert_grads:
            bucket = int(layout.bucket_size_MB * BYTES_PER_BUCKET_MB)
            buffers["edp-buckets"] = min(DP_BUCKETS_IN_FLIGHT * bucket, expert_grads)
    return buffers
