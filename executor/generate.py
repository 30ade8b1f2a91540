"""Greedy generation with a KV cache, on one process or on tensor- and pipeline-parallel ranks (gloo).

The model is the executor's own (:mod:`executor.model`): the same blocks, the same Megatron shards of the
same seeded weights. Generation runs each block's forward segments (:meth:`BlockModule.segment`) and
performs the forward collective of each cut itself (:func:`executor.tp.layer_cuts`: the all-reduce of the
row-parallel partial outputs; the vocabulary-parallel embedding's all-reduce). Only the attention core is
generation's own: the new tokens' keys and values are appended to the block's cache, rotated by their
positions, and the queries attend to every cached key up to their own position. Greedy sampling gathers
each tensor-parallel rank's slice of the last position's logits and takes the argmax over the whole
vocabulary (vLLM gathers the logits likewise before its sampler).

Layout of ranks: ``rank = t + tp * stage`` (tensor-parallel rank fastest, as :mod:`simgrid.serving`
places a replica); stage ``p`` holds the blocks :func:`simgrid.model.stage_blocks` gives it. A step runs
stage 0, sends the hidden state to the next stage (``send``/``recv``), and so on; the last stage samples
and sends the token ids back to stage 0. Sequence parallelism and context parallelism are not used.

:func:`reference_generate` is the check: one process, no KV cache, every step re-running the whole
sequence through the training forward (:class:`executor.blockrun.BlockRun`), so the cache, the positions
of new tokens, the shards and the stage hand-offs are all compared against code that has none of them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from executor.blockrun import BlockRun
from executor.launch import LaunchConfig, RankContext, spawn_world
from executor.model import (
    AttentionBlock,
    BlockModule,
    EmbedBlock,
    HeadBlock,
    apply_rope,
    build_blocks,
    init_weights,
    rope_cos_sin,
)
from executor.tp import TPContext
from simgrid.errors import LayoutError
from simgrid.layout.spec import Layout, check_layout
from simgrid.model import stage_blocks
from simgrid.model.spec import ModelSpec

TOKEN_DTYPE = torch.int64


@dataclass(frozen=True, kw_only=True)
class CommCall:
    """One communication call of a rank during generation, stamped with ``time.perf_counter`` (on Linux the
    system-wide monotonic clock, so stamps of ranks on one host compare)."""

    step: int
    """Generation step (0 = the prefill)."""
    kind: str
    """``all_reduce`` or ``all_gather`` (tensor parallel), ``send`` or ``recv`` (pipeline hand-offs)."""
    bytes: int
    """Bytes of this rank's tensor (the whole tensor for an all-reduce; one rank's slice for an all-gather)."""
    start_s: float
    """When the call was made."""
    end_s: float
    """When it returned (synchronous calls: the data is delivered)."""


@dataclass(kw_only=True)
class RankTimeline:
    """What one rank did in each step, for calibration (:mod:`executor.gencal`)."""

    rank: int
    """Global rank (``t + tp * stage``)."""
    steps: list[tuple[float, float]] = field(default_factory=list)
    """(start, end) stamps of each step."""
    calls: list[CommCall] = field(default_factory=list)
    """Every communication call, in order."""


@dataclass(kw_only=True)
class GenerationResult:
    """Tokens and timings of one generation."""

    tokens: list[list[int]]
    """Generated token ids per sequence (prompt excluded)."""
    step_s: list[float]
    """Wall time of each step at rank 0 (step 0 is the prefill: its time is the time to first token)."""
    timelines: list[RankTimeline] = field(default_factory=list)
    """Every rank's step and communication stamps, rank order (only with ``generate(..., record=True)``)."""

    @property
    def ttft_s(self) -> float:
        """Time to first token: the prefill step."""
        return self.step_s[0]

    @property
    def tpot_s(self) -> float:
        """Mean time per output token after the first (0 when only one token was generated)."""
        decodes = self.step_s[1:]
        return sum(decodes) / len(decodes) if decodes else 0.0


class _Inputs:
    """What :meth:`BlockModule.segment` reads (:class:`executor.block.SegmentInputs`), for a forward only."""

    def __init__(self, block_input: torch.Tensor) -> None:
        self.block_input = block_input
        self.targets: torch.Tensor | None = None
        self.cut_values: list[torch.Tensor | None] = []
        self.leaves: list[torch.Tensor] = []
        self.scratch: dict[str, Any] = {}  # a MoE block's routing, shared by its segments

    def leaf(self, cut: int) -> torch.Tensor:
        return self.leaves[cut]


@dataclass
class _Comm:
    """The tensor-parallel group of this rank (identity on one rank); stamps its calls into ``timeline``."""

    size: int = 1
    group: Any = None
    timeline: RankTimeline | None = None
    step: int = 0

    def stamp(self, kind: str, t: torch.Tensor, start_s: float) -> None:
        if self.timeline is not None:
            self.timeline.calls.append(CommCall(step=self.step, kind=kind, bytes=t.numel() * t.element_size(),
                                                start_s=start_s, end_s=time.perf_counter()))

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        if self.size > 1:
            start = time.perf_counter()
            dist.all_reduce(t, group=self.group)
            self.stamp("all_reduce", t, start)
        return t

    def all_gather_last(self, t: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's ``t`` along its last dimension, in rank order."""
        if self.size == 1:
            return t
        start = time.perf_counter()
        parts = [torch.empty_like(t) for _ in range(self.size)]
        dist.all_gather(parts, t.contiguous(), group=self.group)
        self.stamp("all_gather", t, start)
        return torch.cat(parts, dim=-1)

    def send(self, t: torch.Tensor, dst: int) -> None:
        start = time.perf_counter()
        dist.send(t, dst=dst)
        self.stamp("send", t, start)

    def recv(self, t: torch.Tensor, src: int) -> torch.Tensor:
        start = time.perf_counter()
        dist.recv(t, src=src)
        self.stamp("recv", t, start)
        return t


@dataclass
class KVCache:
    """Keys and values ``[tokens, batch, kv_heads_local, head_dim]`` of each attention block on this rank."""

    keys: dict[int, torch.Tensor] = field(default_factory=dict)
    values: dict[int, torch.Tensor] = field(default_factory=dict)

    def extend(self, block: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append the new tokens' keys and values; return the whole cache of the block."""
        if block in self.keys:
            k, v = torch.cat([self.keys[block], k]), torch.cat([self.values[block], v])
        self.keys[block], self.values[block] = k, v
        return k, v

    def tokens(self) -> int:
        """Tokens cached (the same for every block)."""
        return next(iter(self.keys.values())).shape[0] if self.keys else 0


def _segments(module: BlockModule, x: torch.Tensor, comm: _Comm, upto: int | None = None) -> torch.Tensor:
    """Run ``module``'s forward segments ``0 .. upto - 1`` with each cut's forward collective performed."""
    run = _Inputs(x)
    last = module.num_segments if upto is None else upto
    out = x
    for j in range(last):
        out = module.segment(j, run)
        if j < last - 1:  # the cut between this segment and the next one run here
            kind = module.cuts[j].forward
            if kind == "all_reduce":
                out = comm.all_reduce(out)
            elif kind is not None:
                raise LayoutError(f"generation does not run cut collective {kind!r} (sequence parallelism)")
            run.leaves.append(out)
    return out


def _embed(module: EmbedBlock, tokens: torch.Tensor, offset: int, comm: _Comm) -> torch.Tensor:
    """Token embedding (vocabulary-parallel partial rows summed over the group) plus learned positions."""
    x = comm.all_reduce(module.segment(0, _Inputs(tokens)))
    if module.spec.position == "learned":
        x = x + module.wpe[offset: offset + x.shape[0]].unsqueeze(1)
    return x


def _attention(module: AttentionBlock, x: torch.Tensor, offset: int, cache: KVCache, comm: _Comm) -> torch.Tensor:
    """Pre-norm attention of ``[s, b, h]`` new tokens at positions ``offset ..`` against the cache."""
    spec, d = module.spec, module.spec.head_dim
    s, b, _ = x.shape
    normed = module._norm(x)
    q = module._linear(normed, "q").view(s, b, module.local_heads, d)
    k = module._linear(normed, "k").view(s, b, module.local_kv_heads, d)
    v = module._linear(normed, "v").view(s, b, module.local_kv_heads, d)
    if spec.position == "rope":
        cos, sin = rope_cos_sin(offset + s, d)
        q, k = apply_rope(q, cos[offset:], sin[offset:]), apply_rope(k, cos[offset:], sin[offset:])
    keys, values = cache.extend(module.index, k, v)
    group = module.local_heads // module.local_kv_heads
    if group > 1:
        keys, values = keys.repeat_interleave(group, dim=2), values.repeat_interleave(group, dim=2)
    qh, kh, vh = (t.permute(1, 2, 0, 3) for t in (q, keys, values))  # [b, heads, tokens, d]
    allowed = torch.arange(keys.shape[0])[None, :] <= (offset + torch.arange(s))[:, None]  # causal, by position
    if module.flash_attention:
        attn = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=allowed)
    else:
        scores = (qh @ kh.transpose(-1, -2)) / d**0.5
        attn = scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ vh
    ctx = attn.permute(2, 0, 1, 3).reshape(s, b, module.local_heads * d)
    out = x + comm.all_reduce(module._linear(ctx, "o", with_bias=False))
    return out + module.o_bias if spec.bias else out


def _next_tokens(module: HeadBlock, x: torch.Tensor, comm: _Comm) -> torch.Tensor:
    """Greedy token ids ``[b]`` from the last position: local vocabulary slices gathered, then argmax."""
    logits = _segments(module, x[-1:], comm, upto=2)  # final norm, this rank's vocabulary slice
    return comm.all_gather_last(logits[0]).argmax(dim=-1)


class StageRunner:
    """One rank's blocks of one pipeline stage and their KV cache; :meth:`step` runs new tokens through them."""

    def __init__(self, spec: ModelSpec, modules: dict[int, BlockModule], comm: _Comm) -> None:
        self.spec, self.modules, self.comm = spec, modules, comm
        self.cache = KVCache()

    @torch.no_grad()
    def step(self, x: torch.Tensor, offset: int) -> torch.Tensor:
        """Token ids ``[s, b]`` (first stage) or hidden states in; hidden states or next token ids ``[b]`` out."""
        for index in sorted(self.modules):
            module = self.modules[index]
            if isinstance(module, EmbedBlock):
                x = _embed(module, x, offset, self.comm)
            elif isinstance(module, AttentionBlock):
                x = _attention(module, x, offset, self.cache, self.comm)
            elif isinstance(module, HeadBlock):
                return _next_tokens(module, x, self.comm)
            else:
                x = _segments(module, x, self.comm)
        return x


def _check(spec: ModelSpec, prompt: torch.Tensor, new_tokens: int, tp: int, pp: int) -> Layout:
    layout = Layout(tp=tp, pp=pp, flash_attention=True, precision="fp32")
    check_layout(spec, layout)
    if prompt.dim() != 2 or prompt.shape[1] < 1:
        raise LayoutError(f"prompt must be [batch, tokens] token ids, got shape {tuple(prompt.shape)}")
    if new_tokens < 1 or prompt.shape[1] + new_tokens > spec.seq_length:
        raise LayoutError(f"{prompt.shape[1]} prompt + {new_tokens} new tokens must fit the context of "
                          f"{spec.seq_length} (and new_tokens >= 1)")
    return layout


def generate_local(spec: ModelSpec, prompt: torch.Tensor, new_tokens: int, *, seed: int = 0) -> GenerationResult:
    """Greedy generation with a KV cache on this process (one rank holds every block)."""
    _check(spec, prompt, new_tokens, 1, 1)
    weights = init_weights(spec, seed)
    runner = StageRunner(spec, build_blocks(spec, list(range(2 * spec.num_layers + 2)), weights, TPContext(),
                                            flash_attention=True), _Comm())
    return _loop(prompt, new_tokens, lambda x, offset: runner.step(x, offset))


def _loop(prompt: torch.Tensor, new_tokens: int, step: Any, comm: _Comm | None = None) -> GenerationResult:
    """Prefill the prompt, then feed back each sampled token; time every step (and stamp ``comm``'s timeline)."""
    x = prompt.t().contiguous().to(TOKEN_DTYPE)  # [s, b], Megatron's layout
    offset, out, times = 0, [], []
    for i in range(new_tokens):
        if comm is not None:
            comm.step = i
        start = time.perf_counter()
        nxt = step(x, offset)
        end = time.perf_counter()
        times.append(end - start)
        if comm is not None and comm.timeline is not None:
            comm.timeline.steps.append((start, end))
        out.append(nxt)
        offset += x.shape[0]
        x = nxt.view(1, -1)
    tokens = torch.stack(out, dim=1)  # [b, new_tokens]
    return GenerationResult(tokens=tokens.tolist(), step_s=times)


@torch.no_grad()
def reference_generate(spec: ModelSpec, prompt: torch.Tensor, new_tokens: int, *, seed: int = 0) -> list[list[int]]:
    """Greedy tokens from one process without a KV cache: every step runs the whole sequence through the
    training forward of every block and takes the argmax of the last position's logits."""
    _check(spec, prompt, new_tokens, 1, 1)
    modules = build_blocks(spec, list(range(2 * spec.num_layers + 2)), init_weights(spec, seed), TPContext(),
                           flash_attention=True)
    seq = prompt.t().contiguous().to(TOKEN_DTYPE)
    for _ in range(new_tokens):
        x: torch.Tensor = seq
        for index in sorted(modules):
            head = isinstance(modules[index], HeadBlock)
            run = BlockRun(modules[index], 0, x, torch.zeros_like(seq) if head else None, no_grad_forward=True)
            run.forward()
            x = run.outputs[1] if head else run.output  # the head's logits, before its loss segment
        seq = torch.cat([seq, x[-1].argmax(dim=-1).view(1, -1)])
    return seq[prompt.shape[1]:].t().tolist()


def stage_groups(tp: int, pp: int) -> dict[str, tuple[int, ...]]:
    """Process groups of a generation world: the world and each stage's tensor-parallel group."""
    groups = {"world": tuple(range(tp * pp))}
    groups.update({f"tp/s{p}": tuple(p * tp + t for t in range(tp)) for p in range(pp)})
    return groups


def _worker(ctx: RankContext, payload: dict[str, Any]) -> list[GenerationResult | RankTimeline | None]:
    """Run each ``(prompt, new_tokens)`` of the payload in turn (a fresh cache each; weights built once).

    Per run: rank 0 returns its :class:`GenerationResult` (with its own timeline when recording), the other
    ranks their :class:`RankTimeline` when recording, else ``None``.
    """
    spec: ModelSpec = payload["spec"]
    tp, pp, record = payload["tp"], payload["pp"], payload.get("record", False)
    stage, t = divmod(ctx.rank, tp)
    layout = Layout(tp=tp, pp=pp, flash_attention=True, precision="fp32")
    modules = build_blocks(spec, list(stage_blocks(spec, layout, stage)), init_weights(spec, payload["seed"]),
                           TPContext(size=tp, rank=t), flash_attention=True)
    next_rank, first_rank = ctx.rank + tp, t
    out: list[GenerationResult | RankTimeline | None] = []
    for prompt, new_tokens in payload["runs"]:
        comm = _Comm(tp, ctx.groups.get(f"tp/s{stage}"), RankTimeline(rank=ctx.rank) if record else None)
        runner = StageRunner(spec, modules, comm)
        batch, hidden = prompt.shape[0], spec.hidden_size

        def step(x: torch.Tensor, offset: int, runner: StageRunner = runner, comm: _Comm = comm,
                 batch: int = batch, hidden: int = hidden) -> torch.Tensor:
            ctx.report_op(f"generate stage {stage} offset {offset}")
            if stage > 0:  # receive the previous stage's hidden states
                x = comm.recv(torch.empty(x.shape[0], batch, hidden), src=ctx.rank - tp)
            y = runner.step(x, offset)
            if stage < pp - 1:
                comm.send(y.contiguous(), dst=next_rank)
                tokens = torch.empty(batch, dtype=TOKEN_DTYPE)
                if stage == 0:
                    comm.recv(tokens, src=(pp - 1) * tp + t)
                return tokens
            if pp > 1:
                comm.send(y.contiguous(), dst=first_rank)
            return y

        dist.barrier()
        result = _loop(prompt, new_tokens, step, comm)
        if ctx.rank == 0:
            result.timelines = [comm.timeline] if comm.timeline is not None else []
            out.append(result)
        else:
            out.append(comm.timeline)
    return out


def generate_runs(spec: ModelSpec, runs: Sequence[tuple[torch.Tensor, int]], *, tp: int = 1, pp: int = 1,
                  seed: int = 0, record: bool = False, config: LaunchConfig | None = None) -> list[GenerationResult]:
    """Greedy generation of each ``(prompt, new_tokens)`` of ``runs`` in turn on one world of ``tp * pp``
    spawned ranks (gloo); tokens and rank 0's step times per run, and with ``record`` every rank's
    :class:`RankTimeline` (``result.timelines``, rank order).

    Stages other than the first receive placeholders of the right sequence length from :func:`_loop`, so
    every rank walks the same steps; only stage 0's token ids (received from the last stage) are real.
    """
    if not runs:
        raise LayoutError("generation needs at least one (prompt, new_tokens) run")
    for prompt, new_tokens in runs:
        _check(spec, prompt, new_tokens, tp, pp)
    payload = {"spec": spec, "runs": list(runs), "tp": tp, "pp": pp, "seed": seed, "record": record}
    cfg = config or LaunchConfig(world_size=tp * pp, run_timeout_s=300)
    per_rank = spawn_world(_worker, payload, cfg, groups=stage_groups(tp, pp))
    results = []
    for i in range(len(runs)):
        first = per_rank[0][i]
        assert isinstance(first, GenerationResult)
        if record:
            others = [rank_out[i] for rank_out in per_rank[1:]]
            first.timelines += [timeline for timeline in others if isinstance(timeline, RankTimeline)]
        results.append(first)
    return results


def generate(spec: ModelSpec, prompt: torch.Tensor, new_tokens: int, *, tp: int = 1, pp: int = 1, seed: int = 0,
             record: bool = False, config: LaunchConfig | None = None) -> GenerationResult:
    """Greedy generation on ``tp * pp`` spawned ranks (gloo); tokens and rank 0's step times
    (:func:`generate_runs` with one run)."""
    return generate_runs(spec, [(prompt, new_tokens)], tp=tp, pp=pp, seed=seed, record=record, config=config)[0]
