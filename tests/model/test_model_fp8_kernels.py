"""Transformer Engine's fp8 casts (:mod:`simgrid.model.fp8_kernels`): present only under fp8 and only in dense
transformer sub-blocks, byte counts by hand for one layer, current scaling dearer than delayed, the recompute
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
from simgrid.model.fp8_kernels import NO_FP8, fp8_traffic, fp8_weight_params
from simgrid.model.kernels import block_kernels

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
