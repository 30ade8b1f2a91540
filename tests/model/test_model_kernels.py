"""Memory-bound traffic of the output head's fp32 cross entropy by framework (simgrid.model.kernels).

Expected byte counts are derived in each test from the frameworks' loss code, one pass per tensor op."""

from __future__ import annotations

from simgrid.layout.spec import Layout
from simgrid.model.blocks import block_kind
from simgrid.model.kernels import block_kernels
from simgrid.model.spec import ModelSpec

GPT = ModelSpec(name="ce-test", num_layers=2, hidden_size=256, num_heads=4, vocab_size=32000, seq_length=512,
                tied_embeddings=False)
"""LayerNorm model: PyTorch eager runs LayerNorm as one native kernel, so eager and fused heads differ only
by their cross entropy."""

HEAD = next(b for b in range(10) if block_kind(GPT, b)[0] == "head")


def _head(**layout: object) -> tuple[int, int, int, int]:
    k = block_kernels(GPT, Layout(**layout), HEAD)  # type: ignore[arg-type]
    return k.fwd_hbm_bytes, k.bwd_hbm_bytes, k.fwd_kernels, k.bwd_kernels


def test_megatron_and_pytorch_cross_entropy_differ_by_their_passes_over_the_logits() -> None:
    """Forward: Megatron's vocab-parallel cross entropy subtracts the row max in place (read 4 + write 4 per
    logit) and normalises the softmax in place for its backward (read 4 + write 4): 16 bytes more than PyTorch's
    log-softmax; launches: Megatron's 18 forward kernels (cast, max, subtract, target mask 3, clone and shift 2,
    masked fill, arange, gather, clone, masked fill, exp, sum, log, subtract, divide) against PyTorch's cast, one
    log_softmax kernel and one nll_loss kernel (aten SoftMax.cu host_softmax, Loss.cu): 15 more; backward,
    Megatron's 8 (mask cast, 1 - mask, arange, gather, subtract, index_put, scale, cast) against PyTorch's 4
    (zero-fill, scatter, log-softmax backward, cast): 4 fewer for PyTorch. Backward: PyTorch's nll_loss zero-fills the fp32 gradient (write 4) and
    log-softmax's backward reads the gradient twice and the output once and writes (16) where Megatron
    subtracts and scales in place (8): 12 bytes and 2 launches more for PyTorch."""
    mb, tp = 2, 2
    logits = mb * GPT.seq_length * GPT.vocab_size // tp
    fused = _head(micro_batch_size=mb, tp=tp, global_batch_size=mb, kernel_fusion="fused")
    eager = _head(micro_batch_size=mb, tp=tp, global_batch_size=mb, kernel_fusion="eager")
    assert fused[0] - eager[0] == 16 * logits
    assert eager[1] - fused[1] == 12 * logits
    assert (fused[2] - eager[2], fused[3] - eager[3]) == (15, 4)


def test_megatron_head_forward_counts_every_pass_over_the_fp32_logits() -> None:
    """Fused head forward on one rank, bf16, no sequence parallelism: norm (read + write T h d), and per logit the
    cast (read 2, write 4), max (4), subtract (8), exp (8), sum (4), divide (8) = 38 bytes."""
    T, h, V, d = 512, GPT.hidden_size, GPT.vocab_size, 2
    fwd = _head(micro_batch_size=1, global_batch_size=1)[0]
    assert fwd == 2 * T * h * d + T * V * 38


# The unfused attention core, checked against Megatron-LM's attention code of 2021 (v2.5) and 2022
# (megatron/model/transformer.py, fused_softmax.py, fused_kernels/scaled_upper_triang_masked_softmax.h).
ATTN = next(b for b in range(10) if block_kind(GPT, b)[0] == "attn")


def _core(**layout: object) -> tuple[int, int, int, int]:
    from simgrid.model.kernels import _unfused_core

    c = _unfused_core(GPT, Layout(**layout))  # type: ignore[arg-type]
    return c.fwd_bytes, c.bwd_bytes, c.fwd_kernels, c.bwd_kernels


def test_megatron_causal_softmax_reads_only_the_lower_triangle() -> None:
    """Megatron's causal fused softmax loads the r + 1 unmasked scores of row r and writes the whole row:
    forward reads s (s + 1) / 2 of S and writes S; backward reads dP and P on the lower triangle and writes dS.
    PyTorch's softmax (eager) reads and writes full rows. s = 512, 4 heads, micro-batch 1, fp16 scores."""
    s, heads, hd, d = 512, 4, 64, 2
    S, C = heads * s * s * d, heads * s * hd * d
    lower = heads * s * (s + 1) // 2 * d
    drop = S * 5 // 2  # read P, write P and a 1-byte mask
    fwd, bwd, fwd_k, bwd_k = _core()
    assert fwd == lower + S + 2 * C + drop
    # backward: softmax, dQ and dK scaled by alpha (read, write each), split's cat of dQ, dK, dV (read 3, write
    # 3), dropout's masked scale; the context gradient reaches cuBLAS as a strided view (no copy)
    assert bwd == 2 * lower + S + 4 * C + 6 * C + drop
    assert (fwd_k, bwd_k) == (5, 2 + 1 + 2 + 2 + 1 + 1)
    e_fwd, e_bwd, _, e_bwd_k = _core(kernel_fusion="eager")
    assert (e_fwd, e_bwd) == (2 * S + 2 * C + drop, 3 * S + 2 * C + drop)
    assert e_bwd_k == 2 + 1 + 2 + 1 + 1


def test_causal_softmax_applies_within_the_kernels_limits_only() -> None:
    """The fused causal kernel needs 16-bit scores, s <= 4096 (2022 code) and one sequence per rank: fp32 or a
    context-parallel rank keeps the full-row softmax."""
    from simgrid.model.kernels import MEGATRON_CAUSAL_SOFTMAX_MAX_SEQ, causal_softmax_read_fraction

    assert causal_softmax_read_fraction(2048) == 2049 / 4096
    assert MEGATRON_CAUSAL_SOFTMAX_MAX_SEQ == 4096
    fp32 = _core(precision="fp32")
    s, heads = 512, 4
    S4 = heads * s * s * 4
    C4 = heads * s * 64 * 4
    assert fp32[0] == 2 * S4 + 2 * C4 + S4 * 9 // 4


def test_megatron_core_backward_extras_do_not_depend_on_the_softmax_kernel() -> None:
    """baddbmm's alpha scalings of dQ and dK and split's cat of dQ, dK, dV are autograd's, so Megatron's core
    (kernel_fusion 'fused') pays them also where its causal softmax kernel does not apply (fp32 scores here),
    and never copies the context gradient back; eager attention copies it back and has no such extras."""
    s, heads = 512, 4
    S4, C4 = heads * s * s * 4, heads * s * 64 * 4
    drop = S4 * 9 // 4  # read P, write P (fp32) and a 1-byte mask
    _, bwd, _, bwd_k = _core(precision="fp32")
    assert bwd == 3 * S4 + 4 * C4 + 6 * C4 + drop
    assert bwd_k == 2 + 1 + 2 + 2 + 1 + 1
    _, e_bwd, _, e_bwd_k = _core(precision="fp32", kernel_fusion="eager")
    assert e_bwd == 3 * S4 + 2 * C4 + drop
    assert e_bwd_k == 2 + 1 + 2 + 1 + 1


def test_pytorch_cross_entropy_forward_is_cast_log_softmax_nll_loss() -> None:
    """PyTorch eager head forward: norm (LayerNorm, one native kernel), the logits GEMM, then the .float() cast,
    ONE log_softmax kernel (SoftMax.cu launches a single cunn_SoftMaxForward per call) and nll_loss: 5 launches;
    the backward's 7 are the norm's, two GEMMs, zero-fill, target scatter, log-softmax backward and cast."""
    _, _, fwd_k, bwd_k = _head(micro_batch_size=1, global_batch_size=1, kernel_fusion="eager")
    assert (fwd_k, bwd_k) == (5, 7)


def test_eager_rmsnorm_forward_launches_eight_kernels() -> None:
    """torchtitan's (and HF's) eager RMSNorm forward: x.float(), pow, mean, + eps, rsqrt, multiply, type_as,
    weight multiply = 8 launches, 7 more than a fused norm; the eager head adds exactly those to the fused head
    less the loss's own difference."""
    from dataclasses import replace

    llama = replace(GPT, norm="rmsnorm", position="rope", gated_mlp=True, ffn_hidden_size=688)
    head = next(b for b in range(10) if block_kind(llama, b)[0] == "head")
    eager = block_kernels(llama, Layout(kernel_fusion="eager"), head).fwd_kernels
    fused = block_kernels(llama, Layout(kernel_fusion="fused"), head).fwd_kernels
    loss_difference = 18 - 3  # Megatron's loss kernels against PyTorch's cast, log_softmax and nll_loss
    assert eager - fused == 7 - loss_difference


def test_eager_gqa_attention_pays_repeat_kv_copy_and_its_reduction() -> None:
    """torchtitan's eager attention (528cab9 / 9dec370 models/llama/model.py): beyond the output transpose copy
    (2 x out) and the fp32 rotary (16 bytes per Q and K element), GQA adds repeat_kv: per K and V one copy
    reading the kv heads and writing the query heads forward, and expand's backward sum doing the reverse:
    2 x tokens x head_dim x (hq + hkv) x 2 bytes each way, 2 launches each way. Multi-head attention (n_rep 1,
    repeat_kv returns its input) pays none of it. 4 query heads of 64, 1 kv head, 512 tokens, bf16."""
    from dataclasses import replace

    mha = replace(GPT, norm="rmsnorm", position="rope", gated_mlp=True, ffn_hidden_size=688)
    gqa = replace(mha, num_kv_heads=1)
    tokens, hd, d = 512, 64, 2
    for model, hkv in ((mha, 4), (gqa, 1)):
        attn = next(b for b in range(10) if block_kind(model, b)[0] == "attn")
        eager = block_kernels(model, Layout(kernel_fusion="eager-fused-norm"), attn)
        fused = block_kernels(model, Layout(kernel_fusion="fused"), attn)
        out = tokens * 4 * hd * d
        rope = 16 * tokens * (4 + hkv) * hd
        repeat = 2 * tokens * hd * (4 + hkv) * d if hkv < 4 else 0
        assert eager.fwd_hbm_bytes - fused.fwd_hbm_bytes == 2 * out + rope + repeat
        full = tokens * 256 * d  # the three input-gradient sums of the separate Q, K, V GEMMs
        assert eager.bwd_hbm_bytes - fused.bwd_hbm_bytes == 2 * out + 6 * full + rope + repeat
        launches = 2 if repeat else 0
        assert eager.fwd_kernels - fused.fwd_kernels == 1 + 4 + launches
        assert eager.bwd_kernels - fused.bwd_kernels == 3 + 4 + launches
