"""`simgrid plot` inputs: sweep CSVs and traces with text, NaN or huge values where numbers belong (issue 19)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from simgrid.cli.main import main

HEADER = "dp,tp,pp,vpp,zero,mbs,schedule,recompute,step_time_s,tokens_per_s,mfu,peak_memory_bytes,fits"
ROWS = ["8,1,1,1,0,1,none,none,1.0,16000,0.40,17179869184,True",
        "4,2,1,1,0,1,none,none,1.1,15000,0.38,17179869185,True",
        "2,2,2,1,0,1,1f1b,none,1.2,14000,0.36,17179869186,True"]


def _csv(tmp_path: Path, column: str | None = None, value: str = "") -> Path:
    rows = [r.split(",") for r in ROWS]
    if column is not None:
        rows[1][HEADER.split(",").index(column)] = value
    path = tmp_path / "s.csv"
    path.write_text("\n".join([HEADER] + [",".join(r) for r in rows]) + "\n")
    return path


def _plot(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["plot", *args])
    return code, capsys.readouterr().err.strip()


@pytest.mark.parametrize(
    ("kind", "column", "value", "message"),
    [
        ("ranking", "step_time_s", "fast", r"column 'step_time_s' must hold finite numbers up to 1e\+30; row 2 has 'fast'"),
        ("ranking", "step_time_s", "NaN", r"column 'step_time_s' must hold finite numbers up to 1e\+30; row 2 has nan"),
        ("heatmap", "tokens_per_s", "inf", r"column 'tokens_per_s' must hold finite numbers up to 1e\+30; row 2 has inf"),
        ("heatmap", "tp", "1.5", r"column 'tp' must hold integers >= 1; row 2 has 1\.5"),
        ("ranking", "mfu", "9" * 5000, r"column 'mfu' must hold finite numbers up to 1e\+30; row 2 has inf"),
        ("ranking", "fits", "maybe", r"column 'fits' must hold True or False, found 'maybe'"),
        ("ranking", "schedule", "warp", r"column 'schedule' holds 'warp'; expected one of none, gpipe"),
    ],
)
def test_bad_sweep_cells_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str,
                                             column: str, value: str, message: str) -> None:
    """Text, NaN, inf, fractions, 5,000-digit numbers, non-booleans and unknown names name column and row."""
    code, err = _plot(capsys, str(_csv(tmp_path, column, value)), "--kind", kind, "--out", str(tmp_path / "o.png"))
    assert code == 2 and "\n" not in err
    assert re.search(message, err), err
    assert not (tmp_path / "o.png").exists()


def test_heatmap_of_a_text_column_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--metric schedule (not a number) says so instead of failing inside pandas."""
    code, err = _plot(capsys, str(_csv(tmp_path)), "--kind", "heatmap", "--metric", "schedule", "--out",
                      str(tmp_path / "h.png"))
    assert code == 2
    assert "metric 'schedule' is not a numeric column; use e.g. tokens_per_s" in err


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t["traceEvents"].__setitem__(0, {**t["traceEvents"][0], "pid": 10**40, "ph": "X", "ts": 0}),
         r"rank 10{40} is not a rank number|lacks a numeric pid"),
        (lambda t: t["traceEvents"].__setitem__(0, {"ph": "X", "pid": 0, "ts": 0, "dur": 1, "args": {"bytes": [1]}}),
         r"lacks a numeric pid, ts or dur, or its name, tid or args have the wrong type"),
        (lambda t: t["traceEvents"].__setitem__(0, {"ph": "X", "pid": 0, "ts": 0, "dur": 1, "tid": [1]}),
         r"or its name, tid or args have the wrong type"),
    ],
)
def test_chrome_traces_with_wrongly_typed_events(tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: object,
                                                 message: str) -> None:
    """Huge pids, lists where numbers or names belong: one line, no traceback."""
    trace = {"traceEvents": [{"ph": "X", "pid": 0, "tid": 0, "ts": 0.0, "dur": 5.0, "name": "0F0", "cat": "compute"}]}
    edit(trace)  # type: ignore[operator]
    path = tmp_path / "t.json"
    path.write_text(json.dumps(trace))
    code, err = _plot(capsys, str(path), "--out", str(tmp_path / "o.png"))
    assert code == 2 and re.search(message, err), err


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('{"traceEvents": [{"ph": "X", "pid": ' + "9" * 5000 + ', "ts": 0, "dur": 1}]}', "more than 4,300 digits"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply to read"),
        ('{"format": "simgrid-trace", "version": 1, "columns": ["rank"], "rows": [[0]], '
         '"meta": {"multiplicity": {"0": "many"}}}', "meta.multiplicity must map ranks"),
        ('{"format": "simgrid-trace", "version": 1, "columns": ["rank", "oops"], "rows": []}', "'columns' must list"),
    ],
)
def test_trace_files_that_cannot_be_read(tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str,
                                         message: str) -> None:
    """Huge integers, deep nesting, a text multiplicity, unknown columns: one line each."""
    path = tmp_path / "t.json"
    path.write_text(body)
    code, err = _plot(capsys, str(path), "--out", str(tmp_path / "o.png"))
    assert code == 2 and message in err, err


def test_fifo_input_and_missing_output_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A FIFO as the input does not block; an --out into a missing folder fails before reading anything."""
    os.mkfifo(tmp_path / "s.csv")
    code, err = _plot(capsys, str(tmp_path / "s.csv"), "--out", str(tmp_path / "o.png"))
    assert code == 2 and "is not a regular file" in err
    (tmp_path / "good").mkdir()
    code, err = _plot(capsys, str(_csv(tmp_path / "good")), "--out", str(tmp_path / "no" / "o.png"))
    assert code == 2 and "does not exist; create it first" in err
