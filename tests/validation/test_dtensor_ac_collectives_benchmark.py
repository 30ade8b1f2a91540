"""benchmarks/dtensor_ac_collectives.py, the evidence behind ``tensor_parallel.dtensor_full_recompute_drops``:
run for real (torch, CPU, fake process group, in its own process), it still prints what torch issues for a
torchtitan-plan Llama block: 8 tensor-parallel collectives without a checkpoint, 11 under the full
checkpoint (not Megatron's 14), eager and compiled alike, and a recompute that reruns 6 of the 7 matrix
multiplies (w2's is never rerun: the checkpoint stops early)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "dtensor_ac_collectives.py"


def test_torch_issues_eleven_tp_collectives_per_block_under_full_checkpointing() -> None:
    run = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = {}
    for line in run.stdout.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 6 and cells[0] in ("eager", "torch.compile"):
            rows[cells[0], cells[1]] = (int(cells[4]), cells[5])
    assert rows == {
        ("eager", "none"): (8, "-"),
        ("eager", "full"): (11, "6 / 7"),
        ("torch.compile", "none"): (8, "-"),
        ("torch.compile", "full"): (11, "6 / 7"),
    }
