"""GEMM lists per sub-block: their FLOPs equal the block's FLOPs, their shapes follow the layout, and under
gradient accumulation fusion the weight-gradient lists accumulate into main_grad."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from simgrid.errors import LayoutError
from simgrid.layout import Layout
from simgrid.model import block_cost, get_model
from simgrid.model.blocks import num_model_blocks
from simgrid.model.gemms import block_gemms, wgrad_accumulate_bytes


def flops_of(gemms: tuple[tuple[int, int, int, int], ...]) -> float:
    return sum(2.0 * m * n * k * c for m, n, k, c in gemms)


LAYOUTS = [Layout(), Layout(tp=2, micro_batch_size=2), Layout(tp=4, sequence_parallel=True),
           Layout(flash_attention=True), Layout(cp=2, tp=2, flash_attention=True), Layout(recompute="full"),
           Layout(recompute="selective", tp=2)]


@pytest.mark.parametrize(("model_name", "layout"), list(itertools.product(
    ["gpt2-small", "llama2-7b", "llama3-8b", "megatron-1.7b"], LAYOUTS)))
def test_gemm_flops_equal_block_flops_for_every_pass(model_name: str, layout: Layout) -> None:
    """Forward, input-gradient and weight-gradient GEMMs add up to the block's FLOPs minus the fused core;
    the recompute GEMMs to the recompute FLOPs minus the fused core's share."""
    model = get_model(model_name)
    if model.num_heads % layout.tp or model.seq_length % (2 * layout.cp):
        pytest.skip("layout does not fit the model")
    for block in range(num_model_blocks(model)):
        c = block_cost(model, layout, block)
        assert flops_of(c.fwd_gemms) == pytest.approx(c.fwd_flops - c.fused_attention_fwd_flops)
        assert flops_of(c.bwd_input_gemms) == pytest.approx(c.bwd_input_flops - c.fused_attention_bwd_flops)
        assert flops_of(c.bwd_weight_gemms) == pytest.approx(c.bwd_weight_flops)
        assert flops_of(c.recompute_gemms) == pytest.approx(c.recompute_flops - c.fused_attention_recompute_flops)


def test_llama_mlp_shapes_under_tensor_parallelism() -> None:
    """Llama 2 7B, tp 2, micro-batch 2 (8192 tokens): fused gate+up 8192 x 11008 x 4096, down 8192 x 4096 x
    5504; the weight gradients put the tokens in the inner dimension."""
    g = block_gemms(get_model("llama2-7b"), Layout(tp=2, micro_batch_size=2), 2)
    assert g.fwd == ((8192, 11008, 4096, 1), (8192, 4096, 5504, 1))
    assert g.bwd_weight == ((5504, 4096, 8192, 1), (4096, 11008, 8192, 1))


def test_unfused_core_is_batched_over_heads_and_fused_core_has_no_gemm() -> None:
    """GPT-2 small (12 heads, head dim 64, s 1024): QK^T and PV batched 12x per sequence, listed as one GEMM
    with the 12 members stacked along m; FlashAttention moves the core out of the GEMM list (the attention
    table prices it)."""
    model = get_model("gpt2-small")
    unfused = block_gemms(model, Layout(), 1)
    assert unfused.core_fwd == ((12 * 1024, 1024, 64, 1), (12 * 1024, 64, 1024, 1))
    fused = block_gemms(model, Layout(flash_attention=True), 1)
    assert fused.core_fwd == () and len(fused.fwd) == 2
    assert block_cost(model, Layout(flash_attention=True), 1).attention_shape == (1024, 1024, 64)


def test_context_parallel_core_attends_local_queries_to_all_keys() -> None:
    """cp 2: the rank's 1024 of 2048 queries meet all 2048 keys (shape (s/cp, s, d))."""
    model = get_model("llama2-7b")
    assert block_cost(model, Layout(cp=2, flash_attention=True), 1).attention_shape == (2048, 4096, 128)


# -- gradient accumulation fusion: the weight-gradient GEMMs accumulate into main_grad --------------------------
MEGATRON_FP16 = Layout(tp=2, sequence_parallel=True, zero=1, precision="fp16", grad_accumulation_fusion=True)
"""Megatron-Core as the megatron-h100 rows run it: fp16, so main_grad keeps the 16-bit parameter dtype."""


@pytest.mark.parametrize(("layout", "width"), [
    (MEGATRON_FP16, 2),
    (Layout(precision="bf16", reduce_dtype="fp32", grad_accumulation_fusion=True), 4),  # bf16: fp32 main_grad
    (Layout(precision="fp32", grad_accumulation_fusion=True), 4),
    (Layout(precision="fp16"), 0),  # no fusion: a fresh gradient (Megatron-LM 2021/2022 fp16, SC'21, Korthikanti)
    (Layout(dp=8, zero=3, zero_impl="fsdp2", reduce_dtype="fp32"), 0),  # FSDP2: autograd writes fresh gradients
])
def test_main_grad_width_follows_precision_and_reduce_dtype(layout: Layout, width: int) -> None:
    assert wgrad_accumulate_bytes(layout) == width


def test_weight_gradient_gemms_carry_the_accumulation_and_the_others_do_not() -> None:
    """Under fusion only the W lists are marked; the shapes of every list are those of the unfused layout."""
    model = get_model("megatron-1.7b")
    plain = dataclasses.replace(MEGATRON_FP16, grad_accumulation_fusion=False)
    for block in range(num_model_blocks(model)):
        fused, fresh = block_gemms(model, MEGATRON_FP16, block), block_gemms(model, plain, block)
        assert (fused.fwd, fused.bwd_input, fused.bwd_weight) == (fresh.fwd, fresh.bwd_input, fresh.bwd_weight)
        assert fresh.wgrad_accumulate_bytes == 0
        assert fused.wgrad_accumulate_bytes == (2 if fused.bwd_weight else 0)


def test_fused_accumulation_drops_the_separate_add_of_the_gemm_weights_only() -> None:
    """megatron-1.7b's MLP block at tp 2 (h = 2304, ffn = 9216): its two weight matrices hold 2 x 2304 x 9216 / 2
    parameters, whose separate 6-byte add (read grad 2 + read main_grad 2 + write 2) is gone under fusion; its
    biases and norm keep it."""
    model = get_model("megatron-1.7b")
    plain = dataclasses.replace(MEGATRON_FP16, grad_accumulation_fusion=False)
    mlp = 2  # blocks: embed, attn, mlp, ...
    gemm_weights = 2 * 2304 * 9216 // 2
    fused, fresh = block_cost(model, MEGATRON_FP16, mlp), block_cost(model, plain, mlp)
    assert fresh.bwd_hbm_bytes - fused.bwd_hbm_bytes == 6 * gemm_weights
    assert fused.wgrad_accumulate_bytes == 2 and fresh.wgrad_accumulate_bytes == 0


def test_fusion_needs_megatron_main_grad() -> None:
    with pytest.raises(LayoutError, match=r"grad_accumulation_fusion is Megatron-LM's .* zero = 3"):
        Layout(dp=8, zero=3, zero_impl="fsdp2", grad_accumulation_fusion=True)
    with pytest.raises(LayoutError, match="tp_impl = 'dtensor'"):
        Layout(tp=2, tp_impl="dtensor", grad_accumulation_fusion=True)
    with pytest.raises(LayoutError, match="grad_accumulation_fusion = 1 must be true or false"):
        Layout(grad_accumulation_fusion=1)  # type: ignore[arg-type]


# -- fp8 (Transformer Engine's linear layers) -------------------------------------------------------------------
@pytest.mark.parametrize("flash", [True, False])
def test_fp8_runs_the_te_linears_and_nothing_else(flash: bool) -> None:
    """Under fp8 the QKV, out-projection, fc1 and fc2 GEMMs (forward, input and weight gradient) are fp8; the
    unfused attention core's batched GEMMs, the head and the embedding stay 16-bit; nothing is fp8 without it."""
    model = get_model("llama2-7b")
    layout = Layout(tp=2, global_batch_size=2, flash_attention=flash, fp8_recipe="delayed")
    attn, mlp, head = (block_cost(model, layout, b) for b in (1, 2, num_model_blocks(model) - 1))
    attn_g = block_gemms(model, layout, 1)
    linear = {attn_g.fwd[0], attn_g.fwd[-1], *attn_g.bwd_weight, attn_g.bwd_input[0], attn_g.bwd_input[-1]}
    assert attn.fp8_gemm_shapes == {g[:3] for g in linear}
    assert not attn.fp8_gemm_shapes & {g[:3] for g in attn_g.core_fwd}
    assert mlp.fp8_gemm_shapes == {g[:3] for g in (*mlp.fwd_gemms, *mlp.bwd_input_gemms, *mlp.bwd_weight_gemms)}
    assert head.fp8_gemm_shapes == frozenset() and block_cost(model, layout, 0).fp8_gemm_shapes == frozenset()
    assert block_cost(model, dataclasses.replace(layout, fp8_recipe="none"), 1).fp8_gemm_shapes == frozenset()
