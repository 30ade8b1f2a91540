"""``--optimizer-impl``: the flag reaches the layout and the step time; a bad value is one line, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from simgrid.cli.main import main

_ARGS = ["simulate", "--model", "tiny-gpt", "--cluster", "dgx-a100-hdr", "--gpus", "2", "--zero", "3",
         "--zero-impl", "fsdp2", "--json"]


def _step_s(capsys: pytest.CaptureFixture[str], *extra: str) -> float:
    assert main([*_ARGS, *extra]) in (0, None)
    return float(json.loads(capsys.readouterr().out)["step_time_s"])


def test_foreach_lengthens_the_fsdp2_step(capsys: pytest.CaptureFixture[str]) -> None:
    """tiny-gpt on FSDP2: the foreach step's host time (68 tensors x 0.40 ms) shows in the step time."""
    fused = _step_s(capsys)
    foreach = _step_s(capsys, "--optimizer-impl", "foreach")
    assert foreach > fused + 0.02


def test_bad_optimizer_impl_is_one_line_and_exit_2() -> None:
    """An unknown implementation exits 2 with one stderr line naming the field, value and choices."""
    run = subprocess.run([sys.executable, "-m", "simgrid", *_ARGS[:-1], "--optimizer-impl", "apex"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "optimizer_impl = 'apex' is not one of fused, foreach" in lines[0]
