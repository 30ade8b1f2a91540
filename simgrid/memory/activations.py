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

Loss working set: the head's saved fp32 softmax is counted with the head's activations
(:mod:`simgrid.model.activations`), but turning the 16-bit logits (``T x V/t`` per rank) into an fp32 loss
and back into a 16-bit gradient also holds transient logit-sized tensors while every saved activation of
the micro-batch is still live (the loss runs after the last layer's forward and before any backward).
With ``Layout.cross_entropy``:

* ``fused``, Megatron-Core's ``_VocabParallelCrossEntropy`` (megatron/core/tensor_parallel/cross_entropy.py,
  core_r0.8.0): it casts the logits with ``.float()`` inside its forward while the caller still holds the
  16-bit logits, then builds the softmax in place in that fp32 copy (the saved tensor) and differentiates it
  in place (``grad_input = softmax``; ``grad_input.mul_``); autograd casts the fp32 gradient back to the 16-bit
  input dtype. Extra: one 16-bit logit tensor, forward and backward (none in fp32 training).
* ``unfused``, torchtitan's ``cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))`` (train.py
  at 9dec370, ``loss_fn``): the forward holds the 16-bit ``pred``, its fp32 copy and the fp32 log-softmax
  (the saved one); the backward holds the saved log-softmax, the fp32 gradient ``nll_loss_backward`` writes
  (dense, the input's shape) and the fp32 gradient of ``_log_softmax_backward_data``: two fp32 logit tensors
  beyond the saved one, the larger of the two moments.

The working set sits on the rank that holds the head; like the recompute working set it is one moment of
the step, so a rank counts the larger of the two (recompute runs in the layers' backward, after the loss).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import replace

from simgrid.layout.spec import Layout, check_layout, interleave_rounds
from simgrid.memory.states import stage_block_groups
from simgrid.model.blocks import local_seq_length, local_vocab, stage_blocks, stages_of_rank
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


#: fp32 bytes per element of the loss's fp32 tensors (the logits' upcast, log-softmax and their gradients).
FP32_BYTES = 4


def loss_working_bytes(model: ModelSpec, layout: Layout) -> int:
    """Transient bytes of the loss beyond the head's saved activations, on the rank holding the head (see
    the module docstring): ``fused`` one 16-bit logit tensor, ``unfused`` two fp32 logit tensors."""
    logits = layout.micro_batch_size * local_seq_length(model, layout.cp) * local_vocab(model, layout.tp)
    d = layout.param_bytes
    if layout.cross_entropy == "fused":
        return logits * d if d < FP32_BYTES else 0
    upcast = FP32_BYTES if d < FP32_BYTES else 0  # .float() of fp32 logits is the same tensor
    forward = logits * (d + upcast)  # pred and its fp32 copy beside the saved log-softmax
    backward = logits * 2 * FP32_BYTES  # nll_loss's and log_softmax's fp32 gradients beside the saved one
    return max(forward, backward)


def holds_head(model: ModelSpec, layout: Layout, pp_rank: int) -> bool:
    """Whether pipeline rank ``pp_rank`` runs the output layer and the loss."""
    head = 2 * model.num_layers + 1
    return any(head in stage_blocks(model, layout, stage) for stage in stages_of_rank(layout, pp_rank))


def activation_memory_bytes(model: ModelSpec, layout: Layout) -> list[int]:
    """Peak activation bytes of each pipeline rank (index = pipeline rank, one tp rank each):
    saved activations of the micro-batches in flight plus the larger of the recompute working set and, on the
    rank holding the head, the loss working set."""
    check_layout(model, layout)
    recompute = recompute_working_bytes(model, layout)
    loss = loss_working_bytes(model, layout)
    per_rank = []
    for pp_rank in range(layout.pp):
        stage_bytes = {stage: stage_activation_bytes(model, layout, stage) for stage in stages_of_rank(layout, pp_rank)}
        held = inflight_microbatches(layout, pp_rank, stage_bytes)
        saved = sum(count * stage_bytes[stage] for stage, count in held.items())
        per_rank.append(saved + max(recompute, loss if holds_head(model, layout, pp_rank) else 0))
    return per_rank
