"""``--cross-entropy fused|unfused``: the loss implementation flag reaches the layout of ``memory``, ``simulate``
and ``sweep``, and the unfused loss (an fp32 copy of the logits) needs more activation memory."""

from __future__ import annotations

import json

import pytest

from simgrid.cli.main import main

MEMORY = ["memory", "--model", "llama2-7b", "--gpus", "8", "--zero", "3", "--mbs", "2", "--gbs", "16",
          "--flash-attention", "--json"]


def _memory(capsys: pytest.CaptureFixture[str], extra: list[str]) -> dict:
    assert main(MEMORY + extra) in (0, None)
    return json.loads(capsys.readouterr().out)


def test_memory_unfused_loss_holds_two_fp32_logit_copies(capsys: pytest.CaptureFixture[str]) -> None:
    """The default is Megatron's fused loss; ``unfused`` names itself in the layout and its activations grow by
    the fp32 working set of ``F.cross_entropy`` on mbs x seq x vocab logits (2 x 4096 x 32000 here): the
    backward's two fp32 logit-sized gradients (8 bytes per logit) in place of the fused kernel's one 16-bit
    tensor (2 bytes), 6 bytes per logit more."""
    fused = _memory(capsys, [])
    unfused = _memory(capsys, ["--cross-entropy", "unfused"])
    assert fused["layout"]["cross_entropy"] == "fused"
    assert unfused["layout"]["cross_entropy"] == "unfused"
    logits = 2 * 4096 * 32000
    grown = unfused["breakdown"]["activations"] - fused["breakdown"]["activations"]
    assert grown == logits * (2 * 4 - 2)


def test_memory_text_names_the_unfused_loss(capsys: pytest.CaptureFixture[str]) -> None:
    """The text report's layout line says ``cross_entropy=unfused`` only when it is set."""
    assert main([*MEMORY[:-1], "--cross-entropy", "unfused"]) in (0, None)
    assert "cross_entropy=unfused" in capsys.readouterr().out
    assert main(MEMORY[:-1]) in (0, None)
    assert "cross_entropy" not in capsys.readouterr().out


def test_simulate_and_sweep_take_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """``simulate --json`` reports the layout with the loss it was given; ``sweep`` keeps it fixed in every layout
    it tries (it is part of the recipe, like the optimizer)."""
    assert main(["simulate", "--model", "tiny-gpt", "--cluster", "dgx-a100-hdr", "--gpus", "2",
                 "--cross-entropy", "unfused", "--json"]) in (0, None)
    assert json.loads(capsys.readouterr().out)["layout"]["cross_entropy"] == "unfused"
    from simgrid.cli.cmd_sweep import constraints_from_args
    from simgrid.cli.main import build_parser

    args = build_parser().parse_args(["sweep", "--model", "tiny-gpt", "--cluster", "dgx-a100-hdr", "--gpus", "2",
                                      "--gbs", "8", "--cross-entropy", "unfused"])
    assert dict(constraints_from_args(args).recipe)["cross_entropy"] == "unfused"


def test_bad_cross_entropy_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown loss implementation exits 2 with one stderr line naming the field, the value and the choices
    (the layout's check, as for --zero-impl), not argparse's usage dump."""
    assert main([*MEMORY[:-1], "--cross-entropy", "fusedd"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    assert "cross_entropy = 'fusedd' is not one of fused, unfused" in lines[0]
