"""The modern dev set (issue 12): its data is well formed, the harness's arithmetic is right, the docs round-trip.

Expected values come from the sources (the Megatron-LM H100 table's MFU and aggregate columns, NeMo
AutoModel's step time) or are worked out by hand here on synthetic inputs; none is produced by the code
under test. Simulating every modern row takes about a second, so one test runs them all (without asserting
accuracy, which the cost-model work of issue 12 will change).
"""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import modern_data  # noqa: E402
import modern_devset  # noqa: E402
from modern_data import DEV_ROWS, EXCLUDED, DevRow  # noqa: E402
from modern_devset import DevPoint, DevResult, dev_layout  # noqa: E402

from simgrid.model import get_model, param_count  # noqa: E402

VALIDATION_DOC = BENCHMARKS.parent / "docs" / "validation.md"


# -- the data ----------------------------------------------------------------------------------------------
def test_every_row_names_its_source_recipe_and_conversion() -> None:
    """Each row carries a source (document, section, address, version), the figure as printed, its
    conversion and its recipe; ids are unique; fp8 rows keep a 16-bit precision beside their fp8_recipe."""
    assert len(DEV_ROWS) >= 12
    ids = [r.id for r in DEV_ROWS]
    assert len(ids) == len(set(ids)), "row ids must be unique"
    for row in DEV_ROWS:
        s = row.source
        assert s.document and s.section and s.version, row.id
        assert s.url.startswith("https://"), row.id
        assert row.published > 0 and row.published_text and row.conversion and row.recipe, row.id
        assert row.precision in ("bf16", "fp16"), row.id
        assert row.metric in ("tokens_per_s_per_gpu", "model_tflops_per_gpu"), row.id
        assert row.gpu in ("H100", "H200", "A100"), row.id
    assert sum(r.gpu in ("H100", "H200") for r in DEV_ROWS) >= 12
    assert all(e.source and e.rows and e.reason for e in EXCLUDED)


def test_every_row_layout_validates_against_its_model() -> None:
    """The simulated layout passes the layout rules and the model's (tp divides heads, stages <= layers),
    uses exactly the row's GPUs, and the model runs at the row's sequence length."""
    for row in DEV_ROWS:
        if row.not_expressible:
            continue
        layout = modern_devset.dev_layout(row)
        assert layout.world_size == row.gpus, row.id
        assert layout.gbs == row.global_batch and layout.micro_batch_size == row.micro_batch, row.id
        assert modern_devset.dev_model(row).seq_length == row.seq_length, row.id
        if row.zero == 3:
            assert row.zero_impl == "fsdp2", row.id


def test_published_figure_appears_as_printed() -> None:
    """The number in ``published_text`` is the number compared (thousands separators allowed)."""
    for row in DEV_ROWS:
        digits = row.published_text.split()[0].replace(",", "")
        assert float(digits) == pytest.approx(row.published), row.id


def test_rows_simulate_their_recipes_op_level_checkpointing_fp32_reduce_and_500w_parts() -> None:
    """torch.compile has no simulator setting (a deviation says so); per-op selective checkpointing runs as
    recompute 'selective-op', torchtitan's fp32 gradient reduce as reduce_dtype 'fp32', and the torchtitan H100
    rows run on the 500 W, 2.4 TB/s Grand Teton profile (flagged: its 500 W clock is interpolated)."""
    for row in DEV_ROWS:
        text = row.recipe.lower()
        deviations = " ".join(row.deviations).lower()
        if "torch.compile" in text and "no torch.compile" not in text:
            assert "compile" in deviations, row.id
        if "per-op" in text or "selective op" in text or "selective (per-op)" in text:
            assert row.recompute == "selective-op" and "checkpointing" not in deviations, row.id
        if "fp32 gradient reduce-scatter" in text:
            assert row.zero_impl == "fsdp2" and row.reduce_dtype == "fp32", row.id
            assert dev_layout(row).reduce_dtype == "fp32", row.id
        if row.source is modern_data.TITAN_2024_12 or row.source is modern_data.TITAN_ASYNC_TP:
            assert row.cluster == "grand-teton-h100-rdma" and "500 w" in deviations, row.id


#: Megatron-LM README H100 table (model_table.png): name -> (size B, MFU %, aggregate PFLOP/s), as printed.
MEGATRON_H100_PRINTED = {
    "1.7b": (1.7, 41, 19.6), "7.1b": (7.1, 47, 44.7), "16b": (16, 49, 93.9), "32b": (32, 46, 176.5),
    "70b": (70, 42, 322.3), "119b": (119, 43, 645.9), "177b": (177, 44, 997.2), "314b": (314, 48, 1457.4),
    "462b": (462, 47, 2825.6),
}


def test_megatron_h100_rows_agree_with_the_tables_other_columns() -> None:
    """Per-GPU TFLOP/s x GPUs = the aggregate column, TFLOP/s / 989.4 is the MFU column, and the
    preset's parameter count is the table's model size (within 4 %: 1.754B is printed as "1.7B")."""
    rows = {r.id: r for r in DEV_ROWS if r.source is modern_data.MEGATRON_README}
    assert len(rows) == 9
    for size, (params_b, mfu_pct, aggregate_pf) in MEGATRON_H100_PRINTED.items():
        row = rows[f"megatron-h100-{size}"]
        assert row.published * row.gpus / 1000 == pytest.approx(aggregate_pf, abs=0.06), size
        # The printed MFU is whole percent from unrounded figures (462B: 459.9 / 989.4 = 46.48 % is printed 47 %).
        assert abs(100 * row.published / 989.4 - mfu_pct) < 0.6, size
        assert param_count(get_model(row.model)) / 1e9 == pytest.approx(params_b, rel=0.04), size


def test_megatron_flop_conversion_matches_the_gpt_closed_form() -> None:
    """For a GPT (no GQA, f = 4h, no gating) Megatron-Core's count reduces to 72 B s L h^2 (1 + s/6h + V/12Lh);
    the 1.7B row's 408.8 TFLOP/s on 48 GPUs is then 36,260 tokens/s per GPU."""
    b, s, layers, h, v = 192, 4096, 24, 2048, 131072
    flops = 72 * b * s * layers * h**2 * (1 + s / (6 * h) + v / (12 * layers * h))
    row = next(r for r in DEV_ROWS if r.id == "megatron-h100-1.7b")
    assert modern_data.megatron_core_flops_per_step(get_model(row.model), b) == pytest.approx(flops, rel=1e-12)
    expected_tps = 408.8e12 * 48 / flops * b * s / 48
    assert modern_devset.published_tokens_per_gpu(row) == pytest.approx(expected_tps, rel=1e-9)
    assert expected_tps == pytest.approx(36_260, rel=1e-3)


def test_megatron_flop_count_for_a_gqa_swiglu_model_by_hand() -> None:
    """Llama 3 8B shape (L 32, h 4096, 32 heads, 8 KV groups, f 14336, SwiGLU, V 128256), B 1, s 8192:
    12 * 8192 * 32 * 4096^2 * [(1 + 8/32 + 2) + 3.5 * 1.5 + 128256/(2*32*4096)] = 5.278e13 * 8.989
    = 4.74e14 by hand."""
    bracket = (1 + 8 / 32 + 8192 / 4096) + (14336 / 4096) * 1.5 + 128256 / (2 * 32 * 4096)
    expected = 12 * 8192 * 32 * 4096**2 * bracket
    spec = modern_devset.dev_model(next(r for r in DEV_ROWS if r.id == "titan-8b-fsdp8"))
    assert modern_data.megatron_core_flops_per_step(spec, 1) == pytest.approx(expected, rel=1e-12)
    assert expected == pytest.approx(4.744e14, rel=1e-3)


def test_automodel_row_agrees_with_its_step_time() -> None:
    """NeMo AutoModel: 128 sequences x 8192 tokens / 18.90 s / 64 GPUs = the printed 866.77 tokens/s/GPU."""
    row = next(r for r in DEV_ROWS if r.id == "automodel-70b-fsdp32-cp2")
    assert row.gpus == 64 and row.tokens_per_step == 128 * 8192
    assert row.published == pytest.approx(128 * 8192 / 18.90 / 64, rel=5e-4)


# -- the harness on synthetic inputs -----------------------------------------------------------------------
def _result(row: str, published: float, predicted: float | None, baseline: float | None, *,
            deviates: bool = False, gpu: str = "H100") -> DevResult:
    return DevResult(row=row, source="src, table", gpu=gpu, gpus=8, layout="dp8 zero3 mb1 gbs8 recompute-none fa",
                     published_text=f"{published:g} tok/s/GPU", published=published, predicted=predicted,
                     baseline=baseline, deviations=("hardware differs",) if deviates else (),
                     fits=True if predicted is not None else None)


def test_errors_are_relative_to_the_published_figure() -> None:
    """Published 200, predicted 230, baseline 170: +15 % and -15 %; an unsimulated row has no error."""
    r = _result("a", 200.0, 230.0, 170.0)
    assert r.error == pytest.approx(0.15) and r.baseline_error == pytest.approx(-0.15)
    assert _result("b", 200.0, None, None).error is None


def test_summary_counts_means_and_target_verdict() -> None:
    """Errors +5 %, -20 %, +9 %: 2 within 10 %, MAE 34/3 %, signed -2 %, max 20 %, targets missed; the
    baseline's errors +10 %, +30 %, -10 %: 2 within (10 % counts as within), MAE 50/3 %, signed +10 %."""
    points = [DevPoint(label="a", error=0.05, baseline_error=0.10), DevPoint(label="b", error=-0.20, baseline_error=0.30),
              DevPoint(label="c", error=0.09, baseline_error=-0.10)]
    s = modern_devset.summarize(points)
    assert (s.rows, s.within, s.baseline_within) == (3, 2, 2)
    assert s.mae == pytest.approx(0.34 / 3) and s.mean_signed == pytest.approx(-0.02)
    assert s.max_abs == pytest.approx(0.20)
    assert s.baseline_mae == pytest.approx(0.50 / 3) and s.baseline_mean_signed == pytest.approx(0.10)
    assert not s.targets_met


def test_targets_need_rows_within_small_mae_and_no_systematic_bias() -> None:
    """+1 %, -2 %, +3 % meets every target; +4 % three times has MAE 4 % but a +4 % bias, which misses;
    an empty set never meets them."""
    def points(errors: list[float]) -> list[DevPoint]:
        return [DevPoint(label=str(i), error=e, baseline_error=0.0) for i, e in enumerate(errors)]

    assert modern_devset.summarize(points([0.01, -0.02, 0.03])).targets_met
    biased = modern_devset.summarize(points([0.04, 0.04, 0.04]))
    assert biased.mae == pytest.approx(0.04) and not biased.targets_met
    empty = modern_devset.summarize([])
    assert empty.rows == 0 and math.isnan(empty.mae) and not empty.targets_met


def test_groups_combine_sc21_rows_and_modern_rows() -> None:
    """SC'21 points use half of peak (156 TFLOP/s) as baseline; the whole set has both kinds of rows; the
    no-deviation set drops flagged rows; unsimulated rows count nowhere."""
    class FakeSc21:
        def __init__(self, row: str, published: float, predicted: float) -> None:
            self.row, self.published, self.rel_err = row, published, (predicted - published) / published

    sc21 = [FakeSc21("megatron-a", 130.0, 143.0)]
    modern = [_result("m1", 100.0, 120.0, 80.0), _result("m2", 100.0, 90.0, 95.0, deviates=True, gpu="A100"),
              _result("m3", 100.0, None, None)]
    groups = dict(modern_devset.dev_groups(sc21, modern, 156.0))
    whole = groups[modern_devset.WHOLE_DEV_SET]
    assert whole.rows == 3 and whole.mean_signed == pytest.approx((0.10 + 0.20 - 0.10) / 3)
    assert groups["Megatron SC'21 Table 1 (A100)"].baseline_mean_signed == pytest.approx(0.2)
    assert groups["modern rows without a deviation"].rows == 1
    assert groups["modern A100 rows"].rows == 1 and groups["modern H100 rows"].rows == 1
    assert modern_devset.WHOLE_DEV_SET not in dict(modern_devset.dev_groups([], modern, 156.0))


def test_dev_table_round_trips_through_the_parser() -> None:
    """The markdown table parses back to the same ids, numbers, errors and verdicts."""
    results = [_result("row-a", 1000.0, 1150.0, 900.0), _result("row-b", 50.0, 47.5, 60.0, deviates=True),
               _result("row-c", 10.0, None, None)]
    results[0] = dataclasses.replace(results[0], assumed=("mbs 1", "vpp 1"))
    results[2] = dataclasses.replace(results[2], assumed=("vpp 1",), deviations=("compile", "hardware differs"))
    parsed = modern_devset.parse_dev_table(modern_devset.dev_table(results))
    assert [p["row"] for p in parsed] == ["row-a", "row-b", "row-c"]
    a, b, c = parsed
    assert (a["published tok/s/GPU"], a["predicted tok/s/GPU"], a["error"], a["within 10%"]) == (
        "1000.0", "1150.0", "+15.0%", "OUTSIDE")
    assert (b["error"], b["within 10%"], b["half-peak error"]) == ("-5.0%", "within", "+20.0%")
    assert (c["predicted tok/s/GPU"], c["error"], c["fits"]) == ("-", "-", "-")
    # Codes number distinct texts in table order: the same text gets the same code on every row.
    assert [(p["assumed"], p["deviations"]) for p in parsed] == [("A1 A2", "-"), ("-", "D1"), ("A2", "D2 D1")]
    notes = modern_devset.row_notes(results)
    assert notes[:4] == ["- A1: mbs 1.", "- A2: vpp 1.", "- D1 (deviation): hardware differs.",
                         "- D2 (deviation): compile."]


def test_docs_block_is_found_between_its_markers() -> None:
    """The rendered block sits between the markers, and extract_block returns its inside unchanged."""
    results = [_result("row-a", 1000.0, 1150.0, 900.0)]
    groups = modern_devset.dev_groups([], results, 156.0)
    block = modern_devset.render_block(results, groups)
    document = "# Validation\n\nbefore\n\n" + block + "\n\nafter\n"
    inside = modern_devset.extract_block(document)
    assert inside is not None and "## Modern dev set (H100/H200)" in inside
    assert modern_devset.parse_dev_table(inside.split("\n\n", 2)[2].split("\n\n")[0])[0]["row"] == "row-a"
    assert modern_devset.extract_block("no markers here") is None


def test_committed_validation_doc_lists_every_dev_row() -> None:
    """docs/validation.md holds the generated block, and its table has exactly the rows of the data."""
    inside = modern_devset.extract_block(VALIDATION_DOC.read_text())
    assert inside is not None, "regenerate docs/validation.md: python benchmarks/published.py"
    table = next(chunk for chunk in inside.split("\n\n") if chunk.startswith("| row |"))
    assert [p["row"] for p in modern_devset.parse_dev_table(table)] == [r.id for r in DEV_ROWS]


# -- the rows simulate (about a second for all of them) ----------------------------------------------------
def test_every_expressible_row_simulates_to_a_plausible_throughput() -> None:
    """Each simulated row gives a positive throughput and baseline, within a factor of 3 of the published
    figure (a unit slip such as per-cluster vs per-GPU tokens would be off by the GPU count)."""
    for row in DEV_ROWS:
        result = modern_devset.simulate_dev_row(row)
        if row.not_expressible:
            assert result.predicted is None
            continue
        assert result.predicted is not None and result.baseline is not None
        assert result.published / 3 < result.predicted < result.published * 3, (row.id, result.predicted)
        assert result.published / 3 < result.baseline < result.published * 3, (row.id, result.baseline)


def test_dev_row_type_defaults_describe_a_plain_data_parallel_bf16_run() -> None:
    """A bare row: tp = pp = cp = 1, no ZeRO, no recompute, flash attention on, bf16; GPUs = dp."""
    row = DevRow(id="x", source=modern_data.AUTOMODEL, gpu="H100", cluster="dgx-h100-ndr", model="llama3-8b",
                 seq_length=8192, dp=8, micro_batch=1, global_batch=8, metric="tokens_per_s_per_gpu",
                 published=1.0, published_text="1 tok/s", conversion="as published", recipe="r")
    assert (row.gpus, row.zero, row.recompute, row.flash_attention, row.precision) == (8, 0, "none", True, "bf16")
    assert modern_devset.layout_text(modern_devset.dev_layout(row)) == "dp8 mb1 gbs8 recompute-none fa"


def test_megatron_rows_follow_megatron_lms_gradient_dtype_rule() -> None:
    """Megatron-LM forces fp32 gradient accumulation and reduce for bf16 only (arguments.py, f2e5db4): the
    README rows assume fp16 (the repository's GPT scripts pass --fp16), so each simulates ZeRO-1 with 16-bit
    gradients in its reduce-scatter; a bf16 row would have to carry reduce_dtype fp32."""
    rows = [r for r in DEV_ROWS if r.source is modern_data.MEGATRON_README]
    assert rows
    for row in rows:
        layout = dev_layout(row)
        assert layout.zero == 1, row.id
        assert layout.reduce_dtype == ("fp32" if row.precision == "bf16" else "param"), row.id
        assert row.precision == "fp16" and "fp16 assumed" in row.assumed[0], row.id


def test_least_interleaving_is_the_smallest_chunk_count_megatron_accepts() -> None:
    """Virtual stages per rank must divide the layers per stage; the shallowest interleaving is the smallest
    divisor > 1 (a prime layer count per stage leaves one layer per chunk); no pipeline, no interleaving."""
    assert modern_data.least_interleaving(84, 2) == 2  # 42 layers per stage
    assert modern_data.least_interleaving(92, 4) == 23  # 23: prime
    assert modern_data.least_interleaving(96, 8) == 2
    assert modern_data.least_interleaving(105, 35) == 3
    assert modern_data.least_interleaving(48, 1) == 1


def test_megatron_pipelined_rows_run_the_interleaved_schedule() -> None:
    """The README overlaps pipeline communication, which Megatron-LM allows only with interleaving: every
    pp > 1 row simulates interleaved 1F1B with whole layers per chunk and micro-batches a multiple of pp (the
    interleaved schedule's own requirement); the pp = 1 rows have no pipeline schedule."""
    rows = [r for r in DEV_ROWS if r.source is modern_data.MEGATRON_README]
    for row in rows:
        layout = dev_layout(row)
        if row.pp == 1:
            assert (layout.schedule, layout.vpp) == ("none", 1), row.id
            continue
        layers = get_model(row.model).num_layers
        assert layout.schedule == "interleaved-1f1b" and layout.vpp > 1, row.id
        assert (layers // row.pp) % layout.vpp == 0, row.id
        assert (row.global_batch // (row.dp * row.micro_batch)) % row.pp == 0, row.id
