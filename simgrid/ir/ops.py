"""The operations of the schedule IR: immutable values, one per thing a rank issues.

Semantics shared by the engine and the executor (see docs/design.md, "IR semantics"):

* A rank issues its ops strictly in list order. Issuing a communication op returns at once.
* Compute ops run on the rank's compute stream, one after the other, in list order. A compute op
  waits for a communication only through an explicit :class:`Wait` issued before it.
* A communication op (collective, send, recv, host transfer) starts when every compute op issued
  before it has finished (the data it moves is ready), the previous op on its own stream has finished,
  and its peers have issued the matching op.
* Memory ops (:class:`Alloc`, :class:`Free`) take effect at their place in the compute stream.
* Blocks: a layer-wise index over the model's sub-blocks. Block 0 is the embedding, block
  ``1 + 2*i`` is the attention sub-block of layer ``i``, block ``2 + 2*i`` its MLP, and block
  ``2*L + 1`` the output head with the loss. A compute op covers the half-open range
  ``[block_start, block_end)``, always inside one model chunk.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

ComputeKind = Literal["F", "B", "I", "W", "R", "OPT"]
"""F forward; B full backward; I input-grad backward; W weight-grad backward; R recompute forward
(activation recomputation before a backward); OPT optimizer step."""

CollectiveKind = Literal["all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all", "barrier",
                         "ring_exchange"]
"""``ring_exchange`` is one step of a ring exchange: every member copies ``bytes`` to the next member of the group
(in group order) and receives as many from the previous one, by peer-to-peer copies on the GPU's copy engines
(Transformer Engine's userbuffers ring exchange, :mod:`simgrid.schedules.lower.tp_overlap`). The copies take no
SMs but do move HBM traffic; the engine slows overlapped compute by the GPU's ``copy_engine_compute_slowdown``
(:mod:`simgrid.engine.overlap`)."""

CommPurpose = Literal[
    "tp",  # tensor-parallel activation all-reduce / SP all-gather + reduce-scatter
    "cp",  # context-parallel key/value all-gather and key/value-gradient reduce-scatter
    "ep",  # expert parallelism: MoE dispatch/combine all-to-alls and expert tensor-parallel gathers
    "dp-grad",  # data-parallel gradient all-reduce (DDP buckets)
    "zero-grad",  # ZeRO gradient reduce-scatter
    "zero-param",  # ZeRO parameter all-gather (ZeRO-3 before use; ZeRO-1/2 after the step)
    "ps-reduce",  # parameter server: gradients reduced to the server rank
    "ps-broadcast",  # parameter server: updated parameters broadcast from the server rank
    "embed-grad",  # tied embedding gradient all-reduce between first and last pipeline stage
    "pp-gather",  # Megatron-LM's all-gather of a pipeline tensor's 1/tp slices (scatter_gather_tensors_in_pipeline)
    "sync",  # barriers and other control
    "amax",  # Transformer Engine delayed scaling's amax MAX all-reduce (simgrid.schedules.lower.amax_reduction)
]
"""Why a collective happens; metrics group exposed time by purpose (tp, cp, ep, pp, dp)."""

MemoryCategory = Literal["weights", "grads", "optimizer", "activations", "comm"]
TransferDirection = Literal["d2h", "h2d"]
P2PDirection = Literal["F", "B"]
Device = Literal["gpu", "cpu"]

COMPUTE_KINDS: tuple[str, ...] = get_args(ComputeKind)
COLLECTIVE_KINDS: tuple[str, ...] = get_args(CollectiveKind)
COMM_PURPOSES: tuple[str, ...] = get_args(CommPurpose)

CommKernel = Literal["nccl", "userbuffers"]
"""What runs a collective: an NCCL kernel, or a Transformer Engine userbuffers kernel (``--tp-comm-overlap``'s
pipelined and bulk reduce-scatters and all-gathers), which holds TE's ``num_sm`` SMs, not NCCL's CTAs."""
COMM_KERNELS: tuple[str, ...] = get_args(CommKernel)
MEMORY_CATEGORIES: tuple[str, ...] = get_args(MemoryCategory)


@dataclass(frozen=True, kw_only=True)
class Compute:
    """Work on the rank's compute stream (or on the host CPU for an offloaded optimizer)."""

    kind: ComputeKind
    """F, B, I, W, R or OPT (see :data:`ComputeKind`)."""
    stage: int
    """Global pipeline stage (model chunk in pipeline order, ``0 .. pp*vpp-1``); -1 for OPT."""
    microbatch: int
    """Micro-batch index ``0 .. m-1``; -1 for per-step ops (OPT)."""
    chunk: int
    """Local model chunk on this rank (``0 .. vpp-1``)."""
    block_start: int
    """First sub-block covered (see module docstring), inclusive."""
    block_end: int
    """One past the last sub-block covered."""
    flops: float
    """Floating-point operations this rank performs (after tensor-parallel splitting)."""
    hbm_bytes: float
    """Bytes moved to/from device memory by memory-bound (non-GEMM) kernels."""
    gemm_mnk: tuple[int, int, int] = (0, 0, 0)
    """(M, N, K) of the dominant matrix multiply, for shape-dependent efficiency; zeros if none."""
    attention_flops: float = 0.0
    """Of ``flops``, those done inside a fused attention kernel (FlashAttention's core): they run at the GPU's
    attention-kernel efficiency, not at the GEMM shape's; 0 for an unfused core and outside attention."""
    kernels: int = 1
    """Kernel launches this op stands for (per-kernel overhead)."""
    gemms: tuple[tuple[int, int, int, int], ...] = ()
    """Every matrix multiply of the op as ``(m, n, k, count)``: ``count`` GEMMs of an ``(m x k) @ (k x n)``
    product launched one after another (a batched GEMM is one GEMM stacked along ``m``), whose ``2 m n k count`` FLOPs sum to ``flops - attention_flops``; the
    cost model prices each by its shape. Empty: one GEMM of shape ``gemm_mnk`` stands for all of them."""
    accumulate_gemms: tuple[tuple[int, int, int, int], ...] = ()
    """Matrix multiplies of the op, in the form of ``gemms`` and not repeated there, that accumulate into an existing
    buffer (beta = 1: Megatron-LM's weight-gradient GEMMs into ``main_grad`` under gradient accumulation fusion):
    their epilogue reads C and writes D, ``accumulate_bytes`` each per element. Their FLOPs count with
    ``gemms``' toward ``flops - attention_flops``."""
    accumulate_bytes: int = 0
    """Bytes per element of the buffer ``accumulate_gemms`` read and write (4: fp32 ``main_grad``, 2: 16-bit);
    0 when there are none."""
    fp8_gemms: tuple[tuple[int, int, int, int], ...] = ()
    """Matrix multiplies of the op, in the form of ``gemms`` and not repeated there or in ``accumulate_gemms``, that
    run on fp8 operands (Transformer Engine fp8 autocast, ``Layout.fp8_recipe``): priced at the GPU's fp8 rate with
    1-byte operands and a 16-bit output. Their FLOPs count with ``gemms``' toward ``flops - attention_flops``."""
    fp8_accumulate_gemms: tuple[tuple[int, int, int, int], ...] = ()
    """fp8 matrix multiplies that accumulate into ``main_grad`` (as ``accumulate_gemms``, ``accumulate_bytes`` each
    way), not repeated in the other lists."""
    attention_shape: tuple[int, int, int] = (0, 0, 0)
    """``(query tokens, key tokens, head dim)`` per sequence of the fused attention core, for the GPU
    profile's attention-speed table; zeros when the op has no fused core."""
    gemm_streams: int = 1
    """Equal GEMM kernels in flight together on separate streams, this op's among them (Transformer Engine's
    userbuffers issue the chunk GEMMs of one overlapped GEMM round-robin on up to 3 streams): their thread blocks
    share the SMs' waves, so each of ``gemms`` is priced as ``1 / gemm_streams`` of one GEMM with
    ``gemm_streams`` times its rows (:func:`simgrid.costs.gemm.gemms_time_s`). 1: alone on the compute stream."""
    device: Device = "gpu"
    """Where it runs: ``cpu`` for an optimizer offloaded to the host."""
    host_s: float = 0.0
    """Seconds the host CPU spends issuing this GPU op's kernels (Python and dispatcher work, e.g. a
    ``foreach`` optimizer step over DTensors, :mod:`simgrid.schedules.lower.optimizer`). The op cannot end
    before the host has issued its last kernel, so it lasts ``max(GPU time, host_s)``; 0 (the default):
    the GPU is the bound."""


@dataclass(frozen=True, kw_only=True)
class P2PKey:
    """Identity of one pipeline transfer, equal on the sending and the receiving side."""

    src_stage: int
    """Global stage that produces the tensor."""
    dst_stage: int
    """Global stage that consumes it."""
    microbatch: int
    """Micro-batch the tensor belongs to."""
    direction: P2PDirection
    """F: activations going forward; B: gradients going backward."""


@dataclass(frozen=True, kw_only=True)
class Send:
    """Asynchronous point-to-point send (``dist.isend``) of a pipeline tensor."""

    peer: int
    """Destination global rank."""
    bytes: int
    """Payload size."""
    key: P2PKey
    """Matching key; the peer's :class:`Recv` carries an equal key."""
    handle: str
    """Name a later :class:`Wait` uses; unique within the rank."""
    grouped: bool = False
    """Part of an NCCL group (``batch_isend_irecv``): runs on its own direction's stream to the peer
    (``p2p:<peer>:send``), so a group's send and receive to one peer run at once, as NCCL runs a group's ops;
    otherwise a peer pair's sends and receives share ``p2p:<peer>`` in issue order (separate ``isend`` /
    ``irecv``)."""


@dataclass(frozen=True, kw_only=True)
class Recv:
    """Asynchronous point-to-point receive (``dist.irecv``) of a pipeline tensor."""

    peer: int
    """Source global rank."""
    bytes: int
    """Payload size."""
    key: P2PKey
    """Matching key; the peer's :class:`Send` carries an equal key."""
    handle: str
    """Name a later :class:`Wait` uses; unique within the rank."""
    grouped: bool = False
    """Part of an NCCL group (``batch_isend_irecv``): runs on its own direction's stream to the peer
    (``p2p:<peer>:recv``), so a group's send and receive to one peer run at once, as NCCL runs a group's ops;
    otherwise a peer pair's sends and receives share ``p2p:<peer>`` in issue order (separate ``isend`` /
    ``irecv``)."""


@dataclass(frozen=True, kw_only=True)
class Collective:
    """Asynchronous collective on a named process group (``async_op=True``)."""

    kind: CollectiveKind
    """all_reduce, reduce_scatter, all_gather, broadcast, reduce, all_to_all, barrier or ring_exchange."""
    group: str
    """Name of a group in the program's group table."""
    bytes: int
    """Message size per rank in the nccl-tests convention: the larger of input and output buffers
    (all-reduce: the buffer; reduce-scatter: the full input; all-gather: the full output; ring exchange:
    what each member sends)."""
    purpose: CommPurpose
    """Why it happens (see :data:`CommPurpose`)."""
    handle: str
    """Name a later :class:`Wait` uses; unique within the rank."""
    root: int | None = None
    """Global root rank for broadcast and reduce; ``None`` otherwise."""
    count: int = 1
    """Back-to-back collectives this op stands for (coarse programs fold per-layer collectives);
    ``bytes`` is their total."""
    label: str = ""
    """What the collective carries, e.g. ``"bucket3"`` or ``"L5.attn"``; the executor uses it."""
    kernel: CommKernel = "nccl"
    """What runs it (see :data:`CommKernel`): it decides what the collective takes from overlapped compute
    (:func:`simgrid.costs.overlap_slowdown`). A ring exchange runs on the copy engines whatever this says."""


@dataclass(frozen=True, kw_only=True)
class Transfer:
    """Asynchronous host <-> device copy over PCIe (optimizer offload)."""

    direction: TransferDirection
    """d2h: device to host (gradients down); h2d: host to device (parameters up)."""
    bytes: int
    """Bytes copied."""
    handle: str
    """Name a later :class:`Wait` uses; unique within the rank."""
    label: str = ""
    """What is copied, e.g. ``"grads"``."""


@dataclass(frozen=True, kw_only=True)
class Wait:
    """Block the compute stream until the named asynchronous op has completed (``work.wait()``)."""

    handle: str
    """Handle of an earlier Send, Recv, Collective or Transfer on the same rank."""


@dataclass(frozen=True, kw_only=True)
class Alloc:
    """Device memory allocated at this point of the compute stream."""

    name: str
    """Buffer name, unique among live buffers of the rank; :class:`Free` refers to it."""
    bytes: int
    """Size."""
    category: MemoryCategory
    """weights, grads, optimizer, activations or comm."""


@dataclass(frozen=True, kw_only=True)
class Free:
    """Release of a buffer allocated earlier on the same rank."""

    name: str
    """Name given in the matching :class:`Alloc`."""


Op = Compute | Send | Recv | Collective | Transfer | Wait | Alloc | Free
"""Any IR operation."""

CommOp = Send | Recv | Collective | Transfer
"""Operations that run asynchronously and carry a handle."""


def stream_of(op: Op) -> str:
    """The stream an op runs on: ``compute``, ``host``, ``comm:<group>``, ``p2p:<peer>`` (``p2p:<peer>:send`` /
    ``:recv`` when grouped) or ``pcie:<dir>``."""
    if isinstance(op, Compute):
        return "host" if op.device == "cpu" else "compute"
    if isinstance(op, Collective):
        return f"comm:{op.group}"
    if isinstance(op, (Send, Recv)):
        return p2p_stream(op)
    if isinstance(op, Transfer):
        return f"pcie:{op.direction}"
    return "compute"


def p2p_stream(op: Send | Recv) -> str:
    """``p2p:<peer>``, or ``p2p:<peer>:send`` / ``p2p:<peer>:recv`` for a grouped op (:attr:`Send.grouped`)."""
    return f"p2p:{p2p_stream_key(op)}"


def p2p_stream_key(op: Send | Recv) -> int | str:
    """The key the engines keep a point-to-point op's stream under: the peer, or ``<peer>:send`` /
    ``<peer>:recv`` for a grouped op (each direction of an NCCL group runs at once)."""
    if not op.grouped:
        return op.peer
    return f"{op.peer}:{'send' if isinstance(op, Send) else 'recv'}"


def block_name(block: int, num_layers: int) -> str:
    """Readable name of a sub-block index: ``embed``, ``L3.attn``, ``L3.mlp`` or ``head``."""
    if block == 0:
        return "embed"
    if block == 2 * num_layers + 1:
        return "head"
    layer, part = divmod(block - 1, 2)
    return f"L{layer}.{'attn' if part == 0 else 'mlp'}"


def num_blocks(num_layers: int) -> int:
    """Sub-blocks of a model with ``num_layers`` layers: embedding, two per layer, head."""
    return 2 * num_layers + 2
