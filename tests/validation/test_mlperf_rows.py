"""The MLPerf Training v3.1 GPT-3 175B dev rows (session 13): NVIDIA's DGX H100 (Eos) submission.

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
from modern_data import DEV_ROWS, MLPERF_31  # noqa: E402

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
