"""Which cut of which block each tensor- or context-parallel collective of a rank's program moves.

Tensor parallel (purpose ``tp``, label ``b{block}:{fwd|bwd|recompute}``): the k-th TP collective of a
(block, micro-batch, phase) is mapped onto the k-th entry of the block's cut plan (:func:`phase_actions`),
built from the block's cuts exactly as :mod:`simgrid.model.comm` lists Megatron's collectives, including
the folding of same-position collectives into one op with ``count > 1``. The micro-batch comes from the
nearest compute op on the same block and phase (:func:`plan_tp_collectives`). Context parallel (purpose
``cp``, same labels): the K/V all-gather, re-gather and dK/dV reduce-scatter of an attention block map
onto its K/V cut the same way (:mod:`executor.cp`). Expert parallel (purpose ``ep``, same labels): the dispatch
and combine all-to-alls of a MoE block map onto its two cuts (:mod:`executor.moe_layers`), forward in cut
order, backward in reverse.

The plan is built once from the rank's ops; the handlers of :mod:`executor.handlers.blockcomm` consume it.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from executor.block import BlockModule
from executor.cp import CP_KV
from executor.moe_layers import EP_CUT_KINDS
from executor.tp import VOCAB_CE
from simgrid.errors import ProgramError
from simgrid.ir.ops import Collective, Compute, Op

Action = tuple[str, int, str]
"""(``cut`` or ``regather`` or a cross-entropy part, cut index, collective kind)."""
SP_GRADS_LABEL = re.compile(r"s(\d+):sp-grads")
"""Label of sequence parallelism's partial-gradient all-reduce (purpose ``tp``, but no block cut)."""
CE_PARTS = ("ce_max", "ce_target", "ce_sumexp")
"""The three all-reduces of the vocabulary-parallel cross entropy, in issue order."""


@dataclass
class TPPlan:
    """Where each tensor-parallel collective of the rank's program lands."""

    anchors: dict[int, tuple[int, int, str, str]] = field(default_factory=dict)
    """Op index -> (block, micro-batch, phase, compute kind of the anchoring op)."""
    anchor_ops: dict[int, int] = field(default_factory=dict)
    """Op index -> index of the anchoring compute op (owns the segments the collective's issue runs)."""
    phases: set[tuple[int, int, str]] = field(default_factory=set)
    """(block, micro-batch, phase) that have TP or CP collectives."""
    cursor: dict[tuple[int, int, str, str], int] = field(default_factory=lambda: defaultdict(int))
    """Actions consumed so far per (block, micro-batch, phase, purpose) in the current step."""


def phase_actions(run_module: BlockModule, phase: str, sequence_parallel: bool, purpose: str = "tp") -> list[Action]:
    """The ``purpose`` (``tp``, ``cp`` or ``ep``) collectives a block needs in ``phase``, in issue order (Megatron's
    order for tp, see simgrid.model.comm; Llama 3's K/V gather, re-gather and dK/dV scatter for cp; the
    dispatch and combine all-to-alls for ep)."""
    cuts = run_module.cuts
    not_tp = (CP_KV, *EP_CUT_KINDS)
    if purpose == "ep":
        ep_cuts = [j for j, c in enumerate(cuts) if c.forward in EP_CUT_KINDS]
        return [("cut", j, "all_to_all") for j in (ep_cuts if phase in ("fwd", "recompute") else ep_cuts[::-1])]
    if purpose == "cp":
        kv = [j for j, c in enumerate(cuts) if c.forward == CP_KV]
        if phase in ("fwd", "recompute"):
            return [("cut", j, "all_gather") for j in kv]
        return [a for j in kv for a in (("regather", j, "all_gather"), ("cut", j, "reduce_scatter"))]
    if phase in ("fwd", "recompute"):
        out: list[Action] = []
        for j, c in enumerate(cuts):
            if c.forward == VOCAB_CE:
                # Megatron's order: logit max, target logit, sum of exponentials (simgrid.model.comm).
                out += [(part, j, "all_reduce") for part in CE_PARTS]
            elif c.forward is not None and c.forward not in not_tp:
                out.append(("cut", j, c.forward))
        return out
    actions: list[Action] = [("cut", j, c.backward) for j, c in reversed(list(enumerate(cuts)))
                             if c.backward is not None and c.backward not in not_tp]
    if sequence_parallel and cuts and cuts[0].forward == "all_gather":
        # Megatron re-gathers the sequence-sharded input of the column-parallel linear for the weight
        # gradient, issued together with the output-gradient all-gather, before the backward.
        gathers = [a for a in actions if a[2] == "all_gather"]
        rest = [a for a in actions if a[2] != "all_gather"]
        actions = [*gathers, ("regather", 0, "all_gather"), *rest]
    return actions


def plan_tp_collectives(ops: Sequence[Op]) -> TPPlan:
    """Anchor every TP, CP and EP collective of a rank's ``ops`` to its block, micro-batch and phase."""
    plan = TPPlan()
    computes = [(i, op) for i, op in enumerate(ops) if isinstance(op, Compute) and op.kind != "OPT"]
    for index, op in enumerate(ops):
        if not (isinstance(op, Collective) and op.purpose in ("tp", "cp", "ep")) or SP_GRADS_LABEL.fullmatch(op.label):
            continue
        match = re.fullmatch(r"b(\d+):(fwd|bwd|recompute)", op.label)
        if match is None:
            raise ProgramError(f"{op.purpose} collective label {op.label!r} is not 'b<block>:<fwd|bwd|recompute>'")
        block, phase = int(match.group(1)), match.group(2)
        kinds = {"fwd": ("F",), "recompute": ("R",), "bwd": ("B", "I")}[phase]
        near = [(abs(i - index), i, c) for i, c in computes
                if c.kind in kinds and c.block_start <= block < c.block_end]
        if not near:
            raise ProgramError(f"{op.purpose} collective {op.label!r} has no {'/'.join(kinds)} op on block {block}")
        _, anchor_index, anchor = min(near, key=lambda t: (t[0], t[1]))
        plan.anchors[index] = (block, anchor.microbatch, phase, anchor.kind)
        plan.anchor_ops[index] = anchor_index
        plan.phases.add((block, anchor.microbatch, phase))
    return plan
