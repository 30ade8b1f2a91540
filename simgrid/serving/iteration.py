"""Time of one serving iteration (a forward pass over a batch of prompt chunks and decode tokens).

Everything per token comes from the training cost code at one token (``model.with_seq_length(1)``), so
there is one copy of each formula: matmul FLOPs (:func:`simgrid.model.block_flops`, linear part), the
attention core's FLOPs per (query, key) pair, element-wise HBM bytes and kernel launches
(:func:`simgrid.model.block_kernels` minus the fused core's own bytes), weights per rank
(:func:`simgrid.model.block_params_on_rank`) and the tensor-parallel collectives
(:func:`simgrid.model.block_tp_collectives`, forward ones); times come from :mod:`simgrid.costs`
(:func:`~simgrid.costs.gemm_time_s`, :func:`~simgrid.costs.fused_attention_time_s`,
:func:`~simgrid.costs.memory_time_s`, :func:`~simgrid.costs.collective_time_s`,
:func:`~simgrid.costs.p2p_time_s`), so a calibrated profile's measured collective and send/recv tables apply.

What inference changes is which ceiling binds (roofline; Williams et al., CACM 2009). Per sub-block and
layer, on one tensor-parallel rank of one pipeline stage:

* GEMMs take ``max(FLOPs / (peak * efficiency(M=tokens)), weight bytes / HBM rate)``: a prefill of
  thousands of tokens is compute-bound, a decode of a few sequences reads every weight once per
  iteration and is bound by HBM (Pope et al., "Efficiently Scaling Transformer Inference", MLSys 2023,
  section 3). The HBM rate is the profile's ``hbm_bandwidth * hbm_efficiency`` (a measured streaming
  fraction, e.g. 0.81 on A100 80GB; each profile's ``[sources]`` says where it comes from).
* The attention core takes ``max(pairs * FLOPs per pair / FlashAttention speed, KV bytes read and written /
  HBM rate)``: a decode token attends to its whole cached context, so it reads the sequence's K and V once
  per layer (FlashDecoding/PagedAttention); a prefill chunk is compute-bound. The speed is the GPU profile's
  FlashAttention table at each prompt chunk's shape (``(new tokens, keys, head dim)``), or its flat fused
  attention efficiency where it has no table (:meth:`IterationCostModel._core_s`).
  ``pairs`` counts causal (query, key) pairs exactly, ``q * k + q (q + 1) / 2`` for ``q`` new tokens after
  ``k`` cached ones.
* Element-wise kernels (norms, rotary, residual adds, activation) cost their bytes at the HBM rate and
  every kernel its launch overhead, as in training. Their list is the training forward's under
  ``dropout = "off"`` (:func:`~simgrid.serving.spec.model_layout`): inference draws no dropout mask.
* Tensor parallelism adds the forward's two all-reduces per layer (attention and MLP outputs; Megatron)
  and the vocabulary-parallel embedding's; the logits of the sampled sequences are all-gathered for the
  sampler. The all-reduces are on the critical path (the next layer needs their sum), so they add.
* Pipeline stages pass the hidden state and the residual stream to the next stage (vLLM's
  ``IntermediateTensors``: two ``tokens x h`` tensors) and the last stage returns the sampled token ids
  (8 bytes each) to the first.

On a profile calibrated for generation (``simgrid-exec calibrate`` on gloo ranks writes ``SERVE:`` rows,
:mod:`simgrid.serving.insitu`) the same formulas run with generation's measured rates (matrix rate,
host time per kernel), and collectives and hand-offs cost their time measured inside real generation
steps at the sizes this model gives them.

Not modelled: CPU-side scheduling, sampling and detokenisation (Vidur models them, measured), CUDA-graph
savings on launches, prefix caching and speculative decoding.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from simgrid.costs import collective_time_s, gemm_time_s, memory_time_s, p2p_time_s
from simgrid.costs.attention import TABLE_DTYPES, attention_table
from simgrid.costs.compute import fused_attention_time_s
from simgrid.errors import ModelError
from simgrid.hardware import GPUSpec
from simgrid.layout.spec import check_layout
from simgrid.model import (
    block_flops,
    block_kernels,
    block_params_on_rank,
    block_tp_collectives,
    local_vocab,
    stage_layers,
)
from simgrid.model.flops import causal_tile_fraction
from simgrid.model.params import word_embedding_params
from simgrid.model.spec import ModelSpec
from simgrid.serving.insitu import InSituCosts
from simgrid.serving.kv_cache import kv_bytes_per_token
from simgrid.serving.spec import ServingConfig, ServingLayout, model_layout
from simgrid.topology import Topology

TOKEN_ID_BYTES = 8
"""Sampled token ids travel as int64."""
PP_TENSORS = 2
"""Tensors of ``tokens x h`` a pipeline stage hands to the next: vLLM's Llama passes the hidden states
and the residual separately (``IntermediateTensors({"hidden_states", "residual"})``)."""
SAMPLER_KERNELS = 2
"""Launches of greedy sampling on the last stage: the fp32 cast of the logits and the argmax."""


@dataclass(frozen=True, kw_only=True)
class BatchShape:
    """What an iteration computes, summed over its sequences."""

    tokens: int
    """New tokens (prompt-chunk tokens plus one per decoding sequence)."""
    pairs: int
    """Causal (query, key) pairs of attention over all sequences (module docstring)."""
    context_tokens: int
    """Sum over sequences of the tokens in the cache after this iteration (K/V read per layer)."""
    sampled: int
    """Sequences that produce an output token this iteration (their logits are computed)."""
    chunks: tuple[tuple[int, int], ...] = ()
    """``(new tokens, keys)`` of each sequence with more than one new token (a prompt or a prompt chunk:
    ``keys`` = cached + new), whose attention core is priced at its own shape; the rest of ``pairs`` belongs
    to single-token queries (decodes)."""


def chunk_shape(new_tokens: int, cached_tokens: int, *, sampled: bool) -> BatchShape:
    """One sequence's share: ``new_tokens`` after ``cached_tokens`` already in its cache."""
    pairs = new_tokens * cached_tokens + new_tokens * (new_tokens + 1) // 2
    keys = cached_tokens + new_tokens
    return BatchShape(tokens=new_tokens, pairs=pairs, context_tokens=keys, sampled=1 if sampled else 0,
                      chunks=((new_tokens, keys),) if new_tokens > 1 else ())


def combine(shapes: Sequence[BatchShape]) -> BatchShape:
    """The shape of a batch of sequences."""
    return BatchShape(tokens=sum(s.tokens for s in shapes), pairs=sum(s.pairs for s in shapes),
                      context_tokens=sum(s.context_tokens for s in shapes), sampled=sum(s.sampled for s in shapes),
                      chunks=tuple(c for s in shapes for c in s.chunks))


def chunk_pairs(new_tokens: int, keys: int) -> int:
    """Causal (query, key) pairs of ``new_tokens`` queries that end a sequence of ``keys`` tokens."""
    return new_tokens * (keys - new_tokens) + new_tokens * (new_tokens + 1) // 2


@dataclass(frozen=True, kw_only=True)
class IterationTime:
    """Seconds of one iteration on one replica."""

    stage_s: tuple[float, ...]
    """Busy time of each pipeline stage (compute plus its tensor-parallel collectives)."""
    hop_s: tuple[float, ...]
    """Transfer after each stage: to the next stage, and from the last back to the first (0 when pp = 1)."""
    breakdown_s: dict[str, float]
    """Sum over stages by part: gemm, attention, elementwise, launch, tp_comm, pp_comm."""

    @property
    def latency_s(self) -> float:
        """From the first stage's start to the sampled tokens being back at the first stage."""
        return sum(self.stage_s) + sum(self.hop_s)


@dataclass(frozen=True)
class _Stage:
    """Per-token and per-iteration coefficients of one stage (one tensor-parallel rank)."""

    layers: int
    first: bool
    last: bool
    ranks: tuple[int, ...]
    attn_flops: float
    mlp_flops: float
    pair_flops: float
    attn_weight_bytes: float
    mlp_weight_bytes: float
    attn_nk: tuple[int, int]
    mlp_nk: tuple[int, int]
    layer_elementwise_bytes: float
    layer_kernels: int
    kv_token_bytes: float
    embed_bytes: float
    embed_kernels: int
    head_flops: float
    head_weight_bytes: float
    head_nk: tuple[int, int]
    head_elementwise_bytes: float
    layer_allreduce_bytes: float
    embed_allreduce_bytes: float
    logits_gather_bytes: float


class IterationCostModel:
    """Iteration times of one replica on a topology (coefficients computed once, times per batch)."""

    def __init__(self, model: ModelSpec, layout: ServingLayout, config: ServingConfig, topology: Topology, *,
                 replica: int = 0) -> None:
        if model.moe is not None:
            # The per-layer costs below take one dense MLP per layer; MoE layers are modelled for training only.
            raise ModelError(
                f"serving: {model.name!r} has MoE layers, which the serving simulator does not model yet "
                "(expert parallelism is modelled for training: simgrid simulate --ep); use a dense model"
            )
        self.model, self.layout, self.config, self.topology = model, layout, config, topology
        self.insitu = InSituCosts.from_tables(topology.cluster.spec.measured)
        self.gpu = topology.cluster.gpu if self.insitu is None else self.insitu.rank_gpu(topology.cluster.gpu)
        self.mlayout = model_layout(layout, config)
        check_layout(model, self.mlayout)
        self.act_bytes = self.mlayout.param_bytes
        self.act_dtype = config.activation_dtype
        base = replica * layout.gpus_per_replica
        self.stage_ranks = [tuple(base + p * layout.tp + i for i in range(layout.tp)) for p in range(layout.pp)]
        self.stages = [self._stage(p) for p in range(layout.pp)]
        self._table = _has_attention_table(self.gpu, self.act_dtype)
        """Whether the GPU's FlashAttention table prices the attention core (:meth:`_core_s`)."""
        self._comm_cache: dict[tuple[str, tuple[int, ...], int, int], float] = {}
        self._hop_cache: dict[tuple[int, int], float] = {}
        self._gemm_cache: dict[tuple[int, int, int], float] = {}
        """GEMM seconds by (stage, tokens, sampled): a load test asks for the same few thousand batch sizes
        hundreds of thousands of times, and the tile model's cost is the serving loop's largest."""

    def _stage(self, p: int) -> _Stage:
        model, ml, cfg, tp = self.model, self.mlayout, self.config, self.layout.tp
        one = model.with_seq_length(1)
        layers = len(stage_layers(model, ml, p))
        attn, mlp, head = 1, 2, 2 * model.num_layers + 1
        fa, fm, fh = (block_flops(one, b, tp=tp) for b in (attn, mlp, head))
        ka, km, ke = (block_kernels(one, ml, b) for b in (attn, mlp, 0))
        wbytes = cfg.weight_bytes
        first, last = p == 0, p == self.layout.pp - 1
        vocab = local_vocab(model, tp)
        # The output GEMM reads the V x h matrix even when it is tied to the embedding (counted in block 0).
        tied = model.tied_embeddings and self.layout.pp == 1
        head_weights = block_params_on_rank(model, ml, head) + (word_embedding_params(model, tp) if tied else 0)

        def fwd_allreduce_bytes(block: int) -> float:
            return float(sum(c.bytes for c in block_tp_collectives(one, ml, block)
                             if c.phase == "fwd" and c.kind == "all_reduce"))

        return _Stage(
            layers=layers, first=first, last=last, ranks=self.stage_ranks[p],
            attn_flops=fa.fwd - fa.attention_core_fwd, mlp_flops=fm.fwd, pair_flops=fa.attention_core_fwd,
            attn_weight_bytes=block_params_on_rank(model, ml, attn) * wbytes,
            mlp_weight_bytes=block_params_on_rank(model, ml, mlp) * wbytes,
            attn_nk=ka.gemm_mnk[1:], mlp_nk=km.gemm_mnk[1:],
            layer_elementwise_bytes=(ka.fwd_hbm_bytes - ka.core_fwd_hbm_bytes) + km.fwd_hbm_bytes,
            layer_kernels=ka.fwd_kernels + km.fwd_kernels,
            kv_token_bytes=kv_bytes_per_token(model, layers=1, tp=tp, kv_bytes=cfg.kv_bytes),
            embed_bytes=ke.fwd_hbm_bytes, embed_kernels=ke.fwd_kernels,
            head_flops=fh.fwd, head_weight_bytes=head_weights * wbytes, head_nk=(vocab, model.hidden_size),
            # final norm (read and write h) and the logits written by the GEMM and read by the sampler
            head_elementwise_bytes=2 * model.hidden_size * self.act_bytes + 2 * vocab * self.act_bytes,
            layer_allreduce_bytes=fwd_allreduce_bytes(attn) + fwd_allreduce_bytes(mlp),
            embed_allreduce_bytes=fwd_allreduce_bytes(0),
            logits_gather_bytes=model.vocab_size * self.act_bytes,
        )

    def with_gpu(self, gpu: GPUSpec) -> IterationCostModel:
        """The same deployment priced on ``gpu`` (other rates; the per-token coefficients are reused)."""
        other = copy.copy(self)
        other.gpu = gpu
        other._gemm_cache = {}  # priced on the other GPU
        other._table = _has_attention_table(gpu, self.act_dtype)
        return other

    # -- times -----------------------------------------------------------------------------------------
    def _collective(self, kind: str, nbytes: float, ranks: tuple[int, ...], count: int) -> float:
        key = (kind, ranks, int(nbytes), count)
        t = self._comm_cache.get(key)
        if t is None:
            us = self.insitu.collective_us(kind, len(ranks), nbytes / count) if self.insitu is not None else None
            t = count * us * 1e-6 if us is not None else collective_time_s(kind, nbytes, ranks, self.topology,
                                                                           count=count)
            self._comm_cache[key] = t
        return t

    def _hop(self, nbytes: int, src: int, dst: int) -> float:
        key = (nbytes, src * self.topology.num_gpus + dst)
        t = self._hop_cache.get(key)
        if t is None:
            us = self.insitu.hop_us(nbytes) if self.insitu is not None else None
            t = self._hop_cache[key] = us * 1e-6 if us is not None else p2p_time_s(nbytes, src, dst, self.topology)
        return t

    def kernels(self, p: int, batch: BatchShape) -> int:
        """Kernel launches of stage ``p`` for ``batch`` (the training forward's list, plus the sampler)."""
        s = self.stages[p]
        kernels = s.layers * s.layer_kernels
        if s.first:
            kernels += s.embed_kernels
        if s.last and batch.sampled:
            kernels += 2 + SAMPLER_KERNELS  # final norm, output GEMM, sampler
        return kernels

    def tp_calls(self, p: int, batch: BatchShape) -> list[tuple[str, float, int]]:
        """Stage ``p``'s tensor-parallel collectives for ``batch``: (kind, bytes of all calls, calls), in
        :func:`simgrid.costs.collective_time_s`'s convention (an all-gather's bytes are its whole output)."""
        s = self.stages[p]
        if self.layout.tp == 1:
            return []
        calls: list[tuple[str, float, int]] = []
        if s.first:
            calls.append(("all_reduce", batch.tokens * s.embed_allreduce_bytes, 1))
        if s.layers:
            calls.append(("all_reduce", batch.tokens * s.layer_allreduce_bytes * s.layers, 2 * s.layers))
        if s.last and batch.sampled:
            calls.append(("all_gather", batch.sampled * s.logits_gather_bytes, 1))
        return calls

    def stage_parts(self, p: int, batch: BatchShape) -> dict[str, float]:
        """Seconds of stage ``p`` for ``batch`` by part (gemm, attention, elementwise, launch, tp_comm).

        With a profile calibrated for generation (:mod:`simgrid.serving.insitu`), the rank's matrix rate
        and launch cost are generation's and collectives cost their time inside real generation steps."""
        s, gpu = self.stages[p], self.gpu
        t = batch.tokens
        n = batch.sampled if s.last else 0
        gemm = self._gemm_cache.get((p, t, n))
        if gemm is None:
            gemm = self._gemm_cache[(p, t, n)] = self._gemm_s(s, t, n)
        kv_bytes = (batch.context_tokens + t) * s.kv_token_bytes  # read the context, write the new tokens
        attention = s.layers * max(self._core_s(s.pair_flops, batch), memory_time_s(kv_bytes, gpu))
        elementwise_bytes = s.layers * t * s.layer_elementwise_bytes
        if s.first:
            elementwise_bytes += t * s.embed_bytes
        if n:
            elementwise_bytes += n * s.head_elementwise_bytes
        tp_comm = sum(self._collective(kind, nbytes, s.ranks, count) for kind, nbytes, count in self.tp_calls(p, batch))
        return {"gemm": gemm, "attention": attention, "elementwise": memory_time_s(elementwise_bytes, gpu),
                "launch": self.kernels(p, batch) * gpu.kernel_overhead_us * 1e-6, "tp_comm": tp_comm}

    def _core_s(self, pair_flops: float, batch: BatchShape) -> float:
        """Compute time of one layer's fused attention cores for ``batch`` (FLOPs per pair ``pair_flops``):
        each prompt chunk at the FlashAttention table's speed for its own shape, the decodes together.

        The profile's table (FlashAttention-2/3 papers) gives a kernel's speed by sequence length and head dim
        in the papers' FLOP count, half the causal square: the exact causal pairs counted here are that count.
        :func:`~simgrid.costs.fused_attention_time_s` takes the FLOPs a causal kernel executes (its diagonal
        tiles whole) and divides them by ``2 causal_tile_fraction(keys)`` to get back to the papers' count, so
        the pairs go in multiplied by that factor. Without a table (other GPUs, fp32) the profile's flat
        ``fused_attention_efficiency`` prices the pairs as before.

        A decode is one query against its whole context, ``shape = (1, context, head_dim)``: the table is
        read at the square of equal area, ``sqrt(context)`` tokens, below its shortest sequence (512) for any
        context under 262,144 tokens, so the clamp prices it at the 512-token speed. That is a training
        kernel's speed; a decode core is a matrix-vector product per head that reads the sequence's K and V
        once (FlashDecoding, PagedAttention), and :meth:`stage_parts` takes the larger of this time and the
        KV read at the HBM rate: the read is the larger (``heads / kv_heads`` FLOPs per KV byte; its time is 8x
        this one's or more on A100 for Llama 2 70B's grouped-query attention, ~65x with one KV head per query
        head), so the clamp does not set decode time. The decodes are priced together at their mean
        context (exact under the clamp)."""
        gpu, dtype = self.gpu, self.act_dtype
        if not self._table:
            return fused_attention_time_s(batch.pairs * pair_flops, gpu, dtype=dtype)
        head_dim, total, rest, decodes = self.model.head_dim, 0.0, batch.pairs, batch.tokens
        for q, keys in batch.chunks:
            pairs = chunk_pairs(q, keys)
            rest, decodes = rest - pairs, decodes - q
            total += fused_attention_time_s(pairs * pair_flops * 2 * causal_tile_fraction(keys), gpu, dtype=dtype,
                                            shape=(q, keys, head_dim))
        if rest > 0 and decodes > 0:
            keys = max(1, round(rest / decodes))
            total += fused_attention_time_s(rest * pair_flops * 2 * causal_tile_fraction(keys), gpu, dtype=dtype,
                                            shape=(1, keys, head_dim))
        return total

    def _gemm_s(self, s: _Stage, t: int, n: int) -> float:
        """GEMM seconds of a stage for ``t`` tokens, ``n`` of them sampled through the output layer: each GEMM
        at the slower of its tile-model time and reading its weights once (a decode step's bound)."""
        gpu, dt = self.gpu, self.config.dtype
        gemm = s.layers * (
            max(gemm_time_s(t * s.attn_flops, (t, *s.attn_nk), gpu, dtype=dt), memory_time_s(s.attn_weight_bytes, gpu))
            + max(gemm_time_s(t * s.mlp_flops, (t, *s.mlp_nk), gpu, dtype=dt), memory_time_s(s.mlp_weight_bytes, gpu))
        )
        if n:
            gemm += max(gemm_time_s(n * s.head_flops, (n, *s.head_nk), gpu, dtype=dt),
                        memory_time_s(s.head_weight_bytes, gpu))
        return gemm

    def hop_bytes(self, p: int, batch: BatchShape) -> int:
        """Bytes sent after stage ``p``: activations to stage ``p + 1``, or token ids back to stage 0."""
        if p < self.layout.pp - 1:
            return int(PP_TENSORS * batch.tokens * self.model.hidden_size * self.act_bytes)
        return TOKEN_ID_BYTES * max(1, batch.sampled)

    def hop_s(self, p: int, batch: BatchShape) -> float:
        """Transfer after stage ``p``: activations to stage ``p + 1``, or token ids back to stage 0."""
        if self.layout.pp == 1:
            return 0.0
        nxt = self.stage_ranks[(p + 1) % self.layout.pp][0]
        return self._hop(self.hop_bytes(p, batch), self.stage_ranks[p][0], nxt)

    def time(self, batch: BatchShape) -> IterationTime:
        """Stage and hop times of one iteration over ``batch``."""
        if batch.tokens <= 0:
            raise ValueError("an iteration needs at least one token")
        parts = [self.stage_parts(p, batch) for p in range(self.layout.pp)]
        hops = tuple(self.hop_s(p, batch) for p in range(self.layout.pp))
        breakdown: dict[str, Any] = {k: sum(part[k] for part in parts) for k in parts[0]}
        breakdown["pp_comm"] = sum(hops)
        return IterationTime(stage_s=tuple(sum(part.values()) for part in parts), hop_s=hops, breakdown_s=breakdown)


def _has_attention_table(gpu: GPUSpec, dtype: str) -> bool:
    """True when :func:`~simgrid.costs.fused_attention_time_s` reads ``gpu``'s default kernel table for
    ``dtype`` given a shape (the rule it applies; otherwise it prices FLOPs at the flat efficiency)."""
    return attention_table(gpu) is not None and dtype in TABLE_DTYPES
