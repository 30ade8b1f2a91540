"""Activation bytes saved for backward: Korthikanti 2022 Table 2 and its generalisations."""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import pytest

from simgrid.errors import ModelError
from simgrid.layout.spec import RecomputePolicy
from simgrid.model import ModelSpec, block_activation_bytes, get_model, layer_activation_bytes

# Shapes of Korthikanti et al. 2022 Table 3 (s = 2048), with the micro-batch sizes and tp they use.
SHAPES = [("korthikanti-22b", 4, 8), ("gpt3-175b", 1, 8), ("megatron-529.6b", 1, 8), ("megatron-1t", 1, 8),
          ("korthikanti-22b", 2, 4)]


def _table2(config: str, s: int, b: int, h: int, a: int, t: int) -> Fraction:
    """Korthikanti et al. 2022 Table 2, bytes per layer, written exactly as in the paper."""
    sbh = Fraction(s * b * h)
    if config == "no parallelism":
        return sbh * (34 + Fraction(5 * a * s, h))
    if config == "tensor parallel":
        return sbh * (10 + Fraction(24, t) + Fraction(5 * a * s, h * t))
    if config == "tensor + sequence parallel":
        return sbh * (Fraction(34, t) + Fraction(5 * a * s, h * t))
    if config == "tensor parallel + selective recompute":
        return sbh * (10 + Fraction(24, t))
    if config == "tensor + sequence parallel + selective recompute":
        return sbh * Fraction(34, t)
    return 2 * sbh  # full recompute


CONFIGS: list[tuple[str, bool, bool, RecomputePolicy]] = [
    # (Table 2 row, uses tp, sequence parallel, recompute)
    ("no parallelism", False, False, "none"),
    ("tensor parallel", True, False, "none"),
    ("tensor + sequence parallel", True, True, "none"),
    ("tensor parallel + selective recompute", True, False, "selective"),
    ("tensor + sequence parallel + selective recompute", True, True, "selective"),
    ("full recompute", True, False, "full"),
]


@pytest.mark.parametrize(("config", "use_tp", "sp", "recompute"), CONFIGS)
@pytest.mark.parametrize(("name", "b", "t"), SHAPES)
def test_layer_activations_match_korthikanti_table2(config: str, use_tp: bool, sp: bool,
                                                    recompute: RecomputePolicy, name: str, b: int, t: int) -> None:
    """Each of the six Table 2 configurations, exactly, for the paper's model shapes."""
    m = get_model(name)
    tp = t if use_tp else 1
    got = layer_activation_bytes(m, micro_batch_size=b, tp=tp, sequence_parallel=sp, recompute=recompute)
    assert got == _table2(config, m.seq_length, b, m.hidden_size, m.num_heads, tp)


def test_table2_with_numbers_for_gpt3_175b() -> None:
    """175B, s=2048, b=1, h=12288, a=96: 34sbh + 5as^2b = 855,638,016 + 2,013,265,920 bytes."""
    m = get_model("gpt3-175b")
    assert layer_activation_bytes(m) == 34 * 2048 * 12288 + 5 * 96 * 2048 * 2048 == 2_868_903_936
    assert layer_activation_bytes(m, tp=8, sequence_parallel=True, recompute="selective") == 106_954_752
    assert layer_activation_bytes(m, recompute="full") == 50_331_648


def test_split_between_attention_and_mlp() -> None:
    """Attention (with its LayerNorm) saves 13sbh + 5as^2b, the MLP 21sbh (Korthikanti section 4.1)."""
    m = get_model("korthikanti-22b")
    s, b, h, a = 2048, 1, 6144, 64
    assert block_activation_bytes(m, 1) == 13 * s * b * h + 5 * a * s * s * b
    assert block_activation_bytes(m, 2) == 21 * s * b * h
    assert block_activation_bytes(m, 1, recompute="full") == 2 * s * b * h
    assert block_activation_bytes(m, 2, recompute="full") == 0


def test_full_recompute_with_sequence_parallel_stores_the_input_shard() -> None:
    """Megatron checkpoints the s/t shard of the layer input under sequence parallelism: 2sbh/t."""
    m = get_model("gpt3-175b")
    got = layer_activation_bytes(m, tp=8, sequence_parallel=True, recompute="full")
    assert got == 2 * 2048 * 12288 // 8


def test_gated_mlp_stores_gate_and_up_outputs() -> None:
    """SwiGLU keeps gate, up and product (3 * sbf * 2 bytes) instead of GeLU input and output (2 * sbf * 2)."""
    gpt = ModelSpec(name="g", num_layers=2, hidden_size=256, num_heads=4, ffn_hidden_size=512, seq_length=128)
    gated = dataclasses.replace(gpt, gated_mlp=True)
    s, f = 128, 512
    assert block_activation_bytes(gated, 2) - block_activation_bytes(gpt, 2) == s * f * 2


def test_gqa_shrinks_stored_k_and_v() -> None:
    """With 2 of 4 KV heads, stored K and V are half their MHA size: saves 2 * s * (h/2) * 2 bytes."""
    mha = ModelSpec(name="m", num_layers=2, hidden_size=256, num_heads=4, seq_length=128)
    gqa = dataclasses.replace(mha, num_kv_heads=2)
    s, h = 128, 256
    assert block_activation_bytes(mha, 1) - block_activation_bytes(gqa, 1) == 2 * s * (h - h // 2) * 2


def test_llama_recipe_has_no_dropout_masks() -> None:
    """Without dropout (Llama recipe) attention keeps a s^2 b * 2 bytes of probabilities and no masks."""
    m = get_model("llama2-7b")
    s, h, a, f = 4096, 4096, 32, 11008
    assert block_activation_bytes(m, 1) == 12 * s * h + 2 * a * s * s
    assert block_activation_bytes(m, 2) == 4 * s * h + 3 * s * f * 2


def test_fp32_training_doubles_tensors_but_not_masks() -> None:
    """fp32 activations are 4 bytes per element; dropout masks stay 1 byte."""
    m = get_model("gpt2-small")
    s, h = 1024, 768
    assert block_activation_bytes(m, 2, dtype_bytes=4) == (2 * 4 + 1) * s * h + 2 * s * 4 * h * 4


def test_embedding_and_head_activations() -> None:
    """Embedding: int64 ids + dropout mask; head: two T h d tensors + fp32 softmax of V/t logits."""
    m = get_model("gpt3-175b")
    s, h, V, t = 2048, 12288, 51200, 8
    assert block_activation_bytes(m, 0, tp=t) == 8 * s + s * h
    assert block_activation_bytes(m, 193, tp=t) == 2 * s * h * 2 + 4 * s * V // t
    assert block_activation_bytes(m, 193, tp=t, recompute="full") == 2 * s * h * 2 + 4 * s * V // t


def test_bad_arguments_are_model_errors() -> None:
    """Non-positive sizes and unknown recompute policies are rejected by name."""
    m = get_model("tiny-gpt")
    with pytest.raises(ModelError, match="micro_batch_size = 0"):
        block_activation_bytes(m, 1, micro_batch_size=0)
    with pytest.raises(ModelError, match="recompute = 'some'"):
        block_activation_bytes(m, 1, recompute="some")  # type: ignore[arg-type]
