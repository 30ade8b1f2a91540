"""Passes: NeMo's apex ``DistributedFusedAdam`` gradient and parameter sync under Megatron-Core's schedules.

``Layout.zero_impl = "apex"`` (ZeRO-1). Read from NeMo r2.0.0rc1 (Aug 2024, the NeMo 2.0 release candidate; assumed
to be the 24.07 container's NeMo: the launcher pins no NeMo version) and the commits its Dockerfile pins (lines 67-68): Megatron-LM 338af514 (core_r0.8.0 but for
docstrings; schedules.py lines below are 338af514's) and NVIDIA/apex 810ffae3 (distributed_fused_adam.py lines below
are 810ffae3's; f3f04924 of April 2024 adds only NCCL user buffers, f9f19d5c of July only another hook registration):

* Buckets (:func:`simgrid.schedules.buckets.apex_buckets`): one per transformer layer, each padded to whole
  ``bucket_cap_mb`` state buckets, communicated together (``init_params_bucket``). NeMo puts the rank's non-layer
  parameters, and every parameter with ``_disable_overlap_grad_sync`` (the sequence-parallel norms; the tied word
  embedding with pp > 1), into the bucket of the rank's first layer (megatron_gpt_model.py ``configure_optimizers``
  lines 557-642), so that bucket's gradients never fill before the optimizer's ``grad_sync()``: with sequence
  parallelism, or with pp > 1 and tied embeddings on the first and last pipeline rank, its reduce-scatter is issued
  after the rank's last backward (:func:`_deferred_bucket`).
* Gradients (``grad_sync_func = reduce_overlap_gradients`` -> ``try_grad_sync`` -> ``_try_start_bucket_grad_sync``,
  NeMo megatron_gpt_model.py ``fwd_bwd_step`` lines 648-666, megatron_base_model.py lines 675-691):
  without pipelining (schedules.py ``forward_backward_no_pipelining``, line 390) and on pipeline rank 0 of
  1F1B (lines 1416-1417, 1441-1442) the last micro-batch runs outside ``no_sync`` and apex's post-backward hooks
  reduce-scatter each layer bucket once it is full, as Megatron's buckets; the other 1F1B ranks call
  ``grad_sync_func`` once after their cool-down (lines 1455-1459). The interleaved schedule calls
  ``grad_sync_func[c]`` for model chunk ``c`` after the backward ``pipeline_rank`` iterations after the chunk's
  last one (``grad_sync_microbatch_id = microbatch_id - pipeline_parallel_rank``, lines 751-760), the rest after
  the loop (lines 1073-1078): all of the chunk's buckets at once.
* Parameters (``overlap_param_sync``; ``param_sync_func = sync_overlap_parameters`` ->
  ``_try_start_bucket_param_sync(params)``): the optimizer step gathers the rank's first bucket itself
  (distributed_fused_adam.py ``step``, lines 2333-2360), here issued in the prologue. Launching a sync first
  makes the compute stream wait for every sync in flight (``_start_bucket_param_sync`` calls
  ``_finish_bucket_param_sync``, lines 1945-1946, 1991-1999), and the gathers start after the compute issued
  before them (``comm_stream.wait_stream(main_stream)``, line 1972), as the IR's collectives do.
  - Interleaved schedule (schedules.py lines 620-623, 671-686): chunks 0 and 1 are synced at the
    start of the step (waiting for the first bucket, then for chunk 0); chunk ``c + 1`` (``1 < c + 1 <
    num_model_chunks``) at the forward iteration ``c * pp - pipeline_rank``, waiting for chunk ``c``. The last
    chunk is waited for by the pre-forward hook of its first forward (``_param_copy``, lines 1600-1609). Every
    other hook finds its bucket ready (``pre_forward_hook`` lines 851-857; ``_try_start_bucket_param_sync()``
    then returns while a later chunk is syncing).
  - No pipelining and 1F1B never call ``param_sync_func``: the pre-forward hooks run the chain alone, one bucket
    in flight, waited for at its first use, the next (in forward order: ``_params_buckets`` is filled in
    descending bucket id, line 2275) launched after it - what :mod:`.param_gather` lowers for Megatron-Core.
"""

from __future__ import annotations

from simgrid.ir.ops import Collective, Op, Wait
from simgrid.schedules.buckets import Bucket
from simgrid.schedules.lower.context import LoweringContext, Role, Step
from simgrid.schedules.lower.data_parallel import (
    add_overlapped_grad_sync,
    bucket_collective,
    sync_after_chunk_backwards,
    sync_during_last_backward,
)
from simgrid.schedules.lower.param_gather import add_overlapped_param_gather, gather_collective, gathers_overlapped


def is_apex(ctx: LoweringContext) -> bool:
    """True when NeMo's apex distributed Adam syncs this layout's ZeRO-1 data parallelism."""
    lay = ctx.layout
    return lay.zero_impl == "apex" and lay.zero == 1 and lay.grad_sync_size > 1


def _deferred_bucket(ctx: LoweringContext, pp_rank: int) -> tuple[int, Bucket] | None:
    """The rank's first-layer bucket when it holds a ``_disable_overlap_grad_sync`` parameter (synced only by the
    optimizer's ``grad_sync()``): sequence-parallel norms on every rank, the tied word embedding with pp > 1 on the
    first and last pipeline rank (megatron_gpt_model.py ``configure_optimizers``, r2.0.0rc1)."""
    lay = ctx.layout
    tied = lay.pp > 1 and ctx.model.tied_embeddings and pp_rank in (0, lay.pp - 1)
    if not (lay.sequence_parallel or tied):
        return None
    stage = ctx.stages_of(pp_rank)[0]
    return stage, ctx.buckets(stage)[-1]


def _backward_steps(role: Role) -> list[Step]:
    return [s for s in role if s.action is not None and s.action.kind in ("B", "W")]


def _forward_steps(role: Role) -> list[Step]:
    return [s for s in role if s.action is not None and s.action.kind == "F"]


def add_apex_grad_sync(ctx: LoweringContext, role: Role, pp_rank: int) -> Role:
    """apex reduce-scatters, placed as NeMo's ``grad_sync_func`` and apex's hooks issue them (module docstring)."""
    if not is_apex(ctx) or not ctx.layout.overlap_grad_reduce:
        return add_overlapped_grad_sync(ctx, role, pp_rank)
    deferred = _deferred_bucket(ctx, pp_rank)
    backwards = _backward_steps(role)
    lay = ctx.layout
    if lay.vpp == 1 and (lay.pp == 1 or pp_rank == 0):
        sync_during_last_backward(ctx, role, pp_rank, skip=deferred)  # apex's post-backward hooks
    else:
        # 1F1B ranks > 0: one grad_sync_func after the cool-down. Interleaved: per chunk, pp_rank backward
        # iterations after the chunk's last one (or after the loop).
        sync_after_chunk_backwards(ctx, role, pp_rank, skip=deferred)
    if deferred is not None:  # the optimizer's grad_sync() (distributed_fused_adam.py step, line 2251)
        backwards[-1].ops = [*backwards[-1].ops, bucket_collective(ctx, pp_rank, *deferred)]
    return role


def add_apex_param_sync(ctx: LoweringContext, role: Role, pp_rank: int) -> Role:
    """apex's parameter all-gathers in the next step's forward (module docstring)."""
    if not (is_apex(ctx) and gathers_overlapped(ctx)) or ctx.layout.vpp == 1:
        return add_overlapped_param_gather(ctx, role, pp_rank)
    stages = ctx.stages_of(pp_rank)
    chunks = [[gather_collective(ctx, pp_rank, stage, bucket) for bucket in reversed(ctx.buckets(stage))]
              for stage in stages]
    first, chunks[0] = chunks[0][:1], chunks[0][1:]

    def wait_for(chunk: list[Collective]) -> list[Op]:
        return [Wait(handle=c.handle) for c in chunk]

    # The previous step's optimizer gathers the first bucket; param_sync_func[0] and [1] at the step's start.
    role[0].ops = [*role[0].ops, *first, *wait_for(first), *chunks[0], *wait_for(chunks[0]), *chunks[1]]
    forwards = _forward_steps(role)
    first_forward: dict[int, int] = {}
    for k, step in enumerate(forwards):
        assert step.action is not None
        first_forward.setdefault(step.action.stage, k)
    before: dict[int, list[Op]] = {}
    for c in range(1, len(stages) - 1):  # chunk c + 1 is launched c * pp - pp_rank forwards in, waiting for c
        at = max(0, first_forward[stages[c]] - pp_rank)
        before.setdefault(at, []).extend([*wait_for(chunks[c]), *chunks[c + 1]])
    # Every chunk but the last is waited for where the next one launches; the last chunk, still syncing at its
    # first use, by the pre-forward hook of that forward.
    before.setdefault(first_forward[stages[-1]], []).extend(wait_for(chunks[-1]))
    for at, ops in before.items():
        forwards[at].ops = [*ops, *forwards[at].ops]
    return role

