"""Per-rank costs under context parallelism: the rank's s / cp queries against all s keys, by hand."""

from __future__ import annotations

from simgrid.layout import Layout
from simgrid.model import block_cost, get_model, p2p_bytes
from simgrid.model.activations import block_activation_bytes
from simgrid.model.flops import block_flops

LLAMA = get_model("llama3-8b").with_seq_length(8192)  # h 4096, 32 heads, 8 KV heads of 128, ffn 14336
ATTN, MLP = 1, 2


def test_linear_flops_divide_by_cp_and_the_core_by_cp_against_all_keys() -> None:
    """cp 4, tp 2: QKV + out-projection on 2048 local tokens; the core 4 b (s/cp) s (a/tp) hd."""
    s, h, hd = 8192, 4096, 128
    f = block_flops(LLAMA, ATTN, micro_batch_size=1, tp=2, cp=4)
    tokens = s // 4
    qkv_width = (32 + 2 * 8) * hd // 2
    linear = 2 * tokens * h * qkv_width + 2 * tokens * (h // 2) * h
    core = 4 * 1 * (s // 4) * s * (32 // 2) * hd
    assert f.fwd == linear + core
    assert f.attention_core_fwd == core
    mlp = block_flops(LLAMA, MLP, micro_batch_size=1, tp=2, cp=4)
    assert mlp.fwd == block_flops(LLAMA, MLP, micro_batch_size=1, tp=2).fwd / 4


def test_total_flops_over_the_cp_group_equal_the_unsplit_rank() -> None:
    """Context parallelism moves work between ranks, it adds none: cp ranks together do one rank's FLOPs."""
    for block in (0, ATTN, MLP, 2 * LLAMA.num_layers + 1):
        whole = block_flops(LLAMA, block, micro_batch_size=2, tp=1)
        part = block_flops(LLAMA, block, micro_batch_size=2, tp=1, cp=8)
        assert 8 * part.fwd == whole.fwd and 8 * part.bwd_input == whole.bwd_input


def test_activations_keep_the_local_tokens_and_the_local_query_rows() -> None:
    """Unfused core, no dropout (Llama recipe): attention keeps 2 T h d (norm and QKV inputs), Q, K, V,
    out-projection input on the rank's T = s/cp tokens, and softmax probabilities (a) (s/cp) s d."""
    d, s, cp = 2, 8192, 4
    tokens = s // cp
    q_width, kv_width = 32 * 128, 8 * 128
    expected = tokens * 4096 * 2 * d + tokens * (2 * q_width + 2 * kv_width) * d + 32 * tokens * s * d
    assert block_activation_bytes(LLAMA, ATTN, cp=cp) == expected


def test_cp_collectives_gather_the_whole_sequences_keys_and_values() -> None:
    """Forward: all-gather K and V (2 b s kv hd d); backward: gather again and reduce-scatter dK, dV;
    MLP blocks have none, and cp = 1 has none at all."""
    lay = Layout(cp=4, tp=2, dp=1)
    kv = 2 * 1 * 8192 * (8 // 2) * 128 * 2
    comm = block_cost(LLAMA, lay, ATTN).cp_comm
    assert [(c.kind, c.phase, c.position, c.bytes) for c in comm] == [
        ("all_gather", "fwd", "before", kv), ("all_gather", "bwd", "before", kv),
        ("reduce_scatter", "bwd", "after", kv)]
    assert block_cost(LLAMA, lay, MLP).cp_comm == ()
    assert block_cost(LLAMA, Layout(tp=2), ATTN).cp_comm == ()


def test_tp_and_pipeline_messages_carry_the_local_tokens() -> None:
    """The TP all-reduce and the pipeline send move b (s/cp) h d bytes."""
    lay = Layout(cp=4, tp=2, pp=2, dp=1, global_batch_size=2)
    local = 1 * (8192 // 4) * 4096 * 2
    assert {c.bytes for c in block_cost(LLAMA, lay, MLP).tp_comm} == {local}
    assert p2p_bytes(LLAMA, lay) == local
