"""Pass: ZeRO-3 parameter gathers before use and gradient reduce-scatters, as DeepSpeed or FSDP2 does them.

Rajbhandari et al. 2020 (ZeRO), section 5.3: each rank keeps 1/dp of every parameter; before a module
runs (forward, recompute or backward) its parameters are all-gathered over the data-parallel group into
a buffer released after use, and each gradient is reduce-scattered so each rank keeps only its shard.
*What* is gathered at once, how far ahead and when it is released follows the implementation named by
``layout.zero_impl`` (:mod:`simgrid.model.zero3_units`):

* ``deepspeed``: one gather per parameter-owning module (Megatron's fused QKV, output projection,
  the two MLP matrices, embeddings, output layer), prefetching along the recorded module order until
  ``stage3_prefetch_bucket_size`` elements are in flight (bounded by ``stage3_max_live_parameters``);
  a module is released after use unless the trace uses it again within ``stage3_max_reuse_distance``
  elements, measured in the framework's order: with full recompute a layer's recomputed forward runs
  before its backward, so attention weights whose reuse lies beyond the distance (a large model's) are
  released after the recompute and gathered again for the backward. Gradients are reduce-scattered per
  ``reduce_bucket_size`` bucket.
* ``fsdp2``: one gather per transformer layer (and one for the root: embedding, final norm, output
  layer), the next unit prefetched while the current one computes (``layout.zero3_prefetch_depth``
  units, FSDP2's 1 by default), layers resharded after forward and gathered again in the backward, the
  root kept; each unit's gradients reduce-scattered when its backward ends. FSDP2 gathers into a staging
  buffer and copies it out into the unsharded parameters on the compute stream before the unit runs
  (:data:`FSDP2_COPY_OUT_READS_WRITES`): the first compute op of each gathered use pays that copy. Its
  side-stream copies (the all-gather copy-in, the work after each reduce-scatter) are charged to the compute
  op they run beside (:mod:`simgrid.schedules.lower.fsdp2_copies`).

The IR places these at sub-block granularity: a gather issued "during" a module is issued before the
compute op of the sub-block holding that module, and waited before the first compute op that needs it
(the recompute R included). Gathers of one block boundary that go to the same consumers fold into one
collective with ``count`` = the calls it stands for. Labels name the blocks whose parameters an op moves
(``b3+b4:param``, ``b5:grad``), which is what the executor gathers and reduce-scatters. Each gather has
its ALLOC (category ``comm``) at issue and its FREE after the op that releases the last of its modules.
DeepSpeed's reduce bucket is allocated before its first backward op and freed once the next reduce-scatter is
issued (double buffering), the last at the end of the backward. FSDP2's unsharded gradients (parameter dtype)
are allocated before the backward op that produces them; the unit's post-backward (the root's at the end of
the whole backward) waits for the previous reduce-scatter and frees its input, allocates the reduce-scatter
input in the reduce dtype, copies the gradients in and frees them, and issues the reduce-scatter.

ZeRO-3 needs pp = 1 (:class:`~simgrid.layout.Layout`), so one role holds the whole step: prefetching and
residency carry from a micro-batch's forward into its backward and on into the next micro-batch.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections import defaultdict
from dataclasses import dataclass, field

from simgrid.ir.ops import Alloc, Collective, Compute, Free, Op, Wait
from simgrid.layout.mesh import Mesh
from simgrid.memory.buffers import zero3_grad_bytes
from simgrid.model.blocks import block_kind
from simgrid.model.zero3_units import (
    DEEPSPEED,
    FSDP2,
    block_modules,
    fsdp2_unit,
    partitioned_modules,
    reduce_bytes_per_param,
    unit_params,
)
from simgrid.schedules.lower import fsdp2_copies
from simgrid.schedules.lower.context import LoweringContext, Role
from simgrid.schedules.lower.fsdp2_copies import FSDP2_COPY_OUT_READS_WRITES as FSDP2_COPY_OUT_READS_WRITES
from simgrid.schedules.lower.fsdp2_copies import CopyCost

_Pos = tuple[int, int]  # (step index, op index in the step)

_BACKWARD = ("B", "I", "W")


@dataclass
class _Use:
    """One use of a gathered unit (FSDP2) or module (DeepSpeed) by consecutive compute ops."""

    key: str
    blocks: tuple[int, ...]
    numel: int
    first: _Pos
    last: _Pos
    step: int
    layer: int
    recompute: bool
    release: bool = True
    gather: bool = True


@dataclass
class _Call:
    """One all-gather call (or several folded) and the uses it serves."""

    issue: _Pos
    uses: list[int] = field(default_factory=list)
    count: int = 1


def _compute_positions(role: Role) -> list[tuple[_Pos, Compute]]:
    return [((si, oi), op) for si, step in enumerate(role) if step.action is not None
            for oi, op in enumerate(step.ops) if isinstance(op, Compute)]


def _layer(ctx: LoweringContext, block: int) -> int:
    return block_kind(ctx.model, block)[1]


def _fsdp2_uses(ctx: LoweringContext, role: Role) -> list[_Use]:
    """One use per run of consecutive compute ops of one step on one FSDP2 unit."""
    uses: list[_Use] = []
    for pos, op in _compute_positions(role):
        unit = fsdp2_unit(ctx.model, op.block_start)
        key = "+".join(map(str, unit))
        if uses and uses[-1].key == key and uses[-1].step == pos[0]:
            uses[-1].last = pos
            continue
        numel = unit_params(ctx.model, ctx.layout, unit)
        uses.append(_Use(key=key, blocks=unit, numel=numel, first=pos, last=pos, step=pos[0],
                         layer=_layer(ctx, op.block_start), recompute=op.kind == "R"))
    root = "+".join(map(str, fsdp2_unit(ctx.model, 0)))
    for i, use in enumerate(uses):
        later_same_step = any(u.key == use.key and u.step == use.step for u in uses[i + 1:])
        forward = role[use.step].action.kind == "F"  # type: ignore[union-attr]
        keep_after_forward = use.key == root or not FSDP2.reshard_after_forward
        use.release = not later_same_step and not (forward and keep_after_forward)
    return uses


def _deepspeed_uses(ctx: LoweringContext, role: Role) -> list[_Use]:
    """One use per partitioned module per compute op, in the order DeepSpeed's hooks fetch them."""
    uses: list[_Use] = []
    for pos, op in _compute_positions(role):
        for block in range(op.block_start, op.block_end):
            mods = partitioned_modules(ctx.model, ctx.layout, block)
            if op.kind in _BACKWARD:
                mods = mods[::-1]
            for key, numel in mods:
                uses.append(_Use(key=key, blocks=(block,), numel=numel, first=pos, last=pos, step=pos[0],
                                 layer=_layer(ctx, block), recompute=op.kind == "R"))
    # Release decisions by reuse distance, in the framework's order: a checkpointed layer recomputes its
    # whole forward before its backward (R of every block of the layer, then the B ops).
    order = _framework_order(uses)
    position = {use_index: rank for rank, use_index in enumerate(order)}
    next_use: dict[int, int | None] = {}
    last_seen: dict[str, int] = {}
    for use_index in reversed(order):
        next_use[use_index] = last_seen.get(uses[use_index].key)
        last_seen[uses[use_index].key] = use_index
    prefix = [0]
    for use_index in order:
        prefix.append(prefix[-1] + uses[use_index].numel)
    for i, use in enumerate(uses):
        nxt = next_use[i]
        if nxt is None:
            use.release = True
            continue
        between = prefix[position[nxt]] - prefix[position[i] + 1]
        use.release = between >= DEEPSPEED.max_reuse_numel
    return uses


def _framework_order(uses: list[_Use]) -> list[int]:
    """Use indices reordered so that each layer's recompute uses precede its backward uses."""
    order: list[int] = []
    i = 0
    while i < len(uses):
        j = i
        while j < len(uses) and uses[j].step == uses[i].step and uses[j].layer == uses[i].layer and uses[i].layer >= 0:
            j += 1
        if j == i:
            order.append(i)
            i += 1
            continue
        group = list(range(i, j))
        recomputed = sorted((k for k in group if uses[k].recompute), key=lambda k: uses[k].blocks[0])
        order += recomputed + [k for k in group if not uses[k].recompute]
        i = j
    return order


def _mark_gathers(uses: list[_Use]) -> None:
    """A use needs a gather unless its unit is still resident from an earlier use."""
    resident: set[str] = set()
    for use in uses:
        use.gather = use.key not in resident
        if use.release:
            resident.discard(use.key)
        else:
            resident.add(use.key)


def _plan_calls(ctx: LoweringContext, uses: list[_Use]) -> list[_Call]:
    """All-gather calls: a blocking fetch when a use's unit is not yet requested, plus prefetches."""
    calls: list[_Call] = []
    requested: set[int] = set()
    fsdp2 = ctx.layout.zero_impl == "fsdp2"
    pending = [i for i, u in enumerate(uses) if u.gather]
    head = 0
    available = 0
    for j, use in enumerate(uses):
        if use.gather and j not in requested:
            calls.append(_Call(issue=use.first, uses=[j]))
            requested.add(j)
            available += use.numel
        while head < len(pending) and pending[head] <= j:
            head += 1
        if fsdp2:
            # FSDP2: the next zero3_prefetch_depth units of the same pass, one all-gather each.
            for k in pending[head: head + ctx.layout.zero3_prefetch_depth]:
                if k not in requested and uses[k].step == use.step:
                    calls.append(_Call(issue=use.first, uses=[k]))
                    requested.add(k)
        else:
            # DeepSpeed: walk the trace, one coalesced call, until the prefetch bucket is filled.
            budget = min(DEEPSPEED.prefetch_bucket_numel, DEEPSPEED.max_live_numel - available)
            batch: list[int] = []
            taken = 0
            while head < len(pending) and taken < budget:
                k = pending[head]
                head += 1
                if k not in requested:
                    batch.append(k)
                    requested.add(k)
                    taken += uses[k].numel
            if batch:
                calls.append(_Call(issue=use.first, uses=batch))
                available += taken
        if use.release:
            available -= use.numel
    return calls


def _fold_calls(calls: list[_Call], uses: list[_Use]) -> list[_Call]:
    """Calls issued at one op whose uses all start at the same ops become one collective with a count."""
    folded: dict[tuple[_Pos, tuple[_Pos, ...]], _Call] = {}
    for call in calls:
        key = (call.issue, tuple(sorted({uses[u].first for u in call.uses})))
        if key in folded:
            folded[key].uses += call.uses
            folded[key].count += call.count
        else:
            folded[key] = _Call(issue=call.issue, uses=list(call.uses), count=call.count)
    return list(folded.values())


def _reduce_groups(ctx: LoweringContext, role: Role) -> list[tuple[tuple[int, ...], int, _Pos, _Pos]]:
    """Gradient reduce-scatters: (blocks, calls folded, first backward op, op after which it is issued)."""
    groups: list[tuple[tuple[int, ...], int, _Pos, _Pos]] = []
    fsdp2 = ctx.layout.zero_impl == "fsdp2"
    by_step: dict[int, list[tuple[_Pos, Compute]]] = defaultdict(list)
    for pos, op in _compute_positions(role):
        if op.kind in _BACKWARD:
            by_step[pos[0]].append((pos, op))
    for ops in by_step.values():
        pending: list[int] = []
        first: _Pos | None = None
        bucket = 0  # DeepSpeed's reduce bucket, emptied at the end of every backward
        unit_first: dict[tuple[int, ...], _Pos] = {}
        for index, (pos, op) in enumerate(ops):
            blocks = list(range(op.block_start, op.block_end))[::-1]
            first = first or pos
            pending += blocks
            if fsdp2:
                unit = fsdp2_unit(ctx.model, op.block_start)
                unit_first.setdefault(unit, pos)
                if not any(fsdp2_unit(ctx.model, o.block_start) == unit for _, o in ops[index + 1:]):
                    groups.append((unit, 1, unit_first.pop(unit), pos))
                pending, first = [], None
                continue
            flushes = 0
            for block in blocks:
                for _, tensors in block_modules(ctx.model, ctx.layout, block)[::-1]:
                    for numel in tensors[::-1]:
                        if bucket and bucket + numel > DEEPSPEED.reduce_bucket_numel:
                            flushes += 1
                            bucket = 0
                        bucket += numel
            if flushes:
                groups.append((tuple(sorted(set(pending))), flushes, first, pos))
                pending, first = [], None
        if pending and first is not None:
            groups.append((tuple(sorted(set(pending))), 1, first, ops[-1][0]))
        elif bucket and not fsdp2 and groups:
            blocks_done, count, start, end = groups[-1]
            groups[-1] = (blocks_done, count + 1, start, end)  # the bucket's last flush, same blocks
    return groups


def _first_backward_of_blocks(role: Role) -> dict[tuple[int, int], _Pos]:
    """(step, block) -> the first backward compute op of that step covering the block (where autograd writes
    the block's unsharded gradients)."""
    first: dict[tuple[int, int], _Pos] = {}
    for pos, op in _compute_positions(role):
        if op.kind in _BACKWARD:
            for block in range(op.block_start, op.block_end):
                first.setdefault((pos[0], block), pos)
    return first


def _fsdp2_unsharded_grads(ctx: LoweringContext, unit: tuple[int, ...], step: int,
                           produced: dict[tuple[int, int], _Pos], grad: str) -> list[tuple[_Pos, Alloc]]:
    """FSDP2's unsharded gradients of one unit in the parameter dtype, each allocated before the backward op
    that first produces it (autograd's ``param.grad``); the root's output layer gets its gradient at the head's
    backward, the embedding at the end. A tied weight's gradient is counted once, where it first appears."""
    autograd = dataclasses.replace(ctx.layout, reduce_dtype="param")
    by_pos: dict[_Pos, list[int]] = defaultdict(list)
    for block in unit:
        if (step, block) in produced:
            by_pos[produced[(step, block)]].append(block)
    allocs: list[tuple[_Pos, Alloc]] = []
    seen: tuple[int, ...] = ()
    for k, pos in enumerate(sorted(by_pos)):
        now = tuple(sorted(seen + tuple(by_pos[pos])))
        grown = zero3_grad_bytes(ctx.model, autograd, now) - (zero3_grad_bytes(ctx.model, autograd, seen) if seen else 0)
        seen = now
        if grown > 0:
            allocs.append((pos, Alloc(name=f"{grad}:unsharded{k}", bytes=grown, category="comm")))
    return allocs


def _label(blocks: tuple[int, ...] | list[int]) -> str:
    return "+".join(f"b{b}" for b in sorted(set(blocks)))


def add_zero3(ctx: LoweringContext, role: Role, pp_rank: int) -> Role:
    """Insert ZeRO-3 gathers, frees and gradient reduce-scatters into every forward and backward step."""
    if ctx.layout.zero != 3 or ctx.layout.grad_sync_size == 1:
        return role
    group = Mesh.dp_group_name(ctx.coord(pp_rank))
    uses = _fsdp2_uses(ctx, role) if ctx.layout.zero_impl == "fsdp2" else _deepspeed_uses(ctx, role)
    _mark_gathers(uses)
    calls = _fold_calls(_plan_calls(ctx, uses), uses)
    before: dict[_Pos, list[Op]] = defaultdict(list)
    after: dict[_Pos, list[Op]] = defaultdict(list)
    handle_of_use: dict[int, str] = {}
    param_bytes = ctx.layout.param_bytes
    call_names: list[str] = []
    fsdp2 = ctx.layout.zero_impl == "fsdp2"
    copies: dict[_Pos, CopyCost] = defaultdict(CopyCost)  # FSDP2's copies, by the compute op that pays them
    for index, call in enumerate(calls):
        name = f"zero3-param:c{index}"
        call_names.append(name)
        size = sum(uses[u].numel for u in call.uses) * param_bytes
        call_blocks = [b for u in call.uses for b in uses[u].blocks]
        before[call.issue] += [
            Alloc(name=name, bytes=size, category="comm"),
            Collective(kind="all_gather", group=group, bytes=size, purpose="zero-param", handle=name,
                       count=call.count, label=f"{_label(call_blocks)}:param"),
        ]
        for u in call.uses:
            handle_of_use[u] = name
            if fsdp2:
                # each unit's foreach_all_gather casts and copies its shard in before its collective
                copies[call.issue] += fsdp2_copies.copy_in(uses[u].numel, ctx.layout)
    # Waits before the first op of each use; frees once every unit a call brought in is released.
    waited: set[str] = set()  # a call serving several uses is waited before the first (the IR waits once)
    remaining = {name: {uses[u].key for u in calls[i].uses} for i, name in enumerate(call_names)}
    resident_call: dict[str, str] = {}
    for index, use in enumerate(uses):
        if use.gather:
            if fsdp2:
                copies[use.first] += fsdp2_copies.copy_out(use.numel, ctx.layout)
            name = handle_of_use[index]
            resident_call[use.key] = name
            if name not in waited:
                waited.add(name)
                before[use.first].append(Wait(handle=name))
        if use.release:
            name = resident_call.pop(use.key)
            remaining[name].discard(use.key)
            if not remaining[name]:
                after[use.last].append(Free(name=name))
    # Gradient reduce-scatters, double-buffered.
    previous: list[Op] = []
    last_step = -1
    produced = _first_backward_of_blocks(role) if fsdp2 else {}
    positions = [pos for pos, op in _compute_positions(role) if op.device == "gpu"]
    reduced: set[tuple[int, ...]] = set()  # units with a sharded gradient from an earlier micro-batch
    for index, (blocks, count, first, issue_after) in enumerate(_reduce_groups(ctx, role)):
        if issue_after[0] != last_step and previous:
            role[last_step].ops.extend(previous)  # the step's last reduce-scatter, waited at its end
            previous = []
        grad = f"zero3-grad:r{index}"
        size = zero3_grad_bytes(ctx.model, ctx.layout, blocks)
        reduce = Collective(kind="reduce_scatter", group=group, bytes=size, purpose="zero-grad", handle=grad,
                            count=count, label=f"{_label(blocks)}:grad")
        if fsdp2:
            unsharded = _fsdp2_unsharded_grads(ctx, blocks, issue_after[0], produced, grad)
            for pos, alloc in unsharded:
                before[pos].append(alloc)
            # post_backward (the root's from the final callback, once the whole backward has run): wait for the
            # previous reduce-scatter and drop its input, allocate this one's input in the reduce dtype, copy the
            # gradients in, free them, issue (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py
            # post_backward, _fsdp_collectives.py foreach_reduce, _fsdp_state.py _root_post_backward_final_callback).
            after[issue_after] += [*previous, Alloc(name=grad, bytes=size, category="comm"), reduce,
                                   *(Free(name=alloc.name) for _, alloc in unsharded)]
            # its reduce-scatter stream's work after the collective, beside the next compute op; the step's
            # last (the root's) is waited by finalize_backward before the optimizer, so it delays the step as
            # much on the op its reduce-scatter follows (the optimizer op is added after this pass)
            following = bisect.bisect_right(positions, issue_after)  # positions are in program order
            later = positions[following] if following < len(positions) else issue_after
            numel = size // reduce_bytes_per_param(ctx.layout)
            copies[later] += fsdp2_copies.post_reduce(ctx.model, ctx.layout, blocks, numel,
                                                      accumulate=blocks in reduced)
            reduced.add(blocks)
        else:
            # DeepSpeed copies gradients into its reduce bucket (contiguous_gradients): the buffer is the
            # bucket, reduce_bucket_size elements at most, whatever the blocks the call covers.
            from simgrid.memory.states import state_bytes_per_param

            buffer = min(size, DEEPSPEED.reduce_bucket_numel * state_bytes_per_param(ctx.layout).grads)
            before[first].append(Alloc(name=grad, bytes=buffer, category="comm"))
            after[issue_after] += [reduce, *previous]
        previous = [Wait(handle=grad), Free(name=grad)]
        last_step = issue_after[0]
    for si, step in enumerate(role):
        if step.action is None:
            continue
        new_ops: list[Op] = []
        for oi, op in enumerate(step.ops):
            new_ops += before.get((si, oi), [])
            copy = copies.get((si, oi))
            if copy is not None and isinstance(op, Compute) and (copy.hbm_bytes or copy.kernels):
                op = dataclasses.replace(op, hbm_bytes=op.hbm_bytes + copy.hbm_bytes, kernels=op.kernels + copy.kernels)
            new_ops.append(op)
            new_ops += after.get((si, oi), [])
        step.ops = new_ops
    if previous:
        role[last_step].ops.extend(previous)
    return role
