"""MLPerf Training v3.1 GPT-3 175B dev rows (issue 12 item 4, session 13): NVIDIA's closed-division submission on
DGX H100 (Eos), one row per system size, the figure read from the submission's own MLLOG result files.

What the figure is: NeMo's ``train_step_timing`` (the ``tracked_stats`` lines of each ``result_N.txt``), the
median over every training step of a run, then the median over the configuration's three runs; converted to
tokens per second per GPU as ``global_batch_size x max_sequence_length / step_s / GPUs`` (both read from the log's
hyperparameter lines). The MLPerf score itself (time to train, with evaluation and start-up) is not used.
"""

from __future__ import annotations

from devrow import DevRow, Source

_REPO = "mlcommons/training_results_v3.1"
_COMMIT = "d06288b2bd675a9d88e0e6181f5bb5626b71ec19"
_IMPL = "NVIDIA/benchmarks/gpt3/implementations/pytorch"

MLPERF_31 = Source(
    document=f"{_REPO} NVIDIA/results/<system>_ngc23.09_nemo/gpt3/result_{{0,1,2}}.txt",
    section="MLLOG tracked_stats train_step_timing (GPT-3 175B, closed division, DGX H100 Eos)",
    url=f"https://github.com/{_REPO}/tree/{_COMMIT}/NVIDIA/results",
    version="MLPerf Training v3.1 (results uploaded 2023-11-07, f33f944); container nvcr.io/nvidia/pytorch:23.09 "
            "with NeMo bd0b818 (r1.20.0 base), Megatron-LM df72712, Transformer Engine 09ba842, flash-attn 2.0.8 "
            f"({_IMPL}/Dockerfile); recipe read from {_IMPL} at {_COMMIT[:7]}",
)

#: Assumptions shared by every v3.1 row; mlperf4_data reuses its vocabulary and cluster entries.
V31_ASSUMED = (
    "what the figure measures: NeMo's TimingCallback (nemo/utils/exp_manager.py lines 174-198 at NeMo bd0b818) "
    "times on_train_batch_start to on_train_batch_end, i.e. Lightning's whole training step: the data fetch "
    "(next(dataloader_iter) inside the micro-batch forward), forward/backward over every micro-batch, the "
    "sequence-parallel norm all-reduce, the embedding all-reduce and the optimizer step (megatron_gpt_model.py "
    "lines 535-600); the timer does not synchronise CUDA (nemo/utils/timers.py sync_cuda=False), and the spacing "
    "of consecutive tracked_stats lines is ~20 ms longer (11.065 vs 11.045 s at 64 nodes, 0.948 vs 0.926 s at 1280), "
    "the host work between two steps; custom_callbacks.py lines 127-186 only forward the value to MLLOG",
    "fp8: config_fp8.sh FP8=True, FP8_HYBRID=True (E4M3 forward, E5M2 gradients), FP8_AMAX_HISTORY=1024, "
    "FP8_AMAX_ALGO=max, FP8_REDUCE_AMAX=True: Transformer Engine DelayedScaling (the only recipe of TE 09ba842)",
    "fp8 weights off (Layout.fp8_params False): conf/custom.yaml sets no fp8_params and the row's NeMo bd0b818 has no "
    "such option (no fp8_params, fp8_model_init or Float8Tensor under nemo/), so the weights stay bf16 and are "
    "cast to fp8 each step; fp8 weights arrive with NeMo v2.0.0.rc0.beta (the v4.x rows)",
    "layout: config_DGXH100_<nodes>x8x<MINIBS>x4x8_mbs1.sh TP 4, PP 8, MICRO_BATCH_SIZE=1, TP_COMM_OVERLAP=True; "
    "conf/custom.yaml virtual pipeline 12 (line 62, INTERLEAVED_PIPELINE unset), sequence_parallel True (line 97), "
    "no activation recompute (line 94, granularity null), gradient_accumulation_fusion True (line 88), "
    "overlap_p2p_comm True (line 76); the global batch is the log's global_batch_size and the micro-batch follows "
    "from its gradient_accumulation_steps = GBS / (DP x MBS)",
    "optimizer: config_common.sh USE_DIST_OPTIMIZER=True -> run_and_time.sh line 117 "
    "optim@model.optim=distributed_fused_adam: conf/optim/distributed_fused_adam.yaml bucket_cap_mb 100 (line 2), "
    "overlap_grad_sync and overlap_param_sync True (lines 3-4), grad_sync_dtype bf16 (line 6)",
    "attention: flash-attn 2.0.8 (FA2) through Transformer Engine: at TE 09ba842 transformer_engine/pytorch/"
    "attention.py DotProductAttention enables flash-attn unless NVTE_FLASH_ATTN=0 (lines 1493-1496; config_common.sh "
    "leaves that line commented out) and takes it before cuDNN fused attention (line 1747)",
    "vocabulary: the SentencePiece tokenizer's size is not in the repository; GPT-3's 50257, padded by NeMo to a "
    "multiple of 128 x TP 4 = 50688 (make_vocab_size_divisible_by 128 in NeMo's megatron_gpt_config.yaml line 74), "
    "the preset's size",
    "dropout: conf/custom.yaml sets hidden_dropout 0.0 and attention_dropout 0.0 (lines 71-72), but the row keeps "
    "the GPT recipe's dropout masks (Layout.dropout 'auto'): the hidden dropout runs in Transformer Engine 09ba842's "
    "bias_dropout_add_fused_train_, a torch.jit.script function (transformer_engine/pytorch/jit.py lines 137-142), "
    "and TorchScript's autodiff formula for dropout on CUDA draws rand_like(input) < 1 - p and saves that mask "
    "whatever p is (PyTorch symbolic_script.cpp 'def dropout'); flash-attn 2.0.8 with dropout_p 0 draws nothing, "
    "and the simulator prices no in-kernel dropout either way",
    "cluster: Eos, DGX H100 nodes with NDR InfiniBand (submission_platform 'NxNVIDIA DGX H100'); the simulator's "
    "H100 at its profile's sustained clock",
)
_DISTOPT = ("optimizer: NeMo's apex DistributedFusedAdam (distributed_fused_adam) is simulated with Layout.zero_impl "
            "'apex' (docs/design.md, 'apex distributed Adam sync (session 13)'), whose places are the same at this "
            "row's NeMo bd0b818 (megatron_gpt_model.py per-layer buckets lines 439-444, sync functions 461-462) and "
            "Megatron-LM df72712 (schedules.py param_sync_func lines 511-513, 559-563, grad_sync_func 623-629); the "
            "23.09 container's apex commit is not stated: read at 52e18c89 (2023-09-06), whose parameter-sync code "
            "matches 810ffae3's; not modelled: apex's sharded gradient buffer (ZeRO-2 memory), the copy out of the "
            "gathered bucket, the first bucket's gather beside the rest of the optimizer step, the output layer's "
            "parameters syncing in the first chunk's bucket")
_USERBUFFERS = ("TP overlap: the simulator's tp_comm_overlap is Transformer Engine's chunked userbuffers overlap; "
                "the recipe's per-GEMM methods (conf/tp_overlap/h100tp4pp8mbs1.yaml: ring-exchange all-gathers, "
                "4-split pipelined reduce-scatters on 24 / 4 SMs, bulk dgrad/wgrad overlaps) and the fp8 atomic-GEMM "
                "reduce-scatter (config_common.sh NVTE_UB_ATOMIC_GEMM_RS=1, NVTE_RS_STRIDED_ATOMIC=1) are not "
                "modelled one by one, nor the 8-SM layer-norm margins (NVTE_FWD/BWD_LAYERNORM_SM_MARGIN=8)")
_AMAX = (
    "fp8 amax reduction (Layout.fp8_amax_reduction 'tp-async-region', docs/design.md 'TE amax reduction (session "
    "16)'): TE 09ba842 reduces the autocast region's amaxes (NeMo bd0b818 transformer.py lines 1474-1481: one "
    "fp8_autocast per chunk's ParallelTransformer forward) at the autocast exit (fp8.py line 401) and after the "
    "region's first module's backward (module/base.py lines 96-104): torch.cat, then a MAX all-reduce; "
    "config_common.sh NVTE_DP_AMAX_REDUCE_INTERVAL=0 makes it the tensor-parallel group (fp8.py lines 329-356) and "
    "NVTE_ASYNC_AMAX_REDUCTION=1 async_op=True (base.py lines 275-277), waited for by the next forward's first "
    "module (lines 612-616) and the next module backward (lines 74-77); 4 GEMMs x 3 (forward) / 2 (backward) fp32 "
    "amaxes per layer, attention has none at 09ba842; no CUDA graphs in the v3.1 configs")
_N64_BATCH = ("batch at 64 nodes: config_DGXH100_64x8x192x4x8_mbs1.sh sets MINIBS=192 (GBS 3072), but the log "
              "prints global_batch_size 2048 and gradient_accumulation_steps 128, its steps advance 4194304 = 2048 x "
              "2048 tokens and its LR warmup is 198 = 407040 / 2048 steps: the run used GBS 2048 (MINIBS 128), "
              "which the row takes")

# (system directory, nodes, GBS, gradient_accumulation_steps, config script, median train_step_timing of
#  result_0 / result_1 / result_2 in s (read from the logs), tokens/s/GPU = GBS x 2048 / median / GPUs)
# Medians over all train_step_timing lines of each run (288, 288, 288 steps at 64 nodes ...); figure = median of
# the three run medians.
_MLPERF_ROWS: tuple[tuple[str, int, int, int, str, tuple[float, float, float], float], ...] = (
    ("eos_n64", 64, 2048, 128, "config_DGXH100_64x8x192x4x8_mbs1.sh", (11.0453, 11.0550, 11.0539), 741.1),
    ("eos_n96", 96, 3072, 128, "config_DGXH100_96x8x128x4x8_mbs1.sh", (11.0723, 11.0779, 11.0754), 739.7),
    ("eos-dfw_n512", 512, 2048, 16, "config_DGXH100_512x8x16x4x8_mbs1.sh", (1.6084, 1.6081, 1.6098), 636.7),
    ("eos-dfw_n768", 768, 3072, 16, "config_DGXH100_768x8x16x4x8_mbs1.sh", (1.6159, 1.6152, 1.6150), 634.0),
    ("eos-dfw_n1024", 1024, 4096, 16, "config_DGXH100_1024x8x16x4x8_mbs1.sh", (1.6193, 1.6192, 1.6192), 632.4),
    ("eos-dfw_n1280", 1280, 2560, 8, "config_DGXH100_1280x8x8x4x8_mbs1.sh", (0.9256, 0.9255, 0.9256), 553.2),
    ("eos-dfw_n1344", 1344, 2688, 8, "config_DGXH100_1344x8x8x4x8_mbs1.sh", (0.9296, 0.9296, 0.9296), 550.8),
)
_SEQ = 2048
"""max_sequence_length in every log (conf/custom.yaml encoder_seq_length line 64)."""
_TP, _PP, _VPP = 4, 8, 12


def mlperf_row(system: str, nodes: int, gbs: int, ga: int, config: str, run_medians: tuple[float, float, float],
               tps: float, *, round_id: str = "mlperf31", source: Source = MLPERF_31, impl: str = _IMPL,
               tp: int = _TP, pp: int = _PP, vpp: int = _VPP, bucket_size_MB: float = 100, attention_kernel: str = "fa2",
               timing: str = "train_step_timing", config_files: str = "config_common.sh, config_fp8.sh, conf/custom.yaml",
               assumed: tuple[str, ...] | None = None, deviations: tuple[str, ...] | None = None,
               fp8_params: bool = False, fp8_amax_reduction: str = "tp-async-region",
               fp8_attention_amax: bool = False, dropout: str = "auto") -> DevRow:
    """One NVIDIA MLPerf GPT-3 175B row on DGX H100 (Eos) from its result directory ``system``
    (``<name>_ngc<container>_nemo``), the log's batch, the config script and the three runs' median step times;
    the defaults are the v3.1 round's recipe (session 13), the MLPerf v4.x rows (mlperf4_data.py) pass theirs."""
    gpus = nodes * 8
    dp = gpus // (tp * pp)
    step_s = sorted(run_medians)[1]
    mbs = gbs // (dp * ga)
    if assumed is None:
        assumed = (*V31_ASSUMED, _AMAX)
    if deviations is None:
        deviations = (_DISTOPT, _USERBUFFERS, *((_N64_BATCH,) if nodes == 64 else ()))
    return DevRow(
        id=f"{round_id}-gpt3-{gpus}", source=source, gpu="H100", cluster="dgx-h100-ndr", model="nemo-gpt3-175b",
        seq_length=_SEQ, dp=dp, tp=tp, pp=pp, vpp=vpp, zero=1, zero_impl="apex", micro_batch=mbs,
        global_batch=gbs,
        sequence_parallel=True, tp_comm_overlap=True, overlap_param_gather=True, reduce_dtype="param",
        bucket_size_MB=bucket_size_MB, grad_accumulation_fusion=True, attention_kernel=attention_kernel,
        # overlap_p2p_comm defaults True, batch_p2p_comm False in the round's conf/custom.yaml (v3.1 lines 76-77,
        # v4.0 78-79, v4.1 eos_n32/n64 79-80) and no config script sets OVERLAP_P2P_COMM; the interleaved schedule's
        # overlapped path is the same at Megatron-LM df72712, 3c0f3ef and dd18205 as at 338af514
        p2p_order="megatron-core" if vpp > 1 else "witness",
        fp8_recipe="delayed", fp8_params=fp8_params, fp8_amax_reduction=fp8_amax_reduction,
        fp8_attention_amax=fp8_attention_amax, dropout=dropout, metric="tokens_per_s_per_gpu", published=tps,
        # the logs print step times; the tokens/s/GPU figure is derived from them (conversion)
        published_text=f"{tps:.1f} tokens/s/GPU (derived: median {timing} {step_s:.4f} s, runs "
                       f"{', '.join(f'{m:.4f}' for m in run_medians)} s, GBS {gbs} x seq {_SEQ})",
        conversion=f"{gbs} x {_SEQ} tokens / {step_s:.4f} s / {gpus} GPUs = {tps:.1f} tokens/s/GPU",
        recipe=f"GPT-3 175B fp8 on {nodes} DGX H100 ({gpus} GPUs), TP {tp}, PP {pp}, VP {vpp}, DP {dp}, "
               f"GBS {gbs}, MBS {mbs}, seq {_SEQ}; NVIDIA/results/{system}/gpt3; {impl}/{config}, {config_files}",
        assumed=assumed,
        deviations=deviations,
    )


MLPERF_31_ROWS: tuple[DevRow, ...] = tuple(mlperf_row(f"{r[0]}_ngc23.09_nemo", *r[1:]) for r in _MLPERF_ROWS)
"""One row per system size of NVIDIA's DGX H100 GPT-3 submission, smallest first."""
