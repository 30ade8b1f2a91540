"""benchmarks/gpu_session.sh: its stages fit one device call, and its CPU rehearsal (DRY_RUN=1) writes the
session's files under $OUT with each stage's exit code in the log."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_session.sh"
DEVICE_CALL_LIMIT_S = 600
"""One command's limit on the device machine (/work/.library/device/README.md, Limits)."""


def test_stage_limits_fit_one_device_call() -> None:
    """calibrate + accuracy + numerics limits (plus 10 s of kill grace each) stay under the 10-minute limit."""
    limits = [int(n) for n in re.findall(r"run_stage \w+ (\d+) ", SCRIPT.read_text())]
    assert len(limits) == 3 and sum(limits) + 3 * 10 < DEVICE_CALL_LIMIT_S


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None, reason="needs bash and timeout")
def test_cpu_rehearsal_writes_the_session_files(tmp_path: Path) -> None:
    """DRY_RUN=1 on one small case: env.txt, accuracy.txt/json (the dry run's predictions) and session.log
    with the calibration marked skipped and the accuracy stage's exit 0."""
    env = {**os.environ, "OUT": str(tmp_path), "DRY_RUN": "1", "PYTHON": sys.executable,
           "ACCURACY_ARGS": "--models gpt3-125m --variants sdpa"}
    done = subprocess.run(["bash", str(SCRIPT), "env", "calibrate", "accuracy"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert {p.name for p in tmp_path.iterdir()} == {"env.txt", "accuracy.txt", "accuracy.json", "session.log"}
    log = (tmp_path / "session.log").read_text()
    assert "stage calibrate: skipped" in log and "stage accuracy: exit 0" in log
    assert "torch:" in (tmp_path / "env.txt").read_text()
    assert "gpt3-125m sdpa" in (tmp_path / "accuracy.txt").read_text()
