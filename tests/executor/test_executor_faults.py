"""Executor faults end in bounded time with one line naming the rank and the cause (gloo, issue 19):
a killed launcher leaves no orphaned ranks; a torchrun-style launch on a taken port fails on every rank;
bad flags and program files are refused before any rank is spawned."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from executor import runner
from executor.cli import main
from executor.launch import free_port
from simgrid.ir.jsonio import program_to_dict
from simgrid.layout import Layout
from simgrid.model import get_model
from simgrid.schedules import build_program

REPO = Path(__file__).resolve().parents[2]


def _children(pid: int) -> list[int]:
    """Live (non-zombie) processes whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if fields[0] != "Z" and int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process table from /proc (Linux)")
def test_killing_the_launcher_ends_every_rank_with_one_line() -> None:
    """SIGKILL of `simgrid-exec run` (a long run on 2 ranks): both ranks notice, print one line naming
    themselves and the dead launcher, and exit within seconds; none is left running."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "executor.cli", "run", "--model", "tiny-gpt", "--dp", "2", "--gbs", "2",
         "--steps", "1000000", "--timeout", "150"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    ranks: list[int] = []
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and len(ranks) < 2:
            ranks = [c for c in _children(proc.pid) if "spawn_main" in _cmdline(c)]  # not the resource tracker
            time.sleep(0.2)
        assert len(ranks) == 2, "the launcher did not start its two ranks"
        time.sleep(3.0)  # both ranks received their start-up data
        killed_at = time.monotonic()
        os.kill(proc.pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=60)  # EOF once every rank has closed the inherited stderr
        while any(_alive(r) for r in ranks) and time.monotonic() - killed_at < 60:
            time.sleep(0.2)
        assert not any(_alive(r) for r in ranks)
        assert time.monotonic() - killed_at < 60
    finally:
        for pid in [proc.pid, *ranks]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
    lines = [line for line in err.splitlines() if line.strip()]
    for rank in (0, 1):
        assert sum(f"error: rank {rank}: the launching process (pid {proc.pid}) died" in line for line in lines) == 1, err
    assert "Traceback" not in err


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_torchrun_style_launch_on_a_taken_port_fails_on_every_rank_in_bounded_time() -> None:
    """MASTER_PORT held by another program: rank 0 cannot host the rendezvous and says so at once; rank 1
    gives up after the rendezvous timeout (--timeout 5 here) instead of waiting; one line each, exit 2."""
    port = free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2"}
        start = time.monotonic()
        procs = [subprocess.Popen([sys.executable, "-m", "executor.cli", "run", "--model", "tiny-gpt", "--dp", "2",
                                   "--gbs", "2", "--timeout", "5"], cwd=REPO, env={**env, "RANK": str(rank)},
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                 for rank in (0, 1)]
        try:
            errors = [p.communicate(timeout=120)[1] for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        elapsed = time.monotonic() - start
    assert [p.returncode for p in procs] == [2, 2]
    assert elapsed < 60
    lines = [[line for line in err.splitlines() if line.strip()] for err in errors]
    assert len(lines[0]) == 1 and "rank 0: cannot host the rendezvous on 127.0.0.1" in lines[0][0]
    assert len(lines[1]) == 1 and "rank 1: no rendezvous at 127.0.0.1" in lines[1][0]
    assert "within 5 s" in lines[1][0]


@pytest.fixture
def no_spawn(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if any rank process would be started."""
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a rank was spawned for an input that should have been refused first")

    monkeypatch.setattr(runner, "spawn_world", refuse)


def _program_text(mutate: str = "") -> str:
    data = program_to_dict(build_program(get_model("tiny-gpt"), Layout(pp=2, global_batch_size=2)))
    text = json.dumps(data)
    if mutate == "bytes":
        send = next(line for line in data["ranks"][0] if line.startswith("SEND"))
        size = send.split("bytes=")[1].split()[0]
        text = text.replace(f"bytes={size} key=0>1", f"bytes={10**40} key=0>1")
    elif mutate == "digits":
        text = text.replace('"version": 1', '"version": ' + "1" * 5000)
    elif mutate == "nesting":
        text = "[" * 100_000 + "]" * 100_000
    return text


@pytest.mark.torch
@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        ("bytes", r"bytes='10{40}' is not valid; expected an integer within"),
        ("digits", r"an integer has more than 4,300 digits"),
        ("nesting", r"nested too deeply to read"),
    ],
)
def test_bad_program_files_are_refused_before_launch(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    no_spawn: None, mutate: str, match: str) -> None:
    """A program file with 10^40-byte transfers, a 5,000-digit integer or deep nesting: exit 2, one line."""
    path = tmp_path / "p.json"
    path.write_text(_program_text(mutate))
    assert main(["run", "--program", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert re.search(match, err), err


@pytest.mark.torch
@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_timeouts_that_are_not_positive_and_finite_are_refused(capsys: pytest.CaptureFixture[str], no_spawn: None,
                                                              value: str) -> None:
    """--timeout 0, -1, nan and inf are argparse errors (exit 2) naming the value; nothing is spawned."""
    with pytest.raises(SystemExit) as exc:
        main(["run", "--timeout", value])
    assert exc.value.code == 2
    assert f"'{value}' must be a positive finite number" in capsys.readouterr().err


@pytest.mark.torch
def test_unsupported_optimizer_is_refused_before_launch(capsys: pytest.CaptureFixture[str], no_spawn: None) -> None:
    """--optimizer adam-8bit (simulated only): one line before any rank starts, no traceback."""
    assert main(["run", "--optimizer", "adam-8bit"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("simgrid-exec: error: executor: optimizer = 'adam-8bit' is not supported for real runs; use "
                   "'adam' or 'sgd' (8-bit Adam is simulated only)")


@pytest.mark.torch
def test_trace_into_a_missing_directory_is_refused_before_launch(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                 no_spawn: None) -> None:
    """--trace missing/t.json fails before the run, not after it."""
    assert main(["run", "--trace", str(tmp_path / "missing" / "t.json")]) == 2
    assert "does not exist; create it first" in capsys.readouterr().err
