"""The MLPerf Training v3.1 (session 13) and v4.0 / v4.1 (session 14) GPT-3 175B dev rows: NVIDIA's DGX H100 (Eos)
submissions.

The expected values are typed here from the submission (mlcommons/training_results_v3.1 at d06288b): the log's
hyperparameter lines (global_batch_size, gradient_accumulation_steps, max_sequence_length, submission_platform),
the median train_step_timing of each run's tracked_stats lines, and the config scripts' TP / PP / micro-batch; not
produced by the code under test. Covers: rows parse and carry their source, layouts validate and use the
submission's GPUs and recipe, and the step-time to tokens/s/GPU arithmetic.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import modern_devset  # noqa: E402
from modern_data import DEV_ROWS, MLPERF_31, MLPERF_40, MLPERF_41  # noqa: E402

from simgrid.model import get_model  # noqa: E402

# nodes -> (global_batch_size, gradient_accumulation_steps, median train_step_timing of result_0/1/2 in s)
# read from NVIDIA/results/{eos_n64,eos_n96,eos-dfw_nN}_ngc23.09_nemo/gpt3/result_{0,1,2}.txt
LOGS = {
    64: (2048, 128, (11.0453, 11.0550, 11.0539)),
    96: (3072, 128, (11.0723, 11.0779, 11.0754)),
    512: (2048, 16, (1.6084, 1.6081, 1.6098)),
    768: (3072, 16, (1.6159, 1.6152, 1.6150)),
    1024: (4096, 16, (1.6193, 1.6192, 1.6192)),
    1280: (2560, 8, (0.9256, 0.9255, 0.9256)),
    1344: (2688, 8, (0.9296, 0.9296, 0.9296)),
}
SEQ = 2048  # max_sequence_length in every log
ROWS = [r for r in DEV_ROWS if r.source is MLPERF_31]


def test_one_row_per_system_size_with_the_logs_batch_and_the_configs_layout() -> None:
    """Seven rows (64 to 1344 nodes of 8 H100), smallest first, each with the log's GBS, TP 4, PP 8, VP 12, MBS
    = GBS / (DP x gradient_accumulation_steps) = 1, and the source pinned to the repository commit."""
    assert [r.gpus for r in ROWS] == [8 * n for n in LOGS]
    assert "d06288b2bd675a9d88e0e6181f5bb5626b71ec19" in MLPERF_31.url
    for row, (nodes, (gbs, ga, _)) in zip(ROWS, LOGS.items(), strict=True):
        assert row.id == f"mlperf31-gpt3-{8 * nodes}"
        assert (row.tp, row.pp, row.vpp, row.cp, row.dp) == (4, 8, 12, 1, 8 * nodes // 32), row.id
        assert row.global_batch == gbs and row.micro_batch == 1 == gbs // (row.dp * ga), row.id
        assert row.seq_length == SEQ and row.model == "nemo-gpt3-175b" and row.gpu == "H100", row.id
        assert row.fp8_recipe == "delayed" and row.precision == "bf16" and row.recompute == "none", row.id
        assert row.sequence_parallel and row.tp_comm_overlap and not row.tp_async_grad_comm, row.id
        assert row.zero == 1 and row.overlap_param_gather and row.bucket_size_MB == 100, row.id
        assert row.reduce_dtype == "param" and row.grad_accumulation_fusion and row.attention_kernel == "fa2", row.id
        assert not row.not_expressible and row.assumed and row.recipe, row.id
        assert any("DistributedFusedAdam" in d for d in row.deviations), row.id
        # v3.1's custom.yaml sets no fp8_params (NeMo bd0b818 has none): bf16 weights, cast each step
        assert not row.fp8_params and any(a.startswith("fp8 weights off") for a in row.assumed), row.id
    # the 64-node config script says MINIBS 192; the row follows the log (GBS 2048) and says so
    assert any("MINIBS=192" in d for d in ROWS[0].deviations)
    assert not any("MINIBS=192" in d for r in ROWS[1:] for d in r.deviations)


def test_published_figure_is_the_median_step_time_as_tokens_per_second_per_gpu() -> None:
    """GBS x 2048 tokens / (median of the three runs' median step times) / GPUs, e.g. 64 nodes:
    2048 x 2048 / 11.0539 s / 512 = 741.1 tokens/s/GPU; the row states that conversion."""
    for row, (nodes, (gbs, _, medians)) in zip(ROWS, LOGS.items(), strict=True):
        step_s = statistics.median(medians)
        expected = gbs * SEQ / step_s / (8 * nodes)
        assert abs(row.published - expected) < 0.06, (row.id, row.published, expected)
        assert f"{step_s:.4f} s" in row.conversion and row.metric == "tokens_per_s_per_gpu", row.id
    assert abs(ROWS[0].published - 741.1) < 0.05 and abs(ROWS[-1].published - 550.8) < 0.05


def test_layouts_validate_and_give_every_virtual_stage_one_layer() -> None:
    """The layout covers exactly the submission's GPUs, carries fp8 and userbuffers overlap, and 96 layers over
    PP 8 x VP 12 is one layer per virtual stage; the preset pads GPT-3's vocabulary as NeMo does at TP 4."""
    assert get_model("nemo-gpt3-175b").vocab_size == 50688
    for row in ROWS:
        layout = modern_devset.dev_layout(row)
        assert layout.world_size == row.gpus and layout.schedule == "interleaved-1f1b", row.id
        assert layout.fp8_recipe == "delayed" and layout.tp_comm_overlap and layout.sequence_parallel, row.id
        assert layout.bucket_size_MB == 100 and layout.overlap_param_gather, row.id
        assert get_model(row.model).num_layers == row.pp * row.vpp == 96, row.id


# -- MLPerf v4.0 / v4.1 (session 14) ------------------------------------------------------------------------
# Typed from the logs: (round, nodes) -> (global_batch_size, gradient_accumulation_steps, the three runs' medians in s)
# v4.0 (mlcommons/training_results_v4.0 62f111b, no tracked_stats lines): median over each run's MLLOG blocks of
# (block_stop - block_start) / steps in the block; v4.1 (swsok/training_results_v4.1 b9b0547): median of every
# 'train_step_timing in s' line.
LOGS_4X = {
    ("mlperf40", 64): (2304, 72, (10.9030, 10.9832, 10.9822)),
    ("mlperf40", 1344): (2688, 6, (0.9207, 0.9206, 0.9210)),
    ("mlperf40", 1452): (2904, 6, (0.9224, 0.9214, 0.9214)),
    ("mlperf41", 32): (2048, 128, (18.3716, 18.3743, 18.4212)),
    ("mlperf41", 64): (2048, 64, (9.4931, 9.5542, 9.4964)),
}
# (round, nodes) -> the config script's TP, PP, INTERLEAVED_PIPELINE, MICRO_BATCH_SIZE, BUCKET_CAP_MB
CONFIGS_4X = {
    ("mlperf40", 64): (4, 8, 4, 2, 200),      # config_DGXH100_64x8x128x4x8_mbs2.sh + config_common.sh
    ("mlperf40", 1344): (4, 6, 8, 1, 200),    # config_DGXH100_1344x8x6x4x6_mbs1_cg.sh
    ("mlperf40", 1452): (4, 6, 8, 1, 200),    # config_DGXH100_1452x8x6x4x6_mbs1_cg.sh
    ("mlperf41", 32): (4, 8, 6, 2, 125),      # config_DGXH100_32x8x256x4x8_mbs2.sh ("Fix OOM": BUCKET_CAP_MB=125)
    ("mlperf41", 64): (4, 8, 6, 2, 200),      # config_DGXH100_64x8x128x4x8_mbs2.sh
}
ROWS_4X = [r for r in DEV_ROWS if r.source in (MLPERF_40, MLPERF_41)]


def test_v4_rows_carry_the_logs_batch_and_the_config_scripts_layout() -> None:
    """Five rows (v4.0: 64, 1344, 1452 nodes; v4.1: 32, 64), each with the log's GBS, the config's TP / PP / VP /
    MBS / bucket size, MBS = GBS / (DP x gradient_accumulation_steps), cuDNN attention ('auto') and apex's sync;
    the v4.1 1452-node folder (the v4.0 runs again) is not a second row."""
    assert [(r.id.split("-")[0], r.gpus // 8) for r in ROWS_4X] == list(LOGS_4X)
    for row, ((rnd, nodes), (gbs, ga, _)) in zip(ROWS_4X, LOGS_4X.items(), strict=True):
        tp, pp, vpp, mbs, bucket = CONFIGS_4X[(rnd, nodes)]
        assert row.id == f"{rnd}-gpt3-{8 * nodes}" and row.source is (MLPERF_40 if rnd == "mlperf40" else MLPERF_41)
        assert (row.tp, row.pp, row.vpp, row.cp, row.dp) == (tp, pp, vpp, 1, 8 * nodes // (tp * pp)), row.id
        assert row.global_batch == gbs and row.micro_batch == mbs == gbs // (row.dp * ga), row.id
        assert row.bucket_size_MB == bucket and row.attention_kernel == "auto" and row.zero_impl == "apex", row.id
        assert row.fp8_recipe == "delayed" and row.sequence_parallel and row.tp_comm_overlap, row.id
        assert get_model(row.model).num_layers % (row.pp * row.vpp) == 0, row.id
        # config_common.sh FP8_PARAMS=True -> custom.yaml fp8_params: simulated with fp8 weights (session 15)
        assert row.fp8_params and modern_devset.dev_layout(row).fp8_params, row.id
        assert any("FP8_PARAMS=True" in a for a in row.assumed), row.id
        assert any(("block spacing" in d) == (rnd == "mlperf40") for d in row.deviations), row.id
    assert "62f111b7690f163b269f32e4f93dcaaa13717c9c" in MLPERF_40.url
    assert "b9b05477c3102b3ca834974c75d34a2c424f0f88" in MLPERF_41.url
    # the 64-node v4.0 config says MINIBS 128 (GBS 2048); the log says 2304 and the row follows it
    assert any("MINIBS=128" in d for d in ROWS_4X[0].deviations)
    # CUDA graphs only where the config sets LAYER_CUDA_GRAPH=1 (the *_cg.sh scripts)
    assert [any("LAYER_CUDA_GRAPH" in d for d in r.deviations) for r in ROWS_4X] == [False, True, True, False, False]


def test_v4_figures_are_the_median_step_time_as_tokens_per_second_per_gpu() -> None:
    """GBS x 2048 / (median of the three runs' medians) / GPUs, e.g. v4.1 32 nodes: 2048 x 2048 / 18.3743 s / 256 =
    891.7 tokens/s/GPU; v4.0 1344 nodes: 2688 x 2048 / 0.9207 s / 10752 = 556.1."""
    for row, (_, (gbs, _, medians)) in zip(ROWS_4X, LOGS_4X.items(), strict=True):
        step_s = statistics.median(medians)
        assert abs(row.published - gbs * SEQ / step_s / row.gpus) < 0.06, row.id
        assert f"{step_s:.4f} s" in row.conversion, row.id
    published = {r.id: r.published for r in ROWS_4X}
    assert abs(published["mlperf41-gpt3-256"] - 891.7) < 0.05 and abs(published["mlperf40-gpt3-10752"] - 556.1) < 0.05


def test_v4_layouts_validate() -> None:
    """Each layout covers the submission's GPUs with the interleaved schedule, fp8 and apex's bucket size."""
    for row in ROWS_4X:
        layout = modern_devset.dev_layout(row)
        assert layout.world_size == row.gpus and layout.schedule == "interleaved-1f1b", row.id
        assert layout.fp8_recipe == "delayed" and layout.bucket_size_MB == row.bucket_size_MB, row.id


def test_dropout_follows_each_rounds_config_and_fuser() -> None:
    """conf/custom.yaml sets hidden_dropout and attention_dropout 0.0 in every round (v3.1 lines 71-72, v4.0 73-74,
    v4.1 74-75). The v4.x layouts say so (Layout.dropout 'off': TE's torch.compile'd bias-dropout-add draws no mask
    at p = 0); v3.1 keeps the GPT recipe's masks ('auto'), because its TorchScript bias-dropout-add draws and saves
    a mask whatever p is."""
    for row in ROWS_4X:
        assert modern_devset.dev_layout(row).dropout == "off", row.id
    for row in ROWS:
        assert modern_devset.dev_layout(row).dropout == "auto", row.id
