"""Pass: activation memory, allocated by each forward and freed by the backward that consumes it.

Rules (one buffer per compute unit, i.e. per sub-block or per stage, and micro-batch):

* after a forward op: ALLOC of ``BlockCost.activation_bytes`` summed over its blocks (what the recompute
  policy keeps for the backward; Korthikanti et al. 2022, table 2);
* after a recompute op: ALLOC of what recomputation rebuilds (the activations with recompute off minus
  those kept);
* both are freed after the op that last needs them: the full backward B or, when the backward is split,
  the weight-gradient W. W needs the inputs of every linear layer, which are most of the saved
  activations, so keeping the whole buffer until W is a simple upper bound (Qi et al. 2023, section 3,
  count ZB-H1's activation memory the same way). This is also why ZB-H1's per-rank peak equals 1F1B's.
"""

from __future__ import annotations

from simgrid.ir.ops import Alloc, Compute, Free, Op
from simgrid.schedules.lower.context import LoweringContext, Role


def activation_name(op: Compute, recomputed: bool = False) -> str:
    """Buffer name of the activations of one compute unit and micro-batch."""
    prefix = "rec" if recomputed else "act"
    return f"{prefix}:s{op.stage}:m{op.microbatch}:b{op.block_start}-{op.block_end}"


def add_activation_memory(ctx: LoweringContext, role: Role) -> Role:
    """ALLOC activations after F (and R), FREE them after the backward that releases them."""
    split = any(step.action is not None and step.action.kind == "W" for step in role)
    release = "W" if split else "B"
    live: set[str] = set()
    for step in role:
        if step.action is None:
            continue
        new_ops: list[Op] = []
        for op in step.ops:
            new_ops.append(op)
            if not isinstance(op, Compute):
                continue
            blocks = range(op.block_start, op.block_end)
            if op.kind == "F":
                size = sum(int(ctx.cost(b).activation_bytes) for b in blocks)
                name = activation_name(op)
                new_ops.append(Alloc(name=name, bytes=size, category="activations"))
                live.add(name)
            elif op.kind == "R":
                size = sum(max(0, ctx.full_activation_bytes(b) - int(ctx.cost(b).activation_bytes)) for b in blocks)
                name = activation_name(op, recomputed=True)
                new_ops.append(Alloc(name=name, bytes=size, category="activations"))
                live.add(name)
            elif op.kind == release:
                for name in (activation_name(op), activation_name(op, recomputed=True)):
                    if name in live:
                        new_ops.append(Free(name=name))
                        live.discard(name)
        step.ops = new_ops
    return role
