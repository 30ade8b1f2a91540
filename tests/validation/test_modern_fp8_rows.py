"""The fp8 dev rows (session 12): NeMo 24.07's FP8 pre-training table on DGX-H100, and the harness's fp8 passing.

The expected layouts are the NeMo table's columns as printed (docs/source/performance/performance_summary.md at
NeMo commit 9c5c5e9), typed here from the table, not produced by the code under test; the harness tests use
synthetic results. Covers: data integrity (source pinned, layout uses the table's GPUs, every row expressible
and valid), the fp8 recipe reaching the Layout only where the Layout has the setting, the refusal to simulate an
fp8 row as a 16-bit one, and the summary groups with and without the fp8 rows.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import modern_devset  # noqa: E402
from modern_data import DEV_ROWS, EXCLUDED, NEMO_2407  # noqa: E402
from modern_devset import DevResult  # noqa: E402

from simgrid.model import get_model  # noqa: E402

# NeMo 24.07 table (9c5c5e9): model -> (#GPUs, GBS, MBS, seq, TP, PP, CP, VP, tokens/s/GPU)
NEMO_TABLE = {
    "nemo2407-gpt3-5b": (64, 2048, 4, 2048, 1, 1, 1, 1, 23406),
    "nemo2407-gpt3-20b": (64, 256, 2, 2048, 2, 1, 1, 1, 5851),
    "nemo2407-gpt3-175b-128": (128, 256, 1, 2048, 4, 8, 1, 6, 716),
    "nemo2407-gpt3-175b-512": (512, 2048, 2, 2048, 4, 8, 1, 6, 825),
    "nemo2407-llama2-7b": (8, 128, 1, 4096, 1, 1, 1, 1, 16934),
    "nemo2407-llama2-13b": (16, 128, 1, 4096, 1, 4, 1, 10, 8715),
    "nemo2407-llama2-70b": (64, 128, 1, 4096, 4, 4, 1, 20, 1728),
    "nemo2407-llama3-8b": (8, 128, 1, 8192, 1, 1, 2, 1, 12273),
    "nemo2407-llama3-70b": (64, 128, 1, 8192, 4, 4, 2, 5, 1524),
}
NEMO_ROWS = [r for r in DEV_ROWS if r.source is NEMO_2407]


def test_nemo_rows_are_the_tables_dense_pretraining_rows_with_its_columns() -> None:
    """Every dense GPT-3 / Llama pre-training row of the table is in, with the table's GPUs, batch, sequence
    length, parallel degrees and figure; the source is pinned to the commit; Nemotron stays excluded."""
    assert {r.id for r in NEMO_ROWS} == set(NEMO_TABLE)
    assert "9c5c5e9709407d3511005fc966e45374998bb478" in NEMO_2407.url
    for row in NEMO_ROWS:
        gpus, gbs, mbs, seq, tp, pp, cp, vp, tps = NEMO_TABLE[row.id]
        assert (row.gpus, row.global_batch, row.micro_batch, row.seq_length) == (gpus, gbs, mbs, seq), row.id
        assert (row.tp, row.pp, row.cp, row.vpp) == (tp, pp, cp, vp), row.id
        assert row.published == tps and row.metric == "tokens_per_s_per_gpu", row.id
        assert row.fp8_recipe == "delayed" and row.precision == "bf16" and row.gpu == "H100", row.id
        assert not row.not_expressible and row.recipe and row.assumed, row.id
        assert any("vboost" in d for d in row.deviations), row.id
    assert any("Nemotron" in e.rows and "squared-ReLU" in e.reason for e in EXCLUDED)


def test_nemo_rows_layouts_use_the_tables_gpus_and_split_layers_evenly() -> None:
    """The layout validates, covers exactly the table's GPUs, carries the fp8 recipe, and the interleaved rows
    give every virtual stage the same whole number of layers (NeMo's requirement)."""
    for row in NEMO_ROWS:
        layout = modern_devset.dev_layout(row)
        assert layout.world_size == NEMO_TABLE[row.id][0], row.id
        assert layout.fp8_recipe == "delayed", row.id
        assert layout.bucket_size_MB == row.bucket_size_MB and layout.grad_accumulation_fusion, row.id
        layers = get_model(row.model).num_layers
        assert layers % (row.pp * row.vpp) == 0, row.id
        assert modern_devset.layout_text(layout).endswith("fp8-delayed"), row.id
        # TE's async backward collectives stand in for userbuffers only where the config leaves ub off with TP
        assert layout.tp_async_grad_comm == (row.tp > 1 and not row.tp_comm_overlap), row.id
    assert [r.id for r in NEMO_ROWS if r.tp_async_grad_comm] == ["nemo2407-gpt3-175b-128", "nemo2407-gpt3-175b-512"]


def test_nemo_gpt3_presets_pad_the_gpt2_vocabulary_as_nemo_does() -> None:
    """GPT-2 BPE's 50257 tokens padded to a multiple of 128 x TP (TP 1, 2, 4 in the table): 50304, 50432, 50688."""
    assert get_model("nemo-gpt3-5b").vocab_size == 50304
    assert get_model("nemo-gpt3-20b").vocab_size == 50432
    assert get_model("nemo-gpt3-175b").vocab_size == 50688
    shape = get_model("nemo-gpt3-20b")
    assert (shape.num_layers, shape.hidden_size, shape.num_heads, shape.seq_length) == (44, 6144, 48, 2048)


def test_fp8_recipe_reaches_the_layout_only_where_the_layout_has_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without Layout.fp8_recipe (main before fp8core) the layout is built without it and the fp8 row is reported
    as not simulated (never run as a 16-bit row); with it, the recipe is passed."""
    row = NEMO_ROWS[0]
    assert modern_devset.dev_layout(row).fp8_recipe == "delayed"
    monkeypatch.setattr(modern_devset, "fp8_supported", lambda: False)
    assert modern_devset.dev_layout(row).fp8_recipe == "none"
    result = modern_devset.simulate_dev_row(row)
    assert result.predicted is None and result.error is None
    assert "fp8_recipe" in result.note and result.fp8_recipe == "delayed"


def _result(row: str, published: float, predicted: float, fp8: str = "none") -> DevResult:
    return DevResult(row=row, source="s", gpu="H100", gpus=8, layout="l", published_text="p", published=published,
                     predicted=predicted, baseline=published, fp8_recipe=fp8)


def test_summary_reports_fp8_rows_apart_and_the_whole_set_with_and_without_them() -> None:
    """Groups: the whole set with every row, the whole set without the fp8 rows (as before session 12), the fp8
    rows alone and the 16-bit modern rows alone."""
    class FakeSc21:
        def __init__(self) -> None:
            self.row, self.published, self.rel_err = "megatron-a", 130.0, 0.10

    modern = [_result("bf", 100.0, 120.0), _result("f8", 100.0, 70.0, fp8="delayed")]
    groups = dict(modern_devset.dev_groups([FakeSc21()], modern, 156.0))
    assert groups[modern_devset.WHOLE_DEV_SET].mean_signed == pytest.approx((0.10 + 0.20 - 0.30) / 3)
    assert groups[modern_devset.WHOLE_DEV_SET_16BIT].mean_signed == pytest.approx((0.10 + 0.20) / 2)
    assert groups["modern fp8 rows"].rows == 1 and groups["modern fp8 rows"].mean_signed == pytest.approx(-0.30)
    assert groups["modern 16-bit rows (without fp8)"].rows == 1
    no_fp8 = dict(modern_devset.dev_groups([FakeSc21()], modern[:1], 156.0))
    assert modern_devset.WHOLE_DEV_SET_16BIT not in no_fp8 and "modern fp8 rows" not in no_fp8
