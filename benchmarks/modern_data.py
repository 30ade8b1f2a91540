"""The modern dev set (issue 12): published H100 and A100 training throughputs whose source states the layout.

Every row carries its source beside the data (document, table or section, address, version and date), the
published figure exactly as printed, how it converts to tokens per second per GPU (the convention-free
quantity every row is compared on), the recipe the source states, what the source leaves unstated and
this file assumes (``assumed``), and where the simulator cannot express the recipe and runs the nearest
layout it can (``deviations``). A row the simulator cannot run at all says why in ``not_expressible``.

Sources used (each row names its own):

* Megatron-LM README, "Training Speed and Scalability": the H100 weak-scaling table (images/model_table.png,
  commit f2e5db4, 2024-07-15, Megatron-Core r0.8.0).
* torchtitan ``benchmarks/llama3_h100_202412_torchtitan.md`` (Tables 1 and 3, bf16 rows) and
  ``benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md`` (bf16 "vanilla TP" column).
* torchtitan ``docs/performance.md`` of 2024-04-16 (commit 528cab9): Llama 2 13B / 70B with FSDP2 on
  64 A100 80GB, the ZeRO-3 rows on A100.
* NeMo AutoModel ``docs/performance-summary`` (pre-training, DGX-H100, BF16): Llama 3.1 70B with FSDP2 and
  context parallelism (recipe ``custom_llama3_1_70b_pretrain_benchmark_8nodes.yaml`` at commit 2013a4d).

* NeMo ``docs/source/performance/performance_summary.md`` (commit 9c5c5e9, container NeMo 24.07, DGX-H100, FP8):
  GPT-3 5B / 20B / 175B and Llama 2 7B / 13B / 70B, Llama 3 8B / 70B pre-training, recipes read from
  NeMo-Framework-Launcher tag 24.07 (session 12: fp8 rows, ``fp8_recipe``).
* MLPerf Training v3.1 GPT-3 175B, NVIDIA's DGX H100 (Eos) results, 512 to 10752 GPUs, fp8: the step time of
  the submission's MLLOG files (``mlperf_data.py``, session 13).
* MLPerf Training v4.0 (512, 10752, 11616 GPUs) and v4.1 (256, 512 GPUs) GPT-3 175B, NVIDIA's DGX H100 (Eos)
  results, fp8 with fp8 weights (``mlperf4_data.py``, session 14).

Considered and not used are listed in :data:`EXCLUDED` with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from devrow import (  # noqa: F401  (re-exported: the harness and tests import them from here)
    DEV_MAE_TARGET,
    DEV_ROW_TOLERANCE,
    DEV_SIGNED_TARGET,
    HALF_PEAK,
    DevRow,
    MetricKind,
    Source,
    megatron_core_flops_per_step,
)
from mlperf4_data import MLPERF_4X_ROWS, MLPERF_40, MLPERF_41  # noqa: F401
from mlperf_data import MLPERF_31, MLPERF_31_ROWS  # noqa: F401
from nemo_2407_data import NEMO_2407, NEMO_2407_ROWS  # noqa: F401

from simgrid.model.presets import MEGATRON_H100_SHAPES

# -- sources ------------------------------------------------------------------------------------------------
MEGATRON_README = Source(
    document="Megatron-LM README",
    section="Training Speed and Scalability, H100 model table (images/model_table.png)",
    url="https://github.com/NVIDIA/Megatron-LM/blob/f2e5db402c44ae309aa6448bcb4ae87e8ae0f5f4/images/model_table.png",
    version="Megatron-Core r0.8.0 (legend of the weak-scaling figure); README commit f2e5db4, 2024-07-15",
)
TITAN_2024_12 = Source(
    document="torchtitan benchmarks/llama3_h100_202412_torchtitan.md",
    section="Tables 1 and 3 (1D FSDP, Llama 3.1 8B)",
    url="https://github.com/pytorch/torchtitan/blob/820504e20d1149fbf0b98c567af24c4b0433b22d/benchmarks/"
        "llama3_h100_202412_torchtitan.md",
    version="torchtitan 9dec370 (2024-12-26), torch 1963fc8 (2024-12-23); published 2025-01-30 as "
            "docs/performance.md, moved to benchmarks/ 2025-06-13",
)
TITAN_ASYNC_TP = Source(
    document="torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md",
    section="bf16 row, 'Vanilla TP tokens/sec' column",
    url="https://github.com/pytorch/torchtitan/blob/820504e20d1149fbf0b98c567af24c4b0433b22d/benchmarks/"
        "asyncTP_llama3_h100_2025-06_torchtitan.md",
    version="torchtitan 820504e, torch 38410cf9 (2025-06-14); published 2025-06-13",
)
TITAN_2024_04 = Source(
    document="torchtitan docs/performance.md",
    section="WPS / MFU table, FSDP2 on 64 A100 80GB",
    url="https://github.com/pytorch/torchtitan/blob/528cab939/docs/performance.md",
    version="torchtitan 528cab9, 2024-04-16 (model and batch from train_configs/llama_13b.toml, llama_70b.toml "
            "at that commit)",
)
AUTOMODEL = Source(
    document="NeMo AutoModel docs/performance-summary",
    section="Pre-Training Performance, System: DGX-H100, Precision: BF16, row 'Llama3 70B'",
    url="https://github.com/NVIDIA-NeMo/Automodel/blob/2013a4dd6e932c4e4f48ca6b4a3fc295cdd64e33/docs/"
        "performance-summary.md (recipe examples/llm_pretrain/custom_llama3_1_70b_pretrain_benchmark_8nodes.yaml)",
    version="NeMo AutoModel commit 2013a4d, 2026-04-10 (FSDP2 with weight prefetching)",
)

_TITAN_HW = ("hardware: the source's H100s are 96 GB HBM2e parts at 2.4 TB/s under a 500 W power limit "
             "(Grand Teton), simulated on grand-teton-h100-rdma (GPU h100-sxm-96gb-500w); its sustained clock "
             "at 500 W is interpolated between NVIDIA's 400 W (NVL) and 700 W (SXM) ratings, not measured")
_TITAN_MEMORY = ("Memory(GiB) column: torch.cuda max reserved bytes (the caching allocator's segments, not the "
                 "tensors allocated in them), the maximum over GPUs: torchtitan/metrics.py at 9dec370 line 62 reads "
                 "memory_stats()['reserved_bytes.all.peak'], train.py lines 383 and 393 log it as max_reserved_gib, "
                 "reset after each log (line 403); 1 GiB = 2^30 bytes (metrics.py line 47)")
_TITAN_CLUSTER = "grand-teton-h100-rdma"
"""Cluster profile of the torchtitan H100 rows (Grand Teton, 96 GB HBM2e, 500 W, 400 Gb/s RDMA per GPU)."""
_COMPILE = ("torch.compile: simulated as kernel_fusion 'fused' (its fused element-wise kernels are priced as "
            "Transformer Engine's, not measured per kernel)")
_TITAN_RECIPE = ("bf16 params, fp32 gradient reduce-scatter (torchtitan mixed_precision_reduce default); "
                 "SDPA flash attention; FSDP2 reshard after forward")

_MEGATRON_H100: tuple[tuple[str, int, int, int, float], ...] = (
    # (preset suffix, tp, pp, global batch, published per-GPU TFLOP/s); dp = 48 in every row
    ("1.7b", 1, 1, 192, 408.8),
    ("7.1b", 2, 1, 192, 465.9),
    ("16b", 4, 1, 192, 489.1),
    ("32b", 8, 1, 192, 459.6),
    ("70b", 8, 2, 384, 419.7),
    ("119b", 8, 4, 768, 420.5),
    ("177b", 8, 6, 1152, 432.8),
    ("314b", 8, 8, 1536, 474.4),
    ("462b", 8, 16, 3072, 459.9),
)


def least_interleaving(layers: int, pp: int) -> int:
    """Model chunks per pipeline rank of the shallowest interleaved schedule Megatron-LM accepts for ``layers``
    over ``pp`` stages: the smallest divisor > 1 of the layers per stage (``--num-layers-per-virtual-pipeline-stage``
    must divide them, megatron/training/arguments.py lines 262-267 at f2e5db4); 1 without pipelining."""
    if pp == 1:
        return 1
    per_stage = layers // pp
    return next(v for v in range(2, per_stage + 1) if per_stage % v == 0)


_MEGATRON_H100_LAYERS = {name: layers for name, layers, _, _ in MEGATRON_H100_SHAPES}


def _megatron_row(size: str, tp: int, pp: int, gbs: int, tflops: float) -> DevRow:
    model = f"megatron-h100-{size}"
    return DevRow(
        id=f"megatron-h100-{size}", source=MEGATRON_README, gpu="H100", cluster="dgx-h100-ndr",
        model=model, seq_length=4096, dp=48, tp=tp, pp=pp, zero=1, zero_impl="megatron",
        # The README overlaps "pipeline-parallel communication (enabled by default)": --overlap-p2p-communication
        # defaults on, but Megatron-LM turns it off unless the schedule is interleaved (arguments.py lines
        # 271-277 at f2e5db4, 'non-interleaved schedule does not support overlapping p2p communication'), so
        # the pp > 1 rows ran the interleaved schedule; its depth is not stated (least_interleaving).
        vpp=least_interleaving(_MEGATRON_H100_LAYERS[model], pp),
        # the same flag's overlapped posting (schedules.py lines 834-968 at f2e5db4)
        p2p_order="megatron-core" if pp > 1 else "witness",
        micro_batch=1, global_batch=gbs, sequence_parallel=tp > 1, tp_comm_overlap=tp > 1,
        overlap_param_gather=True,
        # fp16, as every GPT training script in the repository at the table's commit passes (see A1). Megatron-LM
        # forces fp32 gradient accumulation and reduce only for bf16 (megatron/training/arguments.py lines
        # 302-305 at f2e5db4), so with fp16 the DDP grad buffers and their reduce-scatter stay 16-bit.
        precision="fp16",
        metric="model_tflops_per_gpu",
        published=tflops, published_text=f"{tflops} per-GPU teraFLOP/s",
        conversion="tokens/s/GPU = TFLOP/s * 1e12 * GPUs * s * B / Megatron-Core r0.8.0 FLOPs of one step "
                   "(megatron_core_flops_per_step: recompute not counted, causal attention counted in full)",
        recipe="GPT, V = 131072, s = 4096; --overlap-grad-reduce --overlap-param-gather (distributed "
               "optimizer), --tp-comm-overlap, pipeline communication overlapped; throughput end to end",
        assumed=(
            "precision: 16-bit, not stated (the MFU column is TFLOP/s over the 989 TFLOP/s dense 16-bit peak, "
            "'either fp16 or bfloat16' per the maintainers in NVIDIA/Megatron-LM issue 1276); fp16 assumed: the "
            "GPT-3 example at the table's commit (examples/gpt3/train_gpt3_175b_distributed.sh, f2e5db4) passes "
            "--fp16, as issue 1276's asker reports every training script does; Megatron-LM then keeps 16-bit "
            "gradient buffers and reduce-scatter (fp32 accumulation is forced only for bf16). Loss scaling's "
            "unscale and inf check over the 1/dp optimizer shard are not priced",
            "micro-batch 1, no activation recompute: not stated",
            "dropout: not stated; Megatron-LM's defaults at f2e5db4, --attention-dropout 0.1 and --hidden-dropout 0.1 "
            "(megatron/training/arguments.py lines 947-950), the GPT recipe the simulator takes (Layout.dropout "
            "'auto': hidden-dropout masks priced); the fused attention's in-kernel dropout (mask drawn in the forward, "
            "redrawn in the backward) is not priced: no public measurement of its cost on H100 was found (docs/"
            "design.md, 'Dropout as the recipes apply it (session 16)')",
            "pipelined rows (pp > 1): interleaved 1F1B, because the README overlaps pipeline communication and "
            "Megatron-LM disables that overlap outside the interleaved schedule (arguments.py lines 271-277 at "
            "f2e5db4); the depth is not stated: the shallowest the layer count allows (virtual stages per rank = "
            "smallest divisor > 1 of layers per stage: 70b 2, 119b 23, 177b 2, 314b 2, 462b 7)",
            "fused (TE) attention; sequence parallelism with tp > 1 (--tp-comm-overlap requires it)",
            "ZeRO-1 (the distributed optimizer --overlap-param-gather needs); cluster: DGX H100 with NDR "
            "InfiniBand (the README names only the GPU)",
        ),
    )


DEV_ROWS: tuple[DevRow, ...] = (
    *(_megatron_row(*r) for r in _MEGATRON_H100),
    # NeMo 24.07 performance table: FP8 (delayed scaling) pre-training on DGX-H100, dense models ModelSpec expresses.
    *NEMO_2407_ROWS,
    # torchtitan, end of 2024: Llama 3.1 8B with FSDP2 (Tables 1 and 3), bf16 rows only.
    *(
        DevRow(
            id=f"titan-8b-fsdp{gpus}{'-compile' if compiled else ''}", source=TITAN_2024_12, gpu="H100",
            cluster=_TITAN_CLUSTER, model="llama3-8b", seq_length=8192, dp=gpus, zero=3, zero_impl="fsdp2",
            reduce_dtype="fp32", micro_batch=2, global_batch=2 * gpus, attention_kernel="fa2",
            recompute="selective-op",
            kernel_fusion="fused" if compiled else "eager", metric="tokens_per_s_per_gpu", published=tps,
            published_text=f"{tps:,.0f} TPS/GPU", conversion="as published",
            recipe=f"Table {table}: FSDP{' + torch.compile' if compiled else ''}, local batch 2, global "
                   f"batch {2 * gpus}, selective (per-op) activation checkpointing; {_TITAN_RECIPE}; "
                   "throughput read at step 90",
            assumed=("sequence length 8192 (train_configs/llama3_8b.toml at 9dec370; the table does not "
                     "state it)",
                     "kernels: PyTorch eager without compile (norm_type 'rmsnorm' = the fp32 eager RMSNorm in that "
                     "config), SDPA's flash backend (FA2) for attention",),
            deviations=(_TITAN_HW, *((_COMPILE,) if compiled else ())),
            cross_entropy="unfused", published_memory_GiB=mem, memory_definition=_TITAN_MEMORY,
            # 9dec370: torchtitan/optimizer.py build_optimizers passes fused=job.optimizer.fused, foreach=not fused;
            # --optimizer.fused is a store_true flag (config_manager.py) that train_configs/llama3_8b.toml never sets
            optimizer_impl="foreach",
        )
        for table, gpus, compiled, tps, mem in ((1, 8, False, 5762.0, 82.4), (1, 8, True, 6667.0, 77.0),
                                                (3, 128, False, 5605.0, 67.0), (3, 128, True, 6514.0, 62.0))
    ),
    # torchtitan, June 2025: async-TP benchmark, bf16 rows, vanilla (not async) TP.
    DevRow(
        id="titan-70b-fsdp32-tp8", source=TITAN_ASYNC_TP, gpu="H100", cluster=_TITAN_CLUSTER,
        model="llama3-70b", seq_length=8192, dp=32, tp=8, zero=3, zero_impl="fsdp2", reduce_dtype="fp32",
        micro_batch=16,
        global_batch=512, recompute="full", sequence_parallel=True, attention_kernel="fa2", metric="tokens_per_s_per_gpu",
        published=597.3, published_text="597.3 tokens/sec (per GPU, as torchtitan logs TPS/GPU)",
        conversion="as published",
        recipe=f"Llama 3 70B on 256 H100, FSDP 32 x TP 8, torch.compile, full AC, local batch 16; {_TITAN_RECIPE}; "
               "tensor parallel with sequence-parallel norms",
        assumed=("sequence length 8192 (torchtitan llama3_70b.toml at 820504e)",
                 "global batch 512 = local batch 16 x FSDP degree 32"),
        deviations=(_TITAN_HW, _COMPILE),
        tp_impl="dtensor",  # 820504e parallelize_llama.py apply_tp: Shard(1) of [b, s, h] (lines 139-196)
        optimizer_impl="fused",  # 820504e: optimizer.implementation defaults to "fused" (config_manager.py)
        # 820504e models/llama3/parallelize_llama.py line 238: ptd_checkpoint_wrapper(module, preserve_rng_state=
        # False), whose checkpoint_impl defaults to NO_REENTRANT (torch checkpoint_wrapper.py): early stop
        checkpoint_impl="non-reentrant",
    ),
    DevRow(
        id="titan-8b-fsdp8-tp8", source=TITAN_ASYNC_TP, gpu="H100", cluster=_TITAN_CLUSTER,
        model="llama3-8b", seq_length=8192, dp=8, tp=8, zero=3, zero_impl="fsdp2", reduce_dtype="fp32",
        micro_batch=12, global_batch=96, recompute="selective-op", sequence_parallel=True, attention_kernel="fa2", metric="tokens_per_s_per_gpu", published=4378.0,
        published_text="4378 tokens/sec (per GPU)", conversion="as published",
        recipe=f"Llama 3 8B on 64 H100, FSDP 8 x TP 8, torch.compile, per-op SAC, local batch 12; {_TITAN_RECIPE}; "
               "tensor parallel with sequence-parallel norms",
        assumed=("sequence length 8192 (torchtitan llama3_8b.toml at 820504e)",
                 "global batch 96 = local batch 12 x FSDP degree 8"),
        deviations=(_TITAN_HW, _COMPILE),
        tp_impl="dtensor",  # 820504e parallelize_llama.py apply_tp: Shard(1) of [b, s, h] (lines 139-196)
        optimizer_impl="fused",  # 820504e: optimizer.implementation defaults to "fused" (config_manager.py)
    ),
    # NeMo AutoModel: Llama 3.1 70B, FSDP2 + context parallel 2, full activation checkpointing.
    DevRow(
        id="automodel-70b-fsdp32-cp2", source=AUTOMODEL, gpu="H100", cluster="dgx-h100-ndr", model="llama3-70b",
        seq_length=8192, dp=32, cp=2, zero=3, zero_impl="fsdp2", micro_batch=1, global_batch=128,
        recompute="full", metric="tokens_per_s_per_gpu", published=866.77,
        # parallelizer.py lines 230-239 at 2013a4d: with enable_compile, checkpoint_wrapper(self_attn / mlp,
        # checkpoint_impl=CheckpointImpl.NO_REENTRANT); norms and residual adds stay outside (model.py 215-233)
        checkpoint_impl="non-reentrant-modules",
        published_text="866.77 Tokens/sec/GPU (18.90 s per global step, 389 model TFLOP/s/GPU)",
        conversion="as published (= 128 x 8192 / 18.90 s / 64)",
        recipe="64 GPUs, GBS 128, MBS 1, GA 4, seq 8192, TP 1, PP 1, CP 2, FSDP 32; TE kernels, FSDP2 with "
               "weight prefetch, reshard after forward, torch.compile, activation checkpointing on, TE FusedAdam",
        assumed=("activation checkpointing: the recipe's activation_checkpointing: True with enable_compile: True "
                 "wraps each layer's self_attn and mlp in a non-reentrant checkpoint_wrapper (parallelizer.py at "
                 "2013a4d, lines 230-239), simulated as recompute 'full' with checkpoint_impl "
                 "'non-reentrant-modules': neither norm nor residual add is rerun (outside the wrapped modules, "
                 "components/models/llama/model.py lines 215-233), nor, through the checkpoint's early stop, o_proj "
                 "and down_proj (lines 151 and 170)",),
        deviations=(_COMPILE,
                    "recompute under torch.compile: Inductor's min-cut partitioner may still rematerialise the "
                    "fp32 RMSNorm's pointwise output inside the backward's fused kernels (rms_norm: torch_fp32); "
                    "not simulated"),
        # FSDP2 reduce dtype and gradient sync, read at 2013a4d: the recipe sets no mp_policy, so
        # FSDP2Config.__post_init__ builds MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16)
        # (components/distributed/config.py lines 116-123; the fp32 fallback in parallelizer.py line 282 only
        # runs when mp_policy is None): gradients are reduce-scattered in bf16, the parameter dtype.
        reduce_dtype="param",
        # examples/llm_pretrain/custom_llama3_1_70b_pretrain_benchmark_8nodes.yaml line 93 sets
        # defer_fsdp_grad_sync: False, so get_sync_ctx (components/distributed/utils.py lines 240-244) calls
        # set_requires_gradient_sync(True) on every micro-batch: FSDP2 reduce-scatters after each of the 4
        # micro-batches, as simgrid.model.zero3_units lowers FSDP2 (no no_sync).
    ),
    # torchtitan, April 2024: FSDP2 on 64 A100 80GB (the ZeRO-3 rows on A100).
    *(
        DevRow(
            id=f"titan-a100-{size}-{tag}", source=TITAN_2024_04, gpu="A100", cluster="dgx-a100-hdr",
            model=f"llama2-{size}", seq_length=4096, dp=64, zero=3, zero_impl="fsdp2", reduce_dtype="fp32",
            micro_batch=batch, global_batch=64 * batch,
            recompute={"full": "full", "sacop": "selective-op"}.get(tag, "none"), attention_kernel="fa2",
            # 528cab9 parallelisms/parallelize_llama.py lines 73-80: mode "full" is ptd_checkpoint_wrapper(...,
            # checkpoint_impl=CheckpointImpl.NO_REENTRANT, use_reentrant=False): early stop (simgrid.model.early_stop)
            checkpoint_impl="non-reentrant",
            kernel_fusion="eager-fused-norm", metric="tokens_per_s_per_gpu", published=wps,
            published_text=f"{wps:g} WPS (MFU {mfu})",
            conversion="as published (torchtitan's WPS = tokens per second per GPU)",
            recipe=f"Llama 2 {size.upper()} on 64 A100 80GB, FSDP2, local batch {batch}, activation checkpointing: "
                   f"{ac}; bf16 params, fp32 gradient reduce-scatter (parallelize_llama.py at 528cab9); "
                   "SDPA flash attention; no torch.compile (train config compile = false)",
            assumed=("cluster: DGX A100 nodes with 8x HDR 200 Gb/s (the document names only the GPU)",
                     "sequence length 4096 and Llama 2 vocabulary (train configs at 528cab9)",
                     "kernels: PyTorch eager with torchtitan's fused Triton RMSNorm (norm_type 'fused_rmsnorm', "
                     "compile false in train_configs at 528cab9), SDPA's flash backend (FA2)"),
            deviations=(), cross_entropy="unfused",  # 528cab9: model.py:436 .float(), train.py:164 cross_entropy
            optimizer_impl="foreach",  # 528cab9: train.py build_optimizer, torch.optim.AdamW(..., foreach=True)
        )
        for size, tag, batch, ac, wps, mfu in (
            ("13b", "noac", 2, "no", 2162.0, "61.1%"),
            ("13b", "sacop", 2, "selective op", 1904.0, "53.8%"),
            ("70b", "full", 2, "full", 353.0, "50.5%"),
            ("70b", "sacop", 1, "selective op", 355.0, "50.8%"),
        )
    ),
    # MLPerf Training v3.1 GPT-3 175B, NVIDIA on DGX H100 (Eos): fp8, one row per system size (session 13).
    *MLPERF_31_ROWS,
    # MLPerf Training v4.0 / v4.1 GPT-3 175B, NVIDIA on DGX H100 (Eos): fp8 with fp8 weights (session 14).
    *MLPERF_4X_ROWS,
)
"""Every dev row, in table order."""


@dataclass(frozen=True, kw_only=True)
class Excluded:
    """Published figures considered for the dev set and left out, with the reason."""

    source: str
    """Document and table."""
    rows: str
    """Which rows."""
    reason: str
    """Why they are not in the dev set."""


EXCLUDED: tuple[Excluded, ...] = (
    Excluded(source="torchtitan llama3_h100_202412 Tables 1-6", rows="every Float8 row (8B Table 1/3 third row, "
             "Table 2 CP sweep, 70B Table 4, 405B Tables 5 and 6)",
             reason="torchao Float8 training (dynamic tensorwise scaling in torch.compile-generated casts, float8 "
                    "FSDP2 all-gather of the weights): the simulator prices Transformer Engine's fp8 recipes and "
                    "gathers parameters in 16 bits; 405B rows also combine FSDP with pp 8, which Layout refuses "
                    "(ZeRO-2/3 with pp > 1)"),
    Excluded(source="torchtitan asyncTP_llama3_h100_2025-06", rows="float8 rows; 'Async TP' column",
             reason="torchao Float8 (not Transformer Engine's recipes, which are what the simulator prices); "
                    "asynchronous (overlapped) TP has no simulator setting, the vanilla TP column is used instead"),
    Excluded(source="torchtitan llama3-8b_h200_202506_trainy-whitefiber", rows="both rows (H200, 32 and 64 GPUs)",
             reason="torchao Float8 linear layers with float8 all-gather (not Transformer Engine's recipes, and "
                    "weights gathered in 8 bits, which the simulator does not model); the only H200 rows found"),
    Excluded(source="torchtitan docs/performance.md of 2024-04-16", rows="13B 'selective layer' (1914 WPS)",
             reason="checkpointing every other block is neither 'none' nor 'full' in the simulator"),
    Excluded(source="NeMo performance_summary.md (NeMo 24.07 table, commit 9c5c5e9)", rows="Nemotron-8B, "
                    "Nemotron-22B, Nemotron-340B pre-training; the SFT and LoRA rows",
             reason="Nemotron's squared-ReLU MLP is not a ModelSpec activation (GeLU or SwiGLU only); fine-tuning "
                    "rows are not pre-training (LoRA trains adapters only)"),
    Excluded(source="NeMo 24.09-25.04 performance tables (docs.nvidia.com) and Megatron-Bridge performance-summary "
                    "(25.09-26.08), DGX-H100", rows="every dense Llama / GPT-3 / Nemotron pre-training row",
             reason="not in the NeMo repository's history (24.09-25.04 were published on docs.nvidia.com only, "
                    "not stored here) or, for 25.09 on, FP8-CS rows whose Megatron-Bridge recipes were not read "
                    "this session (one table version with readable recipes was preferred: NeMo 24.07); the H100 "
                    "BF16 rows there are GPT-OSS MoE models, whose alternating sliding-window attention with "
                    "attention sinks ModelSpec does not express"),
    Excluded(source="NeMo AutoModel performance-summary, DGX-H100 BF16", rows="every MoE row and the LoRA rows",
             reason="the MoE rows shard with FSDP2 (ZeRO-3), which Layout refuses for MoE models (ZeRO-0/1 only), "
                    "and dispatch with DeepEP, which is not modelled (the simulator's dispatcher is NCCL all-to-all); "
                    "DeepSeek V3 and Kimi K2 add MLA attention, GPT-OSS sliding-window attention, Nemotron V3 Mamba "
                    "layers; LoRA trains adapters only"),
    Excluded(source="MLPerf Training v4.1 GPT-3 175B, NVIDIA b200_n8_preview_nemo (swsok/training_results_v4.1)",
             rows="8 DGX B200 (64 GPUs, preview category)",
             reason="issue 12 item 4 asks for H100/H200 rows; the B200 profile has no measured row to stand on and "
                    "a preview (not yet available) system; no NVIDIA GPT-3 result on H200 exists in v4.0 "
                    "or v4.1 (session 14)"),
    Excluded(source="MLPerf Training v4.0 / v4.1 GPT-3 175B, other submitters (Oracle v4.1 H100, Google TPU, "
                    "Intel Gaudi 2)", rows="all",
             reason="TPU and Gaudi hardware have no profile; Oracle's H100 results were not read this session "
                    "(session 14)"),
    Excluded(source="Megatron-LM README strong-scaling figure (GPT-3 175B, 96-4608 H100)", rows="all points",
             reason="only the end points' MFU (47 %, 42 %) are stated in the text; layouts are not stated"),
    Excluded(source="foundation-model-stack/fms-fsdp README (Llama 2 7B-70B, 96 H100 and 128 A100)",
             rows="all eight",
             reason="7B uses HSDP (shard in a node, replicate across), which no layout expresses; 13B-70B use "
                    "'selective AC' with an unstated fraction of checkpointed blocks; network stated only as "
                    "800 / 400 Gbps"),
    Excluded(source="Zhao et al., PyTorch FSDP (VLDB 2023), GPT-175B / T5 scaling on A100",
             rows="all", reason="the paper's text and tables are not in the stored corpora this session could "
                                "read; nothing was taken from memory"),
)
"""Sources considered for the dev set and left out."""
