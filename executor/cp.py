"""Llama 3 all-gather context parallelism: the tokens a rank holds and the K/V cut around the attention core.

Dubey et al. 2024 ("The Llama 3 Herd of Models"), section 3.3.2: every sequence is split into ``2 * cp``
equal chunks and context-parallel rank ``i`` holds chunks ``i`` and ``2 * cp - 1 - i``, so each rank gets
one early chunk (few keys under the causal mask) and one late chunk (many keys) and the attention work
balances. Before the attention core a rank all-gathers K and V over its CP group and attends its local
queries to every key under the causal mask by *global* position; the backward all-gathers K and V again
and reduce-scatters the full-sequence dK, dV back to the ranks that own those tokens.

In a block, the Q/K/V projection (and RoPE) is a segment of its own, and the cut after it has the pseudo
kind :data:`CP_KV`: it passes Q of the local tokens through unchanged and replaces the local K, V by the
gathered ones. Its leaf (the input of the core segment) is the flat concatenation
``[Q_local | KV_full]`` (``KV_full`` in global token order, ``[s, b, 2 * kv_width]``), so one autograd leaf
carries both; its gradient splits back into dQ (kept) and the full dK, dV (reduce-scattered). This module
starts those collectives on given tensors; the handler of the IR's ``cp`` ops
(:mod:`executor.handlers.blockcomm`) decides when, on which run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from executor.comm import all_gather_dim0, reduce_scatter_dim0
from executor.tp import CutComm
from simgrid.errors import LayoutError

CP_KV = "cp_kv"
"""Pseudo-kind of the context-parallel cut: K/V all-gather forward, dK/dV reduce-scatter backward."""

KV_CUT = CutComm(forward=CP_KV, backward=CP_KV)
"""The cut between an attention block's Q/K/V projection and its core under context parallelism."""

REGATHER_NOTE = "K/V re-gather moved; gathered copy kept from forward"
"""Trace note of the backward K/V all-gather: the executor keeps the forward's gathered K, V in the autograd
graph (as for sequence parallelism's input re-gather), so the re-gathered copy is moved but not used."""


@dataclass(frozen=True, kw_only=True)
class CPContext:
    """This rank's place in its context-parallel group."""

    size: int = 1
    """Context-parallel degree (``Layout.cp``)."""
    rank: int = 0
    """Index of this rank inside the context-parallel group (0 .. size-1)."""

    def __post_init__(self) -> None:
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise LayoutError(f"context-parallel rank {self.rank} is outside 0..{self.size - 1}")

    def positions(self, seq_length: int) -> torch.Tensor:
        """Global positions of this rank's tokens, in the order the rank holds them (``[s / cp]``)."""
        return chunk_positions(seq_length, self.size, self.rank)


def chunk_positions(seq_length: int, cp: int, rank: int) -> torch.Tensor:
    """Global positions held by CP rank ``rank``: chunk ``rank`` then chunk ``2 * cp - 1 - rank`` of ``2 * cp``."""
    if seq_length % (2 * cp):
        raise LayoutError(
            f"context parallelism: cp = {cp} splits a sequence into {2 * cp} chunks, which must divide "
            f"seq_length {seq_length}; choose a cp whose double divides it"
        )
    chunk = seq_length // (2 * cp)
    late = 2 * cp - 1 - rank
    return torch.cat([torch.arange(rank * chunk, (rank + 1) * chunk), torch.arange(late * chunk, (late + 1) * chunk)])


def gathered_positions(seq_length: int, cp: int) -> torch.Tensor:
    """Global position of each row of a CP all-gather (ranks' local rows concatenated in rank order)."""
    return torch.cat([chunk_positions(seq_length, cp, r) for r in range(cp)])


def causal_allowed(query_positions: torch.Tensor, key_count: int) -> torch.Tensor:
    """``[queries, keys]`` boolean: True where a query may attend a key (key position <= query position)."""
    keys = torch.arange(key_count, device=query_positions.device)
    return query_positions.unsqueeze(1) >= keys.unsqueeze(0)


def pack_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Local ``[s, b, heads, d]`` Q, K, V as one ``[s, b, q_width + 2 * kv_width]`` segment output."""
    s, b = q.shape[:2]
    return torch.cat([q.reshape(s, b, -1), k.reshape(s, b, -1), v.reshape(s, b, -1)], dim=-1)


def unpack_leaf(leaf: torch.Tensor, *, local_seq: int, batch: int, q_width: int, kv_width: int, cp: int
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split the cut's flat leaf into local Q ``[s/cp, b, q_width]`` and full K, V ``[s, b, kv_width]``."""
    n_q = local_seq * batch * q_width
    q = leaf[:n_q].view(local_seq, batch, q_width)
    kv = leaf[n_q:].view(local_seq * cp, batch, 2 * kv_width)
    return q, kv[..., :kv_width], kv[..., kv_width:]


def start_kv_gather(packed: torch.Tensor, q_width: int, cp: CPContext, group: Any
                    ) -> tuple[Any, Callable[[], torch.Tensor]]:
    """Forward of the cut: all-gather the local K, V rows; the getter builds the leaf ``[Q_local | KV_full]``."""
    gathered, work = all_gather_dim0(packed[..., q_width:].contiguous(), group, cp.size)
    seq = packed.shape[0] * cp.size
    where = gathered_positions(seq, cp.size).to(packed.device)

    def leaf() -> torch.Tensor:
        full = torch.empty_like(gathered)
        full[where] = gathered  # rank-order rows to global token order
        return torch.cat([packed[..., :q_width].reshape(-1), full.reshape(-1)])

    return work, leaf


def start_kv_regather(packed: torch.Tensor, q_width: int, cp: CPContext, group: Any) -> Any:
    """Backward re-gather of the local K, V rows (moved for real; see :data:`REGATHER_NOTE`)."""
    _, work = all_gather_dim0(packed[..., q_width:].contiguous(), group, cp.size)
    return work


def start_kv_grad_scatter(leaf_grad: torch.Tensor, packed_shape: torch.Size, q_width: int, cp: CPContext,
                          group: Any, index: int, backend: str) -> tuple[Any, Callable[[], torch.Tensor], str]:
    """Backward of the cut: reduce-scatter the full dK, dV so each rank gets the rows of its own tokens.

    The rows are put back in rank order first (the inverse of the forward's reordering), so shard ``i``
    of the reduce-scatter is rank ``i``'s two chunks in the order it holds them. Returns (work, getter of
    the gradient of the packed segment output ``[dQ | dK_local | dV_local]``, note).
    """
    local_seq, batch, width = packed_shape
    n_q = local_seq * batch * q_width
    dq = leaf_grad[:n_q].view(local_seq, batch, q_width)
    dkv = leaf_grad[n_q:].view(local_seq * cp.size, batch, width - q_width)
    where = gathered_positions(local_seq * cp.size, cp.size).to(leaf_grad.device)
    getter, work, note = reduce_scatter_dim0(dkv[where], group, cp.size, index, backend)

    def grad() -> torch.Tensor:
        return torch.cat([dq, getter()], dim=-1)

    return work, grad, note
