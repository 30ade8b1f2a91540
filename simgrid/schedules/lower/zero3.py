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
The collectives carry the unit's full bytes; at ``stage`` granularity the ALLOCs are sized as the
block-granularity window (see :func:`buffer_bytes`), so both granularities replay the same peak. The
head block of a model with tied embeddings also gathers (and reduce-scatters the gradient of) the word
embedding it reads (:func:`tied_head_params`).
"""

from __future__ import annotations

from simgrid.ir.ops import Alloc, Collective, Compute, Free, Op, Wait
from simgrid.layout.mesh import Mesh
from simgrid.schedules.buckets import block_grad_bytes
from simgrid.schedules.lower.context import LoweringContext, Role


def tied_head_params(ctx: LoweringContext, block: int) -> int:
    """Parameters the head block reads but does not own: the tied word embedding, when the head shares
    the embedding block's matrix on the same rank (pp = 1; with pp > 1 the head's cost already counts
    Megatron's duplicate copy). ZeRO-3 gathers it with the head and reduce-scatters its gradient there."""
    head = 2 * ctx.model.num_layers + 1
    if block != head or not ctx.model.tied_embeddings or ctx.layout.pp > 1:
        return 0
    from simgrid.model import params

    return params.word_embedding_params(ctx.model, ctx.layout.tp)


def gathered_param_bytes(ctx: LoweringContext, start: int, end: int) -> int:
    """Working-precision bytes of the full (tp-sharded, dp-gathered) parameters blocks [start, end) use."""
    count = sum(ctx.cost(b).param_count + tied_head_params(ctx, b) for b in range(start, end))
    return count * ctx.layout.param_bytes


def full_grad_bytes(ctx: LoweringContext, start: int, end: int) -> int:
    """Unsharded gradient bytes blocks [start, end) produce (the tied head weight included)."""
    from simgrid.memory.states import state_bytes_per_param

    per_param = state_bytes_per_param(ctx.layout).grads
    return sum(block_grad_bytes(ctx.model, ctx.layout, b) + tied_head_params(ctx, b) * per_param
               for b in range(start, end))


def buffer_bytes(ctx: LoweringContext, start: int, end: int, backward: bool) -> tuple[int, int]:
    """(gathered-parameter, gradient) buffer bytes to ALLOC for a unit covering blocks [start, end).

    One block: its own sizes. A stage-wide unit stands for the per-block gathers and reduce-scatters of
    block granularity, which hold the block in use, ``prefetch depth`` gathered blocks ahead of it and,
    in a backward, its gradient buffer and the previous block's (still being reduce-scattered); the
    sizes returned add up to the largest such set, so both granularities replay the same peak.
    Allocating the whole stage's parameters and gradients instead would put the entire stage in the
    gather buffer, far above what ZeRO-3 holds (Rajbhandari et al. 2020, section 5.3).
    """
    if end - start == 1:
        return gathered_param_bytes(ctx, start, end), full_grad_bytes(ctx, start, end)
    memo = ctx.memo["zero3-buffers"]
    key = (start, end, backward)
    found = memo.get(key)
    if found is None:
        depth = ctx.layout.zero3_prefetch_depth
        params = [gathered_param_bytes(ctx, b, b + 1) for b in range(start, end)]
        if not backward:
            found = (max(sum(params[i: i + 1 + depth]) for i in range(len(params))), 0)
        else:
            # Backward visits blocks in reverse: block i with i-1 .. i-depth prefetched, i+1 reducing.
            grads = [full_grad_bytes(ctx, b, b + 1) for b in range(start, end)]
            live = [sum(params[max(0, i - depth): i + 1]) + grads[i] + (grads[i + 1] if i + 1 < len(grads) else 0)
                    for i in range(len(params))]
            grad_part = max(grads[i] + (grads[i + 1] if i + 1 < len(grads) else 0) for i in range(len(grads)))
            found = (max(live) - grad_part, grad_part)
        memo[key] = found
    return found


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
    if ctx.layout.zero != 3 or ctx.layout.grad_sync_size == 1:
        return role
    group = Mesh.dp_group_name(ctx.coord(pp_rank))
    depth = ctx.layout.zero3_prefetch_depth
    for step in role:
        action = step.action
        if action is None:
            continue
        tag = f"m{action.microbatch}:{action.kind}"
        prefix, units = split_units(step.ops)
        reduces_grads = action.kind in ("B", "W")
        gathers: list[list[Op]] = []
        for (start, end), _ in units:
            name = f"zero3-param:{tag}:b{start}"
            size = gathered_param_bytes(ctx, start, end)
            gathers.append([
                Alloc(name=name, bytes=buffer_bytes(ctx, start, end, reduces_grads)[0], category="comm"),
                Collective(kind="all_gather", group=group, bytes=size, purpose="zero-param", handle=name,
                           count=end - start, label=f"b{start}:param"),
            ])
        issued = 0
        new_ops: list[Op] = list(prefix)
        pending_grad: list[Op] = []
        for index, ((start, end), unit_ops) in enumerate(units):
            while issued < len(units) and issued <= index + depth:
                new_ops += gathers[issued]
                issued += 1
            param = f"zero3-param:{tag}:b{start}"
            grad = f"zero3-grad:{tag}:b{start}"
            grad_size = full_grad_bytes(ctx, start, end)
            new_ops.append(Wait(handle=param))
            if reduces_grads:
                new_ops.append(Alloc(name=grad, bytes=buffer_bytes(ctx, start, end, True)[1], category="comm"))
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
