"""NeMo 24.07 performance table rows of the modern dev set (issue 12): FP8 (delayed scaling) pre-training
on DGX-H100, with the recipe read from NeMo-Framework-Launcher 24.07 beside each row."""

from __future__ import annotations

from devrow import DevRow, Source

NEMO_2407 = Source(
    document="NeMo docs/source/performance/performance_summary.md",
    section="Pretraining table (FP8, container NeMo 24.07, DGX-H100)",
    url="https://github.com/NVIDIA/NeMo/blob/9c5c5e9709407d3511005fc966e45374998bb478/docs/source/performance/"
        "performance_summary.md",
    version="NeMo 24.07 container; table of commit 9c5c5e9 (2024-09-09, '24.07 perf numbers'), the figures that "
            "replaced the 'vboost numbers' of ccef6aa (2024-08-22); recipes read from NeMo-Framework-Launcher tag "
            "24.07 (commit 8325688): launcher_scripts/conf/training/<model>.yaml, conf/config.yaml and "
            "examples/training/*/h100/*fp8*.sh",
)
_LAUNCHER = "NeMo-Framework-Launcher 24.07 launcher_scripts/conf"
_NEMO_2407_ASSUMED = (
    "fp8 recipe: Transformer Engine delayed scaling (DelayedScaling, the only recipe TE had in 2024), HYBRID "
    "format (E4M3 forward, E5M2 gradients): the table says only 'FP8'; the launcher's fp8 examples set "
    "training.model.fp8=true (+ fp8_hybrid=True for Llama), the training configs amax_history_len 1024 / 'max' "
    "(GPT-3, Llama 3) or 1 / 'most_recent' (Llama 2)",
    "fp8 weights off (Layout.fp8_params False): no training config or example script of the launcher at 24.07 sets "
    "fp8_params (only conf/training/gpt3/mlperf.yaml line 270, mlperf-24n.yaml line 304 and the examples/peft "
    "scripts do), and NeMo reads cfg.get('fp8_params', False) (megatron_gpt_model.py line 342 at r2.0.0rc1)",
    "everything the table does not state is the launcher's training config of that model at tag 24.07 plus the "
    "overrides of its H100 fp8 example script: no activation recompute (activations_checkpoint_granularity null), "
    "Transformer Engine layers, gradient_accumulation_fusion true, optimizer distributed_fused_adam with "
    "overlap_grad_sync and overlap_param_sync true and bucket_cap_mb of the config, and grad_sync_dtype=bf16 "
    "(every fp8 example script: 16-bit gradient reduce-scatter)",
    f"attention: Transformer Engine's flash-attn (FA2) backend, not cuDNN: {_LAUNCHER}/config.yaml line 72 sets "
    "env NVTE_FUSED_ATTN=0 for every training job ('Disable cudnn FA until we've tested it more'); "
    "NCCL_NVLS_ENABLE=0 (line 70), CUDA_DEVICE_MAX_CONNECTIONS=1 (nemo_launcher/core/stages.py lines 566-574)",
    f"dropout: {_LAUNCHER}/training/gpt3/{{5b,20b,175b}}.yaml hidden_dropout 0.1, attention_dropout 0.1 (lines "
    "74-75), llama/llama2_*.yaml and llama3_*.yaml 0.0 (hidden, attention, ffn; lines 71-73 / 73-75), no example "
    "script overrides them: each model's usual recipe (Layout.dropout 'auto'); FA2's in-kernel attention dropout "
    "of the GPT-3 rows is not priced: no public measurement of its cost on H100 was found (docs/design.md, "
    "'Dropout as the recipes apply it (session 16)')",
    "cluster: DGX H100 with NDR InfiniBand (the table names the system DGX-H100)",
    "Transformer Engine v1.8 as the container's (its version is not in the sources read): with TP and without "
    "userbuffers (the GPT-3 175B rows) the backward's sequence-parallel collectives run asynchronously beside the "
    "weight-gradient GEMMs (module/layernorm_linear.py lines 444, 564-565; layernorm_mlp.py 630, 919-920), "
    "simulated as tp_async_grad_comm",
)
_NEMO_VBOOST = ("clocks: the published figures are runs with vboost ('nvidia-smi boost-slider --vboost 1', which "
                "shifts power from memory to the SMs; NeMo commit ccef6aa '24.07 vboost numbers' moved the table "
                "by -3 to +7 %); the simulator's H100 runs at its profile's sustained clock, vboost not modelled")
_NEMO_DISTOPT = ("optimizer: NeMo's apex DistributedFusedAdam (distributed_fused_adam) is simulated with Layout.zero_impl "
                 "'apex' (docs/design.md, 'apex distributed Adam sync (session 13)'): one bucket per transformer layer "
                 "padded to whole bucket_cap_mb state buckets, parameter gathers per model chunk as Megatron-Core's "
                 "interleaved schedule calls param_sync_func, reduce-scatters per chunk as it calls grad_sync_func, read "
                 "from NeMo r2.0.0rc1, Megatron-Core core_r0.8.0 and apex f3f04924 (the container's apex commit is not "
                 "stated in the sources read); not modelled: apex's sharded gradient buffer (ZeRO-2 memory), the copy "
                 "out of the gathered bucket, the first bucket's gather beside the rest of the optimizer step, and "
                 "with pp > 1 the output layer's parameters syncing in the first chunk's bucket (here the last chunk's)")
_NEMO_VOCAB_PAD = ("vocabulary: NeMo pads it to a multiple of 128 x TP (Llama 2 32000 -> 32256, Llama 3 128256 -> "
                   "128512 at TP 4); the preset keeps the unpadded size (< 0.5 % of the step's FLOPs)")

# (id suffix, model, seq, GPUs, GBS, MBS, TP, PP, CP, VP, tokens/s/GPU, model TFLOP/s/GPU as printed,
#  launcher training config, fp8 example script, sequence parallel, ub_tp_comm_overlap, bucket_cap_mb)
# Table columns from NeMo 9c5c5e9; sp / ub / bucket read from the config at 24.07 (line numbers in the recipe).
_NEMO_2407_ROWS: tuple[tuple[str, str, int, int, int, int, int, int, int, int, float, str, str, str, bool, bool,
                             float], ...] = (
    ("gpt3-5b", "nemo-gpt3-5b", 2048, 64, 2048, 4, 1, 1, 1, 1, 23406, "765",
     "training/gpt3/5b.yaml (sequence_parallel line 106, ub_tp_comm_overlap 149, bucket_cap_mb 171)",
     "gpt/h100/5b_fp8_8node.sh", False, False, 400),
    ("gpt3-20b", "nemo-gpt3-20b", 2048, 64, 256, 2, 2, 1, 1, 1, 5851, "750",
     "training/gpt3/20b.yaml (sequence_parallel line 106, ub_tp_comm_overlap 149, bucket_cap_mb 172)",
     "gpt/h100/20b_fp8_8node.sh", True, True, 220),
    ("gpt3-175b-128", "nemo-gpt3-175b", 2048, 128, 256, 1, 4, 8, 1, 6, 716, "771",
     "training/gpt3/175b.yaml (sequence_parallel line 106, overlap_p2p_comm 108, ub_tp_comm_overlap false 149, "
     "bucket_cap_mb 172)", "gpt/h100/175b_fp8_16node.sh", True, False, 220),
    ("gpt3-175b-512", "nemo-gpt3-175b", 2048, 512, 2048, 2, 4, 8, 1, 6, 825, "888",
     "training/gpt3/175b.yaml (sequence_parallel line 106, overlap_p2p_comm 108, ub_tp_comm_overlap false 149, "
     "bucket_cap_mb 172)", "gpt/h100/175b_fp8_16node.sh", True, False, 220),
    ("llama2-7b", "llama2-7b", 4096, 8, 128, 1, 1, 1, 1, 1, 16934, "780",
     "training/llama/llama2_7b.yaml (sequence_parallel line 126, ub_tp_comm_overlap 138, bucket_cap_mb 156)",
     "llama/h100/llama2_7b_fp8.sh", False, False, 125),
    ("llama2-13b", "llama2-13b", 4096, 16, 128, 1, 1, 4, 1, 10, 8715, "760",
     "training/llama/llama2_13b.yaml (sequence_parallel line 126, ub_tp_comm_overlap 136, overlap_p2p_comm 137, "
     "bucket_cap_mb 156)", "llama/h100/llama2_13b_fp8.sh", False, False, 125),
    ("llama2-70b", "llama2-70b", 4096, 64, 128, 1, 4, 4, 1, 20, 1728, "768",
     "training/llama/llama2_70b.yaml (sequence_parallel line 126, ub_tp_comm_overlap 136, bucket_cap_mb 157)",
     "llama/h100/llama2_70b_fp8.sh", True, True, 125),
    ("llama3-8b", "llama3-8b", 8192, 8, 128, 1, 1, 1, 2, 1, 12273, "711",
     "training/llama/llama3_8b.yaml (context_parallel_size line 63, sequence_parallel 125, ub_tp_comm_overlap "
     "136, bucket_cap_mb 153)", "llama/h100/llama3_8b_fp8.sh", False, False, 125),
    ("llama3-70b", "llama3-70b", 8192, 64, 128, 1, 4, 4, 2, 5, 1524, "734",
     "training/llama/llama3_70b.yaml (sequence_parallel line 125, ub_tp_comm_overlap 136, bucket_cap_mb 155; "
     "the fp8 example picks tp_overlap ub_cfg_h100_fp8_h8192_tp4_mbs1_seqlen8192)",
     "llama/h100/llama3_70b_fp8.sh", True, True, 125),
)


def _nemo_2407_row(suffix: str, model: str, seq: int, gpus: int, gbs: int, mbs: int, tp: int, pp: int, cp: int,
                   vp: int, tps: float, tflops: str, config: str, script: str, sp: bool, ub: bool,
                   bucket_MB: float) -> DevRow:
    padded = tp > 1 and model.startswith("llama")
    return DevRow(
        id=f"nemo2407-{suffix}", source=NEMO_2407, gpu="H100", cluster="dgx-h100-ndr", model=model,
        seq_length=seq, dp=gpus // (tp * pp * cp), tp=tp, pp=pp, cp=cp, vpp=vp, zero=1, zero_impl="apex",
        micro_batch=mbs, global_batch=gbs, sequence_parallel=sp, tp_comm_overlap=ub, overlap_param_gather=True,
        reduce_dtype="param", bucket_size_MB=bucket_MB, grad_accumulation_fusion=True, attention_kernel="fa2",
        # Transformer Engine v1.8 without userbuffers, sequence parallel: the backward re-gathers the column-parallel
        # input with async_op=True and reduce-scatters dgrad with async_op=True beside the wgrad GEMM
        # (module/layernorm_linear.py lines 444 and 564-565, layernorm_mlp.py 630 and 919-920, linear.py 425, 512-513)
        tp_async_grad_comm=tp > 1 and not ub,
        # every pipelined row's launcher config sets overlap_p2p_comm true, batch_p2p_comm false (gpt3/175b.yaml lines
        # 108-109, llama2_13b.yaml 137-138, llama2_70b.yaml 140-141, llama3_70b.yaml 138-139), which NeMo r2.0.0rc1
        # hands to Megatron-Core's ModelParallelConfig (megatron_base_model.py lines 1174-1177)
        p2p_order="megatron-core" if vp > 1 else "witness",
        fp8_recipe="delayed", metric="tokens_per_s_per_gpu", published=tps,
        published_text=f"{tps:.0f} Tokens/sec/GPU ({tflops} model TFLOP/s/GPU)", conversion="as published",
        recipe=f"FP8 pre-training on {gpus} H100, GBS {gbs}, MBS {mbs}, seq {seq}, TP {tp}, PP {pp}, CP {cp}, "
               f"VP {vp} (table); {_LAUNCHER}/{config}; examples/training/{script} (fp8=true, "
               "optim.grad_sync_dtype=bf16)",
        assumed=_NEMO_2407_ASSUMED,
        deviations=(_NEMO_VBOOST, _NEMO_DISTOPT, *((_NEMO_VOCAB_PAD,) if padded else ())),
    )


NEMO_2407_ROWS: tuple[DevRow, ...] = tuple(_nemo_2407_row(*r) for r in _NEMO_2407_ROWS)
"""The dense models of the table ModelSpec expresses, in table order."""
