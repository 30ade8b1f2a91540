"""The --ep/--etp/--moe-imbalance flags on simulate, memory and program, and their one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simgrid.cli.main import main


def test_simulate_reports_expert_degrees_and_exposed_all_to_all(capsys: pytest.CaptureFixture[str]) -> None:
    """4 GPUs, ep 2: the report names ep and etp and has an ep column of exposed communication."""
    argv = ["simulate", "--model", "tiny-moe", "--cluster", "dgx-h100-ndr", "--gpus", "4", "--ep", "2", "--gbs", "4"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "layout           dp 4, tp 1, pp 1, ep 2, etp 1," in out
    assert "  ep " in out.split("exposed comm", 1)[1].splitlines()[0]


def test_simulate_json_has_exposed_ep(capsys: pytest.CaptureFixture[str]) -> None:
    """--json carries the ep key, positive with ep 2."""
    argv = ["simulate", "--model", "tiny-moe", "--cluster", "dgx-h100-ndr", "--gpus", "2", "--ep", "2", "--json"]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["exposed_comm_s"]["ep"] > 0


def test_memory_splits_experts_over_ep(capsys: pytest.CaptureFixture[str]) -> None:
    """The weights of mixtral-8x7b per GPU shrink from all experts (dp 8) to one per layer (ep 8)."""
    def weights(*flags: str) -> float:
        assert main(["memory", "--model", "mixtral-8x7b", "--dp", "8", "--json", *flags]) == 0
        return float(json.loads(capsys.readouterr().out)["breakdown"]["weights"])

    assert weights("--ep", "8") < weights() / 3


def test_moe_imbalance_flag_changes_the_routed_tokens(capsys: pytest.CaptureFixture[str]) -> None:
    """--moe-imbalance 2 raises the activations of a MoE model."""
    def activations(*flags: str) -> float:
        assert main(["memory", "--model", "tiny-moe", "--dp", "2", "--ep", "2", "--json", *flags]) == 0
        return float(json.loads(capsys.readouterr().out)["breakdown"]["activations"])

    assert activations("--moe-imbalance", "2") > activations()


def test_program_writes_a_moe_program_that_validates(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The program file keeps the MoE model and the expert groups; validate-program accepts it."""
    out = tmp_path / "moe.json"
    assert main(["program", "--model", "tiny-moe", "--dp", "4", "--ep", "2", "--etp", "2", "--out", str(out)]) == 0
    assert main(["validate-program", str(out)]) == 0
    text = capsys.readouterr().out
    assert "ep=2 etp=2" in text and "ALL_TO_ALL" in text and "valid     yes" in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["memory", "--model", "llama2-7b", "--dp", "2", "--ep", "2"], "'llama2-7b' is a dense model"),
        (["memory", "--model", "mixtral-8x7b", "--dp", "2", "--ep", "4"], "ep * etp = 4 * 1 must divide"),
        (["memory", "--model", "tiny-gpt", "--moe-imbalance", "1.2"], "--moe-imbalance applies to MoE models"),
        (["memory", "--model", "tiny-moe", "--moe-imbalance", "0.5"], "load_imbalance = 0.5 must be >= 1.0"),
    ],
)
def test_bad_expert_flags_exit_2_with_one_line(argv: list[str], message: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Each bad flag exits 2 with one line naming the value and the fix."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_models_lists_experts_and_active_parameters(capsys: pytest.CaptureFixture[str]) -> None:
    """`simgrid models` shows experts and top-k; --json adds active_params, below params for a MoE model."""
    assert main(["models"]) == 0
    line = next(li for li in capsys.readouterr().out.splitlines() if li.startswith("mixtral-8x7b "))
    assert line.endswith("8 top-2")
    assert main(["models", "--json"]) == 0
    models = {m["name"]: m for m in json.loads(capsys.readouterr().out)}
    assert models["mixtral-8x7b"]["active_params"] < models["mixtral-8x7b"]["params"]
    assert models["llama2-7b"]["active_params"] == models["llama2-7b"]["params"]
