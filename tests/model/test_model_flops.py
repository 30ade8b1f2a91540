"""FLOPs: per-block counts, Megatron eq. 3, 6N + attention, and the MFU of Korthikanti 2022 Table 5."""

from __future__ import annotations

import pytest

from simgrid.errors import ModelError
from simgrid.model import (
    block_flops,
    flops_6n_attention,
    get_model,
    megatron_eq3_flops,
    model_flops_per_iteration,
)

GPT_MODELS = ["gpt3-175b", "megatron-1.7b", "megatron-1t", "korthikanti-22b", "gpt2-small"]


def _eq3_by_hand(B: int, s: int, L: int, h: int, V: int, *, full_recompute: bool) -> float:
    if full_recompute:  # SC'21 eq. 3 as printed
        return 96 * B * s * L * h**2 * (1 + s / (6 * h) + V / (16 * L * h))
    return 72 * B * s * L * h**2 * (1 + s / (6 * h) + V / (12 * h * L))  # Korthikanti section 6.3


@pytest.mark.parametrize("name", GPT_MODELS)
def test_per_block_sum_equals_megatron_eq3(name: str) -> None:
    """Summing fwd + I + W over blocks equals eq. 3 (element-wise work is costed as bytes, not FLOPs)."""
    m = get_model(name)
    args = (512, m.seq_length, m.num_layers, m.hidden_size, m.vocab_size)
    expected = _eq3_by_hand(*args, full_recompute=False)
    assert model_flops_per_iteration(m, 512) == pytest.approx(expected, rel=1e-12)
    assert megatron_eq3_flops(m, 512) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("name", GPT_MODELS)
def test_full_recompute_equals_eq3_as_printed(name: str) -> None:
    """With full recompute the count is eq. 3's 96 B s L h^2 (1 + s/6h + V/16Lh)."""
    m = get_model(name)
    args = (64, m.seq_length, m.num_layers, m.hidden_size, m.vocab_size)
    expected = _eq3_by_hand(*args, full_recompute=True)
    assert model_flops_per_iteration(m, 64, recompute="full") == pytest.approx(expected, rel=1e-12)
    assert megatron_eq3_flops(m, 64, full_recompute=True) == pytest.approx(expected, rel=1e-12)


def test_selective_recompute_adds_the_attention_core_forward() -> None:
    """Selective recompute adds 4 B s^2 h per layer (one attention-core forward)."""
    m = get_model("gpt3-175b")
    extra = model_flops_per_iteration(m, 8, recompute="selective") - model_flops_per_iteration(m, 8)
    assert extra == pytest.approx(4 * 8 * 2048**2 * 12288 * 96, rel=1e-12)


def test_attention_block_split_into_fwd_input_grad_and_weight_grad() -> None:
    """Attention: linear 8bsh^2 fwd, I and W each; core 4bs^2h fwd, 8bs^2h in I, none in W; /tp."""
    m = get_model("korthikanti-22b")
    b, s, h, t = 4, 2048, 6144, 8
    f = block_flops(m, 1, micro_batch_size=b, tp=t)
    linear, core = 8 * b * s * h * h / t, 4 * b * s * s * h / t
    assert f.fwd == pytest.approx(linear + core)
    assert f.bwd_input == pytest.approx(linear + 2 * core)
    assert f.bwd_weight == pytest.approx(linear)
    assert f.attention_core_fwd == pytest.approx(core)


def test_mlp_and_head_and_embedding_blocks() -> None:
    """MLP 16bsh^2 (gated: 3 * 2bshf); head 2bshV each way; the embedding lookup does no FLOPs."""
    gpt, llama = get_model("gpt2-small"), get_model("llama2-7b")
    b = 2
    assert block_flops(gpt, 2, micro_batch_size=b).fwd == 16 * b * 1024 * 768**2
    assert block_flops(llama, 2, micro_batch_size=b).bwd_weight == 3 * 2 * b * 4096 * 4096 * 11008
    head = block_flops(gpt, 25, micro_batch_size=b, tp=1)
    assert head.fwd == head.bwd_input == head.bwd_weight == 2 * b * 1024 * 768 * 50257
    assert block_flops(gpt, 0).fwd == 0


def test_gqa_reduces_qkv_flops() -> None:
    """llama3-8b QKV projection is h x (h + 2 * 8 * 128) instead of h x 3h."""
    m = get_model("llama3-8b")
    s, h = 8192, 4096
    expected = 2 * s * h * (h + 2 * 1024) + 2 * s * h * h + 4 * s * s * h
    assert block_flops(m, 1).fwd == expected


def test_6n_plus_attention_differs_from_eq3_by_biases_and_norms_only() -> None:
    """PaLM 6N + 12Lhs per token minus eq. 3 = 6 * (13Lh + 2h) per token (biases and LayerNorms)."""
    m = get_model("gpt3-175b")
    B, s, L, h = 16, 2048, 96, 12288
    diff = flops_6n_attention(m, B) - model_flops_per_iteration(m, B)
    assert diff == pytest.approx(6 * (13 * L * h + 2 * h) * B * s, rel=1e-9)


# Korthikanti et al. 2022 Table 3 + 5: (model, global batch, GPUs, iteration s with SP + selective, MFU).
KORTHIKANTI_MFU = [
    ("korthikanti-22b", 4, 8, 1.10, 0.415),
    ("korthikanti-175b", 64, 64, 13.75, 0.514),
    ("korthikanti-530b", 280, 280, 37.83, 0.560),
    ("korthikanti-1t", 512, 512, 71.49, 0.563),
]


@pytest.mark.parametrize(("name", "batch", "gpus", "seconds", "mfu"), KORTHIKANTI_MFU)
def test_model_flops_reproduce_korthikanti_mfu(name: str, batch: int, gpus: int, seconds: float,
                                               mfu: float) -> None:
    """Model FLOPs / (time * GPUs * 312 TF/s) gives the published MFU within half a point.

    Table 5's MFU goes with the sequence-parallel + selective-recompute iteration time (13.75 s for
    175B); with the full-recompute time (18.13 s) the same FLOPs give 39%, which is not what it reports.
    """
    implied = model_flops_per_iteration(get_model(name), batch) / (seconds * gpus * 312e12)
    assert implied == pytest.approx(mfu, abs=0.005)


def test_bad_batch_is_a_model_error() -> None:
    """A non-positive global batch names the parameter."""
    with pytest.raises(ModelError, match="global_batch = 0"):
        model_flops_per_iteration(get_model("tiny-gpt"), 0)
    with pytest.raises(ModelError, match="global_batch = -1"):
        flops_6n_attention(get_model("tiny-gpt"), -1)


# Korthikanti et al. 2022 Table 5 HFU (SP + selective recompute).
KORTHIKANTI_HFU = [("korthikanti-22b", 4, 8, 1.10, 0.437), ("korthikanti-175b", 64, 64, 13.75, 0.528),
                   ("korthikanti-530b", 280, 280, 37.83, 0.570), ("korthikanti-1t", 512, 512, 71.49, 0.570)]


@pytest.mark.parametrize(("name", "batch", "gpus", "seconds", "hfu"), KORTHIKANTI_HFU)
def test_selective_recompute_flops_are_close_to_korthikanti_hfu(name: str, batch: int, gpus: int, seconds: float,
                                                                hfu: float) -> None:
    """Our HFU (one attention-core forward recomputed) is at most 1.6 points below the published HFU.

    Korthikanti's HFU formula uses s/(3h), i.e. charges 12 b s^2 h per layer for the recompute, three times
    a core forward; we charge one (4 b s^2 h), so we sit slightly below, most for the 22B (largest s/h).
    """
    implied = model_flops_per_iteration(get_model(name), batch, recompute="selective") / (seconds * gpus * 312e12)
    assert hfu - 0.016 <= implied <= hfu + 0.005


def test_selective_op_recompute_adds_the_linears_torchtitan_does_not_save() -> None:
    """Per-op checkpointing (torchtitan) reruns wk, wo and w3 of every Llama layer (mm 2, 4 and 6 of the block):
    2 B s (h h_kv + h h + h f) per layer; for llama2-7b (h_kv = h = 4096, f = 11008, L = 32, s = 4096, B = 2)
    that is 2 * 2 * 4096 * (2 * 4096^2 + 4096 * 11008) * 32. It counted 0 before."""
    m = get_model("llama2-7b")
    extra = model_flops_per_iteration(m, 2, recompute="selective-op") - model_flops_per_iteration(m, 2)
    assert extra == 2 * 2 * 4096 * (2 * 4096**2 + 4096 * 11008) * 32


def test_selective_op_iteration_count_equals_the_programs_executed_recompute() -> None:
    """The HFU numerator is the built program's executed FLOPs; switching a layout from no recompute to
    selective-op adds exactly the recompute model_flops_per_iteration counts (one rule for both), so the HFU
    of a per-op checkpointing layout includes its recompute."""
    import dataclasses

    from simgrid.layout import Layout
    from simgrid.simulation import simulate

    model = dataclasses.replace(get_model("llama2-7b"), num_layers=2, seq_length=1024)
    base = Layout(dp=1, tp=2, sequence_parallel=True, micro_batch_size=1, global_batch_size=2,
                  flash_attention=True)

    def executed(recompute: str) -> float:
        metrics = simulate(model, "dgx-h100-ndr", dataclasses.replace(base, recompute=recompute)).metrics
        return metrics.hw_tflops_per_gpu * 1e12 * metrics.step_time_s * base.world_size

    counted = model_flops_per_iteration(model, 2, recompute="selective-op") - model_flops_per_iteration(model, 2)
    assert counted > 0
    assert executed("selective-op") - executed("none") == pytest.approx(counted, rel=1e-9)
