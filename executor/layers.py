"""The four kinds of block of a decoder-only transformer, with their segments and cuts.

Block numbering follows :mod:`simgrid.ir.ops` (see :mod:`executor.model`). Activations use Megatron's
``[sequence, batch, hidden]`` layout so the sequence-parallel collectives work on dimension 0; tensor
parallelism follows Megatron (:mod:`executor.tp`), context parallelism Llama 3 (:mod:`executor.cp`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from executor.block import BlockModule, SegmentInputs
from executor.cp import KV_CUT, CPContext, causal_allowed, pack_qkv, unpack_leaf
from executor.tp import (
    TPContext,
    VocabParallelCrossEntropy,
    embed_cuts,
    head_cuts,
    layer_cuts,
    vocab_range,
)
from executor.weights import head_index
from simgrid.errors import LayoutError
from simgrid.model.spec import ModelSpec

ROPE_BASE = 10000.0
"""Rotary embedding base (Su et al., RoFormer 2021, eq. 15)."""


def rope_cos_sin(seq: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary angles for positions ``0..seq-1`` as ``[s, 1, 1, d]`` cos/sin tables (rotate-half form)."""
    inv = 1.0 / (ROPE_BASE ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    angles = torch.outer(torch.arange(seq, dtype=torch.float64), inv)
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos().float()[:, None, None, :], emb.sin().float()[:, None, None, :]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``[s, b, heads, d]`` query/key vectors by their position."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin



class EmbedBlock(BlockModule):
    """Block 0: vocabulary-parallel token embedding, then (after the reduction) learned positions."""

    def __init__(self, spec: ModelSpec, weights: dict[str, torch.Tensor], tp: TPContext,
                 cp: CPContext | None = None) -> None:
        super().__init__(spec, 0, tp, cp)
        self._param("wte", "embed.wte", weights, 0)
        if spec.position == "learned":
            self._param("wpe", "embed.wpe", weights, None)
        self.vocab_start, self.vocab_end = vocab_range(spec.vocab_size, tp)
        self.cuts = embed_cuts(tp)

    def segment(self, j: int, run: SegmentInputs) -> torch.Tensor:
        if j == 0:
            tokens = run.block_input  # [s, b] token ids
            if self.tp.size == 1:
                return F.embedding(tokens, self.wte)
            local = tokens - self.vocab_start
            held = (local >= 0) & (local < self.vocab_end - self.vocab_start)
            rows = F.embedding(torch.where(held, local, torch.zeros_like(local)), self.wte)
            return rows * held.unsqueeze(-1)  # partial: rows of other ranks' vocabulary are zero here
        x = run.leaf(0)
        if self.spec.position == "learned":
            seq = x.shape[0]
            first = self.tp.rank * seq if self.tp.sequence_parallel else 0
            if self.cp.size > 1:  # the rank's two chunks: rows of their global positions
                x = x + self.wpe[self.positions[first: first + seq]].unsqueeze(1)
            else:
                x = x + self.wpe[first: first + seq].unsqueeze(1)
        else:
            x = x.clone()
        return x


class AttentionBlock(BlockModule):
    """Block ``1 + 2i``: pre-norm causal self-attention (GQA, optional RoPE), Q/K/V column-, O row-parallel.

    Segments: norm | core | residual add. Under context parallelism (:mod:`executor.cp`) the Q/K/V
    projection becomes a segment of its own before the K/V cut: norm | Q/K/V | core | residual add.
    """

    def __init__(self, spec: ModelSpec, layer: int, weights: dict[str, torch.Tensor], tp: TPContext, *,
                 flash_attention: bool = False, cp: CPContext | None = None) -> None:
        super().__init__(spec, 1 + 2 * layer, tp, cp)
        #: Fused core (``scaled_dot_product_attention``; torch picks a FlashAttention kernel where it has
        #: one), as ``Layout.flash_attention`` costs it; otherwise the scores are materialised.
        self.flash_attention = flash_attention
        if spec.num_heads % tp.size or spec.kv_heads % tp.size:
            raise LayoutError(
                f"executor: tensor-parallel size {tp.size} must divide both the {spec.num_heads} query heads "
                f"and the {spec.kv_heads} key/value heads of {spec.name!r} (replicated KV heads are not "
                "supported by the executor); choose a smaller tp"
            )
        prefix = f"L{layer}.attn"
        self._norm_params(prefix, weights)
        for name in ("q", "k", "v"):
            self._linear_params(name, f"{prefix}.{name}", weights, 0)
        self._linear_params("o", f"{prefix}.o", weights, 1)
        norm_cut, out_cut = layer_cuts(tp)
        self.cuts = (norm_cut, KV_CUT, out_cut) if self.cp.size > 1 else (norm_cut, out_cut)
        self.local_heads = spec.num_heads // tp.size
        self.local_kv_heads = spec.kv_heads // tp.size
        #: Width of the local Q part of the packed Q/K/V segment output (context parallelism).
        self.q_width = self.local_heads * spec.head_dim

    def segment(self, j: int, run: SegmentInputs) -> torch.Tensor:
        if j == 0:
            return self._norm(run.block_input)
        if self.cp.size == 1 and j == 1:
            return self._attend(*self._project(run.leaf(0)))
        if j == 1:
            return pack_qkv(*self._project(run.leaf(0)))
        if j == 2 and self.cp.size > 1:
            return self._attend_gathered(run.leaf(1))
        out = run.block_input + run.leaf(len(self.cuts) - 1)
        return out + self.o_bias if self.spec.bias else out

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Q, K, V ``[s, b, heads, d]`` of the local tokens, rotated by their global positions (RoPE)."""
        s, b, _ = x.shape
        d = self.spec.head_dim
        q = self._linear(x, "q").view(s, b, self.local_heads, d)
        k = self._linear(x, "k").view(s, b, self.local_kv_heads, d)
        v = self._linear(x, "v").view(s, b, self.local_kv_heads, d)
        if self.spec.position == "rope":
            if self.cp.size > 1:
                cos, sin = rope_cos_sin(self.spec.seq_length, d)
                cos, sin = cos.to(x.device)[self.positions], sin.to(x.device)[self.positions]
            else:
                cos, sin = rope_cos_sin(s, d)
                cos, sin = cos.to(x.device), sin.to(x.device)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return q, k, v

    def _attend_gathered(self, leaf: torch.Tensor) -> torch.Tensor:
        """The core on a CP rank: local queries against the gathered keys and values (:mod:`executor.cp`)."""
        local_seq = self.positions.shape[0]
        d = self.spec.head_dim
        batch = leaf.shape[0] // (local_seq * (self.q_width + 2 * self.cp.size * self.local_kv_heads * d))
        q, k, v = unpack_leaf(leaf, local_seq=local_seq, batch=batch, q_width=self.q_width,
                              kv_width=self.local_kv_heads * d, cp=self.cp.size)
        return self._attend(q.view(local_seq, batch, self.local_heads, d),
                            k.view(-1, batch, self.local_kv_heads, d), v.view(-1, batch, self.local_kv_heads, d))

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal attention of ``[s_q, b, heads, d]`` queries on ``[s, b, kv_heads, d]`` keys, then the
        (partial, row-parallel) output projection. With context parallelism the queries are the rank's
        chunks and the mask compares global positions (``is_causal`` assumes queries 0..s_q-1)."""
        s, b = q.shape[:2]
        d = self.spec.head_dim
        group = self.local_heads // self.local_kv_heads
        if group > 1:
            k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
        q, k, v = (t.permute(1, 2, 0, 3) for t in (q, k, v))  # [b, heads, s, d]
        allowed = causal_allowed(self.positions, k.shape[2]) if self.cp.size > 1 else None
        if self.flash_attention:
            if allowed is None:
                attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                attn = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        else:
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(d)
            masked = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1) if allowed is None else ~allowed
            attn = scores.masked_fill(masked, float("-inf")).softmax(-1) @ v
        ctx = attn.permute(2, 0, 1, 3).reshape(s, b, self.local_heads * d)
        return self._linear(ctx, "o", with_bias=False)  # partial sum over tensor ranks; bias after reduce


class MlpBlock(BlockModule):
    """Block ``2 + 2i``: pre-norm MLP, GeLU (two matrices) or SwiGLU (three); first column-, last row-parallel."""

    def __init__(self, spec: ModelSpec, layer: int, weights: dict[str, torch.Tensor], tp: TPContext) -> None:
        super().__init__(spec, 2 + 2 * layer, tp)
        prefix = f"L{layer}.mlp"
        self._norm_params(prefix, weights)
        if spec.gated_mlp:
            self._linear_params("gate", f"{prefix}.gate", weights, 0)
            self._linear_params("up", f"{prefix}.up", weights, 0)
        else:
            self._linear_params("fc1", f"{prefix}.fc1", weights, 0)
        self._linear_params("fc2", f"{prefix}.fc2", weights, 1)
        self.cuts = layer_cuts(tp)

    def segment(self, j: int, run: SegmentInputs) -> torch.Tensor:
        if j == 0:
            return self._norm(run.block_input)
        if j == 1:
            leaf = run.leaf(0)
            if self.spec.gated_mlp:
                inner = F.silu(self._linear(leaf, "gate")) * self._linear(leaf, "up")
            else:
                inner = F.gelu(self._linear(leaf, "fc1"))
            return self._linear(inner, "fc2", with_bias=False)
        out = run.block_input + run.leaf(1)
        return out + self.fc2_bias if self.spec.bias else out


class HeadBlock(BlockModule):
    """Block ``2L + 1``: final norm, vocabulary-parallel output projection and cross entropy (mean)."""

    def __init__(self, spec: ModelSpec, weights: dict[str, torch.Tensor], tp: TPContext, *,
                 tied_to: EmbedBlock | None = None) -> None:
        super().__init__(spec, head_index(spec), tp)
        self._norm_params("head", weights)
        self.shared_weight = tied_to is not None
        if tied_to is not None:
            # The same Parameter object: its gradient sums both uses, as in the single-process model.
            self.head_weight = tied_to.wte
        else:
            self._param("head_weight", "embed.wte" if spec.tied_embeddings else "head.weight", weights, 0)
        self.vocab_start, _ = vocab_range(spec.vocab_size, tp)
        self.cuts = head_cuts(tp)

    def segment(self, j: int, run: SegmentInputs) -> torch.Tensor:
        if j == 0:
            return self._norm(run.block_input)
        if j == 1:
            # [s, b, V/tp] logits of this rank's vocabulary, in fp32 under bf16 autocast: the cross entropy's
            # exp and sums run in fp32, as Megatron-LM's does (``fp16_lm_cross_entropy`` off by default).
            return F.linear(run.leaf(0), self.head_weight).float()
        stats = run.cut_values[1]
        if run.targets is None or stats is None:
            raise LayoutError("executor: the head needs targets and the reduced logit statistics")
        loss: torch.Tensor = VocabParallelCrossEntropy.apply(run.leaf(1), stats, run.targets, self.vocab_start)
        return loss

