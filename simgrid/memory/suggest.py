""""What would fit": layouts near the user's that fit a GPU, the least disruptive first.

The search varies the knobs that trade memory for GPUs or speed, one family at a time: ZeRO stage 0-3,
data-parallel degree, tensor parallelism (<= 8, within one node, with sequence parallelism), pipeline
parallelism (1F1B), context parallelism (up to :data:`MAX_SUGGESTED_CP`, with the user's tp and pp, and
only when activations are the largest part: it splits every activation of a long sequence), expert
parallelism for MoE models (powers of two dividing the expert count, on the user's tp, pp and cp: it splits
the experts' weights, gradients and optimizer states over more ranks), activation recompute,
FlashAttention, optimizer offload and 8-bit Adam, up to ``max_gpus`` GPUs.
For each combination of changed knobs it keeps the fitting variant with the fewest GPUs, then ranks the
recipes: those within the user's own GPU count first, fewest changed settings first (someone with 8 GPUs
who only needs FlashAttention and recompute hears that before being offered one GPU and CPU offload);
then those that need more GPUs, fewest GPUs first. Ties go to fewer GPUs, then less memory.
A recipe fits when it stays within the GPU's capacity less the headroom of
:mod:`~simgrid.memory.headroom` (CUDA context and allocator fragmentation), as the verdict does.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import NamedTuple

from simgrid.errors import LayoutError, SimgridError
from simgrid.layout.spec import Layout, OptimizerName, check_layout
from simgrid.memory.estimate import GPULike, estimate_memory
from simgrid.memory.headroom import DEFAULT_HEADROOM, MemoryHeadroom
from simgrid.model.spec import ModelSpec

#: Largest tensor-parallel degree suggested: TP traffic needs the intra-node fabric (8 GPUs per node).
MAX_SUGGESTED_TP = 8
#: Largest context-parallel degree suggested (Llama 3 trained 128K-token sequences with cp 16).
MAX_SUGGESTED_CP = 16


class LayoutSuggestion(NamedTuple):
    """A layout that fits, why it differs from the user's, and its worst-rank memory."""

    description: str
    """Human-readable summary of the changes, e.g. ``"2 GPUs: dp=2, ZeRO-3, full recompute"``."""
    layout: Layout
    """The suggested layout."""
    total_bytes: int
    """Worst-rank GPU memory of the suggestion."""


def suggest_layouts(model: ModelSpec, layout: Layout, gpu: GPULike, max_gpus: int = 64,
                    limit: int = 5, *, headroom: MemoryHeadroom = DEFAULT_HEADROOM) -> list[LayoutSuggestion]:
    """Up to ``limit`` layouts that fit ``gpu`` with ``headroom`` kept free, using at most ``max_gpus``
    GPUs (empty if none does)."""
    if max_gpus < 1 or limit < 1:
        raise LayoutError(f"max_gpus = {max_gpus} and limit = {limit} must be >= 1")
    capacity = headroom.usable_bytes(int(gpu.memory_bytes))
    # Per kind of change (which knobs moved, not by how much) keep the variant with the fewest GPUs, so
    # the answer offers distinct recipes (e.g. offload on 2 GPUs, ZeRO-3 on 8) rather than near-copies.
    best: dict[frozenset[str], tuple[int, int, int, LayoutSuggestion]] = {}
    try:
        breakdown = estimate_memory(model, layout).breakdown
        long_sequence = max(breakdown, key=lambda k: breakdown[k]) == "activations"
    except SimgridError:
        long_sequence = False
    for candidate in _candidates(model, layout, max_gpus, vary_cp=long_sequence):
        try:
            estimate = estimate_memory(model, candidate)
        except SimgridError:
            continue
        if estimate.total_bytes > capacity:
            continue
        changes = _changes(layout, candidate)
        text = f"{candidate.world_size} GPU{'s' if candidate.world_size > 1 else ''}: " + (
            ", ".join(changes) if changes else "as given")
        rank = (candidate.world_size, len(changes), estimate.total_bytes)
        kind = frozenset(change.split("=")[0] for change in changes)
        if kind not in best or rank < best[kind][:3]:
            best[kind] = (*rank, LayoutSuggestion(text, candidate, estimate.total_bytes))
    budget = layout.world_size

    def order(item: tuple[int, int, int, LayoutSuggestion]) -> tuple[int, int, int, int]:
        gpus, changes, total, _ = item
        return (0, changes, gpus, total) if gpus <= budget else (1, gpus, changes, total)

    ranked = sorted(best.values(), key=order)
    return [item[3] for item in ranked[:limit]]


def _powers_of_two(limit: int) -> list[int]:
    return [2**k for k in range(limit.bit_length()) if 2**k <= limit]


def _candidates(model: ModelSpec, base: Layout, max_gpus: int, *, vary_cp: bool) -> list[Layout]:
    tps = sorted({base.tp, *(t for t in _powers_of_two(MAX_SUGGESTED_TP) if model.num_heads % t == 0)})
    pps = sorted({base.pp, *(p for p in _powers_of_two(max_gpus) if model.num_layers % p == 0)})
    dps = sorted({base.dp, *_powers_of_two(max_gpus)})
    recomputes = sorted({base.recompute, "full"})
    flashes = sorted({base.flash_attention, True})
    offloads = sorted({base.offload_optimizer, True})
    optimizers: list[OptimizerName] = [base.optimizer]
    if base.optimizer == "adam":
        optimizers.append("adam-8bit")
    cps = sorted({base.cp, *(c for c in _powers_of_two(MAX_SUGGESTED_CP) if model.seq_length % (2 * c) == 0)
                  } if vary_cp else {base.cp})
    experts = model.moe.num_experts if model.moe is not None else 1
    eps = sorted({base.ep, *(e for e in _powers_of_two(min(experts, max_gpus)) if experts % e == 0)})
    out: list[Layout] = []
    for tp, pp, cp, ep, dp, zero, recompute, flash, offload, optimizer in itertools.product(
        tps, pps, cps, eps, dps, range(4), recomputes, flashes, offloads, optimizers
    ):
        if cp != base.cp and (tp != base.tp or pp != base.pp):
            continue  # context parallelism is offered on the user's own tp and pp (keeps the search small)
        if ep != base.ep and (tp != base.tp or pp != base.pp or cp != base.cp):
            continue  # so is expert parallelism, on the user's tp, pp and cp
        if tp * pp * cp * dp > max_gpus or (zero >= 2 and pp > 1) or (dp * cp == 1 and zero != base.zero):
            continue  # one data-parallel rank has nothing to shard: a changed ZeRO stage there is no recipe
        if offload and optimizer != base.optimizer:
            continue  # an offloaded optimizer's kind does not change GPU memory
        same_pipeline = pp == base.pp
        mbs = base.micro_batch_size
        step = mbs * dp * (pp if not same_pipeline or base.schedule == "interleaved-1f1b" else 1)
        gbs = max(base.gbs, step)
        gbs += (-gbs) % step
        try:
            candidate = dataclasses.replace(
                base, tp=tp, pp=pp, cp=cp, ep=ep, dp=dp, zero=zero, recompute=recompute, flash_attention=flash,
                offload_optimizer=offload,
                optimizer=optimizer, global_batch_size=gbs,
                sequence_parallel=base.sequence_parallel if tp == base.tp else tp > 1,
                schedule=base.schedule if same_pipeline else ("none" if pp == 1 else "1f1b"),
                vpp=base.vpp if same_pipeline else 1,
                dp_mode="allreduce" if zero else base.dp_mode,
            )
            check_layout(model, candidate)
        except SimgridError:
            continue
        out.append(candidate)
    return out


def _changes(base: Layout, new: Layout) -> list[str]:
    changes = []
    for field, label in (("dp", "dp"), ("tp", "tp"), ("pp", "pp"), ("cp", "cp"), ("ep", "ep")):
        if getattr(new, field) != getattr(base, field):
            changes.append(f"{label}={getattr(new, field)}")
    if new.sequence_parallel != base.sequence_parallel:
        changes.append("sequence parallel" if new.sequence_parallel else "no sequence parallel")
    if new.zero != base.zero:
        changes.append(f"ZeRO-{new.zero}")
    if new.recompute != base.recompute:
        changes.append(f"{new.recompute} recompute")
    if new.flash_attention != base.flash_attention:
        changes.append("flash attention" if new.flash_attention else "no flash attention")
    if new.offload_optimizer != base.offload_optimizer:
        changes.append("optimizer offload to CPU" if new.offload_optimizer else "no offload")
    if new.optimizer != base.optimizer:
        changes.append(f"optimizer {new.optimizer}")
    return changes
