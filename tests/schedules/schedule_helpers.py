"""Helpers shared by the schedule-lowering tests: a tiny model, role building, memory replay."""

from __future__ import annotations

import dataclasses
from collections import defaultdict

from simgrid.ir.ops import Alloc, Collective, Compute, Free, Op, Wait
from simgrid.layout.spec import Layout
from simgrid.model import get_model
from simgrid.model.spec import ModelSpec
from simgrid.schedules.lower.context import LoweringContext

TINY: ModelSpec = get_model("tiny-gpt")
"""4 layers, hidden 64, 4 heads, vocab 256, seq 32, tied embeddings: blocks 0..9."""


def tiny_with_layers(num_layers: int) -> ModelSpec:
    """tiny-gpt's shapes with another layer count (so any pp * vpp can divide it)."""
    return dataclasses.replace(TINY, name=f"tiny-gpt-{num_layers}l", num_layers=num_layers)


def context(granularity: str = "block", model: ModelSpec | None = None, **layout: object) -> LoweringContext:
    """A lowering context for a layout built from keyword arguments; the model defaults to tiny-gpt,
    or to tiny-gpt with pp * vpp layers when 4 layers do not split into that many stages."""
    lay = Layout(**layout)  # type: ignore[arg-type]
    if model is None:
        model = TINY if TINY.num_layers % lay.num_stages == 0 else tiny_with_layers(lay.num_stages)
    return LoweringContext(model=model, layout=lay, granularity=granularity)  # type: ignore[arg-type]


def flat(role: list) -> list[Op]:
    """The ops of a role (list of steps) in issue order."""
    return [op for step in role for op in step.ops]


def replay_peaks(ops: tuple[Op, ...] | list[Op]) -> dict[str, int]:
    """Peak live bytes per memory category (and ``total``) replaying ALLOC/FREE in program order."""
    live: dict[str, int] = defaultdict(int)
    peak: dict[str, int] = defaultdict(int)
    sizes: dict[str, tuple[str, int]] = {}
    for op in ops:
        if isinstance(op, Alloc):
            sizes[op.name] = (op.category, op.bytes)
            live[op.category] += op.bytes
            live["total"] += op.bytes
        elif isinstance(op, Free):
            category, size = sizes.pop(op.name)
            live[category] -= size
            live["total"] -= size
        else:
            continue
        for key, value in live.items():
            peak[key] = max(peak[key], value)
    return dict(peak)


def tp_ops_of(ops: list[Op], kind: str, block: int, microbatch: int = 0) -> list[Op]:
    """The ops of the compute op (kind, block, micro-batch) at block granularity: its pieces and the
    tensor-parallel collectives and waits whose handles name it, from the first to the last."""
    tag = f":m{microbatch}:{kind}:b{block}:"

    def mine(o: Op) -> bool:
        if isinstance(o, Compute):
            return o.kind == kind and o.block_start == block and o.microbatch == microbatch
        return isinstance(o, (Collective, Wait)) and o.handle.startswith("tp:") and tag in o.handle

    idx = [i for i, o in enumerate(ops) if mine(o)]
    return [o for o in ops[idx[0]:idx[-1] + 1] if mine(o)]
