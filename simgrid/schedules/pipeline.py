"""Compute-only pipeline orders: which stage, kind and micro-batch each pipeline rank runs, in order.

An order is a list per pipeline rank of :class:`simgrid.ir.torch_csv.Action` values (the IR's pipeline
action, shared so orders and torch CSV files interconvert) in the action grammar of
``torch.distributed.pipelining`` (``"1F0"`` = stage 1, forward, micro-batch 0; ``B`` full backward,
``I`` input-gradient backward, ``W`` weight-gradient backward; ``(0F5;3B1)OVERLAP_F_B`` a forward and a
backward issued as one unit). Orders carry no timing: a rank runs its actions one after the other, each
as soon as the stage it depends on has produced its input (see :mod:`simgrid.schedules.unit_time`).
Every order below equals, action for action, the order torch 2.13's class of the same schedule builds
(idle slots dropped); ``tests/schedules/test_schedules_torch_parity.py`` checks it against the classes.

Schedules and their rules (each rule is checked by :func:`check_schedule`):

* ``none``: no pipeline (pp = 1); gradient accumulation runs F then B per micro-batch.
* ``gpipe``: all forwards, then all backwards (Huang et al. 2019, "GPipe").
* ``1f1b``: PipeDream-Flush / Megatron 1F1B (Narayanan et al. SC'21, section 2.2.1): rank ``r`` runs
  ``min(pp - r - 1, m)`` warm-up forwards, then alternates one forward and one backward.
* ``interleaved-1f1b``: Megatron's interleaved schedule (Narayanan et al. SC'21, section 2.2.2) with
  ``vpp`` model chunks per rank; stage ``s`` lives on rank ``s % pp``. Micro-batches move through the
  chunks in rounds of ``m // max(1, m // pp)`` (``ScheduleInterleaved1F1B``'s flexible rounds; Llama 3
  trained with a micro-batch count that is not a multiple of pp, Dubey et al. 2024, section 3.3.2), so
  ``m`` must be a multiple of the round count ``max(1, m // pp)``: any m <= pp, any multiple of pp, and
  e.g. m = 10 with pp = 4. With m a multiple of pp this is exactly Megatron's order.
* ``zb-h1``: Qi et al. 2023, "Zero Bubble Pipeline Parallelism", ZB-H1: the 1F1B order with B split into
  I (input gradient, on the critical path) and W (weight gradient, deferred). Rank ``r`` delays its
  first ``r`` W's, which fills the cool-down bubble while keeping at most ``pp`` micro-batches in flight,
  the 1F1B peak.
* ``interleaved-zb``: the same split and deferral over ``vpp >= 2`` interleaved chunks
  (``ScheduleInterleavedZeroBubble``, Qi et al. 2023's ZB1P on interleaved stages): warm-up forwards
  grow by one, not two, per hop, and the rounds rule of ``interleaved-1f1b`` applies.
* ``looped-bfs``: breadth-first pipelining (Lamy-Poirier 2023, "Breadth-First Pipeline Parallelism",
  arXiv:2211.05953; ``ScheduleLoopedBFS``): each rank runs every micro-batch through its first chunk,
  then its second, ..., then the backwards chunk by chunk in reverse, micro-batches in reverse.
  ``vpp >= 1`` interleaved chunks; activations of all m micro-batches stay live, as in GPipe.
* ``zbv``: the V-shaped zero-bubble schedule (Qi et al. 2024, "Pipeline Parallelism with Controllable
  Memory", ZB-V; also ``ScheduleZBVZeroBubble`` in torch.distributed.pipelining): two chunks per rank,
  chunk 0 holds stage ``r`` and chunk 1 stage ``2*pp - 1 - r``. Any ``m >= 1`` works: the order is built
  for ``max(m, 2*pp - 1)`` micro-batches (the count that fills the V) and the extra ones are dropped,
  which keeps every dependency of the remaining actions; with fewer than ``2*pp - 1`` micro-batches the
  schedule simply has bubbles.
* ``dualpipev``: DualPipeV (``ScheduleDualPipeV``, after DeepSeek's open-source DualPipe,
  github.com/deepseek-ai/DualPipe): the V placement of ``zbv`` with ``m >= 2*pp``; in its steady state
  each step is an ``OVERLAP_F_B`` unit, the forward of one chunk and the full backward of the other,
  and the tail splits backwards into I and W to fill the drain. torch's runtime performs a unit's two
  computations one after the other (a custom function may overlap them); so do the simulator and the
  executor, whose transfers are asynchronous, so one computation's sends and receives run under the other.
"""

from __future__ import annotations

from typing import Literal

from simgrid.errors import ScheduleError
from simgrid.ir.torch_csv import Action
from simgrid.layout.spec import (
    INTERLEAVED_SCHEDULES,
    SCHEDULES,
    V_SCHEDULES,
    interleave_rounds,
    schedule_problem,
)

ActionKind = Literal["F", "B", "I", "W"]
"""F forward; B full backward; I input-gradient backward; W weight-gradient backward."""

PipelineOrder = list[list[Action]]
"""Per pipeline rank, the actions it runs in order."""


#: Schedules that split the backward into I and W.
SPLIT_BACKWARD_SCHEDULES = ("zb-h1", "interleaved-zb", "zbv")


def num_chunks(schedule: str, vpp: int) -> int:
    """Model chunks each pipeline rank holds under ``schedule``."""
    return vpp if schedule in INTERLEAVED_SCHEDULES + V_SCHEDULES else 1


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
    problem = schedule_problem(schedule, pp, num_microbatches, vpp)
    if problem:
        raise ScheduleError(problem)


def stage_to_rank(stage: int, pp: int, vpp: int, schedule: str) -> int:
    """Pipeline rank that runs global ``stage`` (interleaved: ``s % pp``; zbv: a V over the ranks)."""
    chunks = num_chunks(schedule, vpp)
    if not 0 <= stage < pp * chunks:
        raise ScheduleError(f"stage {stage} is outside 0..{pp * chunks - 1} for pp = {pp}, {chunks} chunk(s)")
    if schedule in V_SCHEDULES:
        return stage if stage < pp else 2 * pp - 1 - stage
    return stage % pp


def stage_chunk(stage: int, pp: int) -> int:
    """Local chunk index of a global stage (the same rule for interleaved and V placements)."""
    return stage // pp


def rank_stages(rank: int, pp: int, vpp: int, schedule: str) -> tuple[int, ...]:
    """Global stages held by pipeline ``rank``, indexed by local chunk."""
    if not 0 <= rank < pp:
        raise ScheduleError(f"pipeline rank {rank} is outside 0..{pp - 1}")
    if schedule in V_SCHEDULES:
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
    if schedule in ("interleaved-1f1b", "zb-h1", "interleaved-zb"):
        zero_bubble = schedule != "interleaved-1f1b"
        return [_interleaved(r, pp, m, vpp, zero_bubble=zero_bubble) for r in range(pp)]
    if schedule == "looped-bfs":
        return [_looped_bfs(r, pp, m, vpp) for r in range(pp)]
    if schedule == "dualpipev":
        return [_dualpipev(r, pp, m) for r in range(pp)]
    return [_zbv(r, pp, m) for r in range(pp)]


def flatten_order(order: PipelineOrder) -> PipelineOrder:
    """``order`` with each ``OVERLAP_F_B`` unit replaced by its sub-actions, in the order they run."""
    return [[leaf for action in row for leaf in action.leaves] for row in order]


def _one_f_one_b(rank: int, pp: int, m: int) -> list[Action]:
    warmup = min(pp - rank - 1, m)
    order = [Action(rank, "F", i) for i in range(warmup)]
    for i in range(m - warmup):
        order += [Action(rank, "F", warmup + i), Action(rank, "B", i)]
    order += [Action(rank, "B", i) for i in range(m - warmup, m)]
    return order


def _interleaved(rank: int, pp: int, m: int, vpp: int, *, zero_bubble: bool) -> list[Action]:
    # torch 2.13 _get_1f1b_rank_ops (ScheduleInterleaved1F1B / ScheduleInterleavedZeroBubble), which for
    # m a multiple of pp is Megatron-LM's forward_backward_pipelining_with_interleaving: the k-th forward
    # of a rank runs chunk (k // per_round) % vpp, the k-th backward walks the chunks in reverse, and each
    # stage takes its micro-batches in order. Warm-up: (vpp - 1) rounds plus 2 forwards per hop to the
    # last rank (1 per hop with zero bubble, whose W's fill the gap). Zero bubble splits B into I and W
    # and delays rank r's first r W's into the cool-down (ZB-H1, Qi et al. 2023, section 3.1).
    _, per_round = interleave_rounds(pp, m)
    total = m * vpp
    warmup = min((vpp - 1) * per_round + (1 if zero_bubble else 2) * (pp - 1 - rank), total)
    next_mb: dict[tuple[str, int], int] = {}

    def take(kind: str, stage: int) -> Action:
        mb = next_mb.get((kind, stage), 0)
        next_mb[(kind, stage)] = mb + 1
        return Action(stage, kind, mb)

    def fwd_stage(k: int) -> int:
        return (k // per_round) % vpp * pp + rank

    def bwd_stage(k: int) -> int:
        return (vpp - 1 - (k - warmup) // per_round % vpp) * pp + rank

    backward = "I" if zero_bubble else "B"
    order: list[Action] = []
    backwards: list[int] = []
    weights = 0
    for k in range(warmup + total):
        if k < total:
            order.append(take("F", fwd_stage(k)))
        if k >= warmup:
            order.append(take(backward, bwd_stage(k)))
            backwards.append(k)
            if zero_bubble and k - warmup >= rank:
                order.append(take("W", bwd_stage(backwards[weights])))
                weights += 1
    while zero_bubble and weights < len(backwards):
        order.append(take("W", bwd_stage(backwards[weights])))
        weights += 1
    return order


def _looped_bfs(rank: int, pp: int, m: int, vpp: int) -> list[Action]:
    # ScheduleLoopedBFS: every micro-batch through each local chunk in turn, then the backwards chunk by
    # chunk in reverse with the micro-batches in reverse.
    stages = [chunk * pp + rank for chunk in range(vpp)]
    order = [Action(s, "F", i) for s in stages for i in range(m)]
    return order + [Action(s, "B", i) for s in reversed(stages) for i in reversed(range(m))]


def _dualpipev(rank: int, pp: int, m: int) -> list[Action]:
    # ScheduleDualPipeV._calculate_single_rank_operations (torch 2.13), phase by phase. A full backward B
    # counts as both the I and the W of its micro-batch; W's of split backwards run oldest first.
    s0, s1 = rank, 2 * pp - 1 - rank
    count: dict[tuple[int, str], int] = {}
    pending_w: list[Action] = []

    def act(stage: int, kind: str) -> Action:
        key = (stage, "I" if kind == "B" else kind)
        action = Action(stage, kind, count.get(key, 0))
        count[key] = action.microbatch + 1
        if kind == "I":
            pending_w.append(Action(stage, "W", action.microbatch))
        return action

    def weight() -> list[Action]:
        return [pending_w.pop(0)] if pending_w else []

    order = [act(s0, "F") for _ in range(2 * (pp - rank - 1))]
    for _ in range(rank + 1):
        order += [act(s0, "F"), act(s1, "F")]
    for _ in range(pp - rank - 1):
        order += [act(s1, "I"), *weight(), act(s1, "F")]
    for i in range(m - 2 * pp + rank + 1):
        if i == 0 and rank == pp - 1:
            order += [act(s0, "F"), act(s1, "B")]  # torch keeps the V's tip apart: a smaller bubble
        else:
            order.append(Action.overlap(act(s0, "F"), act(s1, "B")))
        order.append(Action.overlap(act(s1, "F"), act(s0, "B")))
    for _ in range(pp - rank - 1):
        order += [act(s1, "B"), Action.overlap(act(s1, "F"), act(s0, "B"))]
    split = False
    for i in range(rank + 1):
        split = split or (i == (rank + 1) // 2 and rank % 2 == 1)
        order.append(act(s1, "I" if split else "B"))
        split = split or (i == (rank + 1) // 2 and rank % 2 == 0)
        order.append(act(s0, "I" if split else "B"))
    for _ in range(pp - rank - 1):
        order += [*weight(), act(s0, "I" if split else "B")]
    for _ in range(rank + 1):
        order += weight()
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

