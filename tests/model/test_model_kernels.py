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
    logit) and normalises the softmax in place for its backward (read 4 + write 4): 16 bytes and 2 launches
    more than PyTorch's log-softmax. Backward: PyTorch's nll_loss zero-fills the fp32 gradient (write 4) and
    log-softmax's backward reads the gradient twice and the output once and writes (16) where Megatron
    subtracts and scales in place (8): 12 bytes and 2 launches more for PyTorch."""
    mb, tp = 2, 2
    logits = mb * GPT.seq_length * GPT.vocab_size // tp
    fused = _head(micro_batch_size=mb, tp=tp, global_batch_size=mb, kernel_fusion="fused")
    eager = _head(micro_batch_size=mb, tp=tp, global_batch_size=mb, kernel_fusion="eager")
    assert fused[0] - eager[0] == 16 * logits
    assert eager[1] - fused[1] == 12 * logits
    assert (fused[2] - eager[2], eager[3] - fused[3]) == (2, 2)


def test_megatron_head_forward_counts_every_pass_over_the_fp32_logits() -> None:
    """Fused head forward on one rank, bf16, no sequence parallelism: norm (read + write T h d), and per logit the
    cast (read 2, write 4), max (4), subtract (8), exp (8), sum (4), divide (8) = 38 bytes."""
    T, h, V, d = 512, GPT.hidden_size, GPT.vocab_size, 2
    fwd = _head(micro_batch_size=1, global_batch_size=1)[0]
    assert fwd == 2 * T * h * d + T * V * 38
