"""Transformer Engine's fp8 casts (:mod:`simgrid.model.fp8_kernels`): present only under fp8 and only in
transformer sub-blocks (dense, and MoE's grouped experts, padding copies and shared expert), byte counts by hand for one layer, current scaling dearer than delayed, the recompute
does not redo the once-per-step weight casts, sequence-parallel all-gathers at 1 byte, saved linear inputs at
1 byte."""

from __future__ import annotations

import dataclasses

import pytest

from simgrid.layout import Layout
from simgrid.model import block_cost, get_model
from simgrid.model.activations import block_activation_bytes
from simgrid.model.blocks import num_model_blocks
from simgrid.model.comm import block_tp_collectives
from simgrid.model.fp8_kernels import NO_FP8, fp8_moe_traffic, fp8_moe_weight_params, fp8_traffic, fp8_weight_params
from simgrid.model.kernels import block_kernels
from simgrid.model.moe_spec import MoESpec
from simgrid.model.spec import ModelSpec

MODEL = get_model("llama2-7b")  # h 4096, 32 heads, ffn 11008 (gated), no bias
BASE = Layout(tp=2, global_batch_size=4, flash_attention=True)


def test_nothing_without_fp8_or_outside_dense_transformer_blocks() -> None:
    fp8 = dataclasses.replace(BASE, fp8_recipe="delayed")
    assert fp8_traffic(MODEL, BASE, "attn") == NO_FP8
    assert fp8_traffic(MODEL, fp8, "head") == NO_FP8 and fp8_traffic(MODEL, fp8, "embed") == NO_FP8
    for block in (0, 1, 2, num_model_blocks(MODEL) - 1):
        plain, f8 = block_kernels(MODEL, BASE, block), block_kernels(MODEL, fp8, block)
        if block in (1, 2):
            assert f8.bwd_hbm_bytes > plain.bwd_hbm_bytes and f8.bwd_kernels > plain.bwd_kernels
        else:
            assert f8 == plain


def test_mlp_bytes_by_hand_without_sequence_parallelism() -> None:
    """tp 2, T = 4096 tokens, d = 2, m = 4 micro-batches. Forward: fp8 norm output saves 1 byte per element of
    T x h; fc2's input (T x 5504) cast with its transpose, 4 bytes; fc1 + fc2 weights (4096 x 11008 + 5504 x 4096)
    cast-transposed, 4 bytes, a quarter per micro-batch. Backward: ln_out transposed (2 T h), fc1's output
    gradient (T x 11008) cast-transposed (4), fc2's output gradient (T x h) cast-transposed (4)."""
    layout = dataclasses.replace(BASE, fp8_recipe="delayed")
    t, h = 4096, 4096
    weights = h * 11008 + 5504 * h
    assert fp8_weight_params(MODEL, layout, "mlp") == weights
    got = fp8_traffic(MODEL, layout, "mlp")
    assert got.weight_fwd_bytes == 4 * weights // 4
    assert got.fwd_bytes == -t * h + 4 * t * 5504 + 4 * weights // 4
    assert got.bwd_bytes == 2 * t * h + 4 * t * 11008 + 4 * t * h
    assert (got.fwd_kernels, got.bwd_kernels) == (1 + 1, 3)  # fc2 cast-transpose, weights (2 launches over 4 micro-batches, rounded up)


def test_current_scaling_adds_an_amax_pass_per_quantized_tensor() -> None:
    delayed = fp8_traffic(MODEL, dataclasses.replace(BASE, fp8_recipe="delayed"), "attn")
    current = fp8_traffic(MODEL, dataclasses.replace(BASE, fp8_recipe="current"), "attn")
    assert current.fwd_bytes > delayed.fwd_bytes and current.bwd_bytes > delayed.bwd_bytes
    assert current.fwd_kernels > delayed.fwd_kernels and current.bwd_kernels > delayed.bwd_kernels


def test_full_recompute_reuses_the_cached_fp8_weights() -> None:
    layout = dataclasses.replace(BASE, fp8_recipe="delayed", recompute="full")
    kernels, cost = block_kernels(MODEL, layout, 2), block_cost(MODEL, layout, 2)
    assert kernels.fp8_weight_fwd_hbm_bytes > 0
    assert cost.recompute_hbm_bytes == kernels.fwd_hbm_bytes - kernels.fp8_weight_fwd_hbm_bytes


def test_sequence_parallel_gathers_go_in_fp8_and_reduce_scatters_stay_16_bit() -> None:
    sp = dataclasses.replace(BASE, sequence_parallel=True)
    plain = {c.label: c.bytes for c in block_tp_collectives(MODEL, sp, 1)}
    fp8 = {c.label: c.bytes for c in block_tp_collectives(MODEL, dataclasses.replace(sp, fp8_recipe="current"), 1)}
    for label in ("input", "output-grad", "input-regather"):
        assert fp8[label] * 2 == plain[label]
    for label in ("output", "input-grad"):
        assert fp8[label] == plain[label]
    last = num_model_blocks(MODEL) - 1  # the head: Megatron's own ColumnParallelLinear, 16-bit
    assert block_tp_collectives(MODEL, dataclasses.replace(sp, fp8_recipe="current"), last) == \
        block_tp_collectives(MODEL, sp, last)


@pytest.mark.parametrize("flash", [True, False])
def test_saved_linear_inputs_are_one_byte(flash: bool) -> None:
    """MLP: fc1 input (T h) and fc2 input (T f/tp) shrink by 1 byte per element; attention: the QKV input
    shrinks, the out-projection input shrinks behind an unfused core and is kept twice (16-bit O + fp8 copy)
    behind FlashAttention."""
    t, h, q = 4096, 4096, 4096 // 2

    def saved(block: int, fp8: bool) -> int:
        return block_activation_bytes(MODEL, block, tp=2, flash_attention=flash, fp8=fp8)

    assert saved(2, False) - saved(2, True) == t * h + t * 5504
    assert saved(1, False) - saved(1, True) == t * h + (-t * q if flash else t * q)


# -- MoE sub-blocks (session 14): TE GroupedLinear experts, padding copies, the shared expert's linears ----------
def _moe_toy(**moe: object) -> ModelSpec:
    spec = MoESpec(**{"num_experts": 8, "top_k": 2, "expert_ffn_hidden_size": 32, **moe})  # type: ignore[arg-type]
    return ModelSpec(name="toy", num_layers=2, hidden_size=16, num_heads=2, gated_mlp=True, vocab_size=64,
                     seq_length=8, tied_embeddings=False, norm="rmsnorm", position="rope", bias=False, moe=spec)


def test_moe_expert_casts_and_padding_by_hand() -> None:
    """Toy, ep 2, 2 micro-batches of 2 x 8 tokens: 4 local experts x 8 tokens, padded to 16 each: R = 64 rows, h 16,
    fc1 width 64, expert width 32, d 2. Forward: pad and unpad copies 2 x 2 d R h, cast-transposes of fc1's input
    (R h) and fc2's input (R 32) at d + 2; weights 4 x 16 x (64 + 32) at d + 2, half per micro-batch. Backward: the
    copies' gradients, cast-transposes of fc2's output gradient (R h) and fc1's (R 64). No shared expert."""
    model = _moe_toy()
    layout = Layout(dp=2, ep=2, global_batch_size=8, micro_batch_size=2, fp8_recipe="delayed")
    rows, h, d = 64, 16, 2
    weights = 4 * h * (64 + 32)
    assert fp8_moe_weight_params(model, layout) == weights
    got = fp8_moe_traffic(model, layout)
    pad = 2 * 2 * d * rows * h
    assert got.weight_fwd_bytes == 4 * weights // 2
    assert got.fwd_bytes == pad + 4 * rows * (h + 32) + 4 * weights // 2
    assert got.bwd_bytes == pad + 4 * rows * (h + 64)
    assert (got.fwd_kernels, got.bwd_kernels) == (2 + 2 + 4, 2 + 2)  # 8 weight casts over 2 micro-batches
    assert fp8_moe_traffic(model, dataclasses.replace(layout, fp8_recipe="none")) == NO_FP8
    plain = block_kernels(model, dataclasses.replace(layout, fp8_recipe="none"), 2)
    assert block_kernels(model, layout, 2).fwd_hbm_bytes == plain.fwd_hbm_bytes + got.fwd_bytes


def test_moe_shared_expert_takes_the_dense_linear_pair_without_the_fp8_norm() -> None:
    """The shared expert's fc1 is a TE Linear behind a 16-bit norm: it casts that output itself (d + 2 per element
    without sequence parallelism) instead of saving 1 - d bytes, and needs no ln_out transpose."""
    plain, shared = _moe_toy(), _moe_toy(shared_expert_ffn_hidden_size=24)
    layout = Layout(dp=2, ep=2, global_batch_size=8, micro_batch_size=2, fp8_recipe="delayed")
    extra = [b - a for a, b in zip(fp8_moe_traffic(plain, layout), fp8_moe_traffic(shared, layout), strict=True)]
    t, h, weights = 16, 16, 16 * (48 + 24)
    assert extra[0] == 4 * t * h + 4 * t * 24 + 4 * weights // 2  # fc1 input, fc2 input, weights
    assert extra[1] == 4 * t * 48 + 4 * t * h  # output gradients of fc1 and fc2
    assert fp8_moe_weight_params(shared, layout) == fp8_moe_weight_params(plain, layout) + weights


def test_moe_saved_expert_inputs_take_one_byte_under_fp8() -> None:
    model = _moe_toy()
    layout = Layout(dp=2, ep=2, global_batch_size=8, micro_batch_size=2)
    plain = block_cost(model, layout, 2).activation_bytes
    fp8 = block_cost(model, dataclasses.replace(layout, fp8_recipe="delayed"), 2).activation_bytes
    assert plain - fp8 == (2 - 1) * 32 * (16 + 32)  # T_e = 32 token copies; fc1 input h, fc2 input 32


def test_fp8_params_drop_the_weight_cast_and_keep_a_transpose_refill() -> None:
    """Layout.fp8_params: the weights are Float8Tensors, so no per-step cast (read d, write 2) but the transpose
    cache's refill, read 1 + write 1 per weight, still once per step (a 1/m share, one launch per weight over the
    micro-batches); every activation cast is unchanged."""
    layout = dataclasses.replace(BASE, fp8_recipe="delayed", zero=1, zero_impl="apex")
    fp8w = dataclasses.replace(layout, fp8_params=True)
    weights = fp8_weight_params(MODEL, layout, "mlp")
    plain, got = fp8_traffic(MODEL, layout, "mlp"), fp8_traffic(MODEL, fp8w, "mlp")
    assert plain.weight_fwd_bytes == 4 * weights // 4 and got.weight_fwd_bytes == 2 * weights // 4
    assert got.fwd_bytes - got.weight_fwd_bytes == plain.fwd_bytes - plain.weight_fwd_bytes
    assert got.bwd_bytes == plain.bwd_bytes and got.bwd_kernels == plain.bwd_kernels
    assert got.weight_fwd_kernels == 1  # two transposes over four micro-batches, rounded up
