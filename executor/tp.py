"""Megatron-style 1-D tensor parallelism: how full weights are sharded and where collectives cut a block.

Shoeybi et al., "Megatron-LM" (2019), section 3: the first linear of the attention (Q, K, V) and of the
MLP is column-parallel (output features split), the second (attention output, MLP down projection) is
row-parallel (input features split), so each tensor-parallel rank produces a *partial* output that an
all-reduce sums (operator ``g``), and the gradient entering the column-parallel linear is partial and
summed in backward (operator ``f``). With sequence parallelism (Korthikanti et al. 2022, section 4.2.2)
the forward all-reduce becomes a reduce-scatter along the sequence and the norm input is all-gathered;
backward swaps the two.

The executor keeps these collectives *between* compute ops, as the IR places them: every block is a chain
of segments separated by cuts, and each cut names the collective that moves the real tensor across it in
forward and in backward (:class:`CutComm`). The embedding and the head are vocabulary-parallel (Megatron's
``VocabParallelEmbedding`` and ``_VocabParallelCrossEntropy``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from simgrid.errors import LayoutError

#: The collectives a cut can carry (``None``: the tensor passes unchanged, no communication).
CUT_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "vocab_ce")


@dataclass(frozen=True, kw_only=True)
class TPContext:
    """This rank's place in its tensor-parallel group."""

    size: int = 1
    """Tensor-parallel degree."""
    rank: int = 0
    """Index of this rank inside the tensor-parallel group (0 .. size-1)."""
    sequence_parallel: bool = False
    """Shard norms and residual activations along the sequence (needs size > 1)."""

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.size:
            raise LayoutError(f"tensor-parallel rank {self.rank} is outside 0..{self.size - 1}")
        if self.sequence_parallel and self.size == 1:
            raise LayoutError("sequence_parallel needs a tensor-parallel size > 1")


@dataclass(frozen=True, kw_only=True)
class CutComm:
    """The collective on one cut between two segments of a block."""

    forward: str | None
    """Collective applied to the segment output in forward (``None``: identity)."""
    backward: str | None
    """Collective applied to the gradient of the cut in backward (``None``: identity)."""


IDENTITY_CUT = CutComm(forward=None, backward=None)

VOCAB_CE = "vocab_ce"
"""Pseudo-kind of the head's loss cut: three all-reduces (logit max, target logit, sum of exponentials)."""


def layer_cuts(tp: TPContext) -> tuple[CutComm, CutComm]:
    """Cuts of an attention or MLP block: (norm | core) and (core | residual add)."""
    if tp.size == 1:
        return IDENTITY_CUT, IDENTITY_CUT
    if tp.sequence_parallel:
        return (CutComm(forward="all_gather", backward="reduce_scatter"),
                CutComm(forward="reduce_scatter", backward="all_gather"))
    return CutComm(forward=None, backward="all_reduce"), CutComm(forward="all_reduce", backward=None)


def embed_cuts(tp: TPContext) -> tuple[CutComm]:
    """Cut of the vocabulary-parallel embedding between the partial lookup and the position add."""
    if tp.size == 1:
        return (IDENTITY_CUT,)
    if tp.sequence_parallel:
        return (CutComm(forward="reduce_scatter", backward="all_gather"),)
    return (CutComm(forward="all_reduce", backward=None),)


def head_cuts(tp: TPContext) -> tuple[CutComm, CutComm]:
    """Cuts of the head: (final norm | vocabulary-parallel logits) and (logits | cross entropy)."""
    loss = CutComm(forward=VOCAB_CE, backward=None)
    if tp.size == 1:
        return IDENTITY_CUT, loss
    if tp.sequence_parallel:
        return CutComm(forward="all_gather", backward="reduce_scatter"), loss
    return CutComm(forward=None, backward="all_reduce"), loss


def vocab_range(vocab_size: int, tp: TPContext) -> tuple[int, int]:
    """[first, last) vocabulary ids whose embedding rows and logits this rank holds."""
    if vocab_size % tp.size:
        raise LayoutError(
            f"executor: tensor-parallel size {tp.size} must divide the vocabulary size {vocab_size} "
            "(pad the vocabulary as Megatron-LM does)"
        )
    step = vocab_size // tp.size
    return tp.rank * step, (tp.rank + 1) * step


Reducer = Callable[[torch.Tensor], torch.Tensor]


def vocab_ce_stats(logits: torch.Tensor, targets: torch.Tensor, vocab_start: int, reduce_max: Reducer,
                   reduce_sum: Reducer) -> torch.Tensor:
    """Per-token (max logit, target logit, sum of exp(logit - max)) over the whole vocabulary, ``[3, s, b]``.

    Megatron-LM ``_VocabParallelCrossEntropy``: each rank holds the logits of its vocabulary slice; the
    global max, the target's logit (zero on ranks that do not hold it) and the sum of exponentials are
    all-reduced. ``reduce_*`` perform the collectives (identity on one process).
    """
    with torch.no_grad():
        local_max = reduce_max(logits.max(dim=-1).values.contiguous())
        local = targets - vocab_start
        held = (local >= 0) & (local < logits.shape[-1])
        picked = logits.gather(-1, local.clamp(0, logits.shape[-1] - 1).unsqueeze(-1)).squeeze(-1)
        target_logit = torch.where(held, picked, torch.zeros_like(picked))
        sum_exp = (logits - local_max.unsqueeze(-1)).exp().sum(dim=-1)
        reduced = reduce_sum(torch.stack([target_logit, sum_exp]))
        return torch.stack([local_max, reduced[0], reduced[1]])


class VocabParallelCrossEntropy(torch.autograd.Function):
    """Mean cross entropy from local logits and the reduced statistics; backward is local (softmax - onehot)."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, stats: torch.Tensor, targets: torch.Tensor,
                vocab_start: int) -> torch.Tensor:
        max_logit, target_logit, sum_exp = stats[0], stats[1], stats[2]
        ctx.save_for_backward(logits, stats, targets)
        ctx.vocab_start = vocab_start
        return (sum_exp.log() + max_logit - target_logit).mean()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        logits, stats, targets = ctx.saved_tensors
        probs = (logits - stats[0].unsqueeze(-1)).exp() / stats[2].unsqueeze(-1)
        local = targets - ctx.vocab_start
        held = (local >= 0) & (local < logits.shape[-1])
        onehot = torch.zeros_like(probs).scatter_(-1, local.clamp(0, logits.shape[-1] - 1).unsqueeze(-1), 1.0)
        probs = probs - onehot * held.unsqueeze(-1)
        return probs * (grad / targets.numel()), None, None, None


def shard(full: torch.Tensor, dim: int | None, tp: TPContext) -> torch.Tensor:
    """This rank's contiguous slice of ``full`` along ``dim`` (a copy of all of it when ``dim`` is None)."""
    if dim is None or tp.size == 1:
        return full.detach().clone()
    size = full.shape[dim]
    if size % tp.size:
        raise LayoutError(f"tensor-parallel size {tp.size} does not divide dimension {dim} of size {size}")
    step = size // tp.size
    return full.detach().narrow(dim, tp.rank * step, step).clone()


def unshard(pieces: list[torch.Tensor], dim: int | None) -> torch.Tensor:
    """Reassemble a full tensor from the shards of tensor-parallel ranks 0..tp-1."""
    if dim is None or len(pieces) == 1:
        return pieces[0]
    return torch.cat(pieces, dim=dim)


def sequence_shard(full: torch.Tensor, tp: TPContext) -> torch.Tensor:
    """This rank's slice of a ``[s, b, h]`` activation along the sequence (dim 0)."""
    return shard(full, 0, tp) if tp.sequence_parallel else full
