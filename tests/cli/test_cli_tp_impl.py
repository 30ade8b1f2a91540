"""``--tp-impl megatron|dtensor``: the flag reaches the simulated layout (DTensor's copies lengthen a
sequence-parallel step) and a bad value is one line, exit 2."""

from __future__ import annotations

import json

import pytest

from simgrid.cli.main import main

SIMULATE = ["simulate", "--model", "tiny-gpt", "--cluster", "dgx-h100-ndr", "--gpus", "2", "--tp", "2",
            "--mbs", "2", "--gbs", "4", "--sequence-parallel", "--schedule", "none", "--json"]


def _step_s(capsys: pytest.CaptureFixture[str], extra: list[str]) -> float:
    assert main(SIMULATE + extra) in (0, None)
    return float(json.loads(capsys.readouterr().out)["step_time_s"])


def test_dtensor_copies_lengthen_the_step(capsys: pytest.CaptureFixture[str]) -> None:
    """The default is Megatron's layout; dtensor adds memory-bound copies on the compute stream."""
    default = _step_s(capsys, [])
    assert _step_s(capsys, ["--tp-impl", "megatron"]) == default
    assert _step_s(capsys, ["--tp-impl", "dtensor"]) > default


def test_bad_tp_impl_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown implementation exits 2 with the layout's one-line message (field, value, choices)."""
    assert main([*SIMULATE[:-1], "--tp-impl", "nemo"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    assert "tp_impl = 'nemo' is not one of megatron, dtensor" in lines[0]
