"""Pass: Transformer Engine's tensor-parallel communication overlap (Megatron-Core ``--tp-comm-overlap``).

With ``Layout.tp_comm_overlap`` the sequence-parallel all-gathers and reduce-scatters of a transformer layer
are not issued and waited next to their GEMMs (:mod:`.tensor_parallel`): TE's userbuffers split each GEMM
into chunks and run the communication of one chunk on its own stream while the GEMM works on another. The
methods and their defaults are TE's ``initialize_ub`` (transformer_engine/pytorch/module/base.py,
``methods`` and ``get_default_config``; Megatron-Core passes no ``ub_cfgs`` of its own by default):

* ``ring_exchange`` for the all-gather before ``qkv_fprop`` and ``fc1_fprop`` (the layer input) and before
  ``proj_dgrad`` and ``fc2_dgrad`` (the output gradient): ``num_splits = tp``. The GEMM runs on the local
  sequence shard while every rank copies its shard to its ring successor (``use_ce = True``: a copy-engine
  memcpy into the peer's registered buffer, ``num_sm = 1``); ``tp - 1`` such steps bring every shard, each
  hidden behind the GEMM chunk that runs meanwhile. Nothing is exposed but what a step takes beyond its chunk.
* ``pipeline`` for the reduce-scatter after ``proj_fprop`` and ``fc2_fprop``: ``num_splits = 4``; the GEMM
  runs in 4 chunks of tokens and each chunk's reduce-scatter (a userbuffers kernel on ``num_sm = 16`` SMs)
  runs while the next chunk computes; the last chunk's reduce-scatter is exposed.
* ``bulk`` in the backward of ``qkv`` and ``fc1``: the re-gather of the sequence-parallel input (needed by
  the weight gradient) runs whole beside the input-gradient GEMM (``qkv_dgrad``), and the reduce-scatter of
  that input gradient runs whole beside the weight-gradient GEMM (``qkv_wgrad``).

In the IR each chunk is a :class:`~simgrid.ir.ops.Compute` op of its own (one GEMM of ``m / splits`` rows,
priced by the GPU model at its own shape, so small chunks lose efficiency as they do on the GPU; TE issues the
chunks round-robin on ``min(3, splits)`` compute streams, and each carries ``gemm_streams`` = as many as the
one hardware queue lets run together, priced as its share of the stacked GEMM: :data:`UB_STREAMS` for the
ring exchange, :data:`PIPELINE_STREAMS` / :data:`PIPELINE_STREAMS_FP8` for the pipelined reduce-scatter), each
ring step a ``ring_exchange`` :class:`~simgrid.ir.ops.Collective` and each pipelined piece a
``reduce_scatter`` of ``bytes / 4``, with WAITs where the next chunk needs the data. The engine then finds
the overlap itself: comm on the group's stream concurrent with compute, compute slowed while comm is in
flight by what runs it (:mod:`simgrid.engine.overlap`: the pipelined and bulk collectives are userbuffers kernels,
``kernel="userbuffers"``, on TE's 16 SMs, :data:`simgrid.costs.compute.USERBUFFERS_NUM_SM`; the copy-engine ring
steps by ``copy_engine_compute_slowdown``), and the first/last chunk exposed. No discount factor is applied anywhere.

Only the attention and dense-MLP sub-blocks overlap: TE's userbuffers cover its own ``LayerNormLinear`` /
``Linear`` layers; the embedding and the vocabulary head are Megatron's own parallel layers, and MoE
sub-blocks keep their expert all-to-alls, so their collectives stay as :mod:`.tensor_parallel` places them, except
the head's backward ones, which Megatron's column-parallel linear runs beside its GEMMs (``overlapped_ops``'s
``head_ops`` builder: :func:`.tp_async.te_overlapped_ops`, which the build uses).
At ``stage`` granularity an op's equal layers are folded: each chunk op and collective stands for the same
chunk of every layer (``count`` = layers), which costs what the layers' own pipelines cost one after another.
A W op (split weight gradient) has no collectives; an I op overlaps the gathers but its input-gradient
reduce-scatter, with no weight-gradient GEMM beside it, stays exposed.

The ops of a compute op are built once per (kind, stage, chunk, block range) and copied for every other
micro-batch with its micro-batch and handles patched (:class:`.instantiate.MicrobatchTemplate`): the same ops
as building each one, in about half the build time for gpt3-175b at tp 8, pp 16 (docs/performance.md).
"""

from __future__ import annotations

from collections.abc import Callable

from simgrid.ir.ops import Collective, Compute, Op, Wait
from simgrid.layout.mesh import Mesh
from simgrid.model.blocks import block_kind
from simgrid.model.cost import BlockCost
from simgrid.model.gemms import Gemm, wgrad_accumulate_bytes
from simgrid.model.moe import is_moe_block
from simgrid.schedules.lower.compute import _block_numbers, compute_op, split_fp8
from simgrid.schedules.lower.context import LoweringContext, Role
from simgrid.schedules.lower.instantiate import MicrobatchTemplate
from simgrid.schedules.lower.tensor_parallel import (
    REGATHER,
    block_collectives,
    regathered_by_recompute,
    replace_compute_ops,
    tp_collectives,
)

PIPELINE_SPLITS = 4
"""GEMM chunks of TE's ``pipeline`` reduce-scatter overlap: ``num_splits = 4`` for every non-ring-exchange
method in ``initialize_ub``'s ``get_default_config`` (transformer_engine/pytorch/module/base.py)."""
UB_STREAMS = 3
"""Compute streams TE's userbuffers issue the chunk GEMMs of one overlapped GEMM on, round-robin:
``min(num_max_streams, splits)`` with ``num_max_streams = _NUM_MAX_UB_STREAMS = 3`` (initialize_ub,
transformer_engine/pytorch/module/base.py; ``_stream_compute`` in csrc/comm_gemm_overlap.h, v1.9). Under
``CUDA_DEVICE_MAX_CONNECTIONS=1`` (one hardware queue, which TE's userbuffers require: examples/pytorch/
comm_gemm_overlap/README.md, v1.9) kernels start in issue order; in ``split_overlap_ag`` the only wait issued
between chunk ``i`` and chunk ``i + 1`` is for ring step ``i``'s receive, so up to this many chunks run together
(docs/design.md, "TE overlap chunk concurrency under one hardware queue (session 15)")."""
PIPELINE_STREAMS = 1
"""Chunk GEMMs of a 16-bit pipelined reduce-scatter in flight together under one hardware queue: the
``gemm_overlap = False`` branch of ``split_overlap_rs`` (what ``cpp_extensions/gemm.py`` passes for ``gemm``)
issues, after chunk ``i``, the comm stream's wait for chunk ``i``'s event and then its reduce-scatter, both before
chunk ``i + 1``; in one in-order queue chunk ``i + 1`` starts only once chunk ``i`` has ended (comm_gemm_overlap.h
lines 554-591 at v1.9, the same loop from v1.0 to v1.11)."""
PIPELINE_STREAMS_FP8 = 2
"""The same for an fp8 pipelined reduce-scatter: ``fp8_gemm`` passes ``gemm_overlap = True``, whose loop issues
chunk ``i + 1`` before the wait for chunk ``i`` (lines 494-513 at v1.9), so chunk ``i + 1`` may run beside the end
of chunk ``i``, and chunk ``i + 2`` waits for chunk ``i``: two in flight."""

_OVERLAPPED = ("attn", "mlp")


def _split(rows: int, parts: int) -> list[int]:
    """``rows`` cut into ``parts`` contiguous chunks, as even as integers allow (the larger ones first)."""
    base, extra = divmod(rows, parts)
    return [base + (1 if i < extra else 0) for i in range(parts) if base + (1 if i < extra else 0) > 0]


def _overlappable(ctx: LoweringContext, block: int) -> bool:
    kind, _ = block_kind(ctx.model, block)
    return kind in _OVERLAPPED and not is_moe_block(ctx.model, block)


def _comm_bytes(c: BlockCost, phase: str, label: str) -> int:
    for coll in c.tp_comm:
        if coll.phase == phase and coll.label == label:
            return int(coll.bytes)
    raise ValueError(f"sub-block has no tensor-parallel collective {label!r} in {phase}")  # pragma: no cover


class _Builder:
    """Emits one overlapped pipeline: chunk ops, collectives and waits in issue order."""

    def __init__(self, ctx: LoweringContext, op: Compute, group: str, prefix: str, label: str, layers: int,
                 fp8: frozenset[tuple[int, int, int]] = frozenset()) -> None:
        self.ctx, self.op, self.group, self.prefix, self.label, self.layers = ctx, op, group, prefix, label, layers
        self.ops: list[Op] = []
        self.serial = 0
        self.accumulate_bytes = wgrad_accumulate_bytes(ctx.layout)
        self.fp8 = fp8
        """Shapes of the sub-block's GEMMs that run in fp8 (``BlockCost.fp8_gemm_shapes``)."""

    def compute(self, flops: float, hbm: float, kernels: int, gemms: tuple[Gemm, ...], attention_flops: float = 0.0,
                attention_shape: tuple[int, int, int] = (0, 0, 0), accumulate: tuple[Gemm, ...] = (),
                streams: int = 1, fp8: bool | None = None) -> None:
        """One compute op; ``accumulate``: weight-gradient GEMMs that add into ``main_grad`` (gradient
        accumulation fusion), not repeated in ``gemms``; ``streams``: chunk GEMMs in flight together; ``fp8``:
        whether every GEMM given runs in fp8 (a chunk of a linear's GEMM), ``None``: by shape (``self.fp8``)."""
        if flops <= 0 and hbm <= 0:
            return
        op = self.op
        folded = tuple((m, n, k, count * self.layers) for m, n, k, count in gemms)
        acc = tuple((m, n, k, count * self.layers) for m, n, k, count in accumulate) if self.accumulate_bytes else ()
        if accumulate and not acc:
            folded += tuple((m, n, k, count * self.layers) for m, n, k, count in accumulate)
        first = gemms or accumulate
        if fp8 is None:
            folded, fp8_folded = split_fp8(folded, self.fp8)
            acc, fp8_acc = split_fp8(acc, self.fp8)
        elif fp8:
            folded, fp8_folded, acc, fp8_acc = (), folded, (), acc
        else:
            fp8_folded = fp8_acc = ()
        self.ops.append(Compute(kind=op.kind, stage=op.stage, microbatch=op.microbatch, chunk=op.chunk,
                                block_start=op.block_start, block_end=op.block_end, flops=flops * self.layers,
                                hbm_bytes=hbm * self.layers, gemm_mnk=first[0][:3] if first else (0, 0, 0),
                                kernels=max(1, kernels) * self.layers, attention_flops=attention_flops * self.layers,
                                gemms=folded, attention_shape=attention_shape, accumulate_gemms=acc,
                                accumulate_bytes=self.accumulate_bytes if acc or fp8_acc else 0, gemm_streams=streams,
                                fp8_gemms=fp8_folded, fp8_accumulate_gemms=fp8_acc))

    def gemm(self, gemm: Gemm, rows: int | None = None, *, weight: bool = False, splits: int = 1,
             in_flight: int = UB_STREAMS) -> None:
        """One GEMM (``rows`` of its ``m``); ``weight``: a weight-gradient GEMM (accumulates into ``main_grad``
        under gradient accumulation fusion); ``splits``: the chunks of its GEMM, of which at most ``in_flight``
        run together (``min(in_flight, splits)``)."""
        m, n, k, count = gemm
        rows = m if rows is None else rows
        one = ((rows, n, k, count),)
        self.compute(2.0 * rows * n * k * count, 0.0, count, () if weight else one, accumulate=one if weight else (),
                     streams=min(in_flight, splits), fp8=(m, n, k) in self.fp8)

    def issue(self, kind: str, nbytes: float) -> str:
        handle = f"{self.prefix}{self.serial}"
        self.serial += 1
        self.ops.append(Collective(kind=kind, group=self.group, bytes=round(nbytes * self.layers),  # type: ignore[arg-type]
                                   purpose="tp", handle=handle, count=self.layers, label=self.label,
                                   kernel="userbuffers"))
        return handle

    def wait(self, handle: str) -> None:
        self.ops.append(Wait(handle=handle))

    def ring_gathered(self, gemm: Gemm, nbytes: int) -> None:
        """A GEMM on an all-gathered input by ring exchange: chunk ``i`` runs while step ``i`` moves the next
        shard (``nbytes`` is the gathered tensor; each step moves one shard of it per rank)."""
        tp = self.ctx.layout.tp
        for i, rows in enumerate(_split(gemm[0], tp)):
            handle = self.issue("ring_exchange", nbytes / tp) if i < tp - 1 else None
            self.gemm(gemm, rows, splits=tp)
            if handle is not None:
                self.wait(handle)

    def pipelined_scatter(self, gemm: Gemm, nbytes: int) -> None:
        """A GEMM whose output is reduce-scattered in ``PIPELINE_SPLITS`` pieces, each after its chunk."""
        chunks = _split(gemm[0], PIPELINE_SPLITS)
        in_flight = PIPELINE_STREAMS_FP8 if gemm[:3] in self.fp8 else PIPELINE_STREAMS
        handles = []
        for rows in chunks:
            self.gemm(gemm, rows, splits=PIPELINE_SPLITS, in_flight=in_flight)
            handles.append(self.issue("reduce_scatter", nbytes * rows / gemm[0]))
        for handle in handles:
            self.wait(handle)

    def bulk(self, kind: str, nbytes: int, gemm: Gemm, *, weight: bool = False) -> None:
        """One whole collective beside one whole GEMM (``weight``: a weight-gradient GEMM)."""
        handle = self.issue(kind, nbytes)
        self.gemm(gemm, weight=weight)
        self.wait(handle)


def _flops(gemms: tuple[Gemm, ...]) -> float:
    return sum(2.0 * m * n * k * count for m, n, k, count in gemms)


def _pipeline(ctx: LoweringContext, op: Compute, group: str, block: int, layers: int) -> list[Op]:
    """The overlapped ops of ``layers`` equal sub-blocks like ``block`` for ``op``'s compute kind."""
    c = ctx.cost(block)
    kind_name, _ = block_kind(ctx.model, block)
    flops, hbm, kernels, fused, lists = _block_numbers(c, op.kind)
    phase = "fwd" if op.kind in ("F", "R") else "bwd"
    prefix = f"tp:s{op.stage}:m{op.microbatch}:{op.kind}:b{op.block_start}:{kind_name}{block}:"
    label = (f"b{op.block_start}" if ctx.granularity == "block" else f"s{op.stage}") + \
        (":recompute" if op.kind == "R" else f":{phase}")
    b = _Builder(ctx, op, group, prefix, label, layers, c.fp8_gemm_shapes)
    shape = c.attention_shape if fused > 0 else (0, 0, 0)
    if phase == "fwd":
        gemms = lists[0]
        first, middle, last = gemms[0], gemms[1:-1], gemms[-1]
        b.ring_gathered(first, _comm_bytes(c, "fwd", "input"))
        b.compute(flops - _flops((first, last)), hbm, kernels - 2, middle, fused, shape)
        b.pipelined_scatter(last, _comm_bytes(c, "fwd", "output"))
        return b.ops
    inputs = lists[0]
    first, middle, last = inputs[0], inputs[1:-1], inputs[-1]
    weights = lists[1] if op.kind == "B" else ()
    b.ring_gathered(first, _comm_bytes(c, "bwd", "output-grad"))
    if weights:
        b.gemm(weights[0], weight=True)  # the output projection's weight gradient follows its input gradient
    b.compute(flops - _flops((first, last, *weights)), hbm, kernels - 2 - len(weights), middle, fused, shape)
    if regathered_by_recompute(ctx, block):
        b.gemm(last)  # the recompute already gathered this input (tensor_parallel.regathered_by_recompute)
    else:
        b.bulk("all_gather", _comm_bytes(c, "bwd", REGATHER), last)
    if weights:
        b.bulk("reduce_scatter", _comm_bytes(c, "bwd", "input-grad"), weights[-1], weight=True)
    else:
        b.wait(b.issue("reduce_scatter", _comm_bytes(c, "bwd", "input-grad")))
    return b.ops


EdgeBuilder = Callable[[LoweringContext, Compute, str], list[Op] | None]
"""Builds the ops of a non-overlapped edge (the vocabulary head) of a compute op, or None to wrap it as usual."""


def overlapped_ops(ctx: LoweringContext, op: Compute, group: str, head_ops: EdgeBuilder | None = None) -> list[Op] | None:
    """``op`` with its tensor-parallel collectives overlapped TE's way, or None when ``op`` is not one that
    overlaps (W, selective recompute, a range that holds a MoE sub-block between transformer sub-blocks):
    the caller then wraps it as usual. Reads only ``op``'s kind, stage, micro-batch, chunk and block range
    (the costs come from ``ctx``), which is what lets :func:`add_replaced_tensor_parallel` stamp the ops of
    one micro-batch for the others."""
    if op.kind not in ("F", "B", "I") and not (op.kind == "R" and ctx.layout.recompute == "full"):
        return None
    blocks = range(op.block_start, op.block_end)
    inner = [b for b in blocks if _overlappable(ctx, b)]
    if not inner or inner != list(range(inner[0], inner[-1] + 1)):
        return None
    # Equal sub-blocks of one kind fold into one pipeline (count = how many); unequal ones do not overlap.
    by_kind: dict[str, list[int]] = {}
    for block in inner:
        by_kind.setdefault(block_kind(ctx.model, block)[0], []).append(block)
    for members in by_kind.values():
        if any(ctx.cost(m) != ctx.cost(members[0]) for m in members[1:]):
            return None
    segments: list[list[Op]] = []
    if inner[0] > op.block_start:  # the embedding before the layers: as tensor_parallel places it
        head = compute_op(ctx, op.kind, op.stage, op.microbatch, op.block_start, inner[0])
        before, after = block_collectives(ctx, head, group)
        segments.append([*before, head, *after])
    segments += [_pipeline(ctx, op, group, members[0], len(members)) for members in by_kind.values()]
    if inner[-1] + 1 < op.block_end:  # the vocabulary head after the layers
        tail = compute_op(ctx, op.kind, op.stage, op.microbatch, inner[-1] + 1, op.block_end)
        built = head_ops(ctx, tail, group) if head_ops is not None else None
        if built is None:
            before, after = block_collectives(ctx, tail, group)
            built = [*before, tail, *after]
        segments.append(built)
    if op.kind in ("B", "I"):
        segments.reverse()
    return [o for segment in segments for o in segment]


_MISSING, _BUILD = object(), object()


def add_replaced_tensor_parallel(ctx: LoweringContext, role: Role, pp_rank: int,
                                 build: Callable[[LoweringContext, Compute, str], list[Op] | None]) -> Role:
    """The tensor-parallel pass of an overlap (``tp_comm_overlap``, ``tp_async_grad_comm``): ``build`` turns a
    compute op into its overlapped ops, or returns None and the op is wrapped as
    :func:`.tensor_parallel.add_tensor_parallel` wraps it. The ops of a compute op differ between
    micro-batches only in their micro-batch and handles, so they are built once per (kind, stage, chunk,
    block range) and stamped for the others (921k chunk ops for gpt3-175b at tp 8, pp 16, block
    granularity, under ``tp_comm_overlap``)."""
    if ctx.layout.tp == 1:
        return role
    group = Mesh.tp_group_name(ctx.coord(pp_rank))
    # None: the op is wrapped synchronously; _BUILD: built again for every micro-batch (not stampable).
    templates: dict[tuple[str, int, int, int, int], MicrobatchTemplate | object | None] = {}

    def replaced(op: Compute) -> list[Op] | None:
        key = (op.kind, op.stage, op.chunk, op.block_start, op.block_end)
        found = templates.get(key, _MISSING)
        if isinstance(found, MicrobatchTemplate):
            return found.stamp(op.microbatch)
        if found is None:
            return None
        ops = build(ctx, op, group)
        if found is _MISSING:
            templates[key] = None if ops is None else (MicrobatchTemplate.of(ops, op.microbatch) or _BUILD)
        return ops

    def replaced_or_wrapped(op: Compute) -> list[Op]:
        ops = replaced(op)
        if ops is None:
            before, after = tp_collectives(ctx, op, group)
            ops = [*before, op, *after]
        return ops

    return replace_compute_ops(role, replaced_or_wrapped)

