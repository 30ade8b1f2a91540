"""The interpreter's op semantics on hand-built programs with hand-computed times."""

from __future__ import annotations

import pytest
from engine_helpers import UniformCost, allreduce, fwd, recv, send

from simgrid.engine import simulate_program
from simgrid.errors import SimulationError
from simgrid.ir import Program, Wait
from simgrid.trace import TraceRow

TFLOP = 1e12  # one second of compute on UniformCost's default 1 TFLOP/s


def _rows(res, rank: int, kind: str) -> list[TraceRow]:  # type: ignore[no-untyped-def]
    return sorted((r for r in res.trace.timing_rows if r.rank == rank and r.kind == kind), key=lambda r: r.start_s)


def test_compute_stream_is_serial_and_comm_is_asynchronous() -> None:
    """Two 1 s computes run back to back; an all-reduce issued between them (1 s on 2 ranks of
    S = 1 GB at 1 GB/s: 2 * 1/2 * 1 s) overlaps the second; the WAIT at the end blocks nothing."""
    ops = [fwd(TFLOP), allreduce("g", 10**9, "a"), fwd(TFLOP, mb=1), Wait(handle="a")]
    res = simulate_program(Program(groups={"g": (0, 1)}, ranks=[ops, ops]), cost_model=UniformCost(), mode="full")
    f = _rows(res, 0, "F")
    assert [(r.start_s, r.end_s) for r in f] == [(0.0, 1.0), (1.0, 2.0)]
    ar = _rows(res, 0, "all_reduce")[0]
    assert (ar.start_s, ar.end_s) == (1.0, 2.0)
    assert res.makespan_s == 2.0
    assert _rows(res, 0, "WAIT") == []


def test_wait_blocks_the_compute_stream_until_the_comm_ends() -> None:
    """A WAIT right after issuing a 1 s all-reduce delays the next compute by that second."""
    ops = [allreduce("g", 10**9, "a"), Wait(handle="a"), fwd(TFLOP)]
    res = simulate_program(Program(groups={"g": (0, 1)}, ranks=[ops, ops]), cost_model=UniformCost(), mode="full")
    assert [(r.start_s, r.end_s) for r in _rows(res, 0, "F")] == [(1.0, 2.0)]
    wait = _rows(res, 0, "WAIT")[0]
    assert (wait.start_s, wait.end_s, wait.exposed_s, wait.purpose) == (0.0, 1.0, 1.0, "dp-grad")


def test_collective_starts_when_every_member_has_issued_it() -> None:
    """Rank 1 computes 2 s before its all-reduce: the collective runs 2..3 on both ranks; rank 0's wait
    lasts 0..3 but only the last second is exposed communication."""
    r0 = [allreduce("g", 10**9, "a"), Wait(handle="a")]
    r1 = [fwd(2 * TFLOP), allreduce("g", 10**9, "a"), Wait(handle="a")]
    res = simulate_program(Program(groups={"g": (0, 1)}, ranks=[r0, r1]), cost_model=UniformCost(), mode="full")
    for rank in (0, 1):
        ar = _rows(res, rank, "all_reduce")[0]
        assert (ar.start_s, ar.end_s) == (2.0, 3.0)
    wait = _rows(res, 0, "WAIT")[0]
    assert (wait.start_s, wait.end_s, wait.exposed_s) == (0.0, 3.0, 1.0)


def test_send_and_recv_rendezvous() -> None:
    """A send issued at 0 waits for the receive, issued after 1.5 s of compute; the 1 GB transfer
    (1 GB/s) then runs 1.5..2.5 on both sides."""
    r0 = [send(1, 10**9, "s"), Wait(handle="s")]
    r1 = [fwd(1.5 * TFLOP), recv(0, 10**9, "r"), Wait(handle="r")]
    res = simulate_program(Program(ranks=[r0, r1]), cost_model=UniformCost(), mode="full")
    s, r = _rows(res, 0, "SEND")[0], _rows(res, 1, "RECV")[0]
    assert (s.start_s, s.end_s) == (1.5, 2.5) == (r.start_s, r.end_s)
    assert s.match == r.match != ""


def test_ops_on_one_stream_run_in_issue_order() -> None:
    """Two all-reduces on one group share its stream: the second starts when the first ends."""
    ops = [allreduce("g", 10**9, "a"), allreduce("g", 10**9, "b"), Wait(handle="b")]
    res = simulate_program(Program(groups={"g": (0, 1)}, ranks=[ops, ops]), cost_model=UniformCost(), mode="full")
    assert [(r.start_s, r.end_s) for r in _rows(res, 0, "all_reduce")] == [(0.0, 1.0), (1.0, 2.0)]


def test_comm_waits_for_compute_issued_before_it() -> None:
    """An all-reduce issued after a 1 s compute starts at 1 s, not at issue time."""
    ops = [fwd(TFLOP), allreduce("g", 10**9, "a"), Wait(handle="a")]
    res = simulate_program(Program(groups={"g": (0, 1)}, ranks=[ops, ops]), cost_model=UniformCost(), mode="full")
    assert _rows(res, 0, "all_reduce")[0].start_s == 1.0


def test_compute_slows_only_while_communication_overlaps() -> None:
    """Slowdown s = 0.5 halves the compute rate while a comm runs. A 1 s compute overlapping a 0.5 s
    all-reduce from its start does 0.25 s of work in the first 0.5 s and the remaining 0.75 s at full
    rate: it ends at 1.25 s."""
    ops = [allreduce("g", 10**9 // 2, "a"), fwd(TFLOP), Wait(handle="a")]
    res = simulate_program(Program(groups={"g": (0, 1)}, ranks=[ops, ops]),
                           cost_model=UniformCost(slowdown=0.5), mode="full")
    assert _rows(res, 0, "F")[0].end_s == pytest.approx(1.25, rel=1e-12)


def test_speed_factor_makes_a_straggler() -> None:
    """Rank 1 at half speed takes 2 s for its 1 s compute; the all-reduce after it starts at 2 s."""
    ops = [fwd(TFLOP), allreduce("g", 10**9, "a"), Wait(handle="a")]
    res = simulate_program(Program(groups={"g": (0, 1)}, ranks=[ops, ops]), cost_model=UniformCost(),
                           speed_factors={1: 0.5})
    assert res.mode == "full"
    assert _rows(res, 0, "all_reduce")[0].start_s == 2.0
    assert res.makespan_s == 3.0


@pytest.mark.parametrize(("factors", "match"), [({5: 1.0}, "speed_factors key 5"),
                                                 ({0: 0.0}, r"speed_factors\[0\] = 0.0 must be a positive")])
def test_bad_speed_factors_are_rejected_with_the_value(factors: dict[int, float], match: str) -> None:
    """Speed factors must name existing ranks and be positive and finite."""
    program = Program(ranks=[[fwd(TFLOP)], [fwd(TFLOP)]])
    with pytest.raises(SimulationError, match=match):
        simulate_program(program, cost_model=UniformCost(), speed_factors=factors)


def test_deadlock_is_reported_with_the_blocked_op() -> None:
    """A receive nobody sends to leaves rank 1 blocked; the error names the rank and the op."""
    program = Program(ranks=[[fwd(TFLOP)], [recv(0, 10, "r"), Wait(handle="r")]])
    with pytest.raises(SimulationError, match=r"deadlocked.*rank 1 blocked at WAIT on RECV peer=0"):
        simulate_program(program, cost_model=UniformCost(), mode="full")


def test_wait_on_unknown_handle_is_an_error() -> None:
    """A WAIT naming no earlier async op is a SimulationError naming the handle."""
    with pytest.raises(SimulationError, match="WAIT handle=nope names no earlier"):
        simulate_program(Program(ranks=[[Wait(handle="nope")]]), cost_model=UniformCost())


@pytest.mark.parametrize(("kwargs", "match"), [({"mode": "fastest"}, "mode = 'fastest'"),
                                                ({"comm_model": "packet"}, "comm_model = 'packet'")])
def test_bad_mode_names_are_rejected(kwargs: dict[str, str], match: str) -> None:
    """Unknown mode / comm model names are SimulationErrors listing the choices."""
    with pytest.raises(SimulationError, match=match):
        simulate_program(Program(ranks=[[fwd(TFLOP)]]), cost_model=UniformCost(), **kwargs)  # type: ignore[arg-type]


def test_trace_op_text_is_the_ir_text() -> None:
    """Trace rows carry format_op text once read (rendered lazily)."""
    from simgrid.ir import format_op

    op = fwd(TFLOP)
    res = simulate_program(Program(ranks=[[op]]), cost_model=UniformCost())
    assert [r.op for r in res.trace.rows] == [format_op(op)]


def test_host_transfers_do_not_slow_compute() -> None:
    """A d2h copy (copy engines, not SMs) overlapping a 1 s compute leaves it at 1 s even with s = 0.5;
    it runs on its own pcie stream: 1 GB at 1 GB/s from 0 to 1 s."""
    from simgrid.ir import Transfer

    ops = [Transfer(direction="d2h", bytes=10**9, handle="x"), fwd(TFLOP), Wait(handle="x")]
    res = simulate_program(Program(ranks=[ops]), cost_model=UniformCost(slowdown=0.5))
    assert _rows(res, 0, "F")[0].end_s == 1.0
    copy = _rows(res, 0, "d2h")[0]
    assert (copy.stream, copy.start_s, copy.end_s, copy.purpose) == ("pcie:d2h", 0.0, 1.0, "offload")
