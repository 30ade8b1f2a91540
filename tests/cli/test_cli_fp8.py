"""``--fp8 none|delayed|current``: the flag reaches the simulated layout, a bad value or a GPU without fp8
tensor cores is one line and exit 2."""

from __future__ import annotations

import json

import pytest

from simgrid.cli.main import main

SIMULATE = ["simulate", "--model", "tiny-gpt", "--cluster", "dgx-h100-ndr", "--gpus", "2", "--mbs", "2",
            "--gbs", "4", "--schedule", "none", "--json"]


def test_fp8_flag_reaches_the_layout(capsys: pytest.CaptureFixture[str]) -> None:
    for recipe in ("none", "delayed", "current"):
        assert main([*SIMULATE, "--fp8", recipe]) in (0, None)
        assert json.loads(capsys.readouterr().out)["layout"]["fp8_recipe"] == recipe


def test_bad_fp8_value_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SIMULATE[:-1], "--fp8", "e4m3"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "fp8_recipe = 'e4m3' is not one of none, delayed, current" in lines[0]


def test_fp8_on_a_gpu_without_fp8_peak_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    args = [*SIMULATE[:-1], "--fp8", "delayed"]
    args[args.index("dgx-h100-ndr")] = "dgx-a100-hdr"
    assert main(args) == 2
    lines = [line for line in capsys.readouterr().err.strip().splitlines() if "error" in line]
    assert len(lines) == 1 and "GPU 'a100-80gb-sxm' has no fp8 peak rate" in lines[0] and "--fp8 none" in lines[0]
