"""The CLI under bad input (issue 19): outputs checked before work and written atomically, sizes bounded,
inconsistent sweep pins explained, strict JSON, and one line (exit 2) for every mistake."""

from __future__ import annotations

import json
import math
import os
import re
import time
from pathlib import Path

import pytest

from simgrid.cli.common import print_json
from simgrid.cli.main import main
from simgrid.errors import SimgridError

SIM = ["simulate", "--model", "tiny-gpt", "--cluster", "dgx-a100-hdr", "--gpus", "2"]


def _error(capsys: pytest.CaptureFixture[str]) -> str:
    """The one error line on stderr (progress and warning lines aside)."""
    lines = [ln for ln in capsys.readouterr().err.splitlines()
             if ln.strip() and not ln.startswith(("simulating ", "simulated ", "simgrid: warning:"))]
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize(
    ("outputs", "message"),
    [
        (["--trace", "t.json", "--gantt", "missing/g.png"], r"--gantt missing/g\.png: directory missing does not exist"),
        (["--gantt", "g.png", "--trace", "missing/t.json"], r"--trace missing/t\.json: directory missing does not"),
        (["--trace", "t.json", "--gantt", "g.txt"], r"--gantt g\.txt: the suffix '\.txt' is not supported"),
        (["--trace", "same.png", "--gantt", "same.png"], r"--gantt and --trace both name same\.png"),
    ],
)
def test_one_bad_output_path_writes_nothing_and_simulates_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], outputs: list[str],
        message: str) -> None:
    """`--trace ok --gantt <missing dir>`: exit 2 before simulating, and the good trace is not written either."""
    monkeypatch.chdir(tmp_path)
    assert main([*SIM, *outputs]) == 2
    err = capsys.readouterr().err
    assert "simulating" not in err
    assert len([ln for ln in err.splitlines() if "error" in ln]) == 1
    assert re.search(message, err), err
    assert os.listdir(tmp_path) == []


def test_both_outputs_are_written_with_no_temporary_left(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The good case: trace and Gantt chart appear, and nothing else."""
    monkeypatch.chdir(tmp_path)
    assert main([*SIM, "--trace", "t.json", "--gantt", "g.png"]) == 0
    assert sorted(os.listdir(tmp_path)) == ["g.png", "t.json"]
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]


def test_json_output_refuses_non_finite_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    """Infinity or NaN in a result is an error naming the key, never the non-JSON token `Infinity`."""
    with pytest.raises(SimgridError, match=r"the result has exposed_comm_s\.tp = inf, which JSON cannot hold"):
        print_json({"step_time_s": 1.0, "exposed_comm_s": {"tp": math.inf}})
    assert capsys.readouterr().out == ""


def test_simulate_json_is_strict_json(capsys: pytest.CaptureFixture[str]) -> None:
    """A normal --json result parses with NaN and Infinity forbidden."""
    assert main([*SIM, "--json"]) == 0

    def refuse(token: str) -> None:
        raise AssertionError(token)

    data = json.loads(capsys.readouterr().out, parse_constant=refuse)
    assert math.isfinite(data["step_time_s"]) and 0 <= data["mfu"] <= 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["simulate", "--model", "gpt3-175b", "--cluster", "dgx-a100-hdr", "--gpus", str(10**12)],
         r"needs 1e\+12 GPUs; the limit is 131,072"),
        (["simulate", "--model", "tiny-gpt", "--cluster", "dgx-a100-hdr", "--dp", str(10**12), "--gbs", str(10**12)],
         r"needs 1e\+12 GPUs; the limit is 131,072"),
        (["simulate", "--model", "tiny-gpt", "--cluster", "dgx-a100-hdr", "--gbs", str(10**12)],
         r"1e\+12 micro-batches x 1 ranks.*the limit is 20,000,000 ops"),
        (["simulate", "--params", "1e30", "--cluster", "dgx-a100-hdr", "--gpus", "8"],
         r"--params = 1e\+30 is above the largest model"),
        (["memory", "--model", "llama2-7b", "--gpu", "rtx-4090", "--max-gpus", str(10**12)],
         r"--max-gpus 1000000000000 needs 1e\+12 GPUs"),
        (["schedule", "--schedule", "1f1b", "--pp", "2", "--microbatches", str(10**12)],
         r"about 6e\+12 actions; the limit is 20,000,000"),
        (["program", "--model", "gpt3-175b", "--tp", "8", "--pp", "8", "--dp", "4096", "--gbs", "4096", "--out", "p.json"],
         r"needs 262,144 GPUs"),
        (["simulate", "--model", "tiny-gpt", "--cluster", "/", "--gpus", "2"], r"/ is a directory, not a cluster"),
    ],
)
def test_oversized_requests_are_refused_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str], argv: list[str],
                                                message: str) -> None:
    """The issue's runs that never finished (--gpus 10^12, --dp/--gbs 10^12, --params 1e30) end in < 2 s."""
    monkeypatch.chdir(tmp_path)
    start = time.monotonic()
    assert main(argv) == 2
    assert time.monotonic() - start < 2.0
    assert re.search(message, _error(capsys))


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--gpus", "8", "--tp", "3"], r"--tp 3: no value divides --gpus 8 \(e\.g\. 1, 2, 4, 8\); pin one"),
        (["--gpus", "6", "--tp", "3,6"], r"--tp 3,6: no value divides tiny-gpt's 4 attention heads"),
        (["--gpus", "8", "--dp", "4", "--pp", "4"], r"--dp 4 --pp 4: no combination divides --gpus 8"),
        (["--gpus", "8", "--pp", "8"], r"--pp 8: no value is at most tiny-gpt's 4 layers"),
        (["--gpus", "8", "--cp", "3"], r"--cp 3: no value divides --gpus 8"),
        (["--gpus", "8", "--dp", "2", "--gbs", "3"], r"--dp 2: no value divides --gbs 3"),
        (["--gpus", "8", "--gbs", str(10**12)], r"at least 15,625,000,000 micro-batches per pipeline"),
    ],
)
def test_sweep_pins_that_leave_no_layout_say_why(capsys: pytest.CaptureFixture[str], flags: list[str],
                                                  message: str) -> None:
    """Instead of 'no layout could be simulated' (exit 1), one line naming the pin and the rule (exit 2)."""
    argv = ["sweep", "--model", "tiny-gpt", "--cluster", "dgx-a100-hdr", "--workers", "1", "--no-progress"]
    if "--gbs" not in flags:
        flags = [*flags, "--gbs", "8"]
    assert main([*argv, *flags]) == 2
    assert re.search(message, _error(capsys))


def test_profiles_skips_a_fifo_on_the_search_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A FIFO named x.toml used to block `simgrid profiles` forever: now one warning line and the list."""
    os.mkfifo(tmp_path / "x.toml")
    monkeypatch.setenv("SIMGRID_PROFILE_PATH", str(tmp_path))
    start = time.monotonic()
    assert main(["profiles"]) == 0
    assert time.monotonic() - start < 5.0
    captured = capsys.readouterr()
    assert "dgx-a100-hdr" in captured.out
    assert captured.err.count("simgrid: warning: skipping") == 1 and "x.toml" in captured.err


def test_demo_into_a_missing_parent_creates_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """demo --out missing/out: the folder is created, never its parents; a typo is one line, nothing written."""
    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--out", "missing/out"]) == 2
    assert "directory missing does not exist" in _error(capsys)
    assert os.listdir(tmp_path) == []
