"""The --cp flag: simulate derives dp from the GPU count and reports cp; memory shards ZeRO over dp * cp."""

from __future__ import annotations

import json

import pytest

from simgrid.cli.main import main


def test_simulate_with_cp_reports_the_degree_and_its_exposed_time(capsys: pytest.CaptureFixture[str]) -> None:
    """8 GPUs with tp 2 and cp 2 leave dp 2; the report names cp and its exposed communication."""
    argv = ["simulate", "--model", "tiny-gpt", "--cluster", "dgx-a100-hdr", "--gpus", "8", "--tp", "2", "--cp", "2",
            "--gbs", "4"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "layout           dp 2, tp 2, pp 1, cp 2," in out
    assert "exposed comm     tp " in out and "  cp " in out


def test_gpu_count_that_cp_does_not_divide_is_one_clear_line(capsys: pytest.CaptureFixture[str]) -> None:
    """6 GPUs cannot hold tp 2 x cp 2: exit 2 and the message names all three degrees."""
    argv = ["simulate", "--model", "tiny-gpt", "--cluster", "dgx-a100-hdr", "--gpus", "6", "--tp", "2", "--cp", "2"]
    assert main(argv) == 2
    assert "--gpus 6 is not divisible by tp * pp * cp = 2 * 1 * 2" in capsys.readouterr().err


def test_memory_shards_optimizer_states_over_dp_times_cp(capsys: pytest.CaptureFixture[str]) -> None:
    """ZeRO-1 over dp 2 and cp 2: the optimizer states are a quarter of dp 1's (the ranks of both axes
    hold the same parameters)."""
    def optimizer_bytes(*flags: str) -> float:
        assert main(["memory", "--model", "llama2-7b", "--json", "--zero", "1", *flags]) == 0
        return float(json.loads(capsys.readouterr().out)["breakdown"]["optimizer"])

    whole = optimizer_bytes()
    assert optimizer_bytes("--dp", "2", "--cp", "2", "--gbs", "2") == pytest.approx(whole / 4, rel=1e-6)
