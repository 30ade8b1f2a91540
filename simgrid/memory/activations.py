"""Activation memory per pipeline rank: one micro-batch's saved tensors times the micro-batches in flight.

The per-block bytes come from :func:`simgrid.model.block_cost` (Korthikanti et al. 2022, Table 2,
generalised). How many micro-batches a rank holds at its peak depends on the schedule; we count chunk by
chunk (which model chunk each in-flight micro-batch belongs to), so first and last stages with the
embedding or the head are exact:

* no pipeline (pp = 1): one micro-batch; gradient accumulation finishes each backward before the next
  forward.
* GPipe (Huang et al. 2019): all ``m`` forwards run before any backward.
* 1F1B (Narayanan et al. 2021, PipeDream-Flush) and ZB-H1 (Qi et al. 2024, which keeps 1F1B's peak):
  rank ``r`` holds ``min(pp - r, m)`` micro-batches; the first stage holds ``min(pp, m)``.
* interleaved 1F1B (Narayanan et al. SC'21, Megatron-LM ``forward_backward_pipelining_with_interleaving``):
  rank ``r`` runs ``(pp - r - 1) * 2 + (vpp - 1) * n`` warm-up forwards plus one before its first
  backward, capped at ``m * vpp``, in the order chunk 0 for ``n`` micro-batches, chunk 1 for ``n``, ...,
  where ``n = m // max(1, m // pp)`` is the round size (``pp`` when pp divides m).
  For rank 0 with enough micro-batches that is ``L (1 + (pp-1)/(pp*vpp))`` layers' worth: Korthikanti's
  interleaving factor ``1 + (p-1)/(p m)`` with ``m`` the number of model chunks.
* ZBV (Qi et al. 2024, V-shaped): each of a rank's two chunks holds ``min(pp, m)`` micro-batches, the
  same ``L`` layers' worth as 1F1B's first stage (the paper's design point); an approximation per rank.
* interleaved ZB, looped BFS and DualPipeV: counted off the order itself (:func:`order_peak`): a forward
  adds its micro-batch to its stage, the B or W that ends its backward removes it, and the rank's peak
  is the moment the held activations weigh most (weighted by each stage's bytes when known).

Recompute working set: Korthikanti's Table 2 counts only what is stored between forward and backward.
During the backward, recompute rebuilds one layer's activations at a time (Megatron checkpoints each
layer), so the peak also holds one layer's recomputed tensors: under full recompute the whole layer
minus its stored input, under selective recompute one attention core's ``a s^2 b`` tensors. We add that
one-layer working set to every rank that recomputes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import replace

from simgrid.layout.spec import Layout, check_layout, interleave_rounds
from simgrid.memory.states import stage_block_groups
from simgrid.model.blocks import stages_of_rank
from simgrid.model.cost import block_cost
from simgrid.model.spec import ModelSpec


def inflight_microbatches(layout: Layout, pp_rank: int, weights: Mapping[int, int] | None = None) -> dict[int, int]:
    """Micro-batches whose activations each of the rank's stages holds at the rank's peak (``weights``:
    activation bytes per stage, used by the schedules whose peak is read off the order)."""
    m, pp, vpp = layout.num_microbatches, layout.pp, layout.vpp
    stages = stages_of_rank(layout, pp_rank)
    schedule = layout.schedule
    if schedule == "none":
        return {stage: 1 for stage in stages}
    if schedule == "gpipe":
        return {stage: m for stage in stages}
    if schedule in ("1f1b", "zb-h1"):
        return {stage: min(pp - pp_rank, m) for stage in stages}
    if schedule == "zbv":
        return {stage: min(pp, m) for stage in stages}
    if schedule != "interleaved-1f1b":
        return order_peak(layout, pp_rank, weights or {})
    # interleaved-1f1b: the first forwards in Megatron's order, chunk (k // n) % vpp for the k-th one.
    total = m * vpp
    _, per_round = interleave_rounds(pp, m)
    held = min((pp - pp_rank - 1) * 2 + (vpp - 1) * per_round + 1, total)
    counts = Counter(stages[(k // per_round) % vpp] for k in range(held))
    return {stage: counts.get(stage, 0) for stage in stages}


def order_peak(layout: Layout, pp_rank: int, weights: Mapping[int, int]) -> dict[int, int]:
    """Micro-batches each of the rank's stages holds when the rank's held activations weigh most, walking
    its pipeline order (F adds, the B or W that ends a backward removes; a stage missing from ``weights``
    weighs 1)."""
    from simgrid.schedules.pipeline import flatten_order, pipeline_order

    row = flatten_order(pipeline_order(str(layout.schedule), layout.pp, layout.num_microbatches, layout.vpp))[pp_rank]
    held = dict.fromkeys(stages_of_rank(layout, pp_rank), 0)
    best, best_weight = dict(held), 0
    for action in row:
        if action.kind == "F":
            held[action.stage] += 1
            weight = sum(count * weights.get(stage, 1) for stage, count in held.items())
            if weight > best_weight:
                best, best_weight = dict(held), weight
        elif action.kind in ("B", "W"):
            held[action.stage] -= 1
    return best


def stage_activation_bytes(model: ModelSpec, layout: Layout, stage: int) -> int:
    """Bytes one micro-batch leaves saved in global stage ``stage`` after its forward (one tp rank)."""
    return sum(block_cost(model, layout, block).activation_bytes * copies
               for block, copies in stage_block_groups(model, layout, stage))


def recompute_working_bytes(model: ModelSpec, layout: Layout) -> int:
    """Extra bytes of one layer's recomputed activations during the backward (0 without recompute)."""
    if layout.recompute == "none":
        return 0
    plain = replace(layout, recompute="none")
    # Layers of one kind have the same shapes: layer 0, and the last layer (a MoE layer when layer 0 is a
    # MoE model's dense one); the larger working set of the two counts.
    layers = {(1, 2), (2 * model.num_layers - 1, 2 * model.num_layers)}
    return max(sum(block_cost(model, plain, b).activation_bytes - block_cost(model, layout, b).activation_bytes
                   for b in layer) for layer in layers)


def activation_memory_bytes(model: ModelSpec, layout: Layout) -> list[int]:
    """Peak activation bytes of each pipeline rank (index = pipeline rank, one tp rank each):
    saved activations of the micro-batches in flight plus the recompute working set."""
    check_layout(model, layout)
    working = recompute_working_bytes(model, layout)
    per_rank = []
    for pp_rank in range(layout.pp):
        stage_bytes = {stage: stage_activation_bytes(model, layout, stage) for stage in stages_of_rank(layout, pp_rank)}
        held = inflight_microbatches(layout, pp_rank, stage_bytes)
        saved = sum(count * stage_bytes[stage] for stage, count in held.items())
        per_rank.append(saved + working)
    return per_rank
