"""Pass: Megatron 1-D tensor-parallel collectives around the compute ops that need them.

``BlockCost.tp_comm`` lists, per sub-block, the collectives Megatron-LM issues (Shoeybi et al. 2019,
figure 3: one all-reduce after the attention and one after the MLP in the forward, the conjugate ones in
the backward; with sequence parallelism an all-gather before and a reduce-scatter after instead,
Korthikanti et al. 2022, figure 5). Megatron's tensor-parallel communication is synchronous, so each
collective is followed at once by its WAIT.

Which phase goes with which compute kind: F and a full-recompute R use the ``fwd`` collectives (full
recompute reruns the layer's forward, communication included); B and I use the ``bwd`` ones (the
input-gradient path); W needs none (weight gradients are local). Selective recompute reruns only the
attention core, which has no communication.

At ``stage`` granularity the collectives of the op's whole block range are folded into one collective
per (position, kind) with ``count`` = how many were folded and ``bytes`` their total.
"""

from __future__ import annotations

from collections import defaultdict

from simgrid.ir.ops import Collective, Compute, Op, Wait
from simgrid.layout.mesh import Mesh
from simgrid.schedules.lower.context import LoweringContext, Role


def _phase(ctx: LoweringContext, op: Compute) -> str | None:
    if op.kind == "F" or (op.kind == "R" and ctx.layout.recompute == "full"):
        return "fwd"
    if op.kind in ("B", "I"):
        return "bwd"
    return None


def _folded(ctx: LoweringContext, kind: str, start: int, end: int, phase: str) -> list[tuple[str, str, int, int]]:
    """(position, collective kind, count, bytes) of the TP collectives of blocks [start, end) in a phase.

    Block granularity keeps every collective, in the model's order; stage granularity folds them per
    (position, kind), in order of first occurrence. The same for every micro-batch, so cached.
    """
    cache = ctx.memo["tp-folds"]
    key = (kind, start, end)
    if key not in cache:
        folded: dict[tuple[str, str, int], list[int]] = defaultdict(lambda: [0, 0])
        for block in range(start, end):
            if kind == "R" and ctx.cost(block).recompute_flops == 0:
                continue  # a stage-wide R op does not rerun the embedding or the head
            for serial, coll in enumerate(ctx.cost(block).tp_comm):
                if coll.phase == phase:
                    entry = folded[(coll.position, coll.kind, serial if ctx.granularity == "block" else 0)]
                    entry[0] += 1
                    entry[1] += int(coll.bytes)
        cache[key] = [(pos, coll_kind, count, size) for (pos, coll_kind, _), (count, size) in folded.items()]
    return cache[key]


def tp_collectives(ctx: LoweringContext, op: Compute, group: str) -> tuple[list[Op], list[Op]]:
    """(ops before, ops after) the compute op: each TP collective followed by its WAIT."""
    phase = _phase(ctx, op)
    if phase is None or ctx.layout.tp == 1:
        return [], []
    label_base = f"b{op.block_start}" if ctx.granularity == "block" else f"s{op.stage}"
    label = f"{label_base}:{phase}" if op.kind != "R" else f"{label_base}:recompute"
    prefix = f"tp:s{op.stage}:m{op.microbatch}:{op.kind}:b{op.block_start}:"
    before: list[Op] = []
    after: list[Op] = []
    for index, (position, kind, count, size) in enumerate(_folded(ctx, op.kind, op.block_start, op.block_end, phase)):
        handle = f"{prefix}{position}{index}"
        collective = Collective(kind=kind, group=group, bytes=size, purpose="tp", handle=handle,  # type: ignore[arg-type]
                                count=count, label=label)
        (before if position == "before" else after).extend((collective, Wait(handle=handle)))
    return before, after


def add_tensor_parallel(ctx: LoweringContext, role: Role, pp_rank: int) -> Role:
    """Wrap every F, B, I and full-recompute R op with its tensor-parallel collectives."""
    if ctx.layout.tp == 1:
        return role
    group = Mesh.tp_group_name(ctx.coord(pp_rank))
    for step in role:
        if step.action is None:
            continue
        new_ops: list[Op] = []
        for op in step.ops:
            if type(op) is Compute:
                before, after = tp_collectives(ctx, op, group)
                new_ops += before
                new_ops.append(op)
                new_ops += after
            else:
                new_ops.append(op)
        step.ops = new_ops
    return role
