"""Presets: published shapes and parameter counts, lookup errors, and the shape chosen for a bare count."""

from __future__ import annotations

import math
from decimal import ROUND_HALF_UP, Decimal

import pytest

from simgrid.errors import ModelError
from simgrid.model import get_model, list_models, model_from_params, param_count, params_granularity, params_note

# Narayanan et al. SC'21 Table 1 (copied from shared/reference/megatron_sc21_table1.csv):
# (published parameters in billions as printed, heads, hidden, layers).
SC21_TABLE1 = [
    ("1.7", 24, 2304, 24),
    ("3.6", 32, 3072, 30),
    ("7.5", 32, 4096, 36),
    ("18.4", 48, 6144, 40),
    ("39.1", 64, 8192, 48),
    ("76.1", 80, 10240, 60),
    ("145.6", 96, 12288, 80),
    ("310.1", 128, 16384, 96),
    ("529.6", 128, 20480, 105),
    ("1008.0", 160, 25600, 128),
]


def _preset_name(published: str) -> str:
    return "megatron-1t" if published == "1008.0" else f"megatron-{published}b"


@pytest.mark.parametrize(("published", "heads", "hidden", "layers"), SC21_TABLE1)
def test_sc21_table1_rows_have_their_published_shape_and_size(published: str, heads: int, hidden: int,
                                                              layers: int) -> None:
    """Every Table 1 row is a preset with the paper's shape, V = 51200, s = 2048, GPT recipe."""
    model = get_model(_preset_name(published))
    assert (model.num_heads, model.hidden_size, model.num_layers) == (heads, hidden, layers)
    assert (model.vocab_size, model.seq_length, model.ffn_size) == (51200, 2048, 4 * hidden)
    assert model.tied_embeddings and model.bias and model.norm == "layernorm" and model.position == "learned"
    billions = param_count(model) / 1e9
    digits = Decimal(published)
    significant = len(digits.as_tuple().digits)
    if significant >= 4:
        assert abs(billions - float(digits)) / float(digits) < 0.005
    else:  # the table rounds: 1.652e9 prints as 1.7
        rounded = Decimal(repr(billions)).quantize(digits, rounding=ROUND_HALF_UP)
        assert rounded == digits


@pytest.mark.parametrize(
    ("name", "published", "last_digit"),
    [
        ("llama2-7b", 6.74e9, 0.01e9),  # Touvron et al. 2023; HF model card: 6,738,415,616
        ("llama3-8b", 8.03e9, 0.01e9),  # HF model card: 8,030,261,248
        ("gpt2-small", 124e6, 1e6),  # released GPT-2 small checkpoint: 124,439,808
        ("llama2-13b", 13.0e9, 0.1e9),
        ("llama2-70b", 69.0e9, 0.1e9),
        ("llama3-70b", 70.6e9, 0.1e9),
        ("llama3-405b", 405.9e9, 0.1e9),
    ],
)
def test_published_parameter_counts(name: str, published: float, last_digit: float) -> None:
    """Llama 2/3 and GPT-2 small equal their published counts when rounded to the printed precision."""
    count = param_count(get_model(name))
    assert abs(count - published) <= last_digit / 2


def test_gpt2_small_count_is_exact() -> None:
    """GPT-2 small has exactly 124,439,808 parameters (the released checkpoint, tied head)."""
    assert param_count(get_model("gpt2-small")) == 124_439_808


def test_llama_presets_use_the_llama_recipe() -> None:
    """Llama presets: RMSNorm, no biases, RoPE, SwiGLU, untied embeddings, GQA where published."""
    for name, kv, ffn, vocab, seq in [("llama2-7b", 32, 11008, 32000, 4096), ("llama2-70b", 8, 28672, 32000, 4096),
                                      ("llama3-8b", 8, 14336, 128256, 8192), ("llama3-405b", 8, 53248, 128256, 8192)]:
        m = get_model(name)
        assert (m.kv_heads, m.ffn_size, m.vocab_size, m.seq_length) == (kv, ffn, vocab, seq)
        assert m.gated_mlp and not m.bias and not m.tied_embeddings
        assert m.norm == "rmsnorm" and m.position == "rope"


def test_korthikanti_models_and_aliases() -> None:
    """Korthikanti 2022 Table 3: 22B preset; 175B/530B/1T aliases resolve to the same shapes."""
    table3 = {"korthikanti-22b": (64, 6144, 48), "korthikanti-175b": (96, 12288, 96),
              "korthikanti-530b": (128, 20480, 105), "korthikanti-1t": (160, 25600, 128)}
    for name, shape in table3.items():
        m = get_model(name)
        assert (m.num_heads, m.hidden_size, m.num_layers) == shape
    assert get_model("korthikanti-175b") == get_model("gpt3-175b")
    assert get_model("korthikanti-1t") == get_model("megatron-1t")


def test_tiny_gpt_splits_over_two_and_four() -> None:
    """tiny-gpt is small and its heads and layers divide by 2 and 4 (executor TP/PP tests)."""
    m = get_model("tiny-gpt")
    assert m.num_heads % 4 == 0 and m.num_layers % 4 == 0
    assert param_count(m) < 1_000_000


def test_lookup_is_case_insensitive_and_list_is_complete() -> None:
    """Names resolve case-insensitively; list_models has every preset once."""
    assert get_model("GPT3-175B").name == "gpt3-175b"
    names = [m.name for m in list_models()]
    # 21 + the 9 megatron-h100-* + 4 gpt3-125m..2.7b + 5 MoE presets (4 published, tiny-moe) + 3 nemo-gpt3-*
    assert len(names) == len(set(names)) and len(names) == 42


def test_unknown_model_lists_close_matches_and_names() -> None:
    """A typo gets a ModelError suggesting the close name and listing known ones."""
    with pytest.raises(ModelError, match=r"unknown model 'llama2-7B-chat'.*did you mean llama2-7b.*Known models:"):
        get_model("llama2-7B-chat")
    with pytest.raises(ModelError, match=r"unknown model 'bert'.*Known models: gpt3-175b"):
        get_model("bert")


@pytest.mark.parametrize("n_params", [5e7, 1.234e8, 1.3e9, 7e9, 7.5e9, 13e9, 70e9, 175e9, 1e12, 3e12])
def test_model_from_params_means_n_within_the_stated_granularity(n_params: float) -> None:
    """--params N builds N parameters to within half of the step the shape moves in (16 of MLP width:
    L * 16 * (2h + 1) parameters, which params_note states); under 0.1% above 1B."""
    m = model_from_params(n_params)
    step = m.num_layers * 16 * (2 * m.hidden_size + 1)  # W1 column, its bias and W2 row per MLP unit
    assert params_granularity(m) == step
    assert abs(param_count(m) - n_params) <= step / 2
    assert n_params < 1e9 or abs(param_count(m) / n_params - 1) < 0.001
    assert m.ffn_size % 16 == 0 and m.vocab_size == 51200 and m.seq_length == 2048
    assert f"steps of {step:,}" in params_note(m, n_params)


def test_model_from_params_reuses_a_reference_width() -> None:
    """7.5e9 gives the SC'21 7.5B width (4096, 32 heads) and its 36 layers, with the MLP widened from
    16384 to 16496 so the count is 7.5e9 (the SC'21 shape itself has 7.47B)."""
    m = model_from_params(7.5e9)
    assert (m.hidden_size, m.num_heads, m.num_layers, m.ffn_size) == (4096, 32, 36, 16496)
    assert param_count(m) == 7_500_820_416
    assert round(param_count(get_model("megatron-7.5b")) / 1e9, 2) == 7.47


@pytest.mark.parametrize("bad", [0, -5, 1e6, math.nan, "7e9"])
def test_model_from_params_rejects_bad_counts(bad: object) -> None:
    """Too small, negative or non-numeric counts are ModelErrors naming --params."""
    with pytest.raises(ModelError, match="--params"):
        model_from_params(bad)  # type: ignore[arg-type]
