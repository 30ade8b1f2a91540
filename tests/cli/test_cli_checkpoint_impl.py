"""``--checkpoint-impl reentrant|non-reentrant|non-reentrant-modules``: the flag reaches the simulated layout (a
non-reentrant full recompute reruns less, so the step is shorter) and a bad value is one line, exit 2."""

from __future__ import annotations

import json

import pytest

from simgrid.cli.main import main

SIMULATE = ["simulate", "--model", "tiny-gpt", "--cluster", "dgx-h100-ndr", "--gpus", "2", "--mbs", "2",
            "--gbs", "4", "--recompute", "full", "--schedule", "none", "--json"]


def _step_s(capsys: pytest.CaptureFixture[str], extra: list[str]) -> float:
    assert main(SIMULATE + extra) in (0, None)
    return float(json.loads(capsys.readouterr().out)["step_time_s"])


def test_non_reentrant_checkpoints_shorten_the_step(capsys: pytest.CaptureFixture[str]) -> None:
    """Reentrant is the default; non-reentrant skips w2 and the residual add in each recompute, and the
    per-module wrapping also the norms and the attention's output projection."""
    default = _step_s(capsys, [])
    assert _step_s(capsys, ["--checkpoint-impl", "reentrant"]) == default
    block = _step_s(capsys, ["--checkpoint-impl", "non-reentrant"])
    modules = _step_s(capsys, ["--checkpoint-impl", "non-reentrant-modules"])
    assert modules < block < default


def test_bad_checkpoint_impl_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown implementation exits 2 with the layout's one-line message (field, value, choices)."""
    assert main([*SIMULATE[:-1], "--checkpoint-impl", "sometimes"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    assert "checkpoint_impl = 'sometimes' is not one of reentrant, non-reentrant, non-reentrant-modules" in lines[0]
