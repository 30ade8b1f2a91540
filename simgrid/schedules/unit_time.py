"""Unit-time analysis of a compute-only pipeline order: makespan, idle fraction and a text Gantt chart.

Every action takes a fixed time by kind (by default F = 1, B = 2, split as I = 1 and W = 1, the usual
"backward costs twice the forward" of Narayanan et al. SC'21 section 3.3), communication is free, and an
action starts when its rank is free and its inputs exist:

* F of stage s after F of stage s-1 (same micro-batch);
* B or I of stage s after F of stage s and after B or I of stage s+1 (the gradient it consumes);
* W of stage s after I of stage s.

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


def _producer_keys(action: Action, num_stages: int) -> list[tuple[int, str, int]]:
    s, mb = action.stage, action.microbatch
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
    num_stages = 1 + max((a.stage for row in order for a in row), default=0)
    finish: dict[tuple[int, str, int], float] = {}
    starts: list[list[float]] = [[] for _ in order]
    clock = [0.0] * len(order)
    position = [0] * len(order)
    remaining = sum(len(row) for row in order)
    # Each rank runs until an input is missing and then sleeps on that input; producing it wakes the
    # rank. Every start is the max of the rank's clock and its inputs' finishes, which do not depend
    # on the order ranks are visited in, so this equals sweeping all ranks until none progresses,
    # at a cost linear in the actions instead of (sweeps x ranks).
    sleepers: dict[tuple[int, str, int], list[int]] = {}
    runnable = list(range(len(order) - 1, -1, -1))
    while runnable:
        rank = runnable.pop()
        row = order[rank]
        while position[rank] < len(row):
            action = row[position[rank]]
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
            clock[rank] = start + widths[action.kind]
            produced = _result_key(action)
            finish[produced] = clock[rank]
            starts[rank].append(start)
            position[rank] += 1
            remaining -= 1
            woken = sleepers.pop(produced, None)
            if woken is not None:
                runnable.extend(woken)
    if remaining:
        stuck = ", ".join(
            f"rank {r} at {row[position[r]]}" for r, row in enumerate(order) if position[r] < len(row)
        )
        raise ScheduleError(f"pipeline order deadlocks: every rank waits for an input ({stuck})")
    busy = [sum(widths[a.kind] for a in row) for row in order]
    return UnitTimeResult(starts=starts, makespan=max(clock, default=0.0), busy=busy)


def format_grid(order: PipelineOrder, durations: dict[str, float] | None = None) -> str:
    """Text Gantt chart of ``order`` in unit time: a row per rank, a column per time unit, ``.`` idle.

    An action's label fills its first time unit and ``-`` its remaining ones. Durations must be whole
    numbers of time units.
    """
    widths = DEFAULT_DURATIONS if durations is None else durations
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
