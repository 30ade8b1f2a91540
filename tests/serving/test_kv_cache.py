"""KV cache: bytes per token (GQA- and dtype-aware), the budget beside the weights, and the block pool."""

from __future__ import annotations

import pytest

from simgrid.hardware import load_gpu
from simgrid.model import get_model
from simgrid.serving import ServingConfig, ServingError, ServingLayout, kv_budget, kv_bytes_per_token
from simgrid.serving.kv_cache import BlockPool

A100 = load_gpu("a100-80gb-sxm")


def test_bytes_per_token_multi_head() -> None:
    """llama2-7b (32 KV heads of 128): 2 x 32 x 128 x 2 B = 16 KiB per layer, halved by tp 2 and by fp8."""
    m = get_model("llama2-7b")
    assert kv_bytes_per_token(m, layers=1, tp=1, kv_bytes=2) == 16384
    assert kv_bytes_per_token(m, layers=32, tp=1, kv_bytes=2) == 32 * 16384
    assert kv_bytes_per_token(m, layers=1, tp=2, kv_bytes=2) == 8192
    assert kv_bytes_per_token(m, layers=1, tp=1, kv_bytes=1) == 8192


def test_bytes_per_token_grouped_query_attention() -> None:
    """llama2-70b has 8 KV heads for 64 query heads: 4 KiB per layer at tp 1, 512 B at tp 8, and tp 16 cannot
    go lower (each rank keeps one replicated KV head)."""
    m = get_model("llama2-70b")
    assert kv_bytes_per_token(m, layers=1, tp=1, kv_bytes=2) == 2 * 8 * 128 * 2
    assert kv_bytes_per_token(m, layers=1, tp=8, kv_bytes=2) == 512
    assert kv_bytes_per_token(m, layers=1, tp=16, kv_bytes=2) == 512


def test_budget_of_llama2_7b_on_one_a100_by_hand() -> None:
    """90% of 80 GiB minus 6,738,415,616 bf16 weights minus the workspace of a 4096-token iteration
    (4096 x (2 x 4096 + 3 x 11008) x 2 B plus 256 sequences of 32000 fp32 logits) leaves 63,462,170,624 B:
    121,043 tokens of 512 KiB, 7,565 whole blocks of 16."""
    budget = kv_budget(get_model("llama2-7b"), ServingLayout(), ServingConfig(), A100, max_context=4096)
    (stage,) = budget.stages
    assert stage.weight_bytes == 6_738_415_616 * 2
    assert stage.workspace_bytes == 4096 * (2 * 4096 + 3 * 11008) * 2 + 256 * 32000 * 4
    assert stage.kv_budget_bytes == int(80 * 2**30 * 0.9) - 6_738_415_616 * 2 - stage.workspace_bytes
    assert stage.kv_bytes_per_token == 524_288
    assert budget.capacity_blocks == 63_462_170_624 // 524_288 // 16
    assert budget.blocks_for(17) == 2


def test_pipeline_stages_split_weights_and_cache() -> None:
    """With pp 2 each stage holds 16 layers; stage 0 has the embedding, stage 1 the output layer."""
    budget = kv_budget(get_model("llama2-7b"), ServingLayout(pp=2), ServingConfig(), A100, max_context=4096)
    s0, s1 = budget.stages
    layer = 202_383_360  # 4h^2 + 3hf + 2h of llama2-7b
    assert (s0.layers, s1.layers) == (16, 16)
    assert s0.weight_bytes == (16 * layer + 32000 * 4096) * 2
    assert s1.weight_bytes == (16 * layer + 32000 * 4096 + 4096) * 2
    assert s0.kv_bytes_per_token == s1.kv_bytes_per_token == 16 * 16384


def test_configured_budget_overrides_memory() -> None:
    """kv_budget_GiB sets the cache per GPU directly."""
    budget = kv_budget(get_model("llama2-7b"), ServingLayout(), ServingConfig(kv_budget_GiB=1.0), A100,
                       max_context=4096)
    assert budget.capacity_tokens == 2**30 // 524_288 // 16 * 16


def test_weights_that_leave_no_room_are_refused() -> None:
    """llama2-70b on one A100: 128.5 GiB of weights exceed 72 GiB; the message says what to change."""
    with pytest.raises(ServingError, match=r"needs 128\.5 GiB of weights .* raise tp or pp, or use fp8 weights"):
        kv_budget(get_model("llama2-70b"), ServingLayout(), ServingConfig(), A100, max_context=4096)


def test_block_pool_counts_and_refuses_overcommit() -> None:
    """Blocks taken and given back are counted; taking more than is free is a bug, not a silent wrap."""
    pool = BlockPool(10)
    pool.take(4)
    assert (pool.used, pool.free, pool.occupancy) == (4, 6, 0.4)
    pool.give_back(4)
    assert pool.used == 0
    with pytest.raises(AssertionError, match="over-committed"):
        pool.take(11)
