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
from simgrid.model.blocks import block_kind
from simgrid.model.fp8_kernels import fp8_weight_params
from simgrid.model.moe import is_moe_block
from simgrid.schedules.buckets import Bucket, apex_padded_params, apex_state_bucket_params
from simgrid.schedules.lower.compute import cut_at
from simgrid.schedules.lower.context import LoweringContext, Role, Step

PURPOSE: Final = "zero-param"
FP8_PARAM_BYTES: Final = 1
"""Bytes per element of an fp8 weight in apex's parameter all-gather (``param_sync_dtype = torch.uint8``)."""


def bucket_param_bytes(ctx: LoweringContext, bucket: Bucket) -> int:
    """Parameter bytes one rank holds of a bucket's dense (non-expert) parameters: what its all-gather moves (with
    ``zero_impl = "apex"`` padded to whole apex state buckets, :func:`~simgrid.schedules.buckets.apex_padded_params`)."""
    params = sum(ctx.cost(b).param_count - ctx.cost(b).expert_param_count for b in bucket.blocks)
    if ctx.layout.zero_impl == "apex":
        params = apex_padded_params(params, ctx.layout)
    return params * ctx.layout.param_bytes


def _fp8_weights(ctx: LoweringContext, bucket: Bucket) -> int:
    """Parameters of a bucket that are Transformer Engine ``Float8Tensor`` weights under ``Layout.fp8_params``: the
    dense sub-blocks' TE linears (a MoE sub-block's weights are counted 16-bit: GroupedLinear's fp8 weights are not
    modelled)."""
    model = ctx.model
    return sum(fp8_weight_params(model, ctx.layout, block_kind(model, b)[0]) for b in bucket.blocks
               if not is_moe_block(model, b))


def _dense_params(ctx: LoweringContext, bucket: Bucket) -> int:
    return sum(ctx.cost(b).param_count - ctx.cost(b).expert_param_count for b in bucket.blocks)


def fp8_param_gather_bytes(ctx: LoweringContext, pp_rank: int, stage: int, bucket: Bucket) -> int:
    """Bytes one rank gathers of a bucket under ``Layout.fp8_params`` (NeMo v2.0.0.rc0.beta, b2eccd2).

    NeMo keeps only a layer's ``Float8Tensor`` weights in its bucket and puts every other parameter of the rank
    (norms, biases, embedding, output layer) into the rank's first-layer bucket (megatron_gpt_model.py
    ``make_parameter_bucket``, lines 552-558, and ``buckets[-1].extend``, lines 577-579);
    ``MegatronDistributedFusedAdam.init_params_bucket`` gives a bucket's fp8 weights their own apex state buckets
    with ``param_sync_dtype = torch.uint8`` and the rest state buckets of the 16-bit sync dtype
    (nemo/core/optim/distributed_adam.py lines 240-293), each group padded to whole state buckets. A bucket
    without fp8 weights is kept whole (line 556) and gathered as before."""
    fp8 = _fp8_weights(ctx, bucket)
    if not fp8:
        return bucket_param_bytes(ctx, bucket)
    lay = ctx.layout
    gathered = apex_padded_params(fp8, lay) * FP8_PARAM_BYTES
    first_stage = ctx.stages_of(pp_rank)[0]
    if stage == first_stage and bucket.index == ctx.buckets(stage)[-1].index:
        rest = sum(_dense_params(ctx, b) - _fp8_weights(ctx, b) for s in ctx.stages_of(pp_rank)
                   for b in ctx.buckets(s) if _fp8_weights(ctx, b))
        if rest:
            gathered += apex_padded_params(rest, lay) * lay.param_bytes
    return gathered


def fp8_shard_cast(ctx: LoweringContext, stage: int) -> tuple[int, int]:
    """(fp8 weights of ``stage`` in this rank's ZeRO shard, launches) of the optimizer's fp8 cast under
    ``Layout.fp8_params``: after the Adam update, ``_check_params_shard_dtypes`` runs one ``cast_to_fp8`` per fp8
    weight fragment in the rank's shard of every uint8 state bucket (nemo/core/optim/distributed_adam.py lines
    577-614 at b2eccd2), counted here as one per state bucket (a shard slice holds one fragment but where a
    weight ends inside it)."""
    fp8_per_bucket = [_fp8_weights(ctx, b) for b in ctx.buckets(stage)]
    size = apex_state_bucket_params(ctx.layout)
    launches = sum(apex_padded_params(n, ctx.layout) // size for n in fp8_per_bucket)
    return -(-sum(fp8_per_bucket) // ctx.layout.grad_sync_size), launches


def gather_collective(ctx: LoweringContext, pp_rank: int, stage: int, bucket: Bucket) -> Collective:
    """The ALL_GATHER of one bucket's updated parameters over the data-parallel group (fp8 weights as uint8
    under ``Layout.fp8_params``, :func:`fp8_param_gather_bytes`)."""
    label = f"s{stage}:bucket{bucket.index}"
    size = (fp8_param_gather_bytes(ctx, pp_rank, stage, bucket) if ctx.layout.fp8_params
            else bucket_param_bytes(ctx, bucket))
    return Collective(kind="all_gather", group=Mesh.dp_group_name(ctx.coord(pp_rank)),
                      bytes=size, purpose=PURPOSE, handle=f"{PURPOSE}:{label}", label=label)


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
