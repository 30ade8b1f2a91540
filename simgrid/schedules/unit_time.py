"""Unit-time analysis of a compute-only pipeline order: makespan, idle fraction and a text Gantt chart.

Every action takes a fixed time by kind (by default F = 1, B = 2, split as I = 1 and W = 1, the usual
"backward costs twice the forward" of Narayanan et al. SC'21 section 3.3), communication is free, and an
action starts when its rank is free and its inputs exist:

* F of stage s after F of stage s-1 (same micro-batch);
* B or I of stage s after F of stage s and after B or I of stage s+1 (the gradient it consumes);
* W of stage s after I of stage s.

An ``OVERLAP_F_B`` action runs its sub-actions one after the other (as torch's runtime does). Actions
that are not computation (torch's ``SEND_*``/``RECV_*``, ``UNSHARD``, ``RESHARD``, ``REDUCE_GRAD``, which
orders imported from torch hold) take no time and wait for nothing: the transfers are implied by the
rules above, and a stage's ``REDUCE_GRAD`` follows its backwards on the same rank anyway.

An order whose ranks wait on each other in a cycle is reported as a :class:`ScheduleError`.
"""

from __future__ import annotations

from dataclasses import dataclass

from simgrid.errors import ScheduleError
from simgrid.ir.torch_csv import Action
from simgrid.schedules.pipeline import PipelineOrder

DEFAULT_DURATIONS: dict[str, float] = {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0}
"""Action durations in time units: backward = 2 x forward, split evenly into input and weight grads."""


@dataclass(frozen=True, kw_only=True)
class UnitTimeResult:
    """Timing of a pipeline order under fixed per-kind durations."""

    starts: list[list[float]]
    """Start time of each action, indexed like the order."""
    makespan: float
    """Time from the first start to the last finish."""
    busy: list[float]
    """Time each rank spends computing."""

    @property
    def idle_fraction(self) -> float:
        """Share of rank-time spent idle (the pipeline bubble): ``1 - sum(busy) / (ranks * makespan)``."""
        if self.makespan == 0:
            return 0.0
        return 1.0 - sum(self.busy) / (len(self.busy) * self.makespan)


_COMPUTE = frozenset(("F", "B", "I", "W"))


def _producer_keys(action: Action, num_stages: int) -> list[tuple[int, str, int]]:
    s, mb = action.stage, action.microbatch
    if action.kind not in _COMPUTE:
        return []
    if action.kind == "F":
        return [(s - 1, "F", mb)] if s > 0 else []
    if action.kind == "W":
        return [(s, "G", mb)]
    keys = [(s, "F", mb)]
    if s + 1 < num_stages:
        keys.append((s + 1, "G", mb))
    return keys


def _result_key(action: Action) -> tuple[int, str, int]:
    # B and I both produce the input gradient that the previous stage consumes.
    kind = "G" if action.kind in ("B", "I") else action.kind
    return (action.stage, kind, action.microbatch)


def simulate_unit_time(order: PipelineOrder, durations: dict[str, float] | None = None) -> UnitTimeResult:
    """Run ``order`` with fixed per-kind durations; raise :class:`ScheduleError` if it deadlocks."""
    widths = DEFAULT_DURATIONS if durations is None else durations

    def width(leaf: Action) -> float:
        return widths[leaf.kind] if leaf.kind in _COMPUTE else 0.0

    # Each rank runs its actions' leaves (an OVERLAP_F_B's sub-actions, or the action itself) in order.
    leaves = [[(index, leaf) for index, action in enumerate(row) for leaf in action.leaves] for row in order]
    num_stages = 1 + max((leaf.stage for row in leaves for _, leaf in row), default=0)
    finish: dict[tuple[int, str, int], float] = {}
    starts: list[list[float]] = [[0.0] * len(row) for row in order]
    clock = [0.0] * len(order)
    position = [0] * len(order)
    remaining = sum(len(row) for row in leaves)
    # Each rank runs until an input is missing and then sleeps on that input; producing it wakes the
    # rank. Every start is the max of the rank's clock and its inputs' finishes, which do not depend
    # on the order ranks are visited in, so this equals sweeping all ranks until none progresses,
    # at a cost linear in the actions instead of (sweeps x ranks).
    sleepers: dict[tuple[int, str, int], list[int]] = {}
    runnable = list(range(len(order) - 1, -1, -1))
    while runnable:
        rank = runnable.pop()
        row = leaves[rank]
        while position[rank] < len(row):
            index, action = row[position[rank]]
            needs = _producer_keys(action, num_stages)
            missing = None
            for key in needs:
                if key not in finish:
                    missing = key
                    break
            if missing is not None:
                sleepers.setdefault(missing, []).append(rank)
                break
            start = max([clock[rank], *(finish[key] for key in needs)])
            if position[rank] == 0 or row[position[rank] - 1][0] != index:
                starts[rank][index] = start  # an action starts with its first leaf
            clock[rank] = start + width(action)
            position[rank] += 1
            remaining -= 1
            if action.kind in _COMPUTE:
                produced = _result_key(action)
                finish[produced] = clock[rank]
                woken = sleepers.pop(produced, None)
                if woken is not None:
                    runnable.extend(woken)
    if remaining:
        stuck = ", ".join(
            f"rank {r} at {order[r][row[position[r]][0]]}" for r, row in enumerate(leaves) if position[r] < len(row)
        )
        raise ScheduleError(f"pipeline order deadlocks: every rank waits for an input ({stuck})")
    busy = [sum(width(leaf) for _, leaf in row) for row in leaves]
    return UnitTimeResult(starts=starts, makespan=max(clock, default=0.0), busy=busy)


def format_grid(order: PipelineOrder, durations: dict[str, float] | None = None) -> str:
    """Text Gantt chart of ``order`` in unit time: a row per rank, a column per time unit, ``.`` idle.

    An action's label fills its first time unit and ``-`` its remaining ones. Durations must be whole
    numbers of time units.
    """
    widths = DEFAULT_DURATIONS if durations is None else durations
    # One cell per computation: OVERLAP_F_B units show as their sub-actions, bookkeeping actions not at all.
    order = [[leaf for action in row for leaf in action.leaves if leaf.kind in _COMPUTE] for row in order]
    result = simulate_unit_time(order, widths)
    width = max((len(str(a)) for row in order for a in row), default=3)
    columns = round(result.makespan)
    header = "time    " + " ".join(str(t).ljust(width) for t in range(columns))
    lines = [header]
    for rank, (row, starts) in enumerate(zip(order, result.starts, strict=True)):
        cells = ["." * width] * columns
        for action, start in zip(row, starts, strict=True):
            first = round(start)
            for t in range(first, first + round(widths[action.kind])):
                cells[t] = str(action).ljust(width) if t == first else "-" * width
        lines.append(f"rank {rank:<3} " + " ".join(cells))
    lines.append(f"makespan {result.makespan:g} units, idle fraction {result.idle_fraction:.3f}")
    return "\n".join(lines)
