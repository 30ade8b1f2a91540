"""FlashAttention (``Layout.flash_attention``): activations, FLOPs and HBM traffic of the fused attention core,
and what the layout, the engine and the layout search do with it."""

from __future__ import annotations

import dataclasses

import pytest

from simgrid.errors import LayoutError
from simgrid.layout import Layout
from simgrid.model import get_model, layer_activation_bytes
from simgrid.model.flops import block_flops
from simgrid.model.kernels import block_kernels


def test_activations_drop_the_score_terms_and_keep_one_statistic_per_row() -> None:
    """gpt3-175b, s = 2048, b = 1, h = 12288, a = 96, bf16: Korthikanti's 34 s b h stays (Q, K, V, the output
    and every tensor outside the core), the 5 a s^2 b of scores, softmax, dropout mask and output goes, and
    one fp32 log-sum-exp per row and head (4 a s b bytes) is added."""
    m = get_model("gpt3-175b")
    s, b, h, a = 2048, 1, 12288, 96
    assert layer_activation_bytes(m, flash_attention=True) == 34 * s * b * h + 4 * a * s * b


def test_fused_core_skips_masked_tiles_and_its_backward_recomputes_one_q_k_product() -> None:
    """gpt3-175b, s = 2048: a causal FlashAttention core computes the 16 * 17 / 2 tiles (of 128 rows) on or
    below the diagonal, 17/32 of the unmasked 4 b s^2 h forward; its backward recomputes S = Q K^T, so it is
    2.5 times that (10 instead of 8 b s^2 h unmasked). The linear layers do not change."""
    m = get_model("gpt3-175b")
    s, h = m.seq_length, m.hidden_size
    plain, flash = block_flops(m, 1), block_flops(m, 1, flash_attention=True)
    fraction = (16 * 17 / 2) / 16**2
    assert flash.attention_core_fwd == pytest.approx(fraction * 4 * s * s * h)
    assert flash.attention_core_bwd == pytest.approx(2.5 * flash.attention_core_fwd)
    linear_fwd = plain.fwd - plain.attention_core_fwd
    assert flash.fwd - flash.attention_core_fwd == pytest.approx(linear_fwd)
    assert flash.bwd_weight == plain.bwd_weight


def test_causal_tile_fraction_tends_to_one_half() -> None:
    """One tile: nothing to skip; many tiles: about half (n + 1) / (2 n)."""
    from simgrid.model.flops import causal_tile_fraction

    assert causal_tile_fraction(100) == 1.0
    assert causal_tile_fraction(256) == pytest.approx(3 / 4)
    assert causal_tile_fraction(131072) == pytest.approx(1025 / 2048)


def test_attention_traffic_grows_linearly_with_sequence_length() -> None:
    """With the fused core no HBM term grows with s^2: doubling s doubles the attention sub-block's bytes
    exactly, while the unfused core's score traffic makes them more than double."""
    m = get_model("llama2-7b")
    long = dataclasses.replace(m, seq_length=2 * m.seq_length)
    flash, plain = Layout(flash_attention=True), Layout()
    assert block_kernels(long, flash, 1).fwd_hbm_bytes == 2 * block_kernels(m, flash, 1).fwd_hbm_bytes
    assert block_kernels(long, flash, 1).bwd_hbm_bytes == 2 * block_kernels(m, flash, 1).bwd_hbm_bytes
    assert block_kernels(long, plain, 1).fwd_hbm_bytes > 2 * block_kernels(m, plain, 1).fwd_hbm_bytes


def test_selective_recompute_is_refused_with_flash_attention() -> None:
    """Selective recompute reruns the attention core, which FlashAttention recomputes already: a clear error."""
    with pytest.raises(LayoutError, match=r"selective.*flash_attention"):
        Layout(recompute="selective", flash_attention=True)


def test_simulated_step_with_flash_attention_needs_less_memory_and_time() -> None:
    """llama2-7b at s = 4096 on 8 A100s (dp 8): without the s x s score traffic and activations, the
    simulated step is shorter and its peak memory lower."""
    from simgrid.simulation import simulate

    model = get_model("llama2-7b")
    plain = Layout(dp=8, global_batch_size=8, zero=1)
    runs = [simulate(model, "dgx-a100-hdr", dataclasses.replace(plain, flash_attention=flash))
            for flash in (False, True)]
    assert runs[1].metrics.step_time_s < runs[0].metrics.step_time_s
    assert runs[1].metrics.peak_memory_bytes < runs[0].metrics.peak_memory_bytes


def test_layout_search_tries_flash_attention_without_selective_recompute() -> None:
    """With flash_attention (True,) every enumerated layout has it, and none pairs it with selective recompute."""
    from simgrid.hardware import load_cluster
    from simgrid.sweep import SweepConstraints
    from simgrid.sweep.search_space import enumerate_layouts

    model = get_model("llama2-7b")
    layouts = enumerate_layouts(model, load_cluster("dgx-a100-hdr", gpus=16), gpus=16, global_batch=64,
                                constraints=SweepConstraints(flash_attention=(True,), max_mbs=2))
    assert layouts and all(lay.flash_attention for lay in layouts)
    assert {lay.recompute for lay in layouts} == {"none", "full"}
