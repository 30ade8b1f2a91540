"""benchmarks/moe_megatron.py: its layouts are the harness's (every GPU used, folding), and --write fills the doc."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
from script_modules import load_benchmark

from simgrid.layout import check_layout


def _load() -> ModuleType:
    return load_benchmark("moe_megatron", "moe_megatron_benchmark")


def test_layouts_use_every_gpu_with_the_harness_recipe() -> None:
    """tp x pp x dp = the run's GPUs, global batch 256 of 4096-token sequences, ZeRO-1, and the degrees of the
    row; the folded rows have etp 1, and every layout is valid for its model."""
    bench = _load()
    for run in bench.RUNS:
        layout, model = bench.layout_of(run), bench.model_of(run)
        check_layout(model, layout)
        assert layout.world_size == run.gpus and layout.gbs == 256 and model.seq_length == 4096
        assert (layout.tp, layout.pp, layout.ep, layout.expert_tp, layout.vpp) == (run.tp, run.pp, run.ep, run.etp,
                                                                                   run.vpp)
        assert layout.zero == 1 and layout.sequence_parallel
    assert [r.published_mfu for r in bench.RUNS] == [0.493, 0.390, None, None, None]
    # The fp8 rows are the two paper layouts under fp8 (nothing published for them).
    assert [bench.layout_of(r).fp8_recipe for r in bench.RUNS] == ["none"] * 3 + ["delayed"] * 2
    assert [(r.model, r.tp, r.pp, r.ep, r.vpp) for r in bench.RUNS[3:]] == [
        (r.model, r.tp, r.pp, r.ep, r.vpp) for r in bench.RUNS[:2]]


@pytest.mark.slow
def test_write_fills_the_table_between_the_markers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--write replaces only the text between the markers: one row per run, then one per paper row in the
    imbalance sensitivity table; a doc without the markers exits 2."""
    bench = _load()
    doc = tmp_path / "moe.md"
    doc.write_text("head\n<!-- table -->\nPLACEHOLDER\n<!-- table -->\ntail\n")
    monkeypatch.setattr(bench, "DOC", doc)
    assert bench.main(["--write"]) == 0
    text = doc.read_text()
    assert text.startswith("head\n<!-- table -->\n| run |") and text.endswith("<!-- table -->\ntail\n")
    assert "PLACEHOLDER" not in text and text.count("\n| Mixtral 8x22B") == 4 and text.count("\n| Qwen2-57B") == 3
    doc.write_text("no markers\n")
    assert bench.main(["--write"]) == 2
