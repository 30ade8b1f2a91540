"""The single-process reference step: data, loss at initialisation and gradient accumulation."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from executor.data import global_batch, microbatch  # noqa: E402
from executor.reference import reference_training  # noqa: E402
from simgrid.layout.spec import Layout  # noqa: E402
from simgrid.model.spec import ModelSpec  # noqa: E402

SMALL = ModelSpec(name="t", num_layers=2, hidden_size=32, num_heads=4, vocab_size=64, seq_length=8)


def test_synthetic_batch_is_seeded_and_counts_by_a_stride() -> None:
    """Same seed and step give the same tokens; each sequence advances by a constant stride mod V."""
    layout = Layout(dp=2, micro_batch_size=2, global_batch_size=8)
    a, b = global_batch(SMALL, layout, 3, 0), global_batch(SMALL, layout, 3, 0)
    assert torch.equal(a, b) and a.shape == (2, 2, 2, 9)
    assert not torch.equal(a, global_batch(SMALL, layout, 3, 1))
    diffs = (a[..., 1:] - a[..., :-1]) % SMALL.vocab_size
    assert bool((diffs == diffs[..., :1]).all())
    inputs, targets = microbatch(a, 1, 0)
    assert inputs.shape == (8, 2) and torch.equal(inputs[1:], targets[:-1])


def test_initial_loss_is_near_log_vocabulary() -> None:
    """At initialisation predictions are near uniform: loss ~ ln(V)."""
    result = reference_training(SMALL, Layout(precision="fp32"), steps=1)
    assert result.losses[0] == pytest.approx(math.log(SMALL.vocab_size), rel=0.05)


def test_gradient_accumulation_equals_one_big_micro_batch() -> None:
    """Two micro-batches of 1 sequence and one micro-batch of the same 2 sequences update identically."""
    accumulated = Layout(micro_batch_size=1, global_batch_size=2, optimizer="sgd", precision="fp32")
    single = Layout(micro_batch_size=2, global_batch_size=2, optimizer="sgd", precision="fp32")
    # Both layouts draw the same two sequences (same element count and order from the generator).
    assert torch.equal(global_batch(SMALL, accumulated, 4, 0).reshape(2, -1),
                       global_batch(SMALL, single, 4, 0).reshape(2, -1))
    a = reference_training(SMALL, accumulated, seed=4)
    b = reference_training(SMALL, single, seed=4)
    assert a.losses[0] == pytest.approx(b.losses[0], rel=1e-6)
    for name in a.weights:
        assert torch.allclose(a.weights[name], b.weights[name], rtol=1e-5, atol=1e-8), name
