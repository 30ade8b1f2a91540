"""Pass: ZeRO-1 parameter all-gather overlapped with the forward (Megatron-Core ``--overlap-param-gather``).

What Megatron-Core does (NVIDIA/Megatron-LM, tag core_r0.8.0, ``megatron/core/optimizer/distrib_optimizer.py``):

* ``step_with_ready_grads`` updates the rank's shard and, with ``overlap_param_gather``, does *not* gather
  the updated parameters: the gather is deferred to the next step.
* ``zero_grad`` at the start of the next step dispatches the asynchronous all-gather of the first bucket the
  forward uses (``_dispatch_gather_model_params(0)``). The buckets are listed per model chunk in *reverse*
  of their gradient order (``_get_model_param_buffer_dp_views``: the gradient buckets start at the end of
  the model, the forward at its start), model chunks in order.
* A forward pre-hook on every module waits for the gather of the bucket holding the module's parameters
  and then dispatches the gather of the *next* bucket (``_finish_param_sync_helper``): one gather in
  flight at a time, so communication kernels never head-of-line block compute under
  ``CUDA_DEVICE_MAX_CONNECTIONS=1``. Only the first forward of a module waits (the handle is cleared).

The Program is one steady-state step, so the gathers it holds are those of the parameters the *previous*
step's optimizer updated: the first bucket's ALL_GATHER is issued in the prologue, and before the first
forward op of each bucket (on the stage's first micro-batch) a WAIT for that bucket is followed by the
next bucket's ALL_GATHER, which then runs beside that bucket's forward compute. The optimizer pass then
issues no gathers (:func:`simgrid.schedules.lower.optimizer.add_step_end`): the step still moves every
bucket once (bytes conserved), at a different place. At ``stage`` granularity the first forward op of a
stage is split at bucket boundaries so that each piece can wait for its own bucket (the later
micro-batches keep their one op per stage).

The buckets are :mod:`simgrid.schedules.buckets`'s: ``bucket_size_MB`` on every stage under the ``ddp``
policy, Megatron-Core's rule (one bucket per chunk on pipeline ranks > 0) under ``bucket_policy = "megatron"``.
"""

from __future__ import annotations

from typing import Final

from simgrid.ir.ops import Collective, Compute, Op, Wait
from simgrid.layout.mesh import Mesh
from simgrid.schedules.buckets import Bucket, apex_padded_params
from simgrid.schedules.lower.compute import cut_at
from simgrid.schedules.lower.context import LoweringContext, Role, Step

PURPOSE: Final = "zero-param"


def bucket_param_bytes(ctx: LoweringContext, bucket: Bucket) -> int:
    """Parameter bytes one rank holds of a bucket's dense (non-expert) parameters: what its all-gather moves (with
    ``zero_impl = "apex"`` padded to whole apex state buckets, :func:`~simgrid.schedules.buckets.apex_padded_params`)."""
    params = sum(ctx.cost(b).param_count - ctx.cost(b).expert_param_count for b in bucket.blocks)
    if ctx.layout.zero_impl == "apex":
        params = apex_padded_params(params, ctx.layout)
    return params * ctx.layout.param_bytes


def gather_collective(ctx: LoweringContext, pp_rank: int, stage: int, bucket: Bucket) -> Collective:
    """The ALL_GATHER of one bucket's updated parameters over the data-parallel group."""
    label = f"s{stage}:bucket{bucket.index}"
    return Collective(kind="all_gather", group=Mesh.dp_group_name(ctx.coord(pp_rank)),
                      bytes=bucket_param_bytes(ctx, bucket), purpose=PURPOSE, handle=f"{PURPOSE}:{label}",
                      label=label)


def gathers_overlapped(ctx: LoweringContext) -> bool:
    """True when the parameter gathers move into the forward (and out of the optimizer step)."""
    lay = ctx.layout
    return lay.overlap_param_gather and lay.zero == 1 and lay.grad_sync_size > 1


def _first_forward(role: Role, stage: int) -> Step:
    for step in role:
        if step.action is not None and step.action.kind == "F" and step.action.stage == stage:
            return step
    raise AssertionError(f"internal: stage {stage} has no forward in this role")


def add_overlapped_param_gather(ctx: LoweringContext, role: Role, pp_rank: int) -> Role:
    """Bucket-by-bucket parameter all-gathers in the first forward of each local stage, one in flight."""
    if not gathers_overlapped(ctx):
        return role
    # Forward order: model chunks in order, each chunk's buckets from the model's start (last index first).
    order = [(stage, bucket) for stage in ctx.stages_of(pp_rank) for bucket in reversed(ctx.buckets(stage))]
    issue = [gather_collective(ctx, pp_rank, stage, bucket) for stage, bucket in order]
    role[0].ops = [*role[0].ops, issue[0]]
    position = 0  # index into ``order`` of the next bucket to wait for
    for stage in ctx.stages_of(pp_rank):
        step = _first_forward(role, stage)
        starts = {min(bucket.blocks): i for i, (s, bucket) in enumerate(order) if s == stage}
        new_ops: list[Op] = []
        for op in step.ops:
            if not (isinstance(op, Compute) and op.kind == "F"):
                new_ops.append(op)
                continue
            for piece in cut_at(ctx, op, starts):
                for block in range(piece.block_start, piece.block_end):
                    if block in starts:
                        index = starts[block]
                        if index != position:
                            raise AssertionError(f"internal: bucket {index} is reached before bucket {position}")
                        new_ops.append(Wait(handle=issue[index].handle))
                        if index + 1 < len(issue):
                            new_ops.append(issue[index + 1])
                        position += 1
                new_ops.append(piece)
        step.ops = new_ops
    if position != len(issue):
        raise AssertionError(f"internal: {len(issue) - position} parameter buckets never waited for")
    return role
