"""``--dropout auto|on|off`` reaches the layout of ``memory`` and ``simulate``, and bad values are one line, exit 2."""

from __future__ import annotations

import json

import pytest

from simgrid.cli.main import main

MEMORY = ["memory", "--model", "gpt2-small", "--gpus", "1", "--mbs", "2", "--gbs", "2", "--json"]


def _memory(capsys: pytest.CaptureFixture[str], extra: list[str]) -> dict:
    assert main(MEMORY + extra) in (0, None)
    return json.loads(capsys.readouterr().out)


def test_memory_off_drops_the_dropout_masks(capsys: pytest.CaptureFixture[str]) -> None:
    """gpt2-small (12 layers, s 1024, h 768, 12 heads, mbs 2) trains with dropout by default; ``off`` frees per layer
    the two residual masks (2 b s h bytes), the attention mask and the dropout output (a b s^2 (1 + 2) bytes,
    unfused core), and the embedding's mask (b s h)."""
    auto = _memory(capsys, [])
    off = _memory(capsys, ["--dropout", "off"])
    assert auto["layout"]["dropout"] == "auto" and off["layout"]["dropout"] == "off"
    b, s, h, a, layers = 2, 1024, 768, 12, 12
    freed = layers * (2 * b * s * h + a * b * s * s * 3) + b * s * h
    assert auto["breakdown"]["activations"] - off["breakdown"]["activations"] == freed


def test_simulate_takes_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--model", "tiny-gpt", "--cluster", "dgx-a100-hdr", "--gpus", "2",
                 "--dropout", "off", "--json"]) in (0, None)
    assert json.loads(capsys.readouterr().out)["layout"]["dropout"] == "off"


def test_bad_dropout_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*MEMORY, "--dropout", "maybe"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    assert "dropout = 'maybe' is not one of auto, on, off" in lines[0]
