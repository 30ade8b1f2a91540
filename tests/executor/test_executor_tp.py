"""Tensor-parallel helpers: vocabulary-parallel cross entropy and weight sharding."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from executor.tp import (  # noqa: E402
    TPContext,
    VocabParallelCrossEntropy,
    shard,
    unshard,
    vocab_ce_stats,
    vocab_range,
)
from simgrid.errors import LayoutError  # noqa: E402


def test_vocab_parallel_cross_entropy_equals_full_cross_entropy_loss_and_grad() -> None:
    """Two vocabulary shards whose statistics are combined by hand give F.cross_entropy and its gradient."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 3, 12, generator=gen)  # [s, b, V]
    targets = torch.randint(0, 12, (5, 3), generator=gen)
    full = logits.clone().requires_grad_(True)
    ref = F.cross_entropy(full.reshape(-1, 12), targets.reshape(-1))
    ref.backward()
    shards = [logits[..., :6], logits[..., 6:]]
    maxes = torch.maximum(shards[0].max(-1).values, shards[1].max(-1).values)  # the MAX all-reduce, by hand
    parts = [vocab_ce_stats(s, targets, lo, lambda t: maxes, lambda t: t) for s, lo in zip(shards, (0, 6), strict=True)]
    summed = parts[0][1:] + parts[1][1:]  # the SUM all-reduce of (target logit, sum exp), by hand
    stats = torch.stack([maxes, summed[0], summed[1]])
    grads = []
    for s, lo in zip(shards, (0, 6), strict=True):
        leaf = s.clone().requires_grad_(True)
        loss = VocabParallelCrossEntropy.apply(leaf, stats, targets, lo)
        assert float(loss.detach()) == pytest.approx(float(ref.detach()), rel=1e-6)
        loss.backward()
        grads.append(leaf.grad)
    assert torch.allclose(torch.cat(grads, -1), full.grad, atol=1e-7)


def test_shard_then_unshard_restores_the_full_tensor() -> None:
    """Column and row shards of ranks 0..tp-1 concatenate back to the original."""
    full = torch.arange(24.0).view(4, 6)
    for dim in (0, 1):
        pieces = [shard(full, dim, TPContext(size=2, rank=r)) for r in range(2)]
        assert pieces[0].shape[dim] == full.shape[dim] // 2
        assert torch.equal(unshard(pieces, dim), full)
    assert torch.equal(shard(full, None, TPContext(size=2, rank=1)), full)


def test_vocab_range_and_context_errors_name_the_values() -> None:
    """A vocabulary the tp degree does not divide, or a bad rank, is refused with a message."""
    assert vocab_range(256, TPContext(size=4, rank=3)) == (192, 256)
    with pytest.raises(LayoutError, match="tensor-parallel size 3 must divide the vocabulary size 256"):
        vocab_range(256, TPContext(size=3, rank=0))
    with pytest.raises(LayoutError, match=r"rank 2 is outside 0\.\.1"):
        TPContext(size=2, rank=2)
    with pytest.raises(LayoutError, match="sequence_parallel needs"):
        TPContext(size=1, sequence_parallel=True)
