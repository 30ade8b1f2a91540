"""Passes: Megatron 1-D tensor-parallel and context-parallel collectives around the compute ops that need them.

``BlockCost.tp_comm`` lists, per sub-block, the collectives Megatron-LM issues (Shoeybi et al. 2019,
figure 3: one all-reduce after the attention and one after the MLP in the forward, the conjugate ones in
the backward; with sequence parallelism an all-gather before and a reduce-scatter after instead,
Korthikanti et al. 2022, figure 5). Megatron's tensor-parallel communication is synchronous, so each
collective is followed at once by its WAIT.

Which phase goes with which compute kind: F and a full-recompute R use the ``fwd`` collectives (full
recompute reruns the layer's forward, communication included); B and I use the ``bwd`` ones (the
input-gradient path); W needs none (weight gradients are local). Selective recompute reruns only the
attention core, which has no communication. torchtitan's per-op recompute (``selective-op``) reruns linears
whose sequence-parallel input is an all-gather output it does not save: the sub-block's ``input-regather``
all-gather moves from before its backward to before its recompute, whose output the backward then reuses
(:func:`regathered_by_recompute`). DTensor tensor parallelism under a full checkpoint (torchtitan's
``recompute = "full"``, ``tp_impl = "dtensor"``) issues fewer collectives than Megatron's
(:func:`dtensor_full_recompute_drops`): no input re-gather before the backward. A non-reentrant full checkpoint
(``Layout.checkpoint_impl``) reruns no collective after the GEMM its early stop skips (:func:`early_stop_drops`):
the layer's last reduce-scatter (and, checkpointing the attention and MLP modules apart, the attention's too).

At ``stage`` granularity the collectives of the op's whole block range are folded into one collective
per (position, kind) with ``count`` = how many were folded and ``bytes`` their total.

Context parallelism uses the same machinery on ``BlockCost.cp_comm`` and the CP group: the attention's K/V
all-gather before the forward (and a full recompute's forward), the re-gather and the dK/dV
reduce-scatter around the backward (:func:`simgrid.model.comm.block_cp_collectives`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from simgrid.ir.ops import Collective, Compute, Op, Wait
from simgrid.layout.mesh import Mesh
from simgrid.model.blocks import block_kind
from simgrid.model.early_stop import skips_last_gemm
from simgrid.schedules.lower.context import LoweringContext, Role
from simgrid.schedules.lower.dtensor_copies import copies_dtensor, with_copies

REGATHER = "input-regather"
"""Label of the backward's sequence-parallel all-gather of a sub-block's input (:mod:`simgrid.model.comm`)."""


def regathered_by_recompute(ctx: LoweringContext, block: int) -> bool:
    """Whether ``block``'s input re-gather runs before its recompute instead of its backward: torchtitan's
    per-op checkpointing saves mm outputs but not the all-gather before ``wq..wv`` / ``w1, w3``, so the
    recompute gathers the shard again before it reruns ``wk`` / ``w3`` (which read it), and the backward uses
    that gathered tensor (:mod:`simgrid.model.selective_op`)."""
    return ctx.layout.recompute == "selective-op" and ctx.cost(block).recompute_flops > 0


def dtensor_full_recompute_drops(ctx: LoweringContext, block: int, kind: str, label: str) -> bool:
    """Whether a Megatron-style collective of ``block`` does not run under torchtitan's full checkpoint with
    DTensor tensor parallelism (``recompute = "full"``, ``tp_impl = "dtensor"``), for a ``kind`` compute op.

    - B / I: the ``input-regather``. DTensor's autograd runs above its dispatch, so ``aten.mm`` saves the
      ``Replicate`` input the forward all-gather produced, not its shard; the full checkpoint drops that
      saved tensor and the recompute's all-gather brings it back, so the backward gathers nothing again.
      Megatron's linear saves only the shard and re-gathers in its backward (:mod:`simgrid.model.comm`).
    - R of an MLP sub-block: the layer's output reduce-scatter (``output``), with a non-reentrant checkpoint
      only (``Layout.checkpoint_impl``; :func:`early_stop_drops`, which Megatron's tp_impl follows too).
      PyTorch's non-reentrant checkpoint stops recomputing once the last tensor the forward saved is back
      (``torch/utils/checkpoint.py``, ``early_stop``: ``_StopRecomputationError`` from the recompute's pack
      hook), which is ``w2``'s ``mm`` input, packed before the ``mm`` runs; under torch.compile the backward
      graph keeps only what the gradients need, and nothing needs the block's output. The attention's
      reduce-scatter reruns: the MLP's norm reads the residual sum it feeds.

    Counted on torch 2.13 (CPU, fake process group) for a Llama block with 820504e's TP plan, wrapped in
    ``checkpoint_wrapper(preserve_rng_state=False)`` as ``apply_ac`` does for "full" (parallelize_llama.py
    lines 237-238): forward AG RS AG RS; backward AG | AG RS AG (recompute) | RS AG RS, eager and compiled
    (aot_eager, min-cut partitioner) alike: 11 per layer where Megatron's layout has 14 (docs/design.md,
    session 9)."""
    if ctx.layout.tp_impl != "dtensor" or ctx.layout.recompute != "full" or ctx.cost(block).recompute_flops == 0:
        return False
    return kind in ("B", "I") and label == REGATHER


def early_stop_drops(ctx: LoweringContext, block: int, kind: str, label: str) -> bool:
    """Whether ``block``'s output collective (``output``: reduce-scatter, or all-reduce without sequence
    parallelism) is left out of its recompute (``kind`` R): a non-reentrant checkpoint stops before the GEMM
    that feeds it (:func:`simgrid.model.early_stop.skips_last_gemm`)."""
    return (kind == "R" and label == "output" and ctx.cost(block).recompute_flops > 0
            and skips_last_gemm(ctx.model, ctx.layout, block))


def comm_phase(ctx: LoweringContext, op: Compute) -> str | None:
    """Which pass of a block ``op`` runs, as its collectives see it: ``fwd`` (a forward, or a full recompute
    that reruns it), ``bwd`` (a backward or its input-gradient half), ``None`` (W, a partial recompute)."""
    if op.kind == "F" or (op.kind == "R" and ctx.layout.recompute == "full"):
        return "fwd"
    if op.kind in ("B", "I"):
        return "bwd"
    return None


def _folded(ctx: LoweringContext, kind: str, start: int, end: int, phase: str, comm: str
            ) -> list[tuple[str, str, int, int]]:
    """(position, collective kind, count, bytes) of the ``comm`` collectives (``tp_comm`` or ``cp_comm`` of
    :class:`~simgrid.model.cost.BlockCost`) of blocks [start, end) in a phase.

    Block granularity keeps every collective, in the model's order; stage granularity folds them per
    (position, kind), in order of first occurrence. The same for every micro-batch, so cached.
    """
    cache = ctx.memo["block-collective-folds"]
    key = (comm, kind, start, end)
    if key not in cache:
        folded: dict[tuple[str, str, int], list[int]] = defaultdict(lambda: [0, 0])
        for block in range(start, end):
            if kind == "R" and ctx.cost(block).recompute_flops == 0:
                continue  # a stage-wide R op does not rerun the embedding or the head
            moved = comm == "tp_comm" and regathered_by_recompute(ctx, block)
            for serial, coll in enumerate(getattr(ctx.cost(block), comm)):
                regather = moved and coll.label == REGATHER
                if kind == "R" and ctx.layout.recompute == "selective-op":
                    keep = regather  # the per-op recompute issues its sub-blocks' re-gathers and nothing else
                else:
                    keep = coll.phase == phase and not (regather and kind in ("B", "I"))
                    keep = keep and not (comm == "tp_comm" and (dtensor_full_recompute_drops(ctx, block, kind, coll.label)
                                                                or early_stop_drops(ctx, block, kind, coll.label)))
                if keep:
                    entry = folded[(coll.position, coll.kind, serial if ctx.granularity == "block" else 0)]
                    entry[0] += 1
                    entry[1] += int(coll.bytes)
        cache[key] = [(pos, coll_kind, count, size) for (pos, coll_kind, _), (count, size) in folded.items()]
    return cache[key]


def block_collectives(ctx: LoweringContext, op: Compute, group: str, *, comm: str = "tp_comm",
                      purpose: str = "tp") -> tuple[list[Op], list[Op]]:
    """(ops before, ops after) the compute op: each of its blocks' ``comm`` collectives on ``group``,
    followed at once by its WAIT (Megatron's tensor-parallel and Llama 3's context-parallel collectives
    are synchronous)."""
    phase = comm_phase(ctx, op)
    if phase is None and op.kind == "R" and ctx.layout.recompute == "selective-op" and comm == "tp_comm":
        phase = "bwd"  # only the re-gathers (_folded keeps nothing else for this R op)
    if phase is None:
        return [], []
    label_base = f"b{op.block_start}" if ctx.granularity == "block" else f"s{op.stage}"
    label = f"{label_base}:{phase}" if op.kind != "R" else f"{label_base}:recompute"
    prefix = f"{purpose}:s{op.stage}:m{op.microbatch}:{op.kind}:b{op.block_start}:"
    before: list[Op] = []
    after: list[Op] = []
    for index, (position, kind, count, size) in enumerate(
        _folded(ctx, op.kind, op.block_start, op.block_end, phase, comm)
    ):
        handle = f"{prefix}{position}{index}"
        collective = Collective(kind=kind, group=group, bytes=size, purpose=purpose, handle=handle,  # type: ignore[arg-type]
                                count=count, label=label)
        (before if position == "before" else after).extend((collective, Wait(handle=handle)))
    return before, after


def tp_collectives(ctx: LoweringContext, op: Compute, group: str) -> tuple[list[Op], list[Op]]:
    """(ops before, ops after) the compute op: each TP collective followed by its WAIT."""
    if ctx.layout.tp == 1:
        return [], []
    return block_collectives(ctx, op, group)


def replace_compute_ops(role: Role, replace: Callable[[Compute], list[Op]]) -> Role:
    """Put ``replace(op)``'s ops in place of every compute op of the role's actions."""
    for step in role:
        if step.action is None:
            continue
        new_ops: list[Op] = []
        for op in step.ops:
            if type(op) is Compute:
                new_ops += replace(op)
            else:
                new_ops.append(op)
        step.ops = new_ops
    return role


def wrap_compute_ops(role: Role, wrap: Callable[[Compute], tuple[list[Op], list[Op]]]) -> Role:
    """Put ``wrap(op)``'s (before, after) ops around every compute op of the role's actions."""

    def around(op: Compute) -> list[Op]:
        before, after = wrap(op)
        return [*before, op, *after]

    return replace_compute_ops(role, around)


def add_tensor_parallel(ctx: LoweringContext, role: Role, pp_rank: int) -> Role:
    """Wrap every F, B, I and full-recompute R op with its tensor-parallel collectives, and with
    ``tp_impl = "dtensor"`` add DTensor's chunk + cat copies to the op (:mod:`.dtensor_copies`) (with
    ``tp_comm_overlap`` the build runs :func:`simgrid.schedules.lower.tp_async.add_te_overlapped_tensor_parallel`
    instead)."""
    if ctx.layout.tp == 1:
        return role
    group = Mesh.tp_group_name(ctx.coord(pp_rank))
    if not copies_dtensor(ctx.layout):
        return wrap_compute_ops(role, lambda op: tp_collectives(ctx, op, group))

    def around(op: Compute) -> list[Op]:
        before, after = tp_collectives(ctx, op, group)
        return [*before, with_copies(op, before, after), *after]

    return replace_compute_ops(role, around)


def add_context_parallel(ctx: LoweringContext, role: Role, pp_rank: int) -> Role:
    """Wrap every attention F, B, I and full-recompute R op with its context-parallel collectives: the K/V
    all-gather before the core, and in the backward the K/V re-gather and the dK/dV reduce-scatter
    (:func:`simgrid.model.comm.block_cp_collectives`; Llama 3's all-gather context parallelism)."""
    if ctx.layout.cp == 1:
        return role
    group = Mesh.cp_group_name(ctx.coord(pp_rank))
    return wrap_compute_ops(role, lambda op: block_collectives(ctx, op, group, comm="cp_comm", purpose="cp"))


def sp_partial_params(ctx: LoweringContext, block: int) -> int:
    """Parameters of a block whose gradients are partial sums over the TP group under sequence parallelism.

    Those parameters are replicated over the tensor-parallel group but see only this rank's sequence
    shard: every norm, the biases of the row-parallel output projections (attention out, MLP out) and
    the learned position embedding (Korthikanti et al. 2022, section 4.2.2; Megatron-LM marks them
    ``sequence_parallel`` and ``_allreduce_layernorm_grads`` sums them).
    """
    from simgrid.model.moe import is_moe_block
    from simgrid.model.params import norm_params

    model = ctx.model
    kind, _ = block_kind(model, block)
    if kind == "embed":
        return model.seq_length * model.hidden_size if model.position == "learned" else 0
    if kind == "head":
        return norm_params(model)
    extra = 0
    if model.moe is not None and kind == "mlp" and is_moe_block(model, block):
        # The router (and the shared expert's gate) is replicated over tp and sees the rank's sequence shard.
        extra = model.hidden_size * (model.moe.num_experts + int(model.moe.shared_expert_gate))
    return norm_params(model) + (model.hidden_size if model.bias else 0) + extra


def sp_grad_sync(ctx: LoweringContext, pp_rank: int) -> list[Op]:
    """One ALL_REDUCE per local stage over the TP group of its sequence-parallel partial gradients, then
    the WAITs; empty without sequence parallelism.

    Placed after the data-parallel gradient sync has completed and before the tied-embedding sync and
    the optimizer, the order of Megatron-LM's ``finalize_model_grads`` (``finish_grad_sync``, then
    ``_allreduce_layernorm_grads``, then ``_allreduce_embedding_grads``); both reductions are sums, so
    their order does not change the result.
    """
    lay = ctx.layout
    if not lay.sequence_parallel or lay.tp == 1:
        return []
    from simgrid.memory.states import state_bytes_per_param

    grad_bytes = state_bytes_per_param(lay).grads
    group = Mesh.tp_group_name(ctx.coord(pp_rank))
    issues: list[Op] = []
    waits: list[Op] = []
    for stage in ctx.stages_of(pp_rank):
        count = sum(sp_partial_params(ctx, b) for b in ctx.blocks(stage))
        if count == 0:
            continue
        handle = f"tp:s{stage}:sp-grads"
        issues.append(Collective(kind="all_reduce", group=group, bytes=count * grad_bytes, purpose="tp",
                                 handle=handle, label=f"s{stage}:sp-grads"))
        waits.append(Wait(handle=handle))
    return issues + waits
