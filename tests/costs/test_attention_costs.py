"""Fused-attention time from the profile's FlashAttention-2/3 tables: lookup, FLOP convention, kernel choice."""

from __future__ import annotations

import pytest

from simgrid.costs import attention_table, fused_attention_time_s
from simgrid.errors import SimgridError
from simgrid.hardware import load_gpu
from simgrid.model.flops import causal_tile_fraction


def test_time_is_the_papers_flops_over_the_papers_speed_at_the_sustained_clock() -> None:
    """H100, FA3, causal forward at s = 2048, head dim 128: 521 TFLOP/s in FA3's Fig. 5. The op carries the
    executed FLOPs (diagonal tiles included); the paper counts half the square."""
    gpu = load_gpu("h100-sxm")
    full = 4.0 * 2048 * 2048 * 128 * 32  # one sequence, 32 heads
    executed = full * causal_tile_fraction(2048)
    seconds = fused_attention_time_s(executed, gpu, dtype="bf16", direction="fwd", shape=(2048, 2048, 128), kernel="fa3")
    assert seconds == pytest.approx((full / 2) / (521e12 * gpu.sustained_clock_fraction))


def test_auto_uses_the_profiles_default_and_fa2_is_slower_on_h100() -> None:
    """H100 default is FA3; FA2 (FA3 paper's FA2 bars) runs the same core slower in both directions."""
    gpu = load_gpu("h100-sxm")
    assert attention_table(gpu) is gpu.fused_attention["fa3"]
    for direction in ("fwd", "bwd"):
        fa3 = fused_attention_time_s(1e12, gpu, dtype="bf16", direction=direction, shape=(4096, 4096, 128))  # type: ignore[arg-type]
        fa2 = fused_attention_time_s(1e12, gpu, dtype="bf16", direction=direction, shape=(4096, 4096, 128),  # type: ignore[arg-type]
                                     kernel="fa2")
        assert fa2 > 1.5 * fa3


def test_causal_backward_scales_the_full_backward_by_the_forwards_causal_ratio() -> None:
    """FA3 publishes the backward without the mask only (561 TFLOP/s at 16k, head dim 128); at 16k the
    forward's causal/full ratio is 616/648."""
    table = load_gpu("h100-sxm").fused_attention["fa3"]
    assert table.tflops("bwd", 16384, 128, causal=False) == pytest.approx(561)
    assert table.tflops("bwd", 16384, 128) == pytest.approx(561 * 616 / 648)


def test_lookup_interpolates_in_log_length_and_head_dim_and_clamps() -> None:
    """Between 2k (521) and 4k (579) the midpoint in log2 is 3k-ish; head dim 96 lies between 64 and 128;
    beyond 16k and below 512 the table's end values hold."""
    table = load_gpu("h100-sxm").fused_attention["fa3"]
    assert table.tflops("fwd", 2048 * 2**0.5, 128) == pytest.approx((521 + 579) / 2)
    assert table.tflops("fwd", 2048, 96) == pytest.approx((371 + 521) / 2)
    assert table.tflops("fwd", 65536, 128) == pytest.approx(616)
    assert table.tflops("fwd", 128, 128) == pytest.approx(292)


def test_context_parallel_shape_reads_the_square_of_equal_area() -> None:
    """A rank attending 2048 queries to 8192 keys is looked up at sqrt(2048 * 8192) = 4096."""
    gpu = load_gpu("h100-sxm")
    cp = fused_attention_time_s(1e12, gpu, dtype="bf16", shape=(2048, 8192, 128))
    table = gpu.fused_attention["fa3"]
    expected = 1e12 * 0.5 / causal_tile_fraction(8192) / (table.tflops("fwd", 4096, 128) * 1e12 * gpu.sustained_clock_fraction)
    assert cp == pytest.approx(expected)


def test_profiles_without_tables_use_the_flat_figure_and_refuse_a_missing_kernel() -> None:
    """A100 has no table: its flat FA2 figure (x sustained clock) prices the core; asking H100 for an
    unknown kernel names the choices."""
    a100 = load_gpu("a100-80gb-sxm")
    expected = 1e12 / (a100.peak_flops("bf16") * a100.attention_efficiency * a100.sustained_clock_fraction)
    assert fused_attention_time_s(1e12, a100, dtype="bf16", shape=(2048, 2048, 128), kernel="fa2") == pytest.approx(expected)
    with pytest.raises(SimgridError, match="attention kernel 'fa4' is unknown"):
        fused_attention_time_s(1e12, load_gpu("h100-sxm"), dtype="bf16", shape=(2048, 2048, 128), kernel="fa4")


def test_zero_flops_and_unknown_shape() -> None:
    """No FLOPs take no time; an op without a shape falls back to the flat figure."""
    gpu = load_gpu("h100-sxm")
    assert fused_attention_time_s(0.0, gpu, dtype="bf16") == 0.0
    flat = 1e12 / (gpu.peak_flops("bf16") * gpu.attention_efficiency * gpu.sustained_clock_fraction)
    assert fused_attention_time_s(1e12, gpu, dtype="bf16") == pytest.approx(flat)
