"""MLPerf Training v4.0 and v4.1 GPT-3 175B dev rows (issue 12 item 4, session 14): NVIDIA's closed-division DGX H100
(Eos) submissions, built with the v3.1 row builder (:func:`mlperf_data.mlperf_row`).

v4.0 (mlcommons/training_results_v4.0 at 62f111b): 64, 1344 and 1452 nodes, container pytorch:24.04. Its logs hold
no ``tracked_stats`` lines, so the figure is each block's wall time over its training steps (MLLOG ``block_start`` to
``block_stop``, ``epoch_count`` tokens / (GBS x 2048) steps per block, evaluation outside the block), median over the
blocks of a run, median over the three runs; that spacing includes the host work between steps (deviation below).
v4.1 (swsok/training_results_v4.1 at b9b0547, a fork holding the round): 32 and 64 nodes, container pytorch:24.09,
``train_step_timing in s`` lines, taken exactly as v3.1's. The v4.1 folder eos-dfw_n1452_ngc24.04_nemo holds the
v4.0 1452-node runs again (same ``run_start`` times, files equal but for two SYSJSON lines): not a second row.
No NVIDIA GPT-3 result on H200 exists in either round; B200 is in :data:`MLPERF_4X_EXCLUDED`.
"""

from __future__ import annotations

from devrow import DevRow, Source
from mlperf_data import V31_ASSUMED, mlperf_row

_R40 = "mlcommons/training_results_v4.0"
_C40 = "62f111b7690f163b269f32e4f93dcaaa13717c9c"
_IMPL40 = "NVIDIA/benchmarks/gpt3/implementations/nemo"
_R41 = "swsok/training_results_v4.1"
_C41 = "b9b05477c3102b3ca834974c75d34a2c424f0f88"
_IMPL41 = "NVIDIA/benchmarks/gpt3/implementations/eos_n{32,64}_ngc24.09_nemo"

MLPERF_40 = Source(
    document=f"{_R40} NVIDIA/results/<system>_ngc24.04_nemo/gpt3/result_{{0,1,2}}.txt",
    section="MLLOG block_start / block_stop spacing per training step (GPT-3 175B, closed division, DGX H100 Eos)",
    url=f"https://github.com/{_R40}/tree/{_C40}/NVIDIA/results",
    version="MLPerf Training v4.0 (results pushed 2024-06-11, 62f111b); container nvcr.io/nvidia/pytorch:24.04 with "
            "NeMo v2.0.0.rc0.beta (b2eccd2), Megatron-LM core_v0.7.0.beta (3c0f3ef), Transformer Engine v1.6rc1 "
            f"(9e4091e), apex from the container ({_IMPL40}/Dockerfile APEX_REVISION=SKIP)",
)
MLPERF_41 = Source(
    document=f"{_R41} NVIDIA/results/<system>_ngc24.09_nemo/gpt3/result_{{0,1,2}}.txt",
    section="MLLOG tracked_stats 'train_step_timing in s' (GPT-3 175B, closed division, DGX H100 Eos)",
    url=f"https://github.com/{_R41}/tree/{_C41}/NVIDIA/results",
    version="MLPerf Training v4.1 (runs of 2024-10; fork of the round at b9b0547); container nvcr.io/nvidia/pytorch:24.09 "
            "with NeMo 24.09-alpha.rc0 (4068955), Megatron-LM 24.09-alpha.rc0 (dd18205), Transformer Engine and apex "
            "from the container (eos_n64_ngc24.09_nemo/Dockerfile TE_REVISION=SKIP, APEX_REVISION=SKIP)",
)

_V4_ASSUMED = (
    "versions: the Dockerfiles build no apex (APEX_REVISION=SKIP); assumed the apex tag named for the container "
    "release, 24.04 -> 97f517e1 (whose distributed_fused_adam.py equals 810ffae3's, read in session 13), 24.09 -> "
    "59b80ee8 (adds f3f04924, NCCL user buffers, off here: nccl_ub False, and f9f19d5c, hook registration only); the "
    "24.09 container's Transformer Engine is not pinned: TE v1.9, v1.10 and v1.11 were read and agree (attention below)",
    "fp8: config_fp8.sh as v3.1 (hybrid, amax history 1024, max, reduce amax) and fp8 weights, Layout.fp8_params: "
    "config_common.sh FP8_PARAMS=True (v4.0 line 74; v4.1 eos_n32 / eos_n64 line 66) -> conf/custom.yaml "
    "fp8_params (v4.0 line 81, v4.1 line 82) -> NeMo builds the model under Transformer Engine fp8_model_init "
    "(megatron_gpt_model.py lines 327-328 at v2.0.0.rc0.beta, 360-361 at 24.09-alpha.rc0)",
    "attention: cuDNN fused attention, the H100 profile's default ('auto'): TE v1.6rc1 attention.py lines 2912-2917 "
    "drop flash-attn on sm90 when cuDNN's F16_arbitrary_seqlen backend also fits; TE v1.9 / v1.10 / v1.11 likewise "
    "('Disabling FlashAttention to give FusedAttention preference on Hopper+', lines 661-666 / 745-750 / 824-829); "
    "config_common.sh leaves NVTE_FUSED_ATTN=0 commented out",
    "optimizer: run_and_time.sh optim@model.optim=distributed_fused_adam (v4.0 line 117, v4.1 line 134), "
    "conf/optim/distributed_fused_adam.yaml overlap_grad_sync / overlap_param_sync True, grad_sync_dtype bf16, "
    "bucket_cap_mb = BUCKET_CAP_MB (config_common.sh 200, the v4.1 32-node config 125); v4.0's custom_optimizer.py "
    "subclasses NeMo's MegatronDistributedFusedAdam for checkpointing only",
    "dropout off (Layout.dropout 'off'): conf/custom.yaml hidden_dropout 0.0, attention_dropout 0.0 (v4.0 lines "
    "73-74, v4.1 eos_n32 / eos_n64 lines 74-75); the full-TE-layer spec (custom.yaml name "
    "megatron_gpt_full_te_layer_autocast, NeMo get_specs) runs Transformer Engine's bias_dropout_add under "
    "dropout_fuser = torch.compile (TE v1.6rc1 / v1.9 / v1.11 jit.py lines 16-18, PyTorch >= 2.2 in the 24.04 and "
    "24.09 containers), where aten.dropout with p = 0 decomposes to a copy and draws no mask (torch/_decomp/"
    "decompositions.py 'dropout'); cuDNN fused attention with dropout 0 draws nothing either",
    *(a for a in V31_ASSUMED if a.startswith(("vocabulary", "cluster"))),
)
_AMAX_TE = (
    "TE v1.6+ reduce_and_update_fp8_tensors (fp8.py lines 313-368 at v1.6rc1, 325-385 at v1.11) walks global buffers "
    "holding every fp8 module of the rank, all chunks, per key (direction, has fp8 weights, autocast): torch.cat, a "
    "synchronous MAX all-reduce (async_op=False, line 309 / 321), a fused amax-and-scale update; at each autocast exit "
    "(Megatron-Core wraps each chunk's TransformerBlock layers in one) and after each region's first module's "
    "backward; the NVTE_DP_AMAX_REDUCE_INTERVAL / NVTE_ASYNC_AMAX_REDUCTION of config_common.sh no longer exist in "
    "TE; FP8_REDUCE_AMAX does not reach Megatron-Core's TEDelayedScaling, whose reduce_amax stays TE's default True")
_AMAX_40 = (
    "fp8 amax reduction (Layout.fp8_amax_reduction 'tp', docs/design.md 'TE amax reduction (session 16)'): "
    + _AMAX_TE + "; Megatron-LM core_v0.7.0.beta passes the tensor-parallel group as fp8_group (transformer_block.py "
    "line 367 at 3c0f3ef); 4 GEMMs x 3 / 2 fp32 amaxes per layer (attention is no TE base module at v1.6rc1); "
    "LAYER_CUDA_GRAPH=1 graphs each layer with make_graphed_callables (custom_callbacks.py line 223), replayed inside "
    "the block's own non-graphed fp8_autocast, so the exit reduction stays and the graphed backward of the first "
    "layer reduces after replay (graph.py lines 318-344): the same count; not modelled: the one more forward "
    "reduction per step after the optimizer's fp8 weight update (float8_tensor.py lines 71-93)")
_AMAX_41 = (
    "fp8 amax reduction (Layout.fp8_amax_reduction 'stage', docs/design.md 'TE amax reduction (session 16)'): "
    + _AMAX_TE + "; Megatron-LM 24.09-alpha.rc0 passes get_amax_reduction_group(with_context_parallel=True), the "
    "tensor-, data- and context-parallel ranks of the stage (transformer_block.py line 411 at dd18205); TE v1.9-v1.11's "
    "DotProductAttention is a TE base module with 3 GEMMs of fp8 metadata (Layout.fp8_attention_amax), under fp8 "
    "weights in a key of its own: two all-reduces per reduction; no CUDA graphs in the v4.1 configs; not modelled: "
    "the one more forward reduction per step after the optimizer's fp8 weight update")
_V4_DISTOPT = (
    "optimizer: apex DistributedFusedAdam as Layout.zero_impl 'apex' (docs/design.md 'apex distributed Adam sync "
    "(session 13)'); its places hold at these versions: NeMo v2.0.0.rc0.beta megatron_gpt_model.py per-layer buckets "
    "lines 552-579 (buckets.reverse(), leftovers into buckets[-1]), grad_sync_func / param_sync_func lines 600-601; "
    "NeMo 24.09-alpha.rc0 the same at lines 627-650 and 674-675, taken because use_mcore_dist_optim is False "
    "(megatron_base_model.py line 148: optim.name is not 'mcore_distributed_optim'); Megatron-LM core_v0.7.0.beta "
    "schedules.py param_sync_func chunks 0-1 lines 550-552, chunk c + 1 at microbatch_id + pipeline rank 605-615, "
    "grad_sync_func 674-681, and 24.09-alpha.rc0 the same at 664-666, 719-730, 791-798; not modelled as in v3.1 "
    "(sharded gradient buffer, the copy out of the gathered bucket, the first bucket beside the optimizer step)")
_FP8_PARAMS = (
    "fp8 parameters (Layout.fp8_params, docs/design.md 'fp8 parameters (session 15)'): the uint8 all-gathers, the "
    "optimizer's cast of the shard and the weights' transpose refill are simulated; not modelled: the gradient "
    "buckets keep each layer's biases and norms (NeMo moves them into the rank's first bucket, megatron_gpt_model.py "
    "make_parameter_bucket lines 552-558: at most one more padded state bucket of reduce-scatter per rank), the amax "
    "MAX all-reduce over the data-parallel group in the optimizer step (4 bytes per fp8 weight, latency-bound), and "
    "at TE v1.6rc1 (v4.0) the transpose refill sits in the first backward rather than the first forward")
_USERBUFFERS_4 = (
    "TP overlap: the simulator's tp_comm_overlap is Transformer Engine's chunked userbuffers overlap; the recipe's "
    "per-GEMM methods (conf/tp_overlap/h100tp4mbs{1,2}.yaml), the multicast ring all-gathers and reduce-scatters "
    "(MC_TP_OVERLAP_AG / _RS), the fp8 atomic-GEMM reduce-scatters (NVTE_UB_ATOMIC_GEMM_RS=1, strided) and the 8-SM "
    "layer-norm margins are not modelled one by one; NCCL_NVLS_ENABLE=0 is not applied to the data-parallel groups")
_CUDA_GRAPH = (
    "CUDA graphs: LAYER_CUDA_GRAPH=1 (custom.yaml enable_cuda_graph) captures each transformer layer; the simulator "
    "keeps its per-kernel overhead (the host-side launches a graph removes are not modelled either way)")
_DEFER_WGRAD = (
    "defer_embedding_wgrad_compute (custom.yaml line 85: on with PP > 1, MINIBS <= 256 and MBS 1, or set by "
    "DEFER_EMBEDDING_WGRAD_COMPUTE=True in v4.1 with WGRAD_DEFERRAL_LIMIT=65): the output layer's weight-gradient "
    "GEMMs of the last pipeline stage are deferred to the pipeline flush; the simulator runs them in each backward")
_BLOCK_TIMING = (
    "figure: no train_step_timing in the v4.0 logs; the block spacing per step includes the host work between steps, "
    "which the simulator does not add: on logs that print both it exceeds the median train_step_timing by 2.4 % at "
    "v3.1 1344 nodes (0.9519-0.9524 vs 0.9296 s), 1.2 % at v3.1 512 nodes (1.6276-1.6304 vs 1.6081-1.6098 s), "
    "0.2-0.5 % at v4.1 32 and 64 nodes (18.4069 vs 18.3743 s, 9.5351 vs 9.4931 s); not corrected")
_N64_BATCH_40 = (
    "batch at 64 nodes (v4.0): config_DGXH100_64x8x128x4x8_mbs2.sh sets MINIBS=128 (GBS 2048), but the log prints "
    "global_batch_size 2304 and gradient_accumulation_steps 72 (= 2304 / (DP 16 x MBS 2)), its blocks advance "
    "51904512 = 11 x 2304 x 2048 tokens and its LR warmup is 176 = 407040 / 2304 steps: the run used GBS 2304 "
    "(MINIBS 144), which the row takes")


def _v40(system: str, nodes: int, gbs: int, ga: int, config: str, medians: tuple[float, float, float], tps: float,
         pp: int, vpp: int, extra: tuple[str, ...]) -> DevRow:
    return mlperf_row(system, nodes, gbs, ga, config, medians, tps, round_id="mlperf40", source=MLPERF_40,
                      impl=_IMPL40, pp=pp, vpp=vpp, bucket_size_MB=200, attention_kernel="auto",
                      timing="block time per step", assumed=(*_V4_ASSUMED, _AMAX_40), fp8_params=True,
                      fp8_amax_reduction="tp", dropout="off",
                      deviations=(_BLOCK_TIMING, _V4_DISTOPT, _FP8_PARAMS, _USERBUFFERS_4, *extra))


def _v41(system: str, nodes: int, gbs: int, ga: int, config: str, medians: tuple[float, float, float], tps: float,
         bucket_MB: float) -> DevRow:
    return mlperf_row(system, nodes, gbs, ga, config, medians, tps, round_id="mlperf41", source=MLPERF_41,
                      impl=f"NVIDIA/benchmarks/gpt3/implementations/{system}", vpp=6, bucket_size_MB=bucket_MB,
                      attention_kernel="auto", timing="train_step_timing", assumed=(*_V4_ASSUMED, _AMAX_41),
                      fp8_params=True, fp8_amax_reduction="stage", fp8_attention_amax=True, dropout="off",
                      deviations=(_V4_DISTOPT, _FP8_PARAMS, _USERBUFFERS_4, _DEFER_WGRAD))


# Medians typed from the logs: v4.0 per-run median of the blocks' (block_stop - block_start) / steps (24, 23, 23
# blocks of 11 steps at 64 nodes; 22 x 10 steps at 1344; 23 x 9 at 1452); v4.1 per-run median of every
# train_step_timing line (300, 288, 288 steps at 32 nodes; 288, 300, 288 at 64). tokens/s/GPU = GBS x 2048 /
# (median of the three) / GPUs. TP 4 everywhere; PP / VP from the config scripts (INTERLEAVED_PIPELINE).
MLPERF_4X_ROWS: tuple[DevRow, ...] = (
    _v40("eos_n64_ngc24.04_nemo", 64, 2304, 72, "config_DGXH100_64x8x128x4x8_mbs2.sh",
         (10.9030, 10.9832, 10.9822), 839.2, pp=8, vpp=4, extra=(_N64_BATCH_40,)),
    _v40("eos-dfw_n1344_ngc24.04_nemo", 1344, 2688, 6, "config_DGXH100_1344x8x6x4x6_mbs1_cg.sh",
         (0.9207, 0.9206, 0.9210), 556.1, pp=6, vpp=8, extra=(_CUDA_GRAPH, _DEFER_WGRAD)),
    _v40("eos-dfw_n1452_ngc24.04_nemo", 1452, 2904, 6, "config_DGXH100_1452x8x6x4x6_mbs1_cg.sh",
         (0.9224, 0.9214, 0.9214), 555.7, pp=6, vpp=8, extra=(_CUDA_GRAPH, _DEFER_WGRAD)),
    _v41("eos_n32_ngc24.09_nemo", 32, 2048, 128, "config_DGXH100_32x8x256x4x8_mbs2.sh",
         (18.3716, 18.3743, 18.4212), 891.7, bucket_MB=125),
    _v41("eos_n64_ngc24.09_nemo", 64, 2048, 64, "config_DGXH100_64x8x128x4x8_mbs2.sh",
         (9.4931, 9.5542, 9.4964), 862.6, bucket_MB=200),
)
"""NVIDIA's DGX H100 GPT-3 175B rows of MLPerf Training v4.0 then v4.1, smallest first within a round."""
