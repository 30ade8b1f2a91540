"""Pass: ZeRO-3 parameter gathers before use and gradient reduce-scatters after each backward.

Rajbhandari et al. 2020 (ZeRO), section 5.3: each rank keeps 1/dp of every parameter; before a block's
forward, and again before its backward, the block's parameters are all-gathered over the data-parallel
group into a temporary buffer that is freed right after use; after a block's backward its gradient is
reduce-scattered so each rank keeps only its shard. Like DeepSpeed's prefetcher we issue the gathers of
``layout.zero3_prefetch_depth`` blocks ahead of the one being computed, so they overlap its compute.

Per compute unit (a sub-block, or a whole stage at ``stage`` granularity) of a forward or backward step:

* ALLOC the gathered buffer (category ``comm``) and issue ALL_GATHER (purpose ``zero-param``,
  label ``b<block>:param``) once the unit is within the prefetch window;
* WAIT before the unit's first compute op (the recompute R too), FREE after its last one;
* backward only: ALLOC a full-size gradient buffer before the backward, REDUCE_SCATTER it (purpose
  ``zero-grad``, label ``b<block>:grad``) right after, and WAIT/FREE it one unit later (or at the step's
  end), so the reduce-scatter overlaps the next unit's backward.

Prefetching does not cross steps: each micro-batch's forward and backward start with a fresh window.
"""

from __future__ import annotations

from simgrid.ir.ops import Alloc, Collective, Compute, Free, Op, Wait
from simgrid.layout.mesh import Mesh
from simgrid.schedules.buckets import block_grad_bytes
from simgrid.schedules.lower.context import LoweringContext, Role


def gathered_param_bytes(ctx: LoweringContext, start: int, end: int) -> int:
    """Working-precision bytes of the full (tp-sharded, dp-gathered) parameters of blocks [start, end)."""
    return sum(ctx.cost(b).param_count for b in range(start, end)) * ctx.layout.param_bytes


def split_units(ops: list[Op]) -> tuple[list[Op], list[tuple[tuple[int, int], list[Op]]]]:
    """Ops before the first compute op, then per compute unit (block range) the ops that belong to it.

    A unit starts at a compute op whose block range differs from the previous one and takes every op
    up to the next unit (its recompute, backward, and the memory ops placed around them).
    """
    prefix: list[Op] = []
    units: list[tuple[tuple[int, int], list[Op]]] = []
    for op in ops:
        if isinstance(op, Compute) and (not units or units[-1][0] != (op.block_start, op.block_end)):
            units.append(((op.block_start, op.block_end), [op]))
        elif units:
            units[-1][1].append(op)
        else:
            prefix.append(op)
    return prefix, units


def add_zero3(ctx: LoweringContext, role: Role, pp_rank: int) -> Role:
    """Insert ZeRO-3 gathers, frees and gradient reduce-scatters into every F/B step."""
    if ctx.layout.zero != 3 or ctx.layout.dp == 1:
        return role
    group = Mesh.dp_group_name(ctx.coord(pp_rank))
    depth = ctx.layout.zero3_prefetch_depth
    for step in role:
        action = step.action
        if action is None:
            continue
        tag = f"m{action.microbatch}:{action.kind}"
        prefix, units = split_units(step.ops)
        gathers: list[list[Op]] = []
        for (start, end), _ in units:
            name = f"zero3-param:{tag}:b{start}"
            size = gathered_param_bytes(ctx, start, end)
            gathers.append([
                Alloc(name=name, bytes=size, category="comm"),
                Collective(kind="all_gather", group=group, bytes=size, purpose="zero-param", handle=name,
                           count=end - start, label=f"b{start}:param"),
            ])
        reduces_grads = action.kind in ("B", "W")
        issued = 0
        new_ops: list[Op] = list(prefix)
        pending_grad: list[Op] = []
        for index, ((start, end), unit_ops) in enumerate(units):
            while issued < len(units) and issued <= index + depth:
                new_ops += gathers[issued]
                issued += 1
            param = f"zero3-param:{tag}:b{start}"
            grad = f"zero3-grad:{tag}:b{start}"
            grad_size = sum(block_grad_bytes(ctx.model, ctx.layout, b) for b in range(start, end))
            new_ops.append(Wait(handle=param))
            if reduces_grads:
                new_ops.append(Alloc(name=grad, bytes=grad_size, category="comm"))
            new_ops += unit_ops
            new_ops.append(Free(name=param))
            if reduces_grads:
                new_ops += pending_grad
                new_ops.append(Collective(kind="reduce_scatter", group=group, bytes=grad_size,
                                          purpose="zero-grad", handle=grad, count=end - start,
                                          label=f"b{start}:grad"))
                pending_grad = [Wait(handle=grad), Free(name=grad)]
        step.ops = new_ops + pending_grad
    return role
