"""Parameter counts per sub-block, per tensor-parallel rank, and the tied head under pipelining."""

from __future__ import annotations

import pytest

from simgrid.errors import ModelError
from simgrid.layout import Layout
from simgrid.model import (
    ModelSpec,
    attention_params,
    block_params,
    block_params_on_rank,
    get_model,
    matmul_params,
    mlp_params,
    param_count,
)


def test_gpt_layer_is_12h2_plus_13h() -> None:
    """GPT attention = 4h^2 + 4h (QKV, out, biases) + 2h (LayerNorm); MLP = 8h^2 + 5h + 2h."""
    h = 2304
    m = get_model("megatron-1.7b")
    assert attention_params(m) == 4 * h * h + 4 * h + 2 * h
    assert mlp_params(m) == 8 * h * h + 5 * h + 2 * h


def test_gpt_total_matches_sc21_closed_form() -> None:
    """P = 12 L h^2 (1 + 13/(12h) + (V+s)/(12 L h)) (SC'21 section 5.1) plus the final LayerNorm 2h."""
    m = get_model("gpt3-175b")
    L, h, V, s = 96, 12288, 51200, 2048
    closed = 12 * L * h * h + 13 * L * h + (V + s) * h
    assert param_count(m) == closed + 2 * h


def test_llama_blocks_with_gqa_and_swiglu() -> None:
    """Llama 3 8B layer: q and o h^2 each, k and v h*kv*hd each, 3 h f MLP, RMSNorm h, no biases."""
    m = get_model("llama3-8b")
    h, kv_width, f = 4096, 8 * 128, 14336
    assert attention_params(m) == 2 * h * h + 2 * h * kv_width + h
    assert mlp_params(m) == 3 * h * f + h
    assert block_params(m, 0) == 128256 * h  # embedding, no learned positions
    assert block_params(m, 2 * 32 + 1) == 128256 * h + h  # untied output + final RMSNorm


def test_tied_head_counts_only_the_final_norm_once() -> None:
    """A tied output layer adds no parameters to param_count; the head block is the final LayerNorm."""
    m = get_model("gpt2-small")
    assert block_params(m, 2 * 12 + 1) == 2 * 768
    assert block_params(m, 0) == 50257 * 768 + 1024 * 768
    assert param_count(m) == sum(block_params(m, b) for b in range(2 * 12 + 2))


def test_tensor_parallel_share_splits_columns_and_rows_but_not_norms() -> None:
    """tp=8 share: QKV w+b and MLP-in w+b /8, out/MLP-out weights /8, their biases and norms replicated."""
    m = get_model("gpt3-175b")
    h, t = 12288, 8
    assert attention_params(m, t) == (3 * h * h + 3 * h) // t + h * h // t + h + 2 * h
    assert mlp_params(m, t) == (4 * h * h + 4 * h) // t + 4 * h * h // t + h + 2 * h
    layout = Layout(tp=8)
    assert block_params_on_rank(m, layout, 0) == 51200 // 8 * h + 2048 * h  # positions replicated


def test_gqa_with_more_ranks_than_kv_heads_replicates_one_kv_head() -> None:
    """llama2-70b (8 KV heads) at tp=16 keeps one KV head per rank: q/16 + 2 heads of K/V."""
    m = get_model("llama2-70b")
    h, hd = 8192, 128
    assert attention_params(m, 16) == h * (64 // 16 + 2) * hd + (h // 16) * h + h


def test_pipeline_keeps_a_copy_of_the_tied_embedding_on_the_last_stage() -> None:
    """With pp > 1 the tied head block holds V/tp x h (Megatron's output-layer copy); with pp = 1 it does not."""
    m = get_model("gpt3-175b")
    head = 2 * 96 + 1
    assert block_params_on_rank(m, Layout(tp=8, pp=1), head) == 2 * 12288
    assert block_params_on_rank(m, Layout(tp=8, pp=8), head) == 2 * 12288 + 51200 // 8 * 12288


def test_matmul_params_exclude_embedding_lookup_but_include_output_matrix() -> None:
    """N of 6N = all layers + final norm + the V x h output projection (tied or not)."""
    m = get_model("gpt2-small")
    assert matmul_params(m) == param_count(m) - 1024 * 768


@pytest.mark.parametrize("block", [-1, 26, 3.0])
def test_block_out_of_range_is_a_model_error(block: object) -> None:
    """Block indices outside 0..2L+1 name the block and the valid range."""
    with pytest.raises(ModelError, match=r"block = .* is outside 0\.\.25"):
        block_params(get_model("gpt2-small"), block)  # type: ignore[arg-type]


def test_model_without_bias_or_layernorm_counts_rmsnorm_weight_only() -> None:
    """RMSNorm carries h parameters, LayerNorm 2h."""
    base = ModelSpec(name="x", num_layers=2, hidden_size=64, num_heads=4, bias=False, norm="rmsnorm")
    assert attention_params(base) == 4 * 64 * 64 + 64


def test_vocabulary_not_divisible_by_tp_is_rounded_up_per_rank() -> None:
    """GPT-2's 50257 rows over tp=2: each rank holds ceil(50257/2) = 25129 rows (Megatron pads the vocab)."""
    m = get_model("gpt2-small")
    assert block_params_on_rank(m, Layout(tp=2), 0) == 25129 * 768 + 1024 * 768
