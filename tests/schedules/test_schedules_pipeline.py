"""Pipeline orders: action counts and dependency order, placement of stages, rules, torch parity."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simgrid.errors import ScheduleError
from simgrid.ir.torch_csv import Action
from simgrid.layout.spec import SCHEDULES
from simgrid.schedules.pipeline import (
    SPLIT_BACKWARD_SCHEDULES,
    check_schedule,
    flatten_order,
    num_chunks,
    pipeline_order,
    rank_stages,
    stage_to_rank,
)
from simgrid.schedules.unit_time import simulate_unit_time


@st.composite
def schedules(draw: st.DrawFn) -> tuple[str, int, int, int]:
    """A valid (schedule, pp, m, vpp)."""
    schedule = draw(st.sampled_from(SCHEDULES))
    pp = 1 if schedule == "none" else draw(st.integers(1, 4))
    vpp = {"interleaved-1f1b": draw(st.integers(2, 3)), "interleaved-zb": draw(st.integers(2, 3)),
           "looped-bfs": draw(st.integers(1, 3)), "zbv": 2, "dualpipev": 2}.get(schedule, 1)
    m = draw(st.integers(2 * pp if schedule == "dualpipev" else 1, 12))
    if schedule in ("interleaved-1f1b", "interleaved-zb"):
        rounds = max(1, m // pp)
        m -= m % rounds  # torch's rule: equal interleaving rounds
    return schedule, pp, m, vpp


@settings(max_examples=150, deadline=None)
@given(schedules())
def test_every_microbatch_runs_forward_and_backward_once_per_stage(case: tuple[str, int, int, int]) -> None:
    """Each stage runs F and either B or (I and W) exactly once per micro-batch, on its own rank (DualPipeV
    mixes the two per micro-batch; only the split-backward schedules never use B)."""
    schedule, pp, m, vpp = case
    order = flatten_order(pipeline_order(schedule, pp, m, vpp))
    stages = pp * num_chunks(schedule, vpp)
    counts = Counter((a.stage, a.kind, a.microbatch) for row in order for a in row)
    for stage in range(stages):
        for mb in range(m):
            split = counts[(stage, "I", mb)] == 1
            kinds = ("F", "I", "W") if split else ("F", "B")
            assert all(counts[(stage, k, mb)] == 1 for k in kinds)
            assert not split or schedule in ("dualpipev", *SPLIT_BACKWARD_SCHEDULES)
            assert split or schedule not in SPLIT_BACKWARD_SCHEDULES
    splits = sum(1 for key in counts if key[1] == "I")
    assert sum(counts.values()) == stages * m * 2 + splits  # F and B, or F, I and W: nothing else
    for rank, row in enumerate(order):
        assert all(stage_to_rank(a.stage, pp, vpp, schedule) == rank for a in row)


@settings(max_examples=150, deadline=None)
@given(schedules())
def test_orders_respect_dependencies_within_a_rank_and_finish(case: tuple[str, int, int, int]) -> None:
    """On every rank a micro-batch's F precedes its B/I, I precedes W; the unit-time run never deadlocks."""
    schedule, pp, m, vpp = case
    order = flatten_order(pipeline_order(schedule, pp, m, vpp))
    for row in order:
        seen: set[tuple[int, str, int | None]] = set()
        for a in row:
            if a.kind in ("B", "I"):
                assert (a.stage, "F", a.microbatch) in seen
            if a.kind == "W":
                assert (a.stage, "I", a.microbatch) in seen
            seen.add((a.stage, a.kind, a.microbatch))
    simulate_unit_time(order)


def test_1f1b_order_for_four_ranks_matches_the_paper() -> None:
    """Narayanan et al. SC'21 fig. 4 (top): rank r does pp-r-1 warm-up forwards, then alternates."""
    order = pipeline_order("1f1b", 4, 8)
    assert [str(a) for a in order[0][:6]] == ["0F0", "0F1", "0F2", "0F3", "0B0", "0F4"]
    assert [str(a) for a in order[3][:4]] == ["3F0", "3B0", "3F1", "3B1"]
    assert [str(a) for a in order[2][-2:]] == ["2B6", "2B7"]


def test_gpipe_runs_all_forwards_first() -> None:
    """GPipe: every forward of a rank before any backward."""
    row = pipeline_order("gpipe", 2, 3)[1]
    assert [str(a) for a in row] == ["1F0", "1F1", "1F2", "1B0", "1B1", "1B2"]


def test_no_pipeline_alternates_forward_and_backward() -> None:
    """Gradient accumulation without a pipeline keeps one micro-batch of activations: F0 B0 F1 B1."""
    assert [str(a) for a in pipeline_order("none", 1, 2)[0]] == ["0F0", "0B0", "0F1", "0B1"]


def test_zb_h1_defers_rank_r_first_r_weight_passes() -> None:
    """ZB-H1 (Qi et al. 2023): the last rank runs no W until it has done pp-1 input-grad passes."""
    row = [str(a) for a in pipeline_order("zb-h1", 3, 4)[2]]
    assert row[:6] == ["2F0", "2I0", "2F1", "2I1", "2F2", "2I2"]
    assert row[6] == "2W0"
    assert [str(a) for a in pipeline_order("zb-h1", 3, 4)[0]][3:6] == ["0I0", "0W0", "0F3"]


@pytest.mark.parametrize(
    ("schedule", "pp", "vpp", "expected"),
    [
        ("interleaved-1f1b", 4, 2, [0, 1, 2, 3, 0, 1, 2, 3]),
        ("zbv", 3, 2, [0, 1, 2, 2, 1, 0]),
        ("1f1b", 3, 1, [0, 1, 2]),
    ],
)
def test_stage_to_rank_interleaves_or_folds_into_a_v(schedule: str, pp: int, vpp: int, expected: list[int]) -> None:
    """Interleaved: stage s on rank s % pp; zbv: chunk 0 down the ranks, chunk 1 back up."""
    assert [stage_to_rank(s, pp, vpp, schedule) for s in range(len(expected))] == expected
    for rank in range(pp):
        assert all(expected[s] == rank for s in rank_stages(rank, pp, vpp, schedule))


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("interleaved-1f1b", 4, 9, 2), r"m = 9 in max\(1, m // pp\) = 2 rounds .*; use m = 8 or 10$"),
        (("interleaved-zb", 2, 5, 2), r"2 does not divide 5; use m = 4 or 6$"),
        (("interleaved-zb", 2, 4, 1), r"needs vpp >= 2 .* or use 'zb-h1'"),
        (("dualpipev", 2, 3, 2), r"at least 2 \* pp = 4 .* got m = 3"),
        (("dualpipev", 2, 4, 3), "exactly 2 model chunks"),
        (("interleaved-1f1b", 2, 4, 1), "needs vpp >= 2"),
        (("zbv", 2, 4, 3), "exactly 2 model chunks"),
        (("1f1b", 2, 4, 2), r"vpp = 2 \(virtual stages\) only applies to"),
        (("none", 2, 4, 1), "pp = 2"),
        (("pipedream", 2, 4, 1), "unknown"),
        (("1f1b", 0, 4, 1), "pp = 0 must be a positive integer"),
        (("gpipe", 2, 0, 1), "micro-batch count = 0"),
    ],
)
def test_schedule_rules_name_the_problem_and_the_fix(args: tuple[str, int, int, int], match: str) -> None:
    """Each rule raises a ScheduleError that says what is wrong and how to fix it."""
    with pytest.raises(ScheduleError, match=match):
        check_schedule(*args)
    with pytest.raises(ScheduleError, match=match):
        pipeline_order(*args)


def test_stage_outside_the_pipeline_is_an_error() -> None:
    """Asking for a stage or rank that does not exist names the valid range."""
    with pytest.raises(ScheduleError, match=r"outside 0\.\.3"):
        stage_to_rank(4, 2, 2, "zbv")
    with pytest.raises(ScheduleError, match=r"outside 0\.\.1"):
        rank_stages(2, 2, 1, "1f1b")


def test_action_text_is_torch_grammar() -> None:
    """Orders use the IR's pipeline Action, printed as torch writes it."""
    assert str(pipeline_order("zb-h1", 2, 1)[1][1]) == "1I0"
    assert isinstance(pipeline_order("gpipe", 1, 1)[0][0], Action)
