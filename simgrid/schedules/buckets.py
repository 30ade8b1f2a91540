"""Gradient buckets: which sub-blocks' gradients are synchronised together, shared with the executor.

PyTorch DDP groups parameters into buckets of about ``bucket_cap_mb`` (25 MB by default) in the reverse
of their forward order, because gradients become ready in backward order, and launches a bucket's
all-reduce as soon as all its gradients are ready (Li et al., "PyTorch Distributed", VLDB 2020,
section 3.2.3). We bucket whole sub-blocks: walking a stage's blocks from last to first, a bucket is
closed as soon as it holds at least ``layout.bucket_size_MB`` MiB of gradients (DDP's ``bucket_cap_mb``
is in MiB, ``bucket_cap_mb * 1024 * 1024``; the memory model sizes its buckets the same way), and the
remainder forms the last bucket. With ``layout.bucket_policy = "megatron"`` the cap is Megatron-Core's
instead (:func:`bucket_cap_bytes`). The executor calls :func:`grad_buckets` too, so both agree on what a bucket holds.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from simgrid.layout.spec import Layout
from simgrid.model.spec import ModelSpec


@dataclass(frozen=True, kw_only=True)
class Bucket:
    """One gradient bucket of a pipeline stage."""

    index: int
    """Position in the stage's bucket list (0 is synchronised first: it holds the last blocks)."""
    blocks: tuple[int, ...]
    """Sub-blocks whose gradients the bucket holds, in backward (descending) order."""
    bytes: int
    """Gradient bytes of the bucket on one rank before any ZeRO sharding."""


def block_grad_bytes(model: ModelSpec, layout: Layout, block: int, *, experts: bool = False) -> int:
    """Unsharded gradient bytes of one sub-block on one tensor-parallel rank: its dense parameters', or
    (``experts``) its routed experts', which sync over the expert data-parallel group instead.

    ZeRO-2/3 shard the gradient *after* it is reduced; the buffer a bucket synchronises is the full one,
    so the memory model is asked for the gradient size with ZeRO at most 1 (gradients unsharded).
    """
    from simgrid.memory.states import model_states_for_params
    from simgrid.model import block_cost

    unsharded = dataclasses.replace(layout, zero=min(layout.zero, 1))
    cost = block_cost(model, unsharded, block)
    count = cost.expert_param_count if experts else cost.param_count - cost.expert_param_count
    return int(model_states_for_params(count, unsharded).grads_bytes)


MEGATRON_MIN_BUCKET_PARAMS = 40_000_000
"""Megatron-Core's smallest default bucket, parameters (``DistributedDataParallel.__init__``, core_r0.8.0)."""
MEGATRON_BUCKET_PARAMS_PER_DP_RANK = 1_000_000
"""Megatron-Core's default bucket grows by this many parameters per data-parallel rank, so that each rank's
ring chunk stays bandwidth-bound at large dp (same source)."""


def bucket_cap_bytes(model: ModelSpec, layout: Layout, stage: int) -> float:
    """Gradient bytes at which a bucket of global ``stage`` closes (``inf``: one bucket for the stage).

    ``megatron``: ``max(40e6, 1e6 * dp)`` parameters (Megatron-Core counts parameters, so the cap is that many
    parameters' gradient bytes), and no bucketing on pipeline ranks > 0 (``DistributedDataParallel.__init__``:
    their communication is off the critical path) nor for model chunks after the first (megatron/training/
    training.py ``get_model``: ``disable_bucketing=(model_chunk_idx > 0)``), both core_r0.8.0.
    """
    from simgrid.memory.buffers import BYTES_PER_BUCKET_MB
    from simgrid.memory.states import state_bytes_per_param
    from simgrid.schedules.pipeline import stage_chunk, stage_to_rank

    if layout.bucket_policy != "megatron":
        return layout.bucket_size_MB * BYTES_PER_BUCKET_MB
    if stage_to_rank(stage, layout.pp, layout.vpp, str(layout.schedule)) > 0 or stage_chunk(stage, layout.pp) > 0:
        return float("inf")
    params = max(MEGATRON_MIN_BUCKET_PARAMS, MEGATRON_BUCKET_PARAMS_PER_DP_RANK * layout.dp)
    return float(params * state_bytes_per_param(layout).grads)


def grad_buckets(model: ModelSpec, layout: Layout, stage: int, *, experts: bool = False) -> list[Bucket]:
    """Buckets of global pipeline ``stage``: its blocks in reverse order, closed at the bucket size. With
    ``experts`` the buckets of the routed experts' gradients (MoE sub-blocks only; synced over the expert
    data-parallel group, labelled ``ebucket``), otherwise of every other gradient."""
    from simgrid.model import stage_blocks

    if layout.zero_impl == "apex" and layout.zero == 1 and not experts:
        return apex_buckets(model, layout, stage)
    cap = bucket_cap_bytes(model, layout, stage)
    buckets: list[Bucket] = []
    current: list[int] = []
    size = 0
    for block in reversed(stage_blocks(model, layout, stage)):
        grads = block_grad_bytes(model, layout, block, experts=experts)
        if experts and not grads:
            continue
        current.append(block)
        size += grads
        if size >= cap:
            buckets.append(Bucket(index=len(buckets), blocks=tuple(current), bytes=size))
            current, size = [], 0
    if current:
        buckets.append(Bucket(index=len(buckets), blocks=tuple(current), bytes=size))
    return buckets



APEX_ALIGNMENT_BYTES = 128
"""apex DistributedFusedAdam aligns its shards to 128 bytes of the gradient-sync dtype (``self.alignment = 128 //
dtype_size``, apex/contrib/optimizers/distributed_fused_adam.py line 699 at 810ffae3, the commit NeMo r2.0.0rc1's
Dockerfile pins)."""


def apex_state_bucket_params(layout: Layout) -> int:
    """Parameters one apex state bucket holds: ``bucket_size_MB`` MiB of gradient-sync dtype, rounded down so that
    each of the ``grad_sync_size`` shards is a multiple of the alignment (``bucket_size = 1024 * 1024 *
    bucket_cap_mb / dtype_size``, ``shard_size`` rounded down to ``alignment``, the bucket ``shard_size *
    distributed_size``; distributed_fused_adam.py lines 698-704 and ``make_bucket`` 1323-1342, 810ffae3)."""
    from simgrid.memory.states import state_bytes_per_param

    grad_bytes = max(1, round(state_bytes_per_param(layout).grads))
    alignment = max(1, APEX_ALIGNMENT_BYTES // grad_bytes)
    shard = int(1024 * 1024 * layout.bucket_size_MB / grad_bytes / layout.grad_sync_size)
    shard = max(alignment, shard // alignment * alignment)
    return shard * layout.grad_sync_size


def apex_padded_params(params: int, layout: Layout) -> int:
    """Parameters an apex bucket group moves: NeMo gives each layer its own state buckets (``init_params_bucket``
    marks the earlier buckets full, distributed_fused_adam.py lines 1216-1218, 810ffae3), every one ``apex_state_bucket_params``
    long however little of the last is filled, and the all-gathers / reduce-scatters move whole buckets."""
    size = apex_state_bucket_params(layout)
    return -(-params // size) * size


def apex_buckets(model: ModelSpec, layout: Layout, stage: int) -> list[Bucket]:
    """NeMo's apex buckets of global ``stage``: one per transformer layer (NeMo r2.0.0rc1 megatron_gpt_model.py
    ``configure_optimizers``, ``buckets.extend(make_parameter_bucket(layer) for layer in layers)``), last layer
    first; each bucket's ``bytes`` are its gradients padded to whole state buckets (:func:`apex_padded_params`).

    NeMo puts every parameter outside the layers (embedding, output layer, final norm) into the bucket of the
    rank's first layer (``buckets[-1].extend(...)`` after ``buckets.reverse()``); here the embedding joins its
    stage's first layer and the head its stage's last layer (the same stage on one pipeline rank; with pp > 1 the
    head's parameters are synced with the last chunk instead of the first: bytes unchanged)."""
    from simgrid.memory.states import state_bytes_per_param
    from simgrid.model import block_kind, stage_blocks

    blocks = stage_blocks(model, layout, stage)
    layers = [block_kind(model, b)[1] for b in blocks if block_kind(model, b)[1] >= 0]
    groups: dict[int, list[int]] = {}
    for block in reversed(blocks):
        kind, layer = block_kind(model, block)
        key = layer if layer >= 0 else (min(layers) if kind == "embed" and layers else
                                         max(layers) if layers else -1)
        groups.setdefault(key, []).append(block)
    per_param = state_bytes_per_param(layout).grads
    buckets: list[Bucket] = []
    for key in sorted(groups, reverse=True):
        members = tuple(sorted(groups[key], reverse=True))
        params = sum(round(block_grad_bytes(model, layout, b) / per_param) for b in members)
        buckets.append(Bucket(index=len(buckets), blocks=members,
                              bytes=int(apex_padded_params(params, layout) * per_param)))
    return buckets
