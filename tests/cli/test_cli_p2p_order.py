"""``--p2p-order witness|megatron-core``: the flag reaches the simulated layout and moves the interleaved step time;
outside the interleaved schedule, or with a bad value, it is one line and exit 2."""

from __future__ import annotations

import json

import pytest

from simgrid.cli.main import main

SIMULATE = ["simulate", "--model", "tiny-gpt", "--cluster", "dgx-h100-ndr", "--gpus", "4", "--pp", "4", "--vpp", "1",
            "--mbs", "1", "--gbs", "8", "--schedule", "1f1b", "--json"]
INTERLEAVED = ["simulate", "--model", "gpt3-1.3b", "--cluster", "dgx-h100-ndr", "--gpus", "4", "--pp", "4", "--vpp",
               "2", "--mbs", "1", "--gbs", "16", "--schedule", "interleaved-1f1b", "--json"]


def _one_error_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line]
    assert len(lines) == 1 and "Traceback" not in err
    return lines[0]


def test_p2p_order_flag_reaches_the_layout(capsys: pytest.CaptureFixture[str]) -> None:
    times = {}
    for order in ("witness", "megatron-core", "megatron-batched"):
        assert main([*INTERLEAVED, "--p2p-order", order]) in (0, None)
        out = json.loads(capsys.readouterr().out)
        assert out["layout"]["p2p_order"] == order
        times[order] = out["step_time_s"]
    assert len(set(times.values())) == 3


def test_megatron_core_order_outside_the_interleaved_schedule_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SIMULATE, "--p2p-order", "megatron-core"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "p2p_order 'megatron-core' is Megatron-Core's overlapped p2p" in line and "schedule = '1f1b'" in line


def test_bad_p2p_order_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SIMULATE, "--p2p-order", "nccl"]) == 2
    assert "p2p_order = 'nccl' is not one of witness, megatron-core" in _one_error_line(capsys.readouterr().err)


def test_p2p_scatter_gather_flag_reaches_the_layout(capsys: pytest.CaptureFixture[str]) -> None:
    """--p2p-scatter-gather (Megatron-LM 2021/2022's pipeline tensors as 1/tp slices, all-gathered over tp) reaches
    the layout and changes the step time of a tp 2 x pp 2 run."""
    base = ["simulate", "--model", "gpt3-1.3b", "--cluster", "dgx-a100-hdr", "--gpus", "16", "--tp", "8", "--pp",
            "2", "--mbs", "1", "--gbs", "8", "--schedule", "1f1b", "--p2p-order", "megatron-batched", "--json"]
    times = []
    for extra in ([], ["--p2p-scatter-gather"]):
        assert main([*base, *extra]) in (0, None)
        out = json.loads(capsys.readouterr().out)
        assert out["layout"]["p2p_scatter_gather"] is bool(extra)
        times.append(out["step_time_s"])
    assert times[0] != times[1]


def test_p2p_scatter_gather_needs_the_batched_order_and_no_sp(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SIMULATE, "--p2p-scatter-gather"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "p2p_scatter_gather is Megatron-LM's batched p2p" in line and "p2p_order = 'witness'" in line
