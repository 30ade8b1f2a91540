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
    """B200 has no table: its flat figure (x sustained clock) prices the core whatever kernel is named; asking
    H100 for an unknown kernel, or A100 (FA2 only) for FA3, names the choices."""
    b200 = load_gpu("b200")
    expected = 1e12 / (b200.peak_flops("bf16") * b200.attention_efficiency * b200.sustained_clock_fraction)
    for kernel in ("auto", "fa2", "fa3"):
        assert fused_attention_time_s(1e12, b200, dtype="bf16", shape=(2048, 2048, 128), kernel=kernel) == pytest.approx(expected)
    with pytest.raises(SimgridError, match="attention kernel 'fa4' is unknown"):
        fused_attention_time_s(1e12, load_gpu("h100-sxm"), dtype="bf16", shape=(2048, 2048, 128), kernel="fa4")
    with pytest.raises(SimgridError, match=r"GPU 'a100-80gb-sxm' has no fa3 attention table \(it has: fa2\)"):
        fused_attention_time_s(1e12, load_gpu("a100-80gb-sxm"), dtype="bf16", shape=(2048, 2048, 128), kernel="fa3")


def test_zero_flops_and_unknown_shape() -> None:
    """No FLOPs take no time; an op without a shape falls back to the flat figure."""
    gpu = load_gpu("h100-sxm")
    assert fused_attention_time_s(0.0, gpu, dtype="bf16") == 0.0
    flat = 1e12 / (gpu.peak_flops("bf16") * gpu.attention_efficiency * gpu.sustained_clock_fraction)
    assert fused_attention_time_s(1e12, gpu, dtype="bf16") == pytest.approx(flat)


# FlashAttention-2 paper (Dao 2023, arXiv:2307.08691), Fig. 4, A100 80GB SXM4, FlashAttention-2 bars, forward +
# backward TFLOP/s at sequence 512 ... 16k, typed here from the figure (not from the profile): (causal, head dim).
FA2_A100_FIG4 = {
    (False, 64): (132, 153, 162, 171, 175, 176),
    (False, 128): (151, 173, 187, 196, 201, 203),
    (True, 64): (88, 119, 140, 156, 165, 171),
    (True, 128): (99, 133, 155, 173, 182, 189),
}
SEQ_LENS = (512, 1024, 2048, 4096, 8192, 16384)


@pytest.mark.parametrize("name", ["a100-80gb-sxm", "a100-40gb-sxm"])
def test_a100_profiles_carry_the_fa2_table_and_keep_the_flat_fallback(name: str) -> None:
    """Both A100 profiles default to their FlashAttention-2 table (sourced), and keep 0.615 for what it
    does not cover."""
    gpu = load_gpu(name)
    assert gpu.attention_kernel == "fa2" and set(gpu.fused_attention) == {"fa2"}
    assert attention_table(gpu) is gpu.fused_attention["fa2"]
    table = gpu.fused_attention["fa2"]
    assert table.seq_len == SEQ_LENS and table.head_dim == (64, 128)
    assert table.bwd_causal_tflops is not None
    assert "Fig. 4" in gpu.sources["fused_attention"] and gpu.fused_attention_efficiency == 0.615


@pytest.mark.parametrize(("causal", "head_dim"), list(FA2_A100_FIG4))
def test_a100_forward_plus_backward_reproduces_the_fa2_papers_figure_4(causal: bool, head_dim: int) -> None:
    """One sequence's core forward then backward on A100 takes the paper's FLOPs (3.5 x the forward, causal
    half the square) over Fig. 4's speed at the sustained clock, at every length and both head dims, within
    the rounding of the derived backward grid (1%)."""
    gpu = load_gpu("a100-80gb-sxm")
    heads = 2048 // head_dim  # the benchmark's hidden 2048
    for s, fig4 in zip(SEQ_LENS, FA2_A100_FIG4[(causal, head_dim)], strict=True):
        paper_fwd = 4.0 * s * s * head_dim * heads * (0.5 if causal else 1.0)
        executed = 4.0 * s * s * head_dim * heads * (causal_tile_fraction(s) if causal else 1.0)
        table = gpu.fused_attention["fa2"]
        # the cost function reads causal=True; the non-causal cells are checked on the table directly
        if causal:
            seconds = (fused_attention_time_s(executed, gpu, dtype="bf16", direction="fwd", shape=(s, s, head_dim))
                       + fused_attention_time_s(2.5 * executed, gpu, dtype="bf16", direction="bwd", shape=(s, s, head_dim)))
        else:
            seconds = (paper_fwd / (table.tflops("fwd", s, head_dim, causal=False) * 1e12)
                       + 2.5 * paper_fwd / (table.tflops("bwd", s, head_dim, causal=False) * 1e12)) / gpu.sustained_clock_fraction
        speed = 3.5 * paper_fwd / seconds / 1e12 / gpu.sustained_clock_fraction
        assert speed == pytest.approx(fig4, rel=0.01), (s, speed, fig4)


def test_a100_time_follows_sequence_length_head_dim_and_direction() -> None:
    """Causal forward at 2k is 167 (head dim 64) and 187 (128) TFLOP/s in the FA2 paper's Fig. 5: the longer
    sequence and the wider head run faster per FLOP; the backward runs slower than the forward; between the
    tabulated lengths the speed is read in log2."""
    gpu = load_gpu("a100-80gb-sxm")

    def speed(direction: str, s: int, d: int) -> float:
        flops = 4.0 * s * s * d * causal_tile_fraction(s)
        seconds = fused_attention_time_s(flops, gpu, dtype="bf16", direction=direction, shape=(s, s, d))  # type: ignore[arg-type]
        return 4.0 * s * s * d * 0.5 / seconds / 1e12 / gpu.sustained_clock_fraction

    assert speed("fwd", 2048, 64) == pytest.approx(167)
    assert speed("fwd", 2048, 128) == pytest.approx(187)
    assert speed("fwd", 512, 128) == pytest.approx(132)
    assert speed("fwd", 16384, 128) == pytest.approx(197)
    assert speed("fwd", 2048, 96) == pytest.approx((167 + 187) / 2)
    assert speed("fwd", round(2048 * 2**0.5), 128) == pytest.approx((187 + 198) / 2, rel=1e-3)
    for s in SEQ_LENS:
        for d in (64, 128):
            assert speed("bwd", s, d) < speed("fwd", s, d)
    assert speed("fwd", 512, 64) < speed("fwd", 4096, 64) < speed("fwd", 4096, 128)


def test_a100_other_dtypes_and_shapeless_cores_fall_back_to_the_flat_figure() -> None:
    """The paper benchmarked fp16/bf16: tf32 prices at 0.615 of its own peak; an op without a shape too."""
    gpu = load_gpu("a100-80gb-sxm")
    flat = 1e12 / (gpu.peak_flops("tf32") * 0.615 * gpu.sustained_clock_fraction)
    assert fused_attention_time_s(1e12, gpu, dtype="tf32", shape=(2048, 2048, 128)) == pytest.approx(flat)
    flat_bf16 = 1e12 / (312e12 * 0.615 * gpu.sustained_clock_fraction)
    assert fused_attention_time_s(1e12, gpu, dtype="bf16") == pytest.approx(flat_bf16)
