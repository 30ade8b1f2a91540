"""Unit-time analysis: textbook bubble fractions, ZB-H1/ZBV gains, deadlock reports, the text grid.

Derivation of when the textbook formulas are exact (checked below): with every F taking time f and
every B time b on every stage and free communication, the last rank starts after the first micro-batch's
forward crossed pp-1 stages ((pp-1) f), then is busy m(f + b) without a gap, and the first rank finishes
(pp-1) b after the last rank's final backward; so the step takes (m + pp - 1)(f + b), of which m(f + b)
is busy on every rank: idle fraction (pp-1)/(m+pp-1) for any m >= 1 and any f:b ratio. For interleaved
1F1B each chunk costs (f + b)/v and the ramps shrink to (pp-1)(f + b)/v, so the fraction is
(pp-1)/(v*m+pp-1); this holds whenever m is a multiple of pp (the schedule's own rule). The formulas
need uniform stage costs: an unbalanced stage or a non-zero transfer time makes the bubble larger.
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from simgrid.errors import ScheduleError
from simgrid.ir.torch_csv import Action
from simgrid.schedules.pipeline import pipeline_order
from simgrid.schedules.unit_time import format_grid, simulate_unit_time


def _fraction(value: float) -> Fraction:
    return Fraction(value).limit_denominator(10_000)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("durations", [{"F": 1, "B": 2}, {"F": 1, "B": 1}, {"F": 2, "B": 3}])
def test_gpipe_and_1f1b_idle_fraction_is_textbook(schedule: str, durations: dict[str, float]) -> None:
    """(p-1)/(m+p-1) for every pp, m and uniform F:B ratio (Narayanan et al. SC'21, section 2.2)."""
    for pp in range(1, 6):
        for m in range(1, 11):
            result = simulate_unit_time(pipeline_order(schedule, pp, m), durations)
            assert _fraction(result.idle_fraction) == Fraction(pp - 1, m + pp - 1), (pp, m)


@pytest.mark.parametrize("vpp", [2, 3, 4])
def test_interleaved_idle_fraction_is_textbook_when_m_is_a_multiple_of_pp(vpp: int) -> None:
    """(p-1)/(v*m+p-1) with per-chunk F = 1, B = 2 (Narayanan et al. SC'21, section 2.2.2)."""
    for pp in range(1, 6):
        for m in range(pp, 4 * pp + 1, pp):
            result = simulate_unit_time(pipeline_order("interleaved-1f1b", pp, m, vpp))
            assert _fraction(result.idle_fraction) == Fraction(pp - 1, vpp * m + pp - 1), (pp, m)


def test_zb_h1_bubble_is_a_third_of_1f1b_when_f_i_w_are_equal() -> None:
    """Qi et al. 2023 section 3.1: with F = I = W the ZB-H1 bubble is (p-1)*F, i.e. idle fraction
    (p-1)/(3m+p-1) once m >= p, against 1F1B's 3(p-1)F; it is strictly smaller for every pp > 1."""
    for pp in range(2, 6):
        for m in range(1, 11):
            zb = simulate_unit_time(pipeline_order("zb-h1", pp, m)).idle_fraction
            one_f_one_b = simulate_unit_time(pipeline_order("1f1b", pp, m)).idle_fraction
            assert zb < one_f_one_b
            if m >= pp:
                assert _fraction(zb) == Fraction(pp - 1, 3 * m + pp - 1), (pp, m)


def test_zbv_beats_1f1b_and_zb_h1_with_enough_microbatches() -> None:
    """The V schedule (two chunks per rank) idles less than ZB-H1 once m >= 2*pp - 1 fills the V."""
    for pp in range(2, 5):
        for m in range(2 * pp - 1, 2 * pp + 4):
            zbv = simulate_unit_time(pipeline_order("zbv", pp, m, 2)).idle_fraction
            zb = simulate_unit_time(pipeline_order("zb-h1", pp, m)).idle_fraction
            assert zbv < zb


def test_hand_computed_makespan_of_two_stage_1f1b() -> None:
    """pp = 2, m = 2, F = 1, B = 2: 0F0 [0,1] 0F1 [1,2] 1F0 [1,2] 1B0 [2,4] 1F1 [4,5] 0B0 [4,6] 1B1 [5,7]
    0B1 [7,9]: makespan 9, busy 6 per rank."""
    result = simulate_unit_time(pipeline_order("1f1b", 2, 2))
    assert result.makespan == 9
    assert result.busy == [6, 6]
    assert result.starts[0] == [0, 1, 4, 7]
    assert result.starts[1] == [1, 2, 4, 5]


def test_deadlocking_order_is_reported_with_the_stuck_actions() -> None:
    """A rank that runs B before the F it needs, waiting on a rank that waits on it, is a deadlock."""
    order = [[Action(0, "F", 0), Action(0, "B", 0)], [Action(1, "B", 0), Action(1, "F", 0)]]
    with pytest.raises(ScheduleError, match=r"deadlocks.*rank 0 at 0B0.*rank 1 at 1B0"):
        simulate_unit_time(order)


def test_grid_shows_idle_slots_and_the_idle_fraction() -> None:
    """Rows are ranks, columns unit-time steps; idle slots print as dots."""
    text = format_grid(pipeline_order("1f1b", 2, 2))
    lines = text.splitlines()
    assert lines[1].split()[2:] == ["0F0", "0F1", "...", "...", "0B0", "---", "...", "0B1", "---"]
    assert lines[2].split()[2:] == ["...", "1F0", "1B0", "---", "1F1", "1B1", "---", "...", "..."]
    assert lines[-1] == "makespan 9 units, idle fraction 0.333"


def _sweep_until_stuck(order: list[list[Action]], widths: dict[str, float]) -> list[list[float]]:
    """Reference: visit every rank in turn, running what is ready, until a sweep makes no progress."""
    stages = 1 + max(a.stage for row in order for a in row)
    finish: dict[tuple[int, str, int], float] = {}
    starts: list[list[float]] = [[] for _ in order]
    clock = [0.0] * len(order)
    progressed = True
    while progressed:
        progressed = False
        for rank, row in enumerate(order):
            while len(starts[rank]) < len(row):
                a = row[len(starts[rank])]
                if a.kind == "F":
                    needs = [(a.stage - 1, "G0", a.microbatch)] if a.stage > 0 else []
                elif a.kind == "W":
                    needs = [(a.stage, "G", a.microbatch)]
                else:
                    needs = [(a.stage, "G0", a.microbatch)]
                    needs += [(a.stage + 1, "G", a.microbatch)] if a.stage + 1 < stages else []
                if any(k not in finish for k in needs):
                    break
                start = max([clock[rank]] + [finish[k] for k in needs])
                clock[rank] = start + widths[a.kind]
                finish[(a.stage, "G0" if a.kind == "F" else "G" if a.kind in "BI" else "W", a.microbatch)] = clock[rank]
                starts[rank].append(start)
                progressed = True
    return starts


@pytest.mark.parametrize("schedule,vpp", [("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2),
                                          ("interleaved-1f1b", 3), ("zb-h1", 1), ("zbv", 2)])
def test_start_times_match_a_sweep_over_all_ranks(schedule: str, vpp: int) -> None:
    """The event-driven unit-time run gives every action the start of a plain sweep-until-stuck run."""
    widths = {"F": 1.0, "B": 2.5, "I": 1.25, "W": 0.75}
    for pp in (2, 3, 4):
        for m in (pp, 2 * pp, 3 * pp):
            order = pipeline_order(schedule, pp, m, vpp)
            assert simulate_unit_time(order, widths).starts == _sweep_until_stuck(order, widths), (pp, m)


def test_bookkeeping_actions_of_imported_orders_take_no_time_and_wait_for_nothing() -> None:
    """torch's orders hold REDUCE_GRAD (and transfers, UNSHARD/RESHARD): they used to deadlock the unit-time
    run (read as a backward of micro-batch -1); now they cost nothing, and the timing is the plain order's."""
    plain = pipeline_order("1f1b", 2, 3)
    extra = [[Action(r, "UNSHARD"), *row, Action(r, "REDUCE_GRAD"), Action(r, "RESHARD")] for r, row in enumerate(plain)]
    extra[0].insert(2, Action(0, "SEND_F", 1))
    a, b = simulate_unit_time(plain), simulate_unit_time(extra)
    assert b.makespan == a.makespan and b.busy == a.busy
    for row, plain_starts, starts in zip(extra, a.starts, b.starts, strict=True):
        assert [t for action, t in zip(row, starts, strict=True) if action.kind in ("F", "B")] == plain_starts
