"""Pass: activation memory, allocated by each forward and freed by the backward that consumes it.

Rules (one buffer per compute unit, i.e. per sub-block or per stage, and micro-batch):

* after a forward op: ALLOC of ``BlockCost.activation_bytes`` summed over its blocks (what the recompute
  policy keeps for the backward; Korthikanti et al. 2022, table 2);
* after a recompute op: ALLOC of what recomputation holds at once: the activations with recompute off
  minus those kept, for ONE transformer layer (the largest in the op's range). Megatron-LM checkpoints
  per layer and recomputes each layer's forward right before that layer's backward, so only one
  layer's rebuilt activations are live (Korthikanti et al. 2022, section 5; the analytic model's
  :func:`simgrid.memory.recompute_working_bytes` counts the same). At block granularity an R op covers
  one sub-block, so this is that sub-block's rebuilt bytes; at stage granularity one R op stands for a
  whole stage's per-layer recomputes, and allocating the whole stage's rebuilt activations would
  overstate the peak by (layers per stage - 1) layers' worth;
* both are freed after the op that last needs them: the full backward B or, when the backward is split,
  the weight-gradient W (per micro-batch: DualPipeV runs some micro-batches of a stage with B and others
  with I and W). W needs the inputs of every linear layer, which are most of the saved
  activations, so keeping the whole buffer until W is a simple upper bound (Qi et al. 2023, section 3,
  count ZB-H1's activation memory the same way). This is also why ZB-H1's per-rank peak equals 1F1B's.
* around the backward (B or I; a stage-wide R when the stage recomputes: the loss backward precedes every
  layer's recompute) of the compute op holding the head: ALLOC before its first such op and FREE after it
  of the loss working set (:func:`simgrid.memory.loss_working_bytes`: the transient logit-sized
  tensors of the cross entropy), live while every saved activation of the micro-batch still is.
"""

from __future__ import annotations

from simgrid.ir.ops import Alloc, Compute, Free, Op
from simgrid.memory.activations import loss_working_bytes
from simgrid.schedules.lower.context import LoweringContext, Role


def activation_name(op: Compute, recomputed: bool = False) -> str:
    """Buffer name of the activations of one compute unit and micro-batch."""
    prefix = "rec" if recomputed else "act"
    return f"{prefix}:s{op.stage}:m{op.microbatch}:b{op.block_start}-{op.block_end}"


def recompute_working_bytes(ctx: LoweringContext, block_start: int, block_end: int) -> int:
    """Bytes a recompute of blocks ``[block_start, block_end)`` holds at once: the rebuilt activations
    of its largest layer (blocks ``1+2i`` and ``2+2i`` are layer ``i``; the embedding and head blocks
    count on their own)."""
    memo = ctx.memo["recompute_working"]
    key = (block_start, block_end)
    found = memo.get(key)
    if found is None:
        per_layer: dict[int, int] = {}
        for b in range(block_start, block_end):
            rebuilt = max(0, ctx.full_activation_bytes(b) - int(ctx.cost(b).activation_bytes))
            layer = (b - 1) // 2  # -1 for the embedding block, num_layers for the head block
            per_layer[layer] = per_layer.get(layer, 0) + rebuilt
        found = memo[key] = max(per_layer.values(), default=0)
    return int(found)


def add_activation_memory(ctx: LoweringContext, role: Role) -> Role:
    """ALLOC activations after F (and R), FREE them after the backward that releases them."""
    live: set[str] = set()
    kept = ctx.memo["kept_activations"]  # equal for every micro-batch
    head = 2 * ctx.model.num_layers + 1
    loss_bytes = loss_working_bytes(ctx.model, ctx.layout)
    for step in role:
        if step.action is None:
            continue
        new_ops: list[Op] = []
        loss_ops = [i for i, op in enumerate(step.ops) if type(op) is Compute and op.kind in ("R", "B", "I")
                    and op.block_start <= head < op.block_end] if loss_bytes else []
        # The loss backward runs before any layer's recompute: a stage-wide R holding the head carries it
        # (freed before the R's rebuilt layer is allocated), else the head's B or I ops do.
        first = step.ops[loss_ops[0]] if loss_ops else None
        loss_last = loss_ops[0] if isinstance(first, Compute) and first.kind == "R" else (loss_ops or [-1])[-1]
        for i, op in enumerate(step.ops):
            if loss_ops and i == loss_ops[0]:
                new_ops.append(Alloc(name=f"loss:s{step.action.stage}:m{step.action.microbatch}", bytes=loss_bytes,
                                     category="activations"))
            new_ops.append(op)
            if i == loss_last:
                new_ops.append(Free(name=f"loss:s{step.action.stage}:m{step.action.microbatch}"))
            if type(op) is not Compute:
                continue
            if op.kind == "F":
                unit = (op.block_start, op.block_end)
                size = kept.get(unit)
                if size is None:
                    size = kept[unit] = sum(int(ctx.cost(b).activation_bytes) for b in range(*unit))
                name = activation_name(op)
                new_ops.append(Alloc(name=name, bytes=size, category="activations"))
                live.add(name)
            elif op.kind == "R":
                size = recompute_working_bytes(ctx, op.block_start, op.block_end)
                name = activation_name(op, recomputed=True)
                new_ops.append(Alloc(name=name, bytes=size, category="activations"))
                live.add(name)
            elif op.kind in ("B", "W"):  # a micro-batch has either B or I then W
                for name in (activation_name(op), activation_name(op, recomputed=True)):
                    if name in live:
                        new_ops.append(Free(name=name))
                        live.discard(name)
        step.ops = new_ops
    return role
