"""Passes: data-parallel gradient synchronisation issued during the backward, bucket by bucket.

* DDP (ZeRO 0, ``dp_mode = "allreduce"``): one ALL_REDUCE per bucket (:mod:`simgrid.schedules.buckets`),
  issued right after the backward op that completes the bucket on the stage's *last* micro-batch, so it
  overlaps the rest of the backward (Li et al. VLDB 2020, section 3.2.3); earlier micro-batches only
  accumulate (DDP ``no_sync``). With pipeline parallelism each stage (model chunk) syncs its own buckets.
  With ``overlap_grad_reduce = False`` every bucket is issued after the rank's last backward instead.
* Parameter server (``dp_mode = "parameter-server"``): a REDUCE of each bucket to the data-parallel
  group's first rank at the same place; the update and the BROADCAST back follow the backward
  (:mod:`simgrid.schedules.lower.optimizer`).
* ZeRO-1: a REDUCE_SCATTER per bucket at the same place (each rank keeps the reduced shard it updates);
  like Megatron's distributed optimizer with overlapped grad reduce.
* Megatron-LM under the interleaved schedule (``bucket_policy = "megatron"``, ``schedule =
  "interleaved-1f1b"``): ``--delay-grad-reduce`` is on unless ``--no-delay-grad-reduce`` (Megatron-LM f2e5db4,
  megatron/training/arguments.py lines 1422-1424), so training.py (lines 1001-1004) hands the schedule one
  ``grad_sync_func`` per model chunk (``DistributedDataParallel.start_grad_sync``: every bucket of the chunk).
  The schedule then keeps every backward inside ``no_sync`` (the hooks only accumulate: the per-bucket launch
  of lines 731-733 is taken only without ``grad_sync_func``) and, after the backward ``pipeline_rank``
  iterations after a chunk's last one, starts that chunk's buckets all at once (core/pipeline_parallel/
  schedules.py lines 750-759; "we launch asynchronous communication at the same time across the
  pipeline-parallel group"); the chunks still unsynced start after the cool-down, in chunk order (lines
  1073-1079). :func:`sync_after_chunk_backwards` places them so. Without pipelining and under plain 1F1B the
  per-bucket launch above stands (ranks > 0 hold one bucket per chunk, launched after their last backward
  either way: lines 1416-1417, 1455-1459).
* At ``stage`` granularity one op stands for a whole stage's backward, which would hold every bucket back
  until the backward ends. The last backward of each stage is therefore cut at bucket boundaries
  (:func:`split_at_buckets`), its recompute and backward pieces interleaved in backward order as Megatron
  runs them layer by layer, so each bucket is issued where its gradients are complete whatever the
  granularity; the other micro-batches keep their one op per stage.
* ZeRO-2: the gradients are sharded, so every micro-batch's backward reduce-scatters each bucket as it
  completes into the rank's shard; the full-size bucket buffer (category ``comm``) is allocated before the
  bucket's first backward op and freed once its reduce-scatter has completed, which is waited for when
  the next bucket's reduce-scatter is issued (double buffering, as DeepSpeed stage 2 with
  ``overlap_comm``; Rajbhandari et al. 2020, section 5.2), the last one at the end of that backward.
  At ``stage`` granularity one backward op covers every bucket, so a single buffer of the largest two
  consecutive buckets stands for the double buffer (:func:`double_buffer_bytes`).

WAITs for the DDP, PS and ZeRO-1 handles sit before the optimizer step (added by the step-end pass).
"""

from __future__ import annotations

from collections import defaultdict
from itertools import pairwise

from simgrid.ir.ops import Alloc, Collective, Compute, Free, Op, Wait
from simgrid.layout.mesh import Mesh
from simgrid.schedules.buckets import Bucket
from simgrid.schedules.lower.compute import cut_at
from simgrid.schedules.lower.context import LoweringContext, Role, Step

SPLIT_KINDS = ("R", "B", "I", "W")
"""Compute kinds of a backward step that :func:`split_at_buckets` cuts (recompute, backward and its halves)."""


def _weight_grad_op(op: Op, block: int) -> bool:
    return isinstance(op, Compute) and op.kind in ("B", "W") and op.block_start <= block < op.block_end


def insert_after_weight_grads(step: Step, additions: dict[int, list[Op]]) -> None:
    """Insert ``additions[block]`` right after the B/W op of ``step`` that covers ``block``."""
    pending = dict(additions)
    new_ops: list[Op] = []
    for op in step.ops:
        new_ops.append(op)
        for block in [b for b in pending if _weight_grad_op(op, b)]:
            new_ops += pending.pop(block)
    if pending:
        raise AssertionError(f"internal: no backward op for blocks {sorted(pending)} in step {step.action}")
    step.ops = new_ops


def last_backward_step(role: Role, stage: int) -> Step:
    """The step running the stage's last weight-gradient pass (B or W) of the training step."""
    for step in reversed(role):
        if step.action is not None and step.action.stage == stage and step.action.kind in ("B", "W"):
            return step
    raise AssertionError(f"internal: stage {stage} has no backward in this role")


def _pieces(ctx: LoweringContext, op: Compute, cuts: list[int]) -> list[Compute | None]:
    """``op`` cut at the block indices in ``cuts`` that fall inside it, in backward order (last blocks first);
    ``None`` for a recompute piece whose blocks recompute nothing (the embedding or the head alone)."""
    return [None if piece.kind == "R" and not any(ctx.cost(b).recompute_flops > 0
                                                  for b in range(piece.block_start, piece.block_end))
            else piece for piece in reversed(cut_at(ctx, op, cuts))]


def split_at_buckets(ctx: LoweringContext, step: Step, buckets: list[Bucket]) -> None:
    """Cut the multi-bucket R/B/I/W compute ops of ``step`` at bucket boundaries, interleaved per piece.

    A step ``[R, Alloc, B, Free...]`` whose ops span buckets 0..n becomes ``[R0, Alloc, B0, R1, B1, ...,
    Rn, Bn, Free...]``: piece ``j`` of every cut op runs before piece ``j + 1`` of any, as a per-layer
    backward would; the ops between two cut ops stay after the first one's first piece, those after the
    last cut op after its last piece. Costs are summed per piece (:func:`~.compute.cut_at`), so the step's work
    is unchanged. A step whose ops hold one bucket each (block granularity) is left as it is.
    """
    cuts = sorted(min(bucket.blocks) for bucket in buckets)
    split = [i for i, op in enumerate(step.ops) if isinstance(op, Compute) and op.kind in SPLIT_KINDS
             and any(op.block_start < c < op.block_end for c in cuts)]
    if not split:
        return
    pieces = {i: _pieces(ctx, step.ops[i], cuts) for i in split}  # type: ignore[arg-type]
    if len({len(p) for p in pieces.values()}) != 1:
        raise AssertionError(f"internal: backward ops of step {step.action} span different block ranges")
    between = {i: step.ops[i + 1: j] for i, j in pairwise([*split, len(step.ops)])}
    new_ops: list[Op] = list(step.ops[: split[0]])
    for j in range(len(pieces[split[0]])):
        for i in split:
            piece = pieces[i][j]
            if piece is not None:
                new_ops.append(piece)
            if (j == 0 and i != split[-1]) or (j == len(pieces[i]) - 1 and i == split[-1]):
                new_ops += between[i]
    step.ops = new_ops


def bucket_collective(ctx: LoweringContext, pp_rank: int, stage: int, bucket: Bucket) -> Collective:
    """The gradient collective of one bucket: ZeRO reduce-scatter, parameter-server reduce or DDP all-reduce."""
    lay = ctx.layout
    group = Mesh.dp_group_name(ctx.coord(pp_rank))
    label = f"s{stage}:bucket{bucket.index}"
    if lay.zero >= 1:
        return Collective(kind="reduce_scatter", group=group, bytes=bucket.bytes, purpose="zero-grad",
                          handle=f"zero-grad:{label}", label=label)
    if lay.dp_mode == "parameter-server":
        root = ctx.mesh.rank(pp=pp_rank, dp=0, tp=0)
        return Collective(kind="reduce", group=group, bytes=bucket.bytes, purpose="ps-reduce",
                          handle=f"ps-reduce:{label}", root=root, label=label)
    return Collective(kind="all_reduce", group=group, bytes=bucket.bytes, purpose="dp-grad",
                      handle=f"dp-grad:{label}", label=label)


def add_overlapped_grad_sync(ctx: LoweringContext, role: Role, pp_rank: int) -> Role:
    """DDP all-reduce, PS reduce or ZeRO-1 reduce-scatter per bucket on the last micro-batch's backward."""
    if ctx.layout.grad_sync_size == 1 or ctx.layout.zero >= 2:
        return role
    if not ctx.layout.overlap_grad_reduce:
        # Megatron-LM 2021 (``--DDP-impl local``) all-reduces the whole gradient buffer after the last
        # backward of the step (training.py, ``model.allreduce_gradients()``): nothing overlaps.
        last = max((i for i, s in enumerate(role) if s.action is not None and s.action.kind in ("B", "W")))
        role[last].ops = role[last].ops + [
            bucket_collective(ctx, pp_rank, stage, bucket)
            for stage in ctx.stages_of(pp_rank)
            for bucket in ctx.buckets(stage)
        ]
        return role
    if megatron_delays_grad_reduce(ctx):
        sync_after_chunk_backwards(ctx, role, pp_rank)
    else:
        sync_during_last_backward(ctx, role, pp_rank)
    return role


def megatron_delays_grad_reduce(ctx: LoweringContext) -> bool:
    """True when Megatron-LM's default ``delay_grad_reduce`` decides where the gradient collectives start: its
    DDP's buckets (``bucket_policy = "megatron"``) under its interleaved schedule (module docstring)."""
    return ctx.layout.bucket_policy == "megatron" and ctx.layout.schedule == "interleaved-1f1b"


def sync_after_chunk_backwards(ctx: LoweringContext, role: Role, pp_rank: int,
                               skip: tuple[int, Bucket] | None = None) -> None:
    """Every bucket of a model chunk at once, after the backward ``pp_rank`` iterations after the chunk's last
    backward, or after the rank's last backward if the schedule has ended by then (Megatron-Core's interleaved
    ``grad_sync_func`` launch, schedules.py lines 750-759 and 1073-1079 at Megatron-LM f2e5db4 and 338af514).
    Under plain 1F1B a rank has one chunk, whose last backward ends the role: it starts there. ``skip``, a
    ``(stage, bucket)``, is issued elsewhere."""
    backwards = [s for s in role if s.action is not None and s.action.kind in ("B", "W")]
    launch: dict[int, list[Op]] = defaultdict(list)
    for stage in ctx.stages_of(pp_rank):
        last = max(i for i, s in enumerate(backwards) if s.action is not None and s.action.stage == stage)
        launch[min(last + pp_rank, len(backwards) - 1)].extend(
            bucket_collective(ctx, pp_rank, stage, bucket) for bucket in ctx.buckets(stage)
            if skip != (stage, bucket))
    for at, ops in launch.items():
        backwards[at].ops = [*backwards[at].ops, *ops]


def sync_during_last_backward(ctx: LoweringContext, role: Role, pp_rank: int,
                              skip: tuple[int, Bucket] | None = None) -> None:
    """Each bucket's gradient collective as soon as its last gradient is in, on every stage's last backward
    (DDP's / Megatron-Core's / apex's post-backward hooks); ``skip``, a ``(stage, bucket)``, is issued elsewhere."""
    for stage in ctx.stages_of(pp_rank):
        additions: dict[int, list[Op]] = defaultdict(list)
        buckets = ctx.buckets(stage)
        for bucket in buckets:
            if skip != (stage, bucket):
                additions[min(bucket.blocks)].append(bucket_collective(ctx, pp_rank, stage, bucket))
        step = last_backward_step(role, stage)
        split_at_buckets(ctx, step, buckets)
        insert_after_weight_grads(step, additions)


def double_buffer_bytes(buckets: list[Bucket]) -> int:
    """Most bucket bytes live at once when each bucket is freed as the next one's reduce-scatter starts."""
    sizes = [b.bytes for b in buckets]
    return max((sum(sizes[i: i + 2]) for i in range(len(sizes))), default=0)


def add_zero2_grad_sync(ctx: LoweringContext, role: Role, pp_rank: int) -> Role:
    """ZeRO-2: per micro-batch, reduce-scatter each bucket as its backward completes, then free it."""
    if ctx.layout.grad_sync_size == 1 or ctx.layout.zero != 2:
        return role
    group = Mesh.dp_group_name(ctx.coord(pp_rank))
    for step in role:
        action = step.action
        if action is None or action.kind not in ("B", "W"):
            continue
        tag = f"s{action.stage}:m{action.microbatch}"
        allocs: dict[int, list[Op]] = defaultdict(list)
        syncs: dict[int, list[Op]] = defaultdict(list)
        pending: list[Op] = []
        buckets = ctx.buckets(action.stage)
        # One stage-wide compute op stands for every bucket's backward: one buffer of the double-buffered
        # window (two consecutive buckets) replaces the per-bucket buffers, which would all be live at once.
        shared = f"zero2-buckets:{tag}" if ctx.granularity == "stage" else None
        if shared is not None:
            allocs[max(buckets[0].blocks)].append(Alloc(name=shared, bytes=double_buffer_bytes(buckets),
                                                        category="comm"))
        for bucket in buckets:
            buffer = f"zero2-bucket:{tag}:bucket{bucket.index}"
            handle = f"zero-grad:{tag}:bucket{bucket.index}"
            if shared is None:
                allocs[max(bucket.blocks)].append(Alloc(name=buffer, bytes=bucket.bytes, category="comm"))
            # Double buffering: the previous bucket is released once this one's reduce-scatter is issued.
            syncs[min(bucket.blocks)] += [
                Collective(kind="reduce_scatter", group=group, bytes=bucket.bytes, purpose="zero-grad",
                           handle=handle, label=f"s{action.stage}:bucket{bucket.index}"),
                *pending,
            ]
            pending = [Wait(handle=handle)]
            if shared is None:
                pending.append(Free(name=buffer))
        if shared is not None:
            pending.append(Free(name=shared))
        new_ops: list[Op] = []
        for op in step.ops:
            if isinstance(op, Compute) and op.kind in ("B", "W", "R"):
                for block in [b for b in allocs if op.block_start <= b < op.block_end]:
                    new_ops += allocs.pop(block)
            new_ops.append(op)
            if isinstance(op, Compute) and op.kind in ("B", "W"):
                for block in [b for b in syncs if op.block_start <= b < op.block_end]:
                    new_ops += syncs.pop(block)
        step.ops = new_ops + pending
    return role
