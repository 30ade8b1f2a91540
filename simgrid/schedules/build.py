"""``build_program(model, layout)``: the pipeline order lowered, pass by pass, into a full IR Program.

Passes, in order (each in :mod:`simgrid.schedules.lower`, each with its own tests):

1. :func:`~.compute.compute_steps` - F/B/I/W compute ops from the pipeline order, costed per block;
2. :func:`~.compute.add_recompute` - R ops before backwards (full or selective recompute);
3. :func:`~.activations.add_activation_memory` - activation ALLOC after forwards, FREE after backwards;
4. :func:`~.zero3.add_zero3` - ZeRO-3 parameter gathers with prefetch and per-block grad reduce-scatter;
5. :func:`~.data_parallel.add_overlapped_grad_sync` (:mod:`~.apex_sync` for ``zero_impl = "apex"``) - DDP all-reduce / PS reduce / ZeRO-1 reduce-scatter
   per bucket on the last micro-batch; :func:`~.data_parallel.add_zero2_grad_sync` - ZeRO-2 per micro-batch;
6. :func:`add_model_parallel_comm`: :func:`~.tensor_parallel.add_tensor_parallel` - Megatron TP collectives around compute ops;
   :func:`~.tensor_parallel.add_context_parallel` - context-parallel K/V all-gathers around attention;
   :func:`~.moe.add_expert_parallel` - dispatch/combine all-to-alls around MoE sub-blocks (placed, like the
   TP collectives, right next to their compute op, so ahead of the gradient syncs of step 5 and of
   :func:`~.moe.add_expert_grad_sync`, which syncs the routed experts' gradients over the expert
   data-parallel group and runs with step 5);
   then :func:`~.grad_scaling.add_grad_scaling` - Megatron-Core DDP's ``1 / dp`` scaling kernel of each bucket
   folded into the compute op before the bucket's collective; then :func:`~.amax_reduction.add_amax_reduction` -
   Transformer Engine delayed scaling's amax all-reduce after each chunk's last forward layer and first backward layer;
7. :func:`~.p2p.add_pipeline_p2p` - pipeline SEND/RECV placed deadlock-free (all pipeline ranks at once);
8. :func:`~.optimizer.add_step_end` - grad-sync waits, sequence-parallel partial-gradient all-reduce
   (:func:`~.tensor_parallel.sp_grad_sync`), tied-embedding sync, optimizer (offload), param sync;
9. :func:`~.optimizer.add_model_states` - weights/grads/optimizer ALLOC first and FREE last.

The passes build one op list per pipeline rank (two with a parameter server: the server and the
others) for the canonical ``dp = 0, tp = 0, cp = 0`` coordinates; :mod:`~.instantiate` then derives every rank's
list, sharing the op values that do not depend on the rank. That derivation is lazy (a
:class:`~simgrid.ir.program.LazyRanks`): a rank's op tuple is made the first time something reads it,
so symmetric simulation of 16,384 ranks makes only the ``pp`` representatives' lists, while validation,
export and full mode see every rank exactly as an eagerly built program would have them.
"""

from __future__ import annotations

from simgrid.gcpause import collector_paused
from simgrid.ir.ops import Op
from simgrid.ir.program import LazyRanks, MetaValue, Program
from simgrid.layout.experts import expert_groups
from simgrid.layout.mesh import Mesh, RankCoord
from simgrid.layout.spec import Layout, check_layout
from simgrid.model.spec import ModelSpec
from simgrid.schedules.lower.activations import add_activation_memory
from simgrid.schedules.lower.amax_reduction import add_amax_reduction, amax_groups
from simgrid.schedules.lower.apex_sync import add_apex_grad_sync, add_apex_param_sync
from simgrid.schedules.lower.compute import add_recompute, compute_steps
from simgrid.schedules.lower.context import Granularity, LoweringContext, Role
from simgrid.schedules.lower.data_parallel import add_zero2_grad_sync
from simgrid.schedules.lower.grad_scaling import add_grad_scaling
from simgrid.schedules.lower.instantiate import RoleInstantiator
from simgrid.schedules.lower.moe import add_expert_grad_sync, add_expert_parallel
from simgrid.schedules.lower.optimizer import (
    add_model_states,
    add_step_end,
    embed_group_name,
    embed_sync_ranks,
)
from simgrid.schedules.lower.p2p import add_pipeline_p2p
from simgrid.schedules.lower.tensor_parallel import add_context_parallel, add_tensor_parallel
from simgrid.schedules.lower.tp_async import add_async_tensor_parallel, add_te_overlapped_tensor_parallel
from simgrid.schedules.lower.zero3 import add_zero3
from simgrid.schedules.pipeline import PipelineOrder

GENERATOR = "simgrid.schedules.build_program"


def build_roles(ctx: LoweringContext) -> list[Role]:
    """Passes 1-7 for every pipeline rank (the parts shared by all ranks of a pipeline rank)."""
    roles = []
    for pp_rank in range(ctx.layout.pp):
        role = compute_steps(ctx, pp_rank)
        role = add_recompute(ctx, role)
        role = add_activation_memory(ctx, role)
        role = add_zero3(ctx, role, pp_rank)
        role = add_apex_grad_sync(ctx, role, pp_rank)  # Megatron-Core's add_overlapped_grad_sync unless apex
        role = add_zero2_grad_sync(ctx, role, pp_rank)
        role = add_expert_grad_sync(ctx, role, pp_rank)
        role = add_apex_param_sync(ctx, role, pp_rank)  # add_overlapped_param_gather unless apex interleaved
        role = add_grad_scaling(ctx, add_model_parallel_comm(ctx, role, pp_rank))
        roles.append(add_amax_reduction(ctx, role, pp_rank))
    return add_pipeline_p2p(ctx, roles)


def add_model_parallel_comm(ctx: LoweringContext, role: Role, pp_rank: int) -> Role:
    """Pass 6: tensor-, context- and expert-parallel collectives around the compute ops, in the builder's
    order (the layout search's bounds lower their actions through this too)."""
    if ctx.layout.tp_comm_overlap or ctx.layout.tp_async_grad_comm:
        # The overlap splits compute ops into GEMM chunks: the passes that wrap whole compute ops go first.
        role = add_context_parallel(ctx, role, pp_rank)
        role = add_expert_parallel(ctx, role, pp_rank)
        if ctx.layout.tp_async_grad_comm:
            return add_async_tensor_parallel(ctx, role, pp_rank)
        return add_te_overlapped_tensor_parallel(ctx, role, pp_rank)  # the head as tp_async_grad_comm places it
    role = add_tensor_parallel(ctx, role, pp_rank)
    role = add_context_parallel(ctx, role, pp_rank)
    return add_expert_parallel(ctx, role, pp_rank)


def finish_role(ctx: LoweringContext, role: Role, pp_rank: int, dp: int) -> list[Op]:
    """Passes 8-9 for the rank at data-parallel index ``dp`` (only the PS server differs), flattened."""
    steps = [type(step)(action=step.action, ops=list(step.ops)) for step in role]
    steps = add_step_end(ctx, steps, pp_rank, dp)
    steps = add_model_states(ctx, steps, pp_rank, dp)
    return [op for step in steps for op in step.ops]


def mesh_groups(layout: Layout) -> dict[str, tuple[int, ...]]:
    """:meth:`Mesh.groups <simgrid.layout.mesh.Mesh.groups>` from the rank formula directly (same names,
    members and order; it walks every rank through ``coords`` and ``rank``, seconds at 16,384 ranks)."""
    tp, cp, dp, pp = layout.tp, layout.cp, layout.dp, layout.pp
    world = tp * cp * dp * pp
    out: dict[str, tuple[int, ...]] = {"world": tuple(range(world))}
    cps: list[int | None] = list(range(cp)) if cp > 1 else [None]  # RankCoord.cp is None without CP

    def at(p: int, d: int, t: int, c: int | None) -> RankCoord:
        return RankCoord(pp=p, dp=d, tp=t, cp=c)

    # rank = t + tp * (c + cp * (d + dp * p))  (Mesh's order: tp fastest, then cp, then dp, then pp)
    for p in range(pp):
        for d in range(dp):
            for c in cps:
                base = tp * ((c or 0) + cp * (d + dp * p))
                out[Mesh.tp_group_name(at(p, d, 0, c))] = tuple(range(base, base + tp))
            if cp > 1:
                for t in range(tp):
                    first = t + tp * cp * (d + dp * p)
                    out[Mesh.cp_group_name(at(p, d, t, 0))] = tuple(range(first, first + tp * cp, tp))
        for t in range(tp):  # the data-parallel group spans dp and cp
            out[Mesh.dp_group_name(at(p, 0, t, cps[0]))] = tuple(
                range(t + tp * cp * dp * p, t + tp * cp * dp * (p + 1), tp))
    for d in range(dp):
        for c in cps:
            for t in range(tp):
                out[Mesh.pp_group_name(at(0, d, t, c))] = tuple(range(t + tp * ((c or 0) + cp * d), world, tp * cp * dp))
    return dict(sorted(out.items()))


def program_groups(ctx: LoweringContext) -> dict[str, tuple[int, ...]]:
    """The mesh's groups plus the tied-embedding groups when the program uses them, and the expert groups
    (ep, etp, edp) of a MoE model."""
    groups = mesh_groups(ctx.layout)
    if amax := amax_groups(ctx.layout):
        groups = dict(sorted({**groups, **amax}.items()))
    if ctx.model.moe is not None:
        groups = dict(sorted({**groups, **expert_groups(ctx.layout)}.items()))
    pair = embed_sync_ranks(ctx)
    if pair is not None:
        first, last = pair
        cps: list[int | None] = list(range(ctx.layout.cp)) if ctx.layout.cp > 1 else [None]
        for dp in range(ctx.layout.dp):
            for tp in range(ctx.layout.tp):
                for cp in cps:
                    groups[embed_group_name(dp, tp, cp)] = (
                        ctx.mesh.rank(pp=first, dp=dp, tp=tp, cp=cp),
                        ctx.mesh.rank(pp=last, dp=dp, tp=tp, cp=cp),
                    )
    return groups

def build_program(model: ModelSpec, layout: Layout, *, granularity: Granularity = "block",
                  order: PipelineOrder | None = None) -> Program:
    """Lower ``layout``'s pipeline schedule for ``model`` into a Program covering every rank; with
    ``order`` (e.g. :func:`simgrid.schedules.imported.read_pipeline_csv`), lower that compute order instead
    (it must match the layout's pipeline shape; :func:`~simgrid.schedules.imported.layout_for_order`)."""
    from simgrid.limits import check_program_size

    check_program_size(model, layout, granularity, ranks=layout.pp)  # one template per pipeline rank is built
    with collector_paused():
        return _build(model, layout, granularity, order)


def _build(model: ModelSpec, layout: Layout, granularity: Granularity, order: PipelineOrder | None) -> Program:
    check_layout(model, layout)
    if order is not None:
        from simgrid.schedules.imported import check_order

        check_order(order, layout, "pipeline order")
    ctx = LoweringContext(model=model, layout=layout, granularity=granularity, imported_order=order)
    roles = build_roles(ctx)
    server_differs = layout.dp_mode == "parameter-server" and layout.dp > 1
    makers: list[list[RoleInstantiator]] = []  # [pp_rank][0: ordinary rank, 1: the parameter server]
    for pp_rank, role in enumerate(roles):
        templates = [finish_role(ctx, role, pp_rank, 0)]
        if server_differs:
            templates.append(finish_role(ctx, role, pp_rank, 1))
        makers.append([RoleInstantiator(ctx.mesh, pp_rank, ops) for ops in templates])
    tp_size, cp_size, dp_size = layout.tp, layout.cp, layout.dp

    def make_rank(rank: int) -> tuple[Op, ...]:
        # rank = tp + tp_size * (cp + cp_size * (dp + dp_size * pp))  (Mesh's order)
        rest, tp = divmod(rank, tp_size)
        rest, cp = divmod(rest, cp_size)
        pp_rank, dp = divmod(rest, dp_size)
        return makers[pp_rank][1 if dp and server_differs else 0].ops(dp, tp, cp)

    lengths = []
    for pp_rank in range(layout.pp):
        for dp in range(dp_size):
            lengths += [len(makers[pp_rank][1 if dp and server_differs else 0].template)] * (tp_size * cp_size)
    meta: dict[str, MetaValue] = {"generator": GENERATOR, "schedule": ctx.schedule, "granularity": granularity,
                                  "num_microbatches": ctx.num_microbatches}
    if order is not None:
        meta["pipeline_order"] = "imported"
    return Program(model=model, layout=layout, groups=program_groups(ctx), ranks=LazyRanks(make_rank, lengths),
                   meta=meta)
