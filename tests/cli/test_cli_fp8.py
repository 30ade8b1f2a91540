"""``--fp8 none|delayed|current``: the flag reaches the simulated layout; a bad value, a GPU without fp8 tensor
cores (simulate, memory, sweep) is one line and exit 2, with nothing written; fp8 on a MoE model is accepted."""

from __future__ import annotations

import json
import pathlib

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


def _one_error_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line]
    assert len(lines) == 1 and "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize("hardware", [["--cluster", "dgx-a100-hdr"], ["--gpu", "a100-80gb-sxm"]])
def test_memory_refuses_fp8_on_a_gpu_without_fp8_peak(capsys: pytest.CaptureFixture[str], hardware: list[str]) -> None:
    """`simgrid memory --fp8` used to print an estimate and suggestions for an A100; now the simulate error."""
    assert main(["memory", "--model", "tiny-gpt", "--gpus", "2", "--fp8", "delayed", *hardware]) == 2
    out, err = capsys.readouterr()
    line = _one_error_line(err)
    assert out == "" and line.startswith("simgrid memory: error: layout: fp8_recipe = 'delayed' needs fp8 tensor cores")
    assert "GPU 'a100-80gb-sxm' has no fp8 peak rate" in line and "--fp8 none" in line


def test_sweep_refuses_fp8_on_a_gpu_without_fp8_peak_and_writes_nothing(
        capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path) -> None:
    out_csv = tmp_path / "sweep.csv"
    assert main(["sweep", "--model", "tiny-gpt", "--cluster", "dgx-a100-hdr", "--gpus", "2", "--gbs", "4",
                 "--fp8", "current", "--no-progress", "--workers", "1", "--out", str(out_csv)]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "simgrid sweep: error:" in line and "GPU 'a100-80gb-sxm' has no fp8 peak rate" in line
    assert not out_csv.exists()


@pytest.mark.parametrize("command", [
    ["memory", "--model", "tiny-moe", "--gpus", "2", "--cluster", "dgx-h100-ndr"],
    ["simulate", "--model", "tiny-moe", "--cluster", "dgx-h100-ndr", "--gpus", "2", "--mbs", "2", "--gbs", "4",
     "--schedule", "none"],
])
def test_moe_with_fp8_is_accepted(capsys: pytest.CaptureFixture[str], command: list[str]) -> None:
    """MoE + fp8 is priced since session 14 (it was refused): memory and simulate succeed."""
    assert main([*command, "--fp8", "delayed"]) in (0, None)
    assert "error" not in capsys.readouterr().err


APEX = ["--zero", "1", "--zero-impl", "apex"]


def test_fp8_params_flag_reaches_the_layout(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SIMULATE, *APEX, "--fp8", "delayed", "--fp8-params"]) in (0, None)
    assert json.loads(capsys.readouterr().out)["layout"]["fp8_params"] is True
    assert main([*SIMULATE, *APEX, "--fp8", "delayed"]) in (0, None)
    assert json.loads(capsys.readouterr().out)["layout"]["fp8_params"] is False


@pytest.mark.parametrize(("extra", "message"), [
    (["--fp8-params", *APEX], "fp8_params = true needs fp8_recipe 'delayed'"),
    (["--fp8", "delayed", "--fp8-params"], "fp8_params = true is modelled for NeMo's apex DistributedFusedAdam only"),
])
def test_fp8_params_without_delayed_fp8_or_apex_is_one_line(extra: list[str], message: str,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SIMULATE, *extra]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]


def test_fp8_amax_flags_reach_the_layout(capsys: pytest.CaptureFixture[str]) -> None:
    """``--fp8-amax-reduction`` and ``--no-fp8-attention-amax`` (session 16) land in the simulated layout; defaults
    stage and true."""
    assert main([*SIMULATE, "--fp8", "delayed"]) in (0, None)
    layout = json.loads(capsys.readouterr().out)["layout"]
    assert (layout["fp8_amax_reduction"], layout["fp8_attention_amax"]) == ("stage", True)
    assert main([*SIMULATE, "--fp8", "delayed", "--fp8-amax-reduction", "tp-async-region",
                 "--no-fp8-attention-amax"]) in (0, None)
    layout = json.loads(capsys.readouterr().out)["layout"]
    assert (layout["fp8_amax_reduction"], layout["fp8_attention_amax"]) == ("tp-async-region", False)


@pytest.mark.parametrize(("extra", "message"), [
    (["--fp8", "delayed", "--fp8-amax-reduction", "dp"],
     "fp8_amax_reduction = 'dp' is not one of stage, tp, tp-async-region, none"),
    (["--fp8-amax-reduction", "tp"], "fp8_amax_reduction = 'tp' is Transformer Engine's delayed recipe's"),
])
def test_bad_fp8_amax_reduction_is_one_line(extra: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SIMULATE, *extra]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]
