"""Iteration costs checked by hand: decode reads the weights and the KV cache, prefill is compute-bound,
tensor parallelism adds its all-reduces, pipeline stages split the work and add hops."""

from __future__ import annotations

import pytest

from simgrid.costs import collective_time_s, p2p_time_s
from simgrid.hardware import load_cluster
from simgrid.model import get_model
from simgrid.serving import IterationCostModel, ServingConfig, ServingLayout, chunk_shape, combine
from simgrid.topology import Topology

A100_RATE_Bps = 2039e9 * 0.81  # datasheet HBM bandwidth x the profile's measured streaming efficiency
A100_BF16 = 312e12
LLAMA7_LAYER_MATMUL = (4 * 4096**2, 3 * 4096 * 11008)  # attention (QKV + out) and SwiGLU MLP weights
LLAMA7_NORM = 4096
LLAMA7_PAIR_FLOPS = 4 * 32 * 128  # QK^T and PV: 2 x 2 FLOPs per (query, key) pair per head dim, 32 heads
# FlashAttention-2 causal forward, head dim 128, A100 80GB (Dao 2023, Fig. 5; hardware_profiles/gpus/a100-80gb-sxm.toml)
A100_FA2_CAUSAL_FWD_D128 = {512: 132e12, 1024: 164e12, 2048: 187e12}
H100_FA3_CAUSAL_FWD_D128 = {2048: 521e12}  # FlashAttention-3 (Shah et al. 2024, Fig. 5), h100-sxm.toml


def _cost(model: str, layout: ServingLayout, config: ServingConfig | None = None) -> IterationCostModel:
    topo = Topology(load_cluster("dgx-a100-hdr", gpus=layout.world_size))
    return IterationCostModel(get_model(model), layout, config or ServingConfig(), topo)


def test_chunk_shape_counts_causal_pairs() -> None:
    """3 new tokens after 2 cached attend to 3, 4 and 5 keys: 12 pairs; the cache then holds 5."""
    s = chunk_shape(3, 2, sampled=True)
    assert (s.tokens, s.pairs, s.context_tokens, s.sampled) == (3, 12, 5, 1)
    both = combine([s, chunk_shape(1, 9, sampled=False)])
    assert (both.tokens, both.pairs, both.context_tokens, both.sampled) == (4, 22, 15, 1)


def test_decode_of_one_token_reads_every_weight_once() -> None:
    """Batch-1 decode on an A100 is bound by HBM: GEMM time = all weights but the embedding table / rate (the
    token's activations in and out of each GEMM add under 0.1 %)."""
    t = _cost("llama2-7b", ServingLayout()).time(chunk_shape(1, 100, sampled=True))
    weights = 32 * (sum(LLAMA7_LAYER_MATMUL) + 2 * LLAMA7_NORM) + 32000 * 4096 + LLAMA7_NORM
    assert t.breakdown_s["gemm"] == pytest.approx(weights * 2 / A100_RATE_Bps, rel=1e-3)
    assert t.breakdown_s["gemm"] >= weights * 2 / A100_RATE_Bps
    assert t.breakdown_s["tp_comm"] == t.breakdown_s["pp_comm"] == 0.0


def test_decode_attention_reads_the_kv_cache() -> None:
    """64 sequences of 1000 cached tokens read 1001 K/V and write 1 per layer: 16 KiB each, at the HBM rate;
    an fp8 cache halves it."""
    batch = combine([chunk_shape(1, 1000, sampled=True)] * 64)
    t = _cost("llama2-7b", ServingLayout()).time(batch)
    assert t.breakdown_s["attention"] == pytest.approx(32 * 64 * 1002 * 16384 / A100_RATE_Bps, rel=1e-12)
    fp8 = _cost("llama2-7b", ServingLayout(), ServingConfig(kv_dtype="fp8")).time(batch)
    assert fp8.breakdown_s["attention"] == pytest.approx(t.breakdown_s["attention"] / 2, rel=1e-12)


def test_prefill_is_compute_bound() -> None:
    """A 2048-token prompt: 2 x 2048 x (layer matmul weights) FLOPs per layer, each block's at the GPU's GEMM
    efficiency for its largest shape (QKV 2048 x 12288 x 4096, gate+up 2048 x 22016 x 4096), and a causal
    core of 2048 x 2049 / 2 pairs x 4 x 32 x 128 FLOPs at FlashAttention-2's causal forward speed for
    sequence 2048 and head dim 128 on A100 (187 TFLOP/s, the profile's table) at the sustained clock."""
    from simgrid.costs import gemm_efficiency

    cost = _cost("llama2-7b", ServingLayout())
    gpu = cost.gpu
    t = cost.time(chunk_shape(2048, 0, sampled=True))
    attn_w, mlp_w = LLAMA7_LAYER_MATMUL
    gemm = 32 * 2 * 2048 * (attn_w / gemm_efficiency(2048, 12288, 4096, gpu, dtype="bf16")
                            + mlp_w / gemm_efficiency(2048, 22016, 4096, gpu, dtype="bf16")) / A100_BF16
    head = (32000 * 4096 + LLAMA7_NORM) * 2 / A100_RATE_Bps  # one sampled row: reading the matrix binds
    assert t.breakdown_s["gemm"] == pytest.approx(gemm + head, rel=1e-3)
    assert 0.8 * 0.86 < 32 * 2 * 2048 * sum(LLAMA7_LAYER_MATMUL) / A100_BF16 / (gemm) < 0.87  # compute-bound
    core = 32 * (2048 * 2049 // 2) * 4 * 32 * 128 / (A100_FA2_CAUSAL_FWD_D128[2048] * gpu.sustained_clock_fraction)
    assert t.breakdown_s["attention"] == pytest.approx(core, rel=1e-12)


def test_tensor_parallel_adds_two_all_reduces_per_layer_and_the_logits_gather() -> None:
    """llama2-70b at tp 4: 160 all-reduces of tokens x 8192 x 2 B, the vocabulary-parallel embedding's, and an
    all-gather of each sampled row's 32000 logits, timed by the collective cost model on GPUs 0-3."""
    model = _cost("llama2-70b", ServingLayout(tp=4))
    batch = combine([chunk_shape(1, 500, sampled=True)] * 8)
    t = model.time(batch)
    topo, ranks = model.topology, (0, 1, 2, 3)
    expected = (collective_time_s("all_reduce", 160 * 8 * 8192 * 2, ranks, topo, count=160)
                + collective_time_s("all_reduce", 8 * 8192 * 2, ranks, topo)
                + collective_time_s("all_gather", 8 * 32000 * 2, ranks, topo))
    assert t.breakdown_s["tp_comm"] == pytest.approx(expected, rel=1e-12)
    assert _cost("llama2-70b", ServingLayout(tp=8)).time(batch).breakdown_s["gemm"] == pytest.approx(
        t.breakdown_s["gemm"] / 2, rel=0.01)


def test_pipeline_stages_split_the_work_and_add_hops() -> None:
    """pp 2 splits the weight reads over two stages (same sum as pp 1); the hops carry the hidden state and
    the residual (2 x tokens x h x 2 B) forward and 8-byte token ids back; latency = stages + hops."""
    batch = combine([chunk_shape(1, 100, sampled=True)] * 4)
    one = _cost("llama2-7b", ServingLayout()).time(batch)
    two_model = _cost("llama2-7b", ServingLayout(pp=2))
    two = two_model.time(batch)
    assert len(two.stage_s) == 2
    assert two.breakdown_s["gemm"] == pytest.approx(one.breakdown_s["gemm"], rel=1e-12)
    topo = two_model.topology
    assert two.hop_s == pytest.approx((p2p_time_s(2 * 4 * 4096 * 2, 0, 1, topo), p2p_time_s(8 * 4, 1, 0, topo)))
    assert two.latency_s == pytest.approx(sum(two.stage_s) + sum(two.hop_s))


def test_an_empty_iteration_is_a_bug() -> None:
    """Zero tokens is never scheduled."""
    with pytest.raises(ValueError, match="at least one token"):
        _cost("llama2-7b", ServingLayout()).time(combine([]))


def test_repeated_batch_sizes_are_priced_the_same_and_another_gpu_is_priced_afresh() -> None:
    """The GEMM memo keys on (stage, tokens, sampled): a second ask gives the first answer, a batch that
    differs only in context shares the GEMMs but not the attention, and a model moved to another GPU does
    not reuse the first GPU's GEMM times."""
    from simgrid.hardware import load_gpu

    cost = _cost("llama2-7b", ServingLayout())
    first = cost.time(chunk_shape(64, 100, sampled=True))
    assert cost.time(chunk_shape(64, 100, sampled=True)) == first
    longer = cost.time(chunk_shape(64, 4000, sampled=True))
    assert longer.breakdown_s["gemm"] == first.breakdown_s["gemm"]
    assert longer.breakdown_s["attention"] > first.breakdown_s["attention"]
    h100 = load_gpu("h100-sxm")
    moved = cost.with_gpu(h100).time(chunk_shape(64, 100, sampled=True))
    fresh = _cost("llama2-7b", ServingLayout()).with_gpu(h100).time(chunk_shape(64, 100, sampled=True))
    assert moved == fresh
    assert moved.breakdown_s["gemm"] < first.breakdown_s["gemm"]


def test_a100_prefill_attention_reads_the_flash_attention_table_not_the_flat_efficiency() -> None:
    """A 1024-token prompt on A100 is priced at FA2's 164 TFLOP/s for (1024, 1024, 128), not at the flat
    0.615 x 312 = 192 TFLOP/s the profile keeps for shapeless cores: 17% slower attention than before."""
    cost = _cost("llama2-7b", ServingLayout())
    scf = cost.gpu.sustained_clock_fraction
    flops = 32 * (1024 * 1025 // 2) * LLAMA7_PAIR_FLOPS
    attention = cost.time(chunk_shape(1024, 0, sampled=True)).breakdown_s["attention"]
    assert attention == pytest.approx(flops / (A100_FA2_CAUSAL_FWD_D128[1024] * scf), rel=1e-12)
    flat = flops / (A100_BF16 * 0.615 * scf)
    assert attention / flat == pytest.approx(0.615 * 312 / 164, rel=1e-12)


def test_prompt_chunks_are_priced_at_their_own_shape() -> None:
    """Chunked prefill: 512 new tokens after 1536 cached are read at sqrt(512 x 2048) = 1024 tokens (164
    TFLOP/s); two prompts in one batch (512 and 2048 tokens) each at their own length, summed."""
    cost = _cost("llama2-7b", ServingLayout())
    scf = cost.gpu.sustained_clock_fraction
    chunk = cost.time(chunk_shape(512, 1536, sampled=False)).breakdown_s["attention"]
    pairs = 512 * 1536 + 512 * 513 // 2
    assert chunk == pytest.approx(32 * pairs * LLAMA7_PAIR_FLOPS / (A100_FA2_CAUSAL_FWD_D128[1024] * scf), rel=1e-12)
    both = cost.time(combine([chunk_shape(512, 0, sampled=True), chunk_shape(2048, 0, sampled=True)]))
    expected = 32 * LLAMA7_PAIR_FLOPS / scf * (512 * 513 // 2 / A100_FA2_CAUSAL_FWD_D128[512]
                                                 + 2048 * 2049 // 2 / A100_FA2_CAUSAL_FWD_D128[2048])
    assert both.breakdown_s["attention"] == pytest.approx(expected, rel=1e-12)


def test_h100_prefill_attention_reads_its_fa3_table() -> None:
    """On H100 (default kernel FA3) a 2048-token prompt's core runs at 521 TFLOP/s (FA3, head dim 128)."""
    topo = Topology(load_cluster("dgx-h100-ndr", gpus=1))
    cost = IterationCostModel(get_model("llama2-7b"), ServingLayout(), ServingConfig(), topo)
    attention = cost.time(chunk_shape(2048, 0, sampled=True)).breakdown_s["attention"]
    flops = 32 * (2048 * 2049 // 2) * LLAMA7_PAIR_FLOPS
    assert attention == pytest.approx(flops / (H100_FA3_CAUSAL_FWD_D128[2048] * cost.gpu.sustained_clock_fraction),
                                      rel=1e-12)


def test_decode_attention_stays_the_kv_read_and_its_core_clamps_to_the_shortest_sequence() -> None:
    """64 decodes at context 1000: one query per sequence, read at sqrt(1000) tokens, below the table's 512,
    so the core is priced at the 512-token speed (132 TFLOP/s); the KV read (2 x 32 x 128 x 2 B per token
    and layer) is far slower, so decode attention is the read, as before the table applied."""
    cost = _cost("llama2-7b", ServingLayout())
    batch = combine([chunk_shape(1, 999, sampled=True)] * 64)
    core = cost._core_s(LLAMA7_PAIR_FLOPS, batch)
    assert core == pytest.approx(64 * 1000 * LLAMA7_PAIR_FLOPS
                                 / (A100_FA2_CAUSAL_FWD_D128[512] * cost.gpu.sustained_clock_fraction), rel=1e-12)
    kv_read = 32 * 64 * 1001 * (2 * 32 * 128 * 2) / A100_RATE_Bps
    assert cost.time(batch).breakdown_s["attention"] == pytest.approx(kv_read, rel=1e-12)
    assert 32 * core < kv_read / 10


def test_fp32_serving_keeps_the_flat_efficiency() -> None:
    """The tables are the papers' fp16/bf16 kernels: fp32 weights price the core at 0.615 x the fp32 peak."""
    cost = _cost("llama2-7b", ServingLayout(), ServingConfig(dtype="fp32"))
    attention = cost.time(chunk_shape(2048, 0, sampled=True)).breakdown_s["attention"]
    flops = 32 * (2048 * 2049 // 2) * LLAMA7_PAIR_FLOPS
    assert attention == pytest.approx(flops / (19.5e12 * 0.615 * cost.gpu.sustained_clock_fraction), rel=1e-12)
