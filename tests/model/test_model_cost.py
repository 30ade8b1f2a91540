"""block_cost and the pipeline helpers the schedule builder calls: stages, p2p sizes, TP collectives, kernels."""

from __future__ import annotations

import dataclasses

import pytest

from simgrid.errors import LayoutError
from simgrid.layout import Layout
from simgrid.model import (
    TPCollective,
    block_cost,
    get_model,
    microbatch_tokens,
    num_model_blocks,
    p2p_bytes,
    param_count,
    rank_of_stage,
    stage_blocks,
    stages_of_rank,
)


def test_stage_blocks_cover_layers_and_embedding_and_head() -> None:
    """pp=4 over 8 layers: stage 0 = embed + layers 0-1, stage 3 = layers 6-7 + head."""
    m8 = dataclasses.replace(get_model("tiny-gpt"), num_layers=8)
    layout = Layout(pp=4, global_batch_size=8)
    assert stage_blocks(m8, layout, 0) == range(0, 5)
    assert stage_blocks(m8, layout, 1) == range(5, 9)
    assert stage_blocks(m8, layout, 3) == range(13, 18)


@pytest.mark.parametrize(("pp", "vpp", "schedule"), [(1, 1, "none"), (2, 1, "1f1b"), (2, 2, "interleaved-1f1b"),
                                                     (4, 1, "gpipe"), (2, 2, "zbv")])
def test_stages_partition_every_block_once(pp: int, vpp: int, schedule: str) -> None:
    """The stages' block ranges are disjoint and cover 0..2L+1; stage<->rank placement is consistent."""
    m = get_model("tiny-gpt")
    layout = Layout(pp=pp, vpp=vpp, schedule=schedule, global_batch_size=8)  # type: ignore[arg-type]
    blocks = [b for s in range(pp * vpp) for b in stage_blocks(m, layout, s)]
    assert blocks == list(range(num_model_blocks(m)))
    for rank in range(pp):
        assert all(rank_of_stage(layout, s) == rank for s in stages_of_rank(layout, rank))


def test_zbv_places_stages_in_a_v() -> None:
    """ZBV: rank 0 holds the first and the last stage."""
    assert stages_of_rank(Layout(pp=4, vpp=2, schedule="zbv", global_batch_size=8), 0) == [0, 7]


def test_stage_out_of_range_is_a_layout_error() -> None:
    """A stage index past pp*vpp names the valid range."""
    with pytest.raises(LayoutError, match=r"stage = 2 is outside 0\.\.1"):
        stage_blocks(get_model("tiny-gpt"), Layout(pp=2, global_batch_size=4), 2)


def test_p2p_bytes_and_microbatch_tokens() -> None:
    """Boundary tensor b*s*h*2 bytes, divided by tp under sequence parallelism."""
    m = get_model("gpt3-175b")
    assert microbatch_tokens(m, Layout(micro_batch_size=2)) == 4096
    assert p2p_bytes(m, Layout(tp=8, pp=8, micro_batch_size=2)) == 2 * 2048 * 12288 * 2
    assert p2p_bytes(m, Layout(tp=8, pp=8, micro_batch_size=2, sequence_parallel=True)) == 2 * 2048 * 12288 * 2 // 8


def test_block_cost_recompute_rules() -> None:
    """recompute_flops: full = forward of layer blocks only, selective = attention core, none = 0."""
    m = get_model("korthikanti-22b")
    b, s, h = 4, 2048, 6144
    none, full, sel = (block_cost(m, Layout(tp=8, micro_batch_size=b, recompute=r), blk)
                       for r, blk in (("none", 1), ("full", 1), ("selective", 1)))
    assert none.recompute_flops == 0
    assert full.recompute_flops == full.fwd_flops
    assert sel.recompute_flops == pytest.approx(4 * b * s * s * h / 8)
    assert block_cost(m, Layout(tp=8, recompute="selective"), 2).recompute_flops == 0
    assert block_cost(m, Layout(tp=8, recompute="full"), 2 * 48 + 1).recompute_flops == 0
    assert full.recompute_hbm_bytes == full.fwd_hbm_bytes and 0 < sel.recompute_hbm_bytes < full.fwd_hbm_bytes


@pytest.mark.parametrize("name", ["tiny-gpt", "llama2-7b"])
@pytest.mark.parametrize("policy", ["none", "full", "selective", "selective-op"])
def test_every_recompute_field_follows_its_policy(name: str, policy: str) -> None:
    """All five ``recompute_*`` fields of every sub-block kind, per policy, against the forward's own
    FLOPs, kernels and GEMMs (simgrid.model.flops / kernels / gemms): ``full`` reruns a transformer sub-block's
    whole forward; ``selective`` the attention core only (Korthikanti et al. 2022, section 5: 4 b s^2 h / tp
    FLOPs); ``selective-op`` its unsaved GEMMs and never the fused core; the embedding and the head never."""
    from simgrid.model.blocks import block_kind
    from simgrid.model.gemms import block_gemms
    from simgrid.model.kernels import block_kernels

    m = dataclasses.replace(get_model(name), num_layers=2)
    layout = Layout(tp=2, micro_batch_size=2, recompute=policy, sequence_parallel=True,
                    flash_attention=policy in ("full", "selective-op"))  # selective is for the unfused core
    b, s, h = 2, m.seq_length, m.hidden_size
    for blk in range(num_model_blocks(m)):
        kind, _ = block_kind(m, blk)
        c, k, g = block_cost(m, layout, blk), block_kernels(m, layout, blk), block_gemms(m, layout, blk)
        fields = (c.recompute_flops, c.recompute_hbm_bytes, c.recompute_kernels, c.recompute_gemms,
                  c.fused_attention_recompute_flops)
        if policy == "none" or kind not in ("attn", "mlp") or (policy == "selective" and kind == "mlp"):
            assert fields == (0.0, 0, 0, (), 0.0), (kind, policy)
        elif policy == "full":
            assert fields == (c.fwd_flops, k.fwd_hbm_bytes, k.fwd_kernels, g.fwd, c.fused_attention_fwd_flops)
        elif policy == "selective":
            assert c.recompute_flops == pytest.approx(4 * b * s * s * h / 2)
            assert fields[1:] == (k.core_fwd_hbm_bytes, k.core_fwd_kernels, g.core_fwd, 0.0)
        else:
            assert c.recompute_flops == sum(2 * mm * n * kk * cnt for mm, n, kk, cnt in c.recompute_gemms) > 0
            assert c.recompute_flops <= c.fwd_flops and c.fused_attention_recompute_flops == 0.0  # biased: all rerun
            assert 0 < c.recompute_kernels < k.fwd_kernels and 0 < c.recompute_hbm_bytes < k.fwd_hbm_bytes


def test_block_cost_param_counts_sum_to_the_model() -> None:
    """With tp = pp = 1 the blocks' param_count add up to param_count(model)."""
    m = get_model("llama3-8b")
    layout = Layout()
    assert sum(block_cost(m, layout, blk).param_count for blk in range(num_model_blocks(m))) == param_count(m)


def test_gemm_shapes_after_the_tp_split() -> None:
    """Dominant GEMMs: QKV (b*s, 3h/tp, h), MLP-in (b*s, f/tp or 2f/tp, h), head (b*s, V/tp, h), embed none."""
    gpt, llama = get_model("gpt3-175b"), get_model("llama2-7b")
    lay = Layout(tp=8, micro_batch_size=2, sequence_parallel=True)
    assert block_cost(gpt, lay, 1).gemm_mnk == (4096, 3 * 12288 // 8, 12288)
    assert block_cost(gpt, lay, 2).gemm_mnk == (4096, 4 * 12288 // 8, 12288)
    assert block_cost(gpt, lay, 193).gemm_mnk == (4096, 51200 // 8, 12288)
    assert block_cost(gpt, lay, 0).gemm_mnk == (0, 0, 0)
    assert block_cost(llama, Layout(tp=4), 2).gemm_mnk == (4096, 2 * 11008 // 4, 4096)


def test_tp_collectives_without_sequence_parallel() -> None:
    """Attention and MLP: one all-reduce after forward and one in backward, b*s*h*2 bytes; none at tp = 1."""
    m = get_model("gpt3-175b")
    size = 2048 * 12288 * 2
    for blk in (1, 2):
        comm = block_cost(m, Layout(tp=8), blk).tp_comm
        assert [(c.kind, c.phase, c.position, c.bytes) for c in comm] == [
            ("all_reduce", "fwd", "after", size), ("all_reduce", "bwd", "after", size)]
    assert block_cost(m, Layout(), 1).tp_comm == ()
    assert [c.kind for c in block_cost(m, Layout(tp=8), 0).tp_comm] == ["all_reduce"]


def test_tp_collectives_with_sequence_parallel() -> None:
    """SP: all-gather before and reduce-scatter after in forward; backward reverses (plus the input re-gather)."""
    m = get_model("gpt3-175b")
    comm = block_cost(m, Layout(tp=8, sequence_parallel=True), 2).tp_comm
    fwd = [(c.kind, c.position) for c in comm if c.phase == "fwd"]
    bwd = [(c.kind, c.position) for c in comm if c.phase == "bwd"]
    assert fwd == [("all_gather", "before"), ("reduce_scatter", "after")]
    assert ("reduce_scatter", "after") in bwd and ("all_gather", "before") in bwd
    assert all(c.bytes == 2048 * 12288 * 2 for c in comm)


def test_head_collectives_follow_vocab_parallel_cross_entropy() -> None:
    """Head: three fp32 per-token all-reduces in forward (max, target, sum-exp) and the input-grad all-reduce."""
    m = get_model("gpt3-175b")
    comm = block_cost(m, Layout(tp=8, micro_batch_size=2), 193).tp_comm
    small = [c for c in comm if c.bytes == 2 * 2048 * 4]
    assert len(small) == 3 and all(c.kind == "all_reduce" and c.phase == "fwd" for c in small)
    assert TPCollective(kind="all_reduce", phase="bwd", position="after", bytes=2 * 2048 * 12288 * 2,
                        label="input-grad") in comm


def test_mlp_hbm_bytes_by_kernel() -> None:
    """GPT MLP forward: norm 2E + bias-GeLU 2F + bias-dropout-add 3E + mask (E = Thd, F = Tfd); 5 kernels."""
    m = get_model("gpt2-small")
    T, h, d = 1024, 768, 2
    E, F = T * h * d, T * 4 * h * d
    cost = block_cost(m, Layout(), 2)
    assert cost.fwd_hbm_bytes == 2 * E + 2 * F + 3 * E + T * h
    assert cost.fwd_kernels == 5
    # backward: norm 3E, GeLU 3F, dropout-add 2E + mask, residual sum 3E, bias grads read F + E, and 6 bytes
    # per parameter landing the weight gradients in their accumulation buffer.
    assert cost.bwd_hbm_bytes == 3 * E + 3 * F + 2 * E + T * h + 3 * E + F + E + 6 * cost.param_count


def test_attention_hbm_bytes_include_the_s_squared_softmax_and_dropout() -> None:
    """Attention forward: norm 2E, Megatron's causal softmax reading the lower triangle (s (s + 1) / 2 of the
    s^2 scores) and writing S, dropout S(2d+1)/d, context copy 2E, residual 3E + mask (S = a b s^2 d). The core
    GEMMs' s x s operands are priced with the GEMMs by shape, so they are listed there instead."""
    m = get_model("gpt2-small")
    T, h, a, d = 1024, 768, 12, 2
    E, S = T * h * d, a * 1024 * 1024 * d
    cost = block_cost(m, Layout(), 1)
    context_copy = 2 * E  # PV output permuted to [s, b, h] with .contiguous() (Megatron-LM CoreAttention)
    softmax = S * 1025 // 2048 + S
    assert cost.fwd_hbm_bytes == 2 * E + softmax + S * 5 // 2 + context_copy + 3 * E + T * h
    # QK^T and PV, the a heads stacked along m
    assert (a * 1024, 1024, 64, 1) in cost.fwd_gemms and (a * 1024, 64, 1024, 1) in cost.fwd_gemms
    assert cost.bwd_input_gemms.count((a * 1024, 1024, 64, 1)) == 1  # dP = dO V^T writes the s x s gradient


def test_invalid_layout_for_model_is_rejected() -> None:
    """tp not dividing the heads is reported by check_layout through block_cost."""
    with pytest.raises(LayoutError, match="tp = 8 does not divide the 12 attention heads"):
        block_cost(get_model("gpt2-small"), Layout(tp=8), 1)


def test_eager_kernels_move_the_bytes_torchtitans_llama_code_moves() -> None:
    """PyTorch eager (torchtitan's Llama): the fp32 RMSNorm chain (36 bytes per element forward against a
    fused kernel's 4), complex rotary (20 per Q/K element against 4), SiLU-then-multiply (5F against 3F),
    the attention output copy, GQA's repeat_kv copy of K and V to every query head (read 8 kv heads, write 32,
    each); a fused RMSNorm keeps only the norm's fused cost. Forward bytes by hand."""
    m = get_model("llama3-8b")
    layout = Layout(micro_batch_size=1, flash_attention=True)
    T, h, d = m.seq_length, m.hidden_size, 2
    fused = block_cost(m, layout, 1).fwd_hbm_bytes
    eager = block_cost(m, dataclasses.replace(layout, kernel_fusion="eager"), 1).fwd_hbm_bytes
    qk = T * (m.num_heads + m.kv_heads) * m.head_dim
    repeat_kv = 2 * qk * d
    assert eager - fused == (36 - 4) * T * h + 2 * T * m.num_heads * m.head_dim * d + (20 - 4) * qk + repeat_kv
    norm_fused = block_cost(m, dataclasses.replace(layout, kernel_fusion="eager-fused-norm"), 1).fwd_hbm_bytes
    assert eager - norm_fused == (36 - 4) * T * h
    mlp_fused = block_cost(m, layout, 2).fwd_hbm_bytes
    mlp_eager = block_cost(m, dataclasses.replace(layout, kernel_fusion="eager-fused-norm"), 2).fwd_hbm_bytes
    assert mlp_eager - mlp_fused == 2 * T * m.ffn_size * d


def test_eager_layernorm_is_one_native_kernel() -> None:
    """A LayerNorm model pays no eager norm chain (torch's layer_norm is one kernel either way)."""
    m = get_model("gpt2-small")
    fused = block_cost(m, Layout(), 2)
    eager = block_cost(m, Layout(kernel_fusion="eager"), 2)
    assert eager.fwd_hbm_bytes == fused.fwd_hbm_bytes
