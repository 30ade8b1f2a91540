"""torchtitan's per-op selective checkpointing (simgrid.model.selective_op): which linears are saved, the
saved bytes, the recomputed GEMMs, and how block_cost prices a selective-op recompute.

Expected values are worked out by hand from torchtitan's policy (save the 1st, 3rd, ... ``aten.mm`` of a block,
SDPA's outputs and sequence-parallel reduce-scatter outputs) and the model's shapes."""

from __future__ import annotations

import dataclasses

from simgrid.layout.spec import Layout
from simgrid.model import block_cost, get_model
from simgrid.model.activations import block_activation_bytes
from simgrid.model.selective_op import block_linears, recompute_gemms, saved_activation_bytes

LLAMA = dataclasses.replace(get_model("llama3-8b"), seq_length=1024)
"""h 4096, 32 heads of 128, 8 KV heads, SwiGLU f 14336, no biases."""


def _layout(**kw: object) -> Layout:
    return Layout(**{"flash_attention": True, "recompute": "selective-op", **kw})  # type: ignore[arg-type]


def test_llama_block_saves_mm_1_3_5_7_in_torchtitans_forward_order() -> None:
    """wq wk wv wo | w1 w3 w2 are mm 1..7: wq, wv, w1, w2 saved; wk, wo, w3 recomputed."""
    attn = block_linears(LLAMA, 1)
    mlp = block_linears(LLAMA, 2)
    assert [(lin.name, lin.saved) for lin in attn] == [("wq", True), ("wk", False), ("wv", True), ("wo", False)]
    assert [(lin.name, lin.saved) for lin in mlp] == [("w1", True), ("w3", False), ("w2", True)]
    assert block_linears(LLAMA, 0) == () and block_linears(LLAMA, 2 * LLAMA.num_layers + 1) == ()


def test_biased_linears_are_addmm_so_nothing_is_saved_or_counted() -> None:
    """A model with biases runs aten.addmm, which the policy neither saves nor counts: all recomputed."""
    gpt = get_model("gpt3-1.3b")
    assert gpt.bias and not any(lin.saved for b in (1, 2) for lin in block_linears(gpt, b))


def test_non_gated_mlp_saves_w1_and_recomputes_w2() -> None:
    """Non-gated MLP without biases: mm 5 (w1) saved, mm 6 (w2) recomputed."""
    plain = dataclasses.replace(LLAMA, gated_mlp=False)
    assert [(lin.name, lin.saved) for lin in block_linears(plain, 2)] == [("w1", True), ("w2", False)]


def test_saved_bytes_by_hand_tp1() -> None:
    """T = 2 x 1024 tokens, bf16. Attention: block input T h, wq out T h, wv out T 1024, SDPA output T h and its
    fp32 LSE T 32 x 4. MLP: w1 out T f, w2 out T h."""
    t, h, f = 2 * 1024, 4096, 14336
    attn = saved_activation_bytes(LLAMA, 1, micro_batch_size=2, tp=1, cp=1, sequence_parallel=False, dtype_bytes=2)
    mlp = saved_activation_bytes(LLAMA, 2, micro_batch_size=2, tp=1, cp=1, sequence_parallel=False, dtype_bytes=2)
    assert attn == 2 * t * h + 2 * t * h + 2 * t * 1024 + 2 * t * h + 4 * t * 32
    assert mlp == 2 * t * f + 2 * t * h
    assert block_activation_bytes(LLAMA, 1, micro_batch_size=2, recompute="selective-op", flash_attention=True) == attn


def test_saved_bytes_by_hand_tp2_sequence_parallel() -> None:
    """tp 2 + sequence parallel: head-split outputs halve, the block input is the s/t shard, and each sub-block
    also keeps its reduce-scatter output (a shard of T h)."""
    t, h, f = 1024, 4096, 14336
    attn = saved_activation_bytes(LLAMA, 1, micro_batch_size=1, tp=2, cp=1, sequence_parallel=True, dtype_bytes=2)
    mlp = saved_activation_bytes(LLAMA, 2, micro_batch_size=1, tp=2, cp=1, sequence_parallel=True, dtype_bytes=2)
    shard = 2 * t * h // 2
    assert attn == shard + 2 * t * h // 2 + 2 * t * 512 + 2 * t * h // 2 + 4 * t * 16 + shard
    assert mlp == 2 * t * f // 2 + 2 * t * h + shard


def test_selective_op_keeps_less_than_none_and_more_than_full() -> None:
    """Saved bytes per layer order: full < selective-op < none (same layout otherwise)."""
    def layer(recompute: str) -> int:
        lay = _layout(recompute=recompute)
        return sum(block_cost(LLAMA, lay, b).activation_bytes for b in (1, 2))
    assert layer("full") < layer("selective-op") < layer("none")


def test_recompute_gemms_are_wk_wo_and_w3() -> None:
    """The backward reruns wk (h -> 1024), wo (h -> h) and w3 (h -> f) over every token."""
    assert recompute_gemms(LLAMA, 1, micro_batch_size=2, tp=1, cp=1) == ((2048, 1024, 4096, 1), (2048, 4096, 4096, 1))
    assert recompute_gemms(LLAMA, 2, micro_batch_size=2, tp=1, cp=1) == ((2048, 14336, 4096, 1),)


def test_block_cost_prices_the_rerun_linears_not_the_attention_kernel() -> None:
    """Recompute FLOPs = 2 T (h kv + h h) for attention and 2 T h f for the MLP; the fused attention core is
    saved (no fused recompute FLOPs); its bytes and launch are left out of the rerun, and the MLP skips its
    last residual add (3 T h d) and the saved w2 GEMM."""
    lay = _layout(micro_batch_size=2)
    t, h, f = 2048, 4096, 14336
    attn, mlp = block_cost(LLAMA, lay, 1), block_cost(LLAMA, lay, 2)
    assert attn.recompute_flops == 2 * t * (h * 1024 + h * h)
    assert mlp.recompute_flops == 2 * t * h * f
    assert attn.fused_attention_recompute_flops == 0.0
    full = block_cost(LLAMA, _layout(micro_batch_size=2, recompute="full"), 1)
    assert full.fused_attention_recompute_flops > 0
    flash_fwd_bytes = 2 * (t * h * 2) + 2 * (t * 1024 * 2) + t * 32 * 4  # read Q K V, write O, LSE
    assert attn.recompute_hbm_bytes == attn.fwd_hbm_bytes - flash_fwd_bytes
    assert attn.recompute_kernels == attn.fwd_kernels - 1
    assert mlp.recompute_hbm_bytes == mlp.fwd_hbm_bytes - 3 * t * h * 2
    assert mlp.recompute_kernels == mlp.fwd_kernels - 2
    assert block_cost(LLAMA, lay, 0).recompute_flops == 0.0  # the embedding is outside the checkpoints
