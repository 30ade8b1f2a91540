"""MoE models: published parameter counts of the presets, hand-computed per-block costs, and spec validation."""

from __future__ import annotations

import dataclasses

import pytest

from simgrid.errors import ModelError
from simgrid.layout import Layout
from simgrid.model import block_cost, get_model, model_flops_per_iteration, param_count
from simgrid.model.moe import (
    expert_params,
    is_moe_block,
    moe_block_flops,
    moe_collectives,
    tokens_per_local_expert,
)
from simgrid.model.moe_spec import MoESpec
from simgrid.model.params import active_param_count, non_embedding_params
from simgrid.model.spec import ModelSpec

# Published totals and activated counts, in billions, as the sources print them (typed in by hand):
# Mixtral 8x7B: Mistral AI, "Mixtral of experts" (2023): 46.7B total, 12.9B used per token.
# Mixtral 8x22B: Mistral AI, "Cheaper, Better, Faster, Stronger" (2024): 141B, 39B active.
# Qwen2-57B-A14B: Qwen2 technical report (arXiv:2407.10671), Table 1: 57B total, 14B activated.
# Qwen3-30B-A3B: Qwen/Qwen3-30B-A3B model card: 30.5B total, 3.3B activated, 29.9B non-embedding.
PUBLISHED = [
    ("mixtral-8x7b", 46.7, 12.9),
    ("mixtral-8x22b", 141.0, 39.0),
    ("qwen2-57b-a14b", 57.0, 14.0),
    ("qwen3-30b-a3b", 30.5, 3.3),
]


@pytest.mark.parametrize(("name", "total", "active"), PUBLISHED)
def test_moe_presets_match_published_total_and_active_parameters(name: str, total: float, active: float) -> None:
    """Total and activated parameters are within 2% of the published figures, which are given to two or
    three significant digits (Qwen3's 3.35B activated is printed truncated as 3.3B)."""
    model = get_model(name)
    assert abs(param_count(model) / 1e9 / total - 1) < 0.02
    assert abs(active_param_count(model) / 1e9 / active - 1) < 0.02


def test_qwen3_non_embedding_count_and_head_width() -> None:
    """Qwen3-30B-A3B's heads are 128 wide (kv_channels), not h / a = 64; its card gives 29.9B non-embedding."""
    model = get_model("qwen3-30b-a3b")
    assert model.head_dim == 128
    assert abs(non_embedding_params(model) / 1e9 - 29.9) < 0.05


def _toy(**moe: object) -> ModelSpec:
    spec = MoESpec(**{"num_experts": 8, "top_k": 2, "expert_ffn_hidden_size": 32, **moe})  # type: ignore[arg-type]
    return ModelSpec(name="toy", num_layers=2, hidden_size=16, num_heads=2, gated_mlp=True, vocab_size=64,
                     seq_length=8, tied_embeddings=False, norm="rmsnorm", position="rope", bias=False, moe=spec)


def test_moe_block_flops_by_hand() -> None:
    """Router 2 T h E, top-k SwiGLU experts 2 T k h 3 f, shared SwiGLU expert 2 T h 3 f_s, shared gate 2 T h."""
    model = _toy(shared_expert_ffn_hidden_size=24, shared_expert_gate=True)
    t, h = 2 * 8, 16  # b = 2 sequences of 8 tokens
    f = moe_block_flops(model, micro_batch_size=2, routed_factor=1.0)
    expected = 2 * t * h * 8 + 2 * t * 2 * h * 3 * 32 + 2 * t * h * 3 * 24 + 2 * t * h
    assert f.fwd == expected and f.bwd_input == expected and f.bwd_weight == expected


def test_moe_flops_over_ranks_equal_the_whole_layer() -> None:
    """Summed over the tp x dp ranks of a stage, the routed-expert FLOPs equal one rank's at tp = 1 times dp,
    whatever etp is (ETP gathers etp times the tokens onto a 1/etp slice of each expert)."""
    model = _toy()
    whole = moe_block_flops(model, micro_batch_size=1, routed_factor=1.0).fwd
    router = 2 * 8 * 16 * 8
    for tp, etp in ((1, 1), (2, 1), (2, 2), (4, 2)):
        per_rank = moe_block_flops(model, micro_batch_size=1, tp=tp, etp=etp, routed_factor=1.0).fwd
        assert per_rank * tp == pytest.approx(whole)
    # The imbalance scales only the experts' share.
    skewed = moe_block_flops(model, micro_batch_size=1, routed_factor=1.5).fwd
    assert skewed - router == pytest.approx(1.5 * (whole - router))


def test_model_flops_count_active_experts_only() -> None:
    """MFU numerator of a MoE model: per token 6 x (active matmul weights) + attention core, by hand."""
    model = _toy()
    h, s, v, f, e, k = 16, 8, 64, 32, 8, 2
    attn = 4 * h * h  # q, k, v, o (multi-head)
    mlp = h * e + k * 3 * h * f  # router + k SwiGLU experts
    per_token = 6 * (2 * (attn + mlp) + h * v) + 6 * 2 * 2 * s * h  # layers, head; core 4 s h fwd x 3 per layer
    assert model_flops_per_iteration(model, 3) == pytest.approx(3 * s * per_token)


def test_expert_parameters_shard_over_ep_and_etp() -> None:
    """A MoE block's rank holds E/ep experts cut 1/etp, and its dense part (norm, router) whole."""
    model = _toy()
    lay = Layout(dp=4, ep=2, etp=2, global_batch_size=4)
    cost = block_cost(model, lay, 2)
    assert cost.expert_param_count == 4 * expert_params(model, 2) == 4 * (16 * 64 + 32 * 16) // 2
    assert cost.param_count - cost.expert_param_count == 16 + 16 * 8


def test_grouped_gemm_m_is_tokens_per_local_expert() -> None:
    """The experts' GEMM shape: m = k T ep / E tokens per local expert (imbalance included), stacked over
    the E / ep local experts of the grouped GEMM."""
    model = _toy(load_imbalance=1.25)
    lay = Layout(dp=2, ep=2, global_batch_size=8, micro_batch_size=4)
    assert tokens_per_local_expert(model, lay) == round(2 * 32 * 1.25 * 2 / 8)
    assert block_cost(model, lay, 2).gemm_mnk == (20 * 8 // 2, 64, 16)


def test_all_to_alls_carry_k_copies_of_the_rank_tokens() -> None:
    """ep 2: dispatch and combine all-to-alls of k T_r h d bytes; etp 2 adds the gather and scatter."""
    model = _toy()
    lay = Layout(dp=4, ep=2, etp=2, global_batch_size=4)
    colls = moe_collectives(model, lay, 2)
    copies = 2 * 8 * 16 * 2
    assert [(c.phase, c.position, c.kind, c.group, c.bytes) for c in colls] == [
        ("fwd", "before", "all_to_all", "ep", copies),
        ("fwd", "before", "all_gather", "etp", 2 * copies),
        ("fwd", "after", "reduce_scatter", "etp", 2 * copies),
        ("fwd", "after", "all_to_all", "ep", copies),
        ("bwd", "before", "all_to_all", "ep", copies),
        ("bwd", "before", "all_gather", "etp", 2 * copies),
        ("bwd", "after", "reduce_scatter", "etp", 2 * copies),
        ("bwd", "after", "all_to_all", "ep", copies),
    ]
    assert moe_collectives(model, Layout(dp=4, etp=1, global_batch_size=4), 2) == ()


def test_first_dense_layers_keep_the_dense_mlp() -> None:
    """tiny-moe's layer 0 is dense (block 2), layer 1 is MoE (block 4); attention blocks are never MoE."""
    model = get_model("tiny-moe")
    assert not is_moe_block(model, 2) and is_moe_block(model, 4) and not is_moe_block(model, 3)


def test_spec_round_trips_through_dict() -> None:
    """A MoE model survives to_dict / from_dict (the JSON model file format)."""
    model = get_model("qwen2-57b-a14b")
    assert ModelSpec.from_dict(model.to_dict()) == model


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"top_k": 9}, "top_k = 9 exceeds num_experts = 8"),
        ({"capacity_factor": 0}, "capacity_factor = 0 must be > 0"),
        ({"load_imbalance": 0.5}, "load_imbalance = 0.5 must be >= 1.0"),
        ({"num_experts": 0}, "num_experts = 0 must be a positive integer"),
    ],
)
def test_bad_moe_fields_are_named(fields: dict[str, object], match: str) -> None:
    """Each bad MoE field fails with its name, value and rule."""
    with pytest.raises(ModelError, match=match):
        _toy(**fields)


def test_all_dense_layers_is_an_error() -> None:
    """first_dense_layers must leave at least one MoE layer."""
    with pytest.raises(ModelError, match="first_dense_layers = 2 leaves no MoE layer"):
        _toy(first_dense_layers=2)


# -- the MoE sub-block's GEMMs, listed (session 14) ---------------------------------------------------------
def test_moe_gemms_by_hand_and_their_flops_equal_the_block_flops() -> None:
    """Toy: h 16, 8 experts top-2, expert width 32 (SwiGLU), shared expert 24 with a gate; b 2 x s 8 = 16 tokens,
    ep 2: 4 local experts x 2 * 16 * 2 / 8 = 8 tokens each, stacked to 32 rows. Router (16, 8, 16), gate
    (16, 1, 16), experts fc1 (32, 64, 16) and fc2 (32, 16, 32), the weight gradients one h x n output per expert
    stacked along m, the shared expert (16, 48, 16) and (16, 16, 24); their FLOPs are the block's, pass by pass."""
    model = _toy(shared_expert_ffn_hidden_size=24, shared_expert_gate=True)
    lay = Layout(dp=2, ep=2, global_batch_size=4, micro_batch_size=2)
    c = block_cost(model, lay, 2)
    assert c.fwd_gemms == ((16, 8, 16, 1), (16, 1, 16, 1), (32, 64, 16, 1), (32, 16, 32, 1), (16, 48, 16, 1),
                           (16, 16, 24, 1))
    assert c.bwd_weight_gemms == ((24, 16, 16, 1), (16, 48, 16, 1), (4 * 32, 16, 8, 1), (4 * 16, 64, 8, 1),
                                  (16, 1, 16, 1), (16, 8, 16, 1))

    def flops(gemms: tuple[tuple[int, int, int, int], ...]) -> float:
        return sum(2.0 * m * n * k * count for m, n, k, count in gemms)

    assert flops(c.fwd_gemms) == pytest.approx(c.fwd_flops)
    assert flops(c.bwd_input_gemms) == pytest.approx(c.bwd_input_flops)
    assert flops(c.bwd_weight_gemms) == pytest.approx(c.bwd_weight_flops)
    full = block_cost(model, Layout(dp=2, ep=2, global_batch_size=4, micro_batch_size=2, recompute="full"), 2)
    assert full.recompute_gemms == full.fwd_gemms  # a MoE sub-block reruns its whole forward


def test_fp8_pads_tokens_per_expert_to_16_and_keeps_router_and_gate_16_bit() -> None:
    """Under fp8 each expert's 8 tokens are padded to 16 (TEGroupedMLP's Fp8Padding), so the grouped GEMMs grow
    to 4 x 16 rows; the experts' and shared expert's shapes are fp8, the router's and gate's are not."""
    model = _toy(shared_expert_ffn_hidden_size=24, shared_expert_gate=True)
    lay = Layout(dp=2, ep=2, global_batch_size=4, micro_batch_size=2, fp8_recipe="delayed")
    c = block_cost(model, lay, 2)
    assert c.fwd_gemms[2:4] == ((64, 64, 16, 1), (64, 16, 32, 1))
    router, gate = {(16, 8, 16), (16, 16, 8), (16, 8, 16)}, {(16, 1, 16), (16, 16, 1)}
    assert not c.fp8_gemm_shapes & (router | gate)
    listed = {g[:3] for g in (*c.fwd_gemms, *c.bwd_input_gemms, *c.bwd_weight_gemms)}
    assert c.fp8_gemm_shapes == listed - router - gate
    assert block_cost(model, dataclasses.replace(lay, fp8_recipe="none"), 2).fp8_gemm_shapes == frozenset()
