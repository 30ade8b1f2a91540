"""Passes that create compute ops: forward/backward from the pipeline order, and recompute.

Costs come from :func:`simgrid.model.block_cost` (per tensor-parallel rank, one micro-batch). A full
backward B costs I + W. When the backward is split, the memory-bound bytes and kernel launches of the
backward are shared between I and W in proportion to their FLOPs (an approximation: the model gives
one figure for the whole backward); the GEMMs are the pass's own (input- or weight-gradient). At
``stage`` granularity one op covers the stage's whole block range with FLOPs, bytes, kernels and GEMMs
summed (equal shapes merged) and the representative shape of its largest block.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache
from itertools import pairwise

from simgrid.ir.ops import Compute, Op
from simgrid.model.cost import BlockCost
from simgrid.model.gemms import Gemm
from simgrid.schedules.lower.context import LoweringContext, Role, Step
from simgrid.schedules.pipeline import Action


def _share(part: float, whole: float) -> float:
    return part / whole if whole > 0 else 0.5


def _block_numbers(c: BlockCost, kind: str) -> tuple[float, float, int, float, tuple[tuple[Gemm, ...], ...]]:
    """(flops, hbm_bytes, kernels, fused-attention flops, GEMM lists) of one block's cost for one compute
    kind; the GEMMs as the block cost's own lists (B: input- and weight-gradient lists), not copied."""
    if kind == "F":
        return c.fwd_flops, c.fwd_hbm_bytes, c.fwd_kernels, c.fused_attention_fwd_flops, (c.fwd_gemms,)
    if kind == "R":
        # BlockCost carries the recomputed kernels' own traffic: selective recompute reruns the attention
        # core, which is almost all memory traffic on the s x s scores, not a FLOP-share of the block's.
        return (c.recompute_flops, c.recompute_hbm_bytes, max(1, c.recompute_kernels),
                c.fused_attention_recompute_flops, (c.recompute_gemms,))
    bwd = c.bwd_input_flops + c.bwd_weight_flops
    if kind == "B":
        return bwd, c.bwd_hbm_bytes, c.bwd_kernels, c.fused_attention_bwd_flops, (c.bwd_input_gemms, c.bwd_weight_gemms)
    part = c.bwd_input_flops if kind == "I" else c.bwd_weight_flops
    ratio = _share(part, bwd)
    # The core has no weights: its backward is all input gradient (I), none of it weight gradient (W).
    fused = c.fused_attention_bwd_flops if kind == "I" else 0.0
    gemms = c.bwd_input_gemms if kind == "I" else c.bwd_weight_gemms
    return part, c.bwd_hbm_bytes * ratio, max(1, round(c.bwd_kernels * ratio)), fused, (gemms,)


def weight_list_index(c: BlockCost, kind: str) -> int | None:
    """Which of :func:`_block_numbers`' GEMM lists accumulates into ``main_grad`` (the weight-gradient list of a
    B or W under gradient accumulation fusion, ``BlockCost.wgrad_accumulate_bytes``), or None."""
    if not c.wgrad_accumulate_bytes:
        return None
    return 1 if kind == "B" else 0 if kind == "W" else None


_UnitNumbers = tuple[float, float, int, tuple[int, int, int], float, tuple[Gemm, ...], tuple[int, int, int],
                     tuple[Gemm, ...], int, tuple[Gemm, ...], tuple[Gemm, ...]]


def _merge(gemms: dict[tuple[int, int, int], int]) -> tuple[Gemm, ...]:
    """One entry per distinct shape, counts summed, in a fixed order (equal programs stay equal)."""
    return tuple((m, n, k, c) for (m, n, k), c in sorted(gemms.items()))


@lru_cache(maxsize=4096)
def _merged(lists: tuple[tuple[Gemm, ...], ...]) -> tuple[Gemm, ...]:
    """One block's GEMM lists in :func:`_merge`'s form (cached: blocks of one kind share their lists)."""
    shapes: dict[tuple[int, int, int], int] = {}
    for gemms in lists:
        for m, n, k, count in gemms:
            shapes[(m, n, k)] = shapes.get((m, n, k), 0) + count
    return _merge(shapes)


def split_fp8(gemms: tuple[Gemm, ...], fp8: frozenset[tuple[int, int, int]]) -> tuple[tuple[Gemm, ...], tuple[Gemm, ...]]:
    """``gemms`` as (those in the layout's precision, those whose shape is in ``fp8``), order kept."""
    if not fp8:
        return gemms, ()
    return tuple(g for g in gemms if g[:3] not in fp8), tuple(g for g in gemms if g[:3] in fp8)


def _unit_numbers(ctx: LoweringContext, kind: str, start: int, end: int) -> _UnitNumbers:
    """(flops, hbm_bytes, kernels, dominant gemm, fused-attention flops, GEMMs, attention shape, accumulating
    GEMMs, their buffer's bytes per element, fp8 GEMMs, fp8 accumulating GEMMs) of blocks [start, end), cached:
    equal for every micro-batch."""
    cache = ctx.memo["compute"]
    key = (kind, start, end)
    found: _UnitNumbers | None = cache.get(key)
    if found is not None:
        return found
    if end == start + 1:  # block granularity: one block's numbers as they are
        c = ctx.cost(start)
        f, b, k, a, lists = _block_numbers(c, kind)
        w = weight_list_index(c, kind)
        acc = _merged((lists[w],)) if w is not None else ()
        if w is not None:
            lists = lists[:w] + lists[w + 1:]
        plain, fp8 = split_fp8(_merged(lists), c.fp8_gemm_shapes)
        acc, fp8_acc = split_fp8(acc, c.fp8_gemm_shapes)
        found = (float(f), float(b), max(1, k), c.gemm_mnk, float(a), plain,
                 c.attention_shape if a > 0 else (0, 0, 0), acc, c.wgrad_accumulate_bytes if acc or fp8_acc else 0,
                 fp8, fp8_acc)
        cache[key] = found
        return found
    flops = hbm = fused = 0.0
    kernels = 0
    dominant, dominant_flops = (0, 0, 0), -1.0
    # Equal layers share their GEMM list objects (simgrid.model.gemms caches them by block kind), so the
    # lists are counted by identity and merged once each.
    lists_seen: dict[int, tuple[Gemm, ...]] = {}
    times: dict[int, int] = {}
    accumulating: set[int] = set()  # identities of the weight-gradient lists that accumulate into main_grad
    fp8_of: dict[int, frozenset[tuple[int, int, int]]] = {}  # each list's shapes that run in fp8
    acc_bytes = 0
    attention_shape = (0, 0, 0)
    for block in range(start, end):
        c = ctx.cost(block)
        if kind == "R" and c.recompute_flops <= 0:
            continue  # a block that recomputes nothing gets no R at block granularity either (add_recompute)
        f, b, k, a, lists = _block_numbers(c, kind)
        flops, hbm, kernels, fused = flops + f, hbm + b, kernels + k, fused + a
        w = weight_list_index(c, kind)
        for index, gemms in enumerate(lists):
            ident = id(gemms)
            if index == w and gemms:
                accumulating.add(ident)
                acc_bytes = c.wgrad_accumulate_bytes
            if ident in times:
                times[ident] += 1
            else:
                lists_seen[ident], times[ident], fp8_of[ident] = gemms, 1, c.fp8_gemm_shapes
        if a > 0:
            attention_shape = c.attention_shape
        if f > dominant_flops:
            dominant, dominant_flops = c.gemm_mnk, f
    shapes: dict[tuple[int, int, int], int] = {}
    acc_shapes: dict[tuple[int, int, int], int] = {}
    fp8_shapes: dict[tuple[int, int, int], int] = {}
    fp8_acc_shapes: dict[tuple[int, int, int], int] = {}
    for ident, gemms in lists_seen.items():
        repeat, in_fp8 = times[ident], fp8_of[ident]
        into = acc_shapes if ident in accumulating else shapes
        into_fp8 = fp8_acc_shapes if ident in accumulating else fp8_shapes
        for m, n, k_dim, count in gemms:
            target = into_fp8 if (m, n, k_dim) in in_fp8 else into
            target[(m, n, k_dim)] = target.get((m, n, k_dim), 0) + count * repeat
    found = cache[key] = (float(flops), float(hbm), max(1, kernels), dominant, float(fused),
                          _merge(shapes), attention_shape, _merge(acc_shapes),
                          acc_bytes if acc_shapes or fp8_acc_shapes else 0,
                          _merge(fp8_shapes), _merge(fp8_acc_shapes))
    return found


def compute_op(ctx: LoweringContext, kind: str, stage: int, microbatch: int, start: int, end: int) -> Compute:
    """One compute op of ``kind`` over blocks ``[start, end)`` of ``stage`` with summed costs."""
    flops, hbm, kernels, gemm, fused, gemms, shape, acc_gemms, acc_bytes, fp8, fp8_acc = _unit_numbers(ctx, kind, start,
                                                                                                      end)
    return Compute(kind=kind, stage=stage, microbatch=microbatch, chunk=ctx.chunk_of(stage),  # type: ignore[arg-type]
                   block_start=start, block_end=end, flops=flops, hbm_bytes=hbm, gemm_mnk=gemm, kernels=kernels,
                   attention_flops=fused, gemms=gemms, attention_shape=shape, accumulate_gemms=acc_gemms,
                   accumulate_bytes=acc_bytes, fp8_gemms=fp8, fp8_accumulate_gemms=fp8_acc)


def cut_at(ctx: LoweringContext, op: Compute, cuts: Iterable[int]) -> list[Compute]:
    """``op`` cut at the block indices in ``cuts`` that fall strictly inside it, as ops of its kind in forward
    order with their blocks' summed costs (``[op]`` when no cut falls inside)."""
    inner = sorted(c for c in set(cuts) if op.block_start < c < op.block_end)
    if not inner:
        return [op]
    edges = [op.block_start, *inner, op.block_end]
    return [compute_op(ctx, op.kind, op.stage, op.microbatch, a, b) for a, b in pairwise(edges)]


def action_compute_ops(ctx: LoweringContext, action: Action) -> list[Op]:
    """Compute ops of one pipeline action: forward units in order, backward units in reverse."""
    units = ctx.units(action.stage)
    if action.kind != "F":
        units = units[::-1]
    return [compute_op(ctx, action.kind, action.stage, action.microbatch, s, e) for s, e in units]


def compute_steps(ctx: LoweringContext, pp_rank: int) -> Role:
    """The role of a pipeline rank with compute ops only: prologue, one step per action, epilogue."""
    steps = [Step(action=None)]
    steps += [Step(action=a, ops=action_compute_ops(ctx, a)) for a in ctx.order[pp_rank]]
    steps.append(Step(action=None))
    return steps


def add_recompute(ctx: LoweringContext, role: Role) -> Role:
    """Insert an R op right before each backward (B or I) op of a block that recomputes anything.

    Full recompute reruns the forward of every transformer sub-block; selective recompute reruns only
    the attention core (Korthikanti et al. 2022, section 5); both come from ``BlockCost.recompute_flops``.
    At block granularity the R of block ``b`` sits right before that block's backward, as Megatron's
    per-layer checkpointing recomputes a layer just before its backward.
    """
    if ctx.layout.recompute == "none":
        return role
    for step in role:
        if step.action is None or step.action.kind not in ("B", "I"):
            continue
        new_ops: list[Op] = []
        for op in step.ops:
            if isinstance(op, Compute) and op.kind in ("B", "I"):
                blocks = range(op.block_start, op.block_end)
                if any(ctx.cost(b).recompute_flops > 0 for b in blocks):
                    new_ops.append(compute_op(ctx, "R", op.stage, op.microbatch, op.block_start, op.block_end))
            new_ops.append(op)
        step.ops = new_ops
    return role
