"""benchmarks/llama3_context_parallel.py: its layouts are Llama 3's (Table 4), and --write fills the doc."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
from script_modules import load_benchmark


def _load() -> ModuleType:
    return load_benchmark("llama3_context_parallel", "llama3_cp_benchmark")


def test_layouts_use_every_gpu_and_sixteen_million_token_batches() -> None:
    """tp 8 x pp 16 x cp x dp = the published GPU count; global batch x sequence = 16M tokens (2^24)."""
    bench = _load()
    for run in bench.RUNS:
        for schedule, vpp in bench.SCHEDULES:
            layout = bench.layout_of(run, schedule, vpp)
            assert layout.world_size == run.gpus and layout.tp == 8 and layout.pp == 16 and layout.cp == run.cp
            assert run.global_batch * run.seq_length == 2**24


@pytest.mark.slow
def test_write_fills_the_table_between_the_markers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--write replaces only the text between the two markers, one table row per run and schedule; a doc
    without the markers is refused with exit 2."""
    bench = _load()
    doc = tmp_path / "cp.md"
    doc.write_text("head\n<!-- table -->\nold\n<!-- table -->\ntail\n")
    monkeypatch.setattr(bench, "DOC", doc)
    assert bench.main(["--write"]) == 0
    text = doc.read_text()
    assert text.startswith("head\n<!-- table -->\n| GPUs |") and text.endswith("<!-- table -->\ntail\n")
    assert "old" not in text and text.count("\n| 16,384 |") == 4 and text.count("\n| 8,192 |") == 2
    doc.write_text("no markers\n")
    assert bench.main(["--write"]) == 2
