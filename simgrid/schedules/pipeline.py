"""Compute-only pipeline orders: which stage, kind and micro-batch each pipeline rank runs, in order.

An order is a list per pipeline rank of :class:`simgrid.ir.torch_csv.Action` values (the IR's pipeline
action, shared so orders and torch CSV files interconvert) in the action grammar of
``torch.distributed.pipelining`` (``"1F0"`` = stage 1, forward, micro-batch 0; ``B`` full backward,
``I`` input-gradient backward, ``W`` weight-gradient backward). Orders carry no timing: a rank runs its
actions one after the other, each as soon as the stage it depends on has produced its input
(see :mod:`simgrid.schedules.unit_time`).

Schedules and their rules (each rule is checked by :func:`check_schedule`):

* ``none``: no pipeline (pp = 1); gradient accumulation runs F then B per micro-batch.
* ``gpipe``: all forwards, then all backwards (Huang et al. 2019, "GPipe").
* ``1f1b``: PipeDream-Flush / Megatron 1F1B (Narayanan et al. SC'21, section 2.2.1): rank ``r`` runs
  ``min(pp - r - 1, m)`` warm-up forwards, then alternates one forward and one backward.
* ``interleaved-1f1b``: Megatron's interleaved schedule (Narayanan et al. SC'21, section 2.2.2) with
  ``vpp`` model chunks per rank; stage ``s`` lives on rank ``s % pp``. Micro-batches move through the
  chunks in groups of ``pp``, so ``m`` must be a multiple of ``pp``.
* ``zb-h1``: Qi et al. 2023, "Zero Bubble Pipeline Parallelism", ZB-H1: the 1F1B order with B split into
  I (input gradient, on the critical path) and W (weight gradient, deferred). Rank ``r`` delays its
  first ``r`` W's, which fills the cool-down bubble while keeping at most ``pp`` micro-batches in flight,
  the 1F1B peak.
* ``zbv``: the V-shaped zero-bubble schedule (Qi et al. 2024, "Pipeline Parallelism with Controllable
  Memory", ZB-V; also ``ScheduleZBVZeroBubble`` in torch.distributed.pipelining): two chunks per rank,
  chunk 0 holds stage ``r`` and chunk 1 stage ``2*pp - 1 - r``. Any ``m >= 1`` works: the order is built
  for ``max(m, 2*pp - 1)`` micro-batches (the count that fills the V) and the extra ones are dropped,
  which keeps every dependency of the remaining actions; with fewer than ``2*pp - 1`` micro-batches the
  schedule simply has bubbles.
"""

from __future__ import annotations

from typing import Literal

from simgrid.errors import ScheduleError
from simgrid.ir.torch_csv import Action
from simgrid.layout.spec import SCHEDULES

ActionKind = Literal["F", "B", "I", "W"]
"""F forward; B full backward; I input-gradient backward; W weight-gradient backward."""

PipelineOrder = list[list[Action]]
"""Per pipeline rank, the actions it runs in order."""


def num_chunks(schedule: str, vpp: int) -> int:
    """Model chunks each pipeline rank holds under ``schedule``."""
    return vpp if schedule in ("interleaved-1f1b", "zbv") else 1


def check_schedule(schedule: str, pp: int, num_microbatches: int, vpp: int = 1) -> None:
    """Raise :class:`ScheduleError` naming the rule when the schedule cannot be built."""
    if schedule not in SCHEDULES:
        raise ScheduleError(f"schedule {schedule!r} is unknown; use one of {', '.join(SCHEDULES)}")
    for name, value in (("pp", pp), ("micro-batch count", num_microbatches), ("vpp", vpp)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ScheduleError(f"schedule {schedule!r}: {name} = {value!r} must be a positive integer")
    if schedule == "none" and pp != 1:
        raise ScheduleError(
            f"schedule 'none' runs the whole model on one rank but pp = {pp}; use pp = 1 or a pipeline "
            "schedule such as '1f1b'"
        )
    if schedule == "interleaved-1f1b":
        if vpp < 2:
            raise ScheduleError(
                f"schedule 'interleaved-1f1b' needs vpp >= 2 model chunks per rank, got vpp = {vpp}; "
                "raise vpp or use '1f1b'"
            )
        if num_microbatches % pp:
            # Megatron walks micro-batches through the chunks in groups of pp; a partial last group
            # would make a chunk wait for micro-batches that never arrive.
            lower, upper = pp * (num_microbatches // pp), pp * (num_microbatches // pp + 1)
            choices = f"m = {lower} or {upper}" if lower else f"m = {upper}"
            raise ScheduleError(
                f"schedule 'interleaved-1f1b' needs the micro-batch count to be a multiple of pp: "
                f"m = {num_microbatches}, pp = {pp}; use {choices}"
            )
    elif schedule == "zbv":
        if vpp != 2:
            raise ScheduleError(f"schedule 'zbv' places exactly 2 chunks per rank (a V); got vpp = {vpp}; set vpp = 2")
    elif vpp != 1:
        raise ScheduleError(
            f"schedule {schedule!r} has one model chunk per rank but vpp = {vpp}; set vpp = 1 or use "
            "'interleaved-1f1b' / 'zbv'"
        )


def stage_to_rank(stage: int, pp: int, vpp: int, schedule: str) -> int:
    """Pipeline rank that runs global ``stage`` (interleaved: ``s % pp``; zbv: a V over the ranks)."""
    chunks = num_chunks(schedule, vpp)
    if not 0 <= stage < pp * chunks:
        raise ScheduleError(f"stage {stage} is outside 0..{pp * chunks - 1} for pp = {pp}, {chunks} chunk(s)")
    if schedule == "zbv":
        return stage if stage < pp else 2 * pp - 1 - stage
    return stage % pp


def stage_chunk(stage: int, pp: int) -> int:
    """Local chunk index of a global stage (the same rule for interleaved and V placements)."""
    return stage // pp


def rank_stages(rank: int, pp: int, vpp: int, schedule: str) -> tuple[int, ...]:
    """Global stages held by pipeline ``rank``, indexed by local chunk."""
    if not 0 <= rank < pp:
        raise ScheduleError(f"pipeline rank {rank} is outside 0..{pp - 1}")
    if schedule == "zbv":
        return (rank, 2 * pp - 1 - rank)
    return tuple(chunk * pp + rank for chunk in range(num_chunks(schedule, vpp)))


def pipeline_order(schedule: str, pp: int, num_microbatches: int, vpp: int = 1) -> PipelineOrder:
    """Per pipeline rank, the compute actions of one training step under ``schedule``."""
    check_schedule(schedule, pp, num_microbatches, vpp)
    m = num_microbatches
    if schedule in ("none", "1f1b"):
        return [_one_f_one_b(r, pp, m) for r in range(pp)]
    if schedule == "gpipe":
        return [[Action(r, "F", i) for i in range(m)] + [Action(r, "B", i) for i in range(m)] for r in range(pp)]
    if schedule == "interleaved-1f1b":
        return [_interleaved(r, pp, m, vpp) for r in range(pp)]
    if schedule == "zb-h1":
        return [_zb_h1(r, pp, m) for r in range(pp)]
    return [_zbv(r, pp, m) for r in range(pp)]


def _one_f_one_b(rank: int, pp: int, m: int) -> list[Action]:
    warmup = min(pp - rank - 1, m)
    order = [Action(rank, "F", i) for i in range(warmup)]
    for i in range(m - warmup):
        order += [Action(rank, "F", warmup + i), Action(rank, "B", i)]
    order += [Action(rank, "B", i) for i in range(m - warmup, m)]
    return order


def _interleaved(rank: int, pp: int, m: int, vpp: int) -> list[Action]:
    # Megatron-LM schedules.py (forward_backward_pipelining_with_interleaving): the k-th virtual
    # micro-batch of a rank belongs to chunk (k mod pp*vpp) // pp, micro-batch
    # (k // (pp*vpp)) * pp + k mod pp; backwards walk the chunks in reverse. Warm-up forwards:
    # 2 * (pp - rank - 1) + (vpp - 1) * pp, capped at the total.
    total = m * vpp
    group = pp * vpp

    def action(k: int, kind: str) -> Action:
        chunk = (k % group) // pp
        if kind != "F":
            chunk = vpp - 1 - chunk
        return Action(chunk * pp + rank, kind, (k // group) * pp + k % pp)

    warmup = min(2 * (pp - rank - 1) + (vpp - 1) * pp, total)
    order = [action(k, "F") for k in range(warmup)]
    for k in range(total - warmup):
        order += [action(warmup + k, "F"), action(k, "B")]
    order += [action(k, "B") for k in range(total - warmup, total)]
    return order


def _zb_h1(rank: int, pp: int, m: int) -> list[Action]:
    # ZB-H1 (Qi et al. 2023, section 3.1 / figure 3): 1F1B with B = I + W; rank r postpones its first
    # r weight-gradient passes into the cool-down, where rank r would otherwise idle.
    warmup = min(pp - rank - 1, m)
    deferred = rank
    order = [Action(rank, "F", i) for i in range(warmup)]
    next_w = 0
    for i in range(m):
        if warmup + i < m:
            order.append(Action(rank, "F", warmup + i))
        order.append(Action(rank, "I", i))
        if i >= deferred:
            order.append(Action(rank, "W", next_w))
            next_w += 1
    order += [Action(rank, "W", i) for i in range(next_w, m)]
    return order


def _zbv(rank: int, pp: int, m: int) -> list[Action]:
    # ZB-V (Qi et al. 2024, figure 5; the same phases as torch's ScheduleZBVZeroBubble): the V is
    # filled by 2*pp - 1 micro-batches; smaller m drops the surplus actions afterwards.
    n = max(m, 2 * pp - 1)
    s0, s1 = rank, 2 * pp - 1 - rank
    order: list[Action] = []
    f0 = f1 = b0 = b1 = 0
    for _ in range(2 * (pp - rank) - 1):
        order.append(Action(s0, "F", f0))
        f0 += 1
    for _ in range(rank):
        order += [Action(s1, "F", f1), Action(s0, "F", f0)]
        f1, f0 = f1 + 1, f0 + 1
    for _ in range(pp - rank):
        order += [Action(s1, "F", f1), Action(s1, "I", b1), Action(s1, "W", b1)]
        f1, b1 = f1 + 1, b1 + 1
    while f1 < f0 or f0 < n:
        if f0 < n:
            order.append(Action(s0, "F", f0))
            f0 += 1
        order += [Action(s0, "I", b0), Action(s0, "W", b0)]
        order += [Action(s1, "F", f1), Action(s1, "I", b1), Action(s1, "W", b1)]
        f1, b0, b1 = f1 + 1, b0 + 1, b1 + 1
    w0, w1 = b0, b1
    for _ in range(rank):
        order += [Action(s0, "I", b0), Action(s1, "I", b1)]
        b0, b1 = b0 + 1, b1 + 1
    for _ in range(pp - rank):
        order += [Action(s0, "I", b0), Action(s0, "W", w0)]
        b0, w0 = b0 + 1, w0 + 1
    order += [Action(s1, "W", i) for i in range(w1, b1)]
    order += [Action(s0, "W", i) for i in range(w0, b0)]
    return [a for a in order if a.microbatch is not None and a.microbatch < m]

