"""Synthetic, learnable training data, identical on every process for a given seed and step."""

from __future__ import annotations

import torch

from simgrid.layout.spec import Layout
from simgrid.model.spec import ModelSpec

MAX_STRIDE = 3
"""Each sequence counts up by a stride in 1..MAX_STRIDE (mod vocabulary): predictable after two tokens."""


def global_batch(spec: ModelSpec, layout: Layout, seed: int, step: int) -> torch.Tensor:
    """Tokens of one optimizer step: ``[m, dp, mbs, s + 1]`` (inputs are ``[..., :-1]``, targets ``[..., 1:]``)."""
    m, dp, b, s = layout.num_microbatches, layout.dp, layout.micro_batch_size, spec.seq_length
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    start = torch.randint(0, spec.vocab_size, (m, dp, b, 1), generator=gen)
    stride = torch.randint(1, MAX_STRIDE + 1, (m, dp, b, 1), generator=gen)
    return (start + stride * torch.arange(s + 1)) % spec.vocab_size


def microbatch(tokens: torch.Tensor, microbatch: int, replica: int, positions: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of one micro-batch of one replica in the ``[s, b]`` layout the model uses.

    ``positions`` (context parallelism) keeps only the tokens at those global positions, in that order.
    """
    seqs = tokens[microbatch, replica]
    inputs, targets = seqs[:, :-1].t(), seqs[:, 1:].t()
    if positions is not None:
        inputs, targets = inputs[positions], targets[positions]
    return inputs.contiguous(), targets.contiguous()
