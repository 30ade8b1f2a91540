"""simgrid.trace: rows, DataFrame and Chrome-trace export, JSON save/load, building from measurements."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from engine_helpers import UniformCost, fwd, recv, send

from simgrid.engine import simulate_program
from simgrid.ir import Program, Wait, format_op
from simgrid.trace import COLUMNS, Trace, TraceError, TraceRow, row_for_op


def _two_stage_trace() -> Trace:
    r0 = [fwd(1e12), send(1, 10**9, "s"), Wait(handle="s")]
    r1 = [recv(0, 10**9, "r"), Wait(handle="r"), fwd(1e12, stage=1)]
    return simulate_program(Program(ranks=[r0, r1]), cost_model=UniformCost(), mode="full").trace


def test_dataframe_has_one_row_per_trace_row_and_every_column() -> None:
    """to_dataframe keeps every column plus duration_s; op text is format_op's."""
    trace = _two_stage_trace()
    df = trace.to_dataframe()
    assert list(df.columns) == [*COLUMNS, "duration_s"]
    assert len(df) == len(trace) == 6  # F, SEND, WAIT on rank 0; RECV, WAIT, F on rank 1
    f_row = df[(df["rank"] == 1) & (df["kind"] == "F")].iloc[0]
    assert f_row["op"] == format_op(fwd(1e12, stage=1))
    assert (f_row["start_s"], f_row["end_s"], f_row["duration_s"]) == (2.0, 3.0, 1.0)


def test_chrome_trace_has_named_processes_threads_events_and_flow_arrows(tmp_path: Path) -> None:
    """pid = rank, tid = stream with name metadata, X events in microseconds, s/f arrow SEND -> RECV."""
    out = tmp_path / "t.json"
    doc = _two_stage_trace().to_chrome_trace(out)
    assert json.loads(out.read_text()) == json.loads(json.dumps(doc))
    events = doc["traceEvents"]
    names = {(e["pid"], e["args"]["name"]) for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {(0, "rank 0"), (1, "rank 1")}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert threads[(0, 0)] == "compute" and "p2p:1" in threads.values()
    send_event = next(e for e in events if e["ph"] == "X" and e["pid"] == 0 and e["name"].startswith("SEND"))
    assert (send_event["ts"], send_event["dur"]) == pytest.approx((1e6, 1e6))
    assert threads[(0, send_event["tid"])] == "p2p:1"
    start = [e for e in events if e["ph"] == "s"]
    finish = [e for e in events if e["ph"] == "f"]
    assert len(start) == len(finish) == 1 and start[0]["id"] == finish[0]["id"]
    assert (start[0]["pid"], finish[0]["pid"]) == (0, 1)


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    """A saved trace loads back with equal rows and metadata."""
    trace = _two_stage_trace()
    loaded = Trace.load(trace.save(tmp_path / "trace.json"))
    assert loaded.rows == trace.rows
    assert loaded.meta == trace.meta
    assert loaded.multiplicity(0) == 1


def test_from_dataframe_round_trip() -> None:
    """A DataFrame made by to_dataframe builds an equal trace (duration_s is ignored)."""
    trace = _two_stage_trace()
    assert Trace.from_dataframe(trace.to_dataframe()).rows == trace.rows


def test_executor_builds_rows_from_measured_times() -> None:
    """row_for_op fills the descriptive columns from the IR op; from_rows accepts rows, tuples, dicts."""
    op = send(3, 4096, "h", src=1, dst=2, mb=5)
    row = row_for_op(2, op, 0.5, 0.75)
    assert row == TraceRow(2, "p2p:3", format_op(op), "SEND", "pp", 0.5, 0.75, 4096, 0.0, 1, 5, "2>3:1>2:F:5")
    trace = Trace.from_rows([row, tuple(row), row._asdict(), (0, "compute", "F", "F", "compute", 0, 1)])
    assert trace.rows[:3] == [row, row, row]
    assert trace.rows[3] == TraceRow(0, "compute", "F", "F", "compute", 0.0, 1.0)


@pytest.mark.parametrize(("rows", "match"), [
    ([{"rank": 0}], r"trace row 0: missing field\(s\) \['stream'"),
    ([(0, "compute")], "trace row 0: has 2 values; give 7 to 13"),
    ([(0, "compute", "F", "F", "compute", "soon", 1.0)], "trace row 0: could not convert string to float"),
])
def test_bad_rows_are_rejected_with_the_row_index(rows: list[object], match: str) -> None:
    """from_rows names the offending row and what is wrong."""
    with pytest.raises(TraceError, match=match):
        Trace.from_rows(rows)  # type: ignore[arg-type]


def test_loading_a_non_trace_file_is_a_clear_error(tmp_path: Path) -> None:
    """A JSON file without the trace format marker is refused with the path in the message."""
    path = tmp_path / "other.json"
    path.write_text('{"hello": 1}')
    with pytest.raises(TraceError, match="is not a simgrid trace"):
        Trace.load(path)
    with pytest.raises(TraceError, match="cannot be read as JSON"):
        Trace.load(tmp_path / "missing.json")
