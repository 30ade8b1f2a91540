"""Passes: expert parallelism. All-to-all dispatch and combine around each MoE sub-block, and the routed
experts' gradient synchronisation over the expert data-parallel group.

:func:`add_expert_parallel` wraps every F, B, I and full-recompute R op of a MoE sub-block with the
collectives of :func:`simgrid.model.moe.moe_collectives` (purpose ``ep``): the dispatch all-to-all over the
EP group and the ETP all-gather before the experts, the ETP reduce-scatter and the combine all-to-all after
them, and their conjugates around the backward (Megatron-Core's ``MoEAlltoAllTokenDispatcher``; Liu et al.
2025, arXiv:2504.14960, section 4). Each is waited at once: the dispatcher is synchronous (the experts cannot
start without their tokens). The dispatcher's buffers (the permuted token copies and the tokens received,
:func:`simgrid.model.moe.dispatcher_buffer_bytes`) are allocated before the first of them and freed after the
last (category ``comm``). At ``stage`` granularity the collectives of the op's MoE blocks are folded per
(position, kind, group) into one op with ``count`` = how many it stands for, as the tensor-parallel pass does.

:func:`add_expert_grad_sync` does for the routed experts' gradients what
:func:`~.data_parallel.add_overlapped_grad_sync` does for the others, on the expert data-parallel group
(``edp``, the ranks holding the same expert shard): an all-reduce (ZeRO 0) or reduce-scatter (ZeRO-1) per
expert bucket (``s{stage}:ebucket{i}``), issued after the last micro-batch's backward op that completes it.
:func:`expert_param_sync` is ZeRO-1's all-gather of the updated expert shards after the optimizer step.
"""

from __future__ import annotations

from collections import defaultdict

from simgrid.ir.ops import Alloc, Collective, Compute, Free, Op, Wait
from simgrid.layout.experts import edp_group_name, ep_group_name, etp_group_name
from simgrid.model.moe import dispatcher_buffer_bytes
from simgrid.schedules.buckets import Bucket
from simgrid.schedules.lower.context import LoweringContext, Role
from simgrid.schedules.lower.data_parallel import insert_after_weight_grads, last_backward_step
from simgrid.schedules.lower.tensor_parallel import comm_phase, wrap_compute_ops

PURPOSE = "ep"
"""Purpose of the dispatch/combine all-to-alls and the expert tensor-parallel gathers."""


def _folded(ctx: LoweringContext, start: int, end: int, phase: str) -> list[tuple[str, str, str, int, int]]:
    """(position, kind, group, count, bytes) of the EP collectives of blocks [start, end) in a phase: every one
    at block granularity, folded per (position, kind, group) at stage granularity; cached."""
    cache = ctx.memo["ep-collective-folds"]
    key = (start, end, phase)
    if key not in cache:
        folded: dict[tuple[str, str, str, int], list[int]] = defaultdict(lambda: [0, 0])
        for block in range(start, end):
            for serial, coll in enumerate(ctx.cost(block).ep_comm):
                if coll.phase == phase:
                    entry = folded[(coll.position, coll.kind, coll.group, serial if ctx.granularity == "block" else 0)]
                    entry[0] += 1
                    entry[1] += int(coll.bytes)
        cache[key] = [(pos, kind, group, count, size) for (pos, kind, group, _), (count, size) in folded.items()]
    return cache[key]


def expert_collectives(ctx: LoweringContext, op: Compute, groups: dict[str, str]) -> tuple[list[Op], list[Op]]:
    """(ops before, ops after) a compute op: its MoE blocks' EP collectives, each waited at once, inside an
    ALLOC/FREE of the dispatcher buffers. ``groups`` maps ``ep``/``etp`` to this role's group names."""
    phase = comm_phase(ctx, op)
    if phase is None:
        return [], []
    found = _folded(ctx, op.block_start, op.block_end, phase)
    if not found:
        return [], []
    label_base = f"b{op.block_start}" if ctx.granularity == "block" else f"s{op.stage}"
    label = f"{label_base}:{phase}" if op.kind != "R" else f"{label_base}:recompute"
    prefix = f"{PURPOSE}:s{op.stage}:m{op.microbatch}:{op.kind}:b{op.block_start}:"
    buffer = f"ep-dispatch:s{op.stage}:m{op.microbatch}:{op.kind}:b{op.block_start}"
    before: list[Op] = [Alloc(name=buffer, bytes=dispatcher_buffer_bytes(ctx.model, ctx.layout), category="comm")]
    after: list[Op] = []
    for index, (position, kind, group, count, size) in enumerate(found):
        handle = f"{prefix}{position}{index}"
        collective = Collective(kind=kind, group=groups[group], bytes=size, purpose=PURPOSE, handle=handle,  # type: ignore[arg-type]
                                count=count, label=label)
        (before if position == "before" else after).extend((collective, Wait(handle=handle)))
    after.append(Free(name=buffer))
    return before, after


def add_expert_parallel(ctx: LoweringContext, role: Role, pp_rank: int) -> Role:
    """Wrap every F, B, I and full-recompute R op of a MoE sub-block with its dispatch and combine (module
    docstring); nothing for a dense model or when ep = etp = 1 (the tokens never leave the rank)."""
    lay = ctx.layout
    if ctx.model.moe is None or (lay.ep == 1 and lay.expert_tp == 1):
        return role
    coord = ctx.expert_coord(pp_rank)
    groups = {"ep": ep_group_name(coord), "etp": etp_group_name(coord)}
    return wrap_compute_ops(role, lambda op: expert_collectives(ctx, op, groups))


def _expert_bucket_collective(ctx: LoweringContext, pp_rank: int, stage: int, bucket: Bucket) -> Collective:
    group = edp_group_name(ctx.expert_coord(pp_rank))
    label = f"s{stage}:ebucket{bucket.index}"
    if ctx.layout.zero >= 1:
        return Collective(kind="reduce_scatter", group=group, bytes=bucket.bytes, purpose="zero-grad",
                          handle=f"zero-grad:{label}", label=label)
    return Collective(kind="all_reduce", group=group, bytes=bucket.bytes, purpose="dp-grad",
                      handle=f"dp-grad:{label}", label=label)


def syncs_expert_grads(ctx: LoweringContext) -> bool:
    """Whether routed-expert gradients need a sync: a MoE model whose expert shards have copies (edp > 1)."""
    return ctx.model.moe is not None and ctx.layout.edp > 1


def add_expert_grad_sync(ctx: LoweringContext, role: Role, pp_rank: int) -> Role:
    """All-reduce (ZeRO 0) or reduce-scatter (ZeRO-1) of each expert bucket over the expert data-parallel
    group, on the last micro-batch's backward (or after the last backward without overlap)."""
    if not syncs_expert_grads(ctx):
        return role
    if not ctx.layout.overlap_grad_reduce:
        last = max(i for i, s in enumerate(role) if s.action is not None and s.action.kind in ("B", "W"))
        role[last].ops = role[last].ops + [
            _expert_bucket_collective(ctx, pp_rank, stage, bucket)
            for stage in ctx.stages_of(pp_rank)
            for bucket in ctx.buckets(stage, experts=True)
        ]
        return role
    for stage in ctx.stages_of(pp_rank):
        additions: dict[int, list[Op]] = defaultdict(list)
        for bucket in ctx.buckets(stage, experts=True):
            additions[min(bucket.blocks)].append(_expert_bucket_collective(ctx, pp_rank, stage, bucket))
        if additions:
            insert_after_weight_grads(last_backward_step(role, stage), additions)
    return role


def expert_param_sync(ctx: LoweringContext, pp_rank: int) -> list[Op]:
    """ZeRO-1: all-gather of the updated expert shards per expert bucket over the expert data-parallel group,
    then the waits; empty otherwise."""
    if not syncs_expert_grads(ctx) or ctx.layout.zero == 0:
        return []
    group = edp_group_name(ctx.expert_coord(pp_rank))
    issues: list[Op] = []
    waits: list[Op] = []
    for stage in ctx.stages_of(pp_rank):
        for bucket in ctx.buckets(stage, experts=True):
            size = sum(ctx.cost(b).expert_param_count for b in bucket.blocks) * ctx.layout.param_bytes
            label = f"s{stage}:ebucket{bucket.index}"
            coll = Collective(kind="all_gather", group=group, bytes=size, purpose="zero-param",
                              handle=f"zero-param:{label}", label=label)
            issues.append(coll)
            waits.append(Wait(handle=coll.handle))
    return issues + waits
