"""Hardware spec dataclasses: GPU, link, node, network, cluster, and a cluster sized for a run.

Units are in the field names: GB/s means 10^9 bytes/s (datasheet convention), GiB means 2^30 bytes,
TFLOP/s means 10^12 FLOP/s. Every spec validates its own fields, so one built in Python is as safe as
one loaded from a TOML profile (see :mod:`simgrid.hardware.loader`).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal, get_args

from simgrid.errors import ProfileError
from simgrid.hardware.attention import AttentionKernelTable
from simgrid.hardware.busbw_curve import BusbwCurve
from simgrid.hardware.measured import MeasuredTables
from simgrid.hardware.rules import (
    FieldError,
    FrozenMapping,
    check_at_least,
    check_choice,
    check_fraction,
    check_int_at_least,
    check_non_negative,
    check_positive,
    check_slowdown,
    check_strictly_ascending,
    check_text,
)

Dtype = Literal["fp32", "tf32", "bf16", "fp16", "fp8"]
DTYPES: tuple[str, ...] = get_args(Dtype)
IntraFabric = Literal["nvswitch", "nvlink-mesh", "pcie"]
INTRA_FABRICS: tuple[str, ...] = get_args(IntraFabric)
CPU_VENDORS: tuple[str, ...] = ("intel", "amd", "arm")
"""Host CPU vendors NCCL's tuner tells apart (``NodeSpec.cpu_vendor``)."""
GPU_ARCHS: tuple[str, ...] = ("volta", "ampere", "hopper", "blackwell")
"""GPU generations as NCCL's tuner groups them: compute capability < 8, 8.x, 9.x, >= 10 (``NodeSpec.gpu_arch``)."""
NetworkKind = Literal[
    "infiniband-edr", "infiniband-hdr", "infiniband-ndr", "infiniband-xdr", "roce", "ethernet", "ideal"
]
NETWORK_KINDS: tuple[str, ...] = get_args(NetworkKind)
NetworkTopology = Literal["rail-optimized-fat-tree", "fat-tree", "single-switch"]
NETWORK_TOPOLOGIES: tuple[str, ...] = get_args(NetworkTopology)

GIB = 2**30


def _freeze_sources(owner: str, obj: object) -> None:
    sources = getattr(obj, "sources")  # noqa: B009 - shared by several spec classes
    for key, line in sources.items():
        check_text(owner, f"sources.{key}", line)
    object.__setattr__(obj, "sources", FrozenMapping(sources))


@dataclass(frozen=True, kw_only=True)
class MatmulEfficiency:
    """How fast the GEMM kernels run.

    With an output tile (``tile_m`` x ``tile_n``) and the GPU's ``sm_count`` the cost model prices each GEMM
    by its full shape (:mod:`simgrid.costs.gemm`): tiles quantised onto waves of SMs, each tile's main loop
    at ``max_efficiency`` of peak and its epilogue (the output write) at HBM speed. Without a tile (a
    calibrated or hand-written legacy profile) ``efficiency(m, n, k) = max_efficiency *
    relative(min(m, n, k))``, ``relative`` linear in log2 of the smallest dimension between the curve's
    points and clamped outside them.
    """

    max_efficiency: float
    """Fraction of the dtype's peak reached by large, well-shaped GEMMs (e.g. A100 bf16: 268/312)."""
    min_dim: tuple[int, ...] = (1,)
    """Smallest GEMM dimension at each curve point, strictly ascending, >= 1."""
    relative: tuple[float, ...] = (1.0,)
    """Efficiency relative to ``max_efficiency`` at each ``min_dim``, each in (0, 1] (legacy curve)."""
    tile_m: int = 0
    """Rows of the output tile one thread block (CTA) computes; 0 = no tile model (use the legacy curve)."""
    tile_n: int = 0
    """Columns of that tile; the cost model also tries the transposed tile, as cuBLAS has both."""
    stream_k: bool = False
    """Whether the GPU's GEMM library has stream-K kernels (work split evenly over persistent CTAs, so a
    partial last wave costs its share, not a whole wave); only with a tile."""
    max_efficiency_fp8: float | None = None
    """Fraction of the fp8 peak an fp8 GEMM's main loop reaches (solved, like ``max_efficiency``, from a measured
    fp8 MAMF through :mod:`simgrid.costs.gemm`); ``None``: ``max_efficiency`` stands in."""

    def efficiency_for(self, dtype: str) -> float:
        """The main-loop fraction of peak for ``dtype``: ``max_efficiency_fp8`` for fp8 where given."""
        if dtype == "fp8" and self.max_efficiency_fp8 is not None:
            return self.max_efficiency_fp8
        return self.max_efficiency

    @property
    def tiled(self) -> bool:
        """Whether the profile gives an output tile (the full-shape GEMM model applies)."""
        return self.tile_m > 0 and self.tile_n > 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "min_dim", tuple(self.min_dim))
        for name in ("tile_m", "tile_n"):
            check_int_at_least("MatmulEfficiency", name, getattr(self, name), 0)
        if (self.tile_m > 0) != (self.tile_n > 0):
            raise FieldError("tile_n", self.tile_n, f"must be given together with tile_m (tile_m = {self.tile_m})",
                             owner="MatmulEfficiency")
        if self.stream_k and not self.tiled:
            raise FieldError("stream_k", self.stream_k, "needs tile_m and tile_n (stream-K splits output tiles)",
                             owner="MatmulEfficiency")
        object.__setattr__(self, "relative", tuple(self.relative))
        check_fraction("MatmulEfficiency", "max_efficiency", self.max_efficiency)
        if self.max_efficiency_fp8 is not None:
            check_fraction("MatmulEfficiency", "max_efficiency_fp8", self.max_efficiency_fp8)
        if not self.min_dim:
            raise FieldError("min_dim", self.min_dim, "must have at least one point", owner="MatmulEfficiency")
        if len(self.min_dim) != len(self.relative):
            raise FieldError("relative", self.relative, f"must have {len(self.min_dim)} values, one per min_dim",
                             owner="MatmulEfficiency")
        check_strictly_ascending("MatmulEfficiency", "min_dim", self.min_dim)
        for i, value in enumerate(self.relative):
            check_fraction("MatmulEfficiency", f"relative[{i}]", value)

    def relative_at(self, smallest_dim: float) -> float:
        """The curve at one smallest dimension: linear in log2(dim), clamped at both ends."""
        dims, values = self.min_dim, self.relative
        if smallest_dim <= dims[0]:
            return values[0]
        if smallest_dim >= dims[-1]:
            return values[-1]
        x = math.log2(smallest_dim)
        for i in range(1, len(dims)):
            if smallest_dim <= dims[i]:
                x0, x1 = math.log2(dims[i - 1]), math.log2(dims[i])
                return values[i - 1] + (values[i] - values[i - 1]) * (x - x0) / (x1 - x0)
        return values[-1]  # unreachable: smallest_dim < dims[-1] was handled above

    def efficiency(self, m: int, n: int, k: int) -> float:
        """Fraction of peak for an (m x k) @ (k x n) GEMM; a GEMM with a zero dimension does no work
        and gets ``max_efficiency`` so callers need no special case."""
        if min(m, n, k) < 0:
            raise ProfileError(f"GEMM shape ({m}, {n}, {k}) has a negative dimension; dimensions must be >= 0")
        smallest = min(m, n, k)
        if smallest == 0:
            return self.max_efficiency
        return self.max_efficiency * self.relative_at(smallest)


def slowest_chip_factor(spread: float, gpus: int) -> float:
    """Expected speed of the slowest of ``gpus`` chips relative to the mean chip, for a relative spread
    ``spread`` = (max - min) / mean of the sustained rate over a node.

    Assumed: chip speeds are uniform over [mean - spread/2, mean + spread/2] (the measurement gives a
    range over 8 GPUs x 5 rounds, no distribution), so the expected minimum of ``gpus`` independent draws
    is ``mean - spread/2 * (gpus - 1) / (gpus + 1)``: 1 for one GPU, falling towards ``1 - spread/2``.
    """
    if gpus <= 1 or spread == 0:
        return 1.0
    return 1.0 - spread / 2 * (gpus - 1) / (gpus + 1)


@dataclass(frozen=True, kw_only=True)
class GPUSpec:
    """One accelerator: peak rates, memory, and the efficiencies and overheads real kernels see."""

    name: str
    """Profile name, e.g. ``a100-80gb-sxm``."""
    description: str
    """One line for humans."""
    memory_GiB: float
    """Device memory capacity in GiB (2^30 bytes)."""
    hbm_bandwidth_GBps: float
    """Peak device-memory bandwidth in GB/s (10^9 bytes/s); ``inf`` for the ideal GPU."""
    hbm_efficiency: float
    """Achievable fraction of ``hbm_bandwidth_GBps`` for streaming (memory-bound) kernels."""
    peak_tflops: Mapping[str, float]
    """Dense peak TFLOP/s per dtype (fp32, tf32, bf16, fp16, fp8 where the GPU has it)."""
    matmul: MatmulEfficiency
    """GEMM efficiency by shape."""
    sm_count: int | None = None
    """Streaming multiprocessors: the waves GEMM tiles are quantised onto; ``None`` = no wave model."""
    sustained_clock_fraction: float = 1.0
    """Share of the benchmarks' (burst) tensor-core throughput the GPU sustains in long GEMM-heavy phases,
    where the power limit holds the SM clock below boost; applies to GEMM and fused-attention time."""
    chip_speed_spread: float = 0.0
    """Chip-to-chip spread of that sustained rate over one node's GPUs, (max - min) / mean (0.045 = 4.5%);
    ``sustained_clock_fraction`` is their mean. A synchronous step waits on its slowest GPU, so a sized
    :class:`Cluster` runs the expected slowest of its GPUs (:meth:`slowest_of`); 0 = identical chips."""
    fused_attention: Mapping[str, AttentionKernelTable] = field(default_factory=dict)
    """Published fused-attention speed by kernel family (``fa2``, ``fa3``), sequence length and head dim."""
    attention_kernel: str | None = None
    """Kernel family used when the layout asks for ``auto``; must name a table of ``fused_attention``."""
    fused_attention_efficiency: float | None = None
    """Fraction of the dtype's peak a fused attention kernel (FlashAttention) reaches over its forward and
    backward, used when no ``fused_attention`` table covers the kernel asked for; ``None``: the GEMM plateau
    ``matmul.max_efficiency`` stands in (optimistic: a fused core also does the softmax on the CUDA cores)."""
    kernel_overhead_us: float
    """Launch plus tail time added to every kernel, in microseconds."""
    comm_compute_slowdown: float
    """Fraction by which compute slows while an SM-based collective runs concurrently: NCCL runs one CTA per
    channel, each holding an SM that compute cannot use, so about NCCL's CTAs / ``sm_count``."""
    p2p_compute_slowdown: float | None = None
    """Fraction by which compute slows while a point-to-point send/receive (pipeline) is in flight: NCCL runs
    it on few CTAs per peer. ``None``: ``comm_compute_slowdown`` (profiles written before issue 12)."""
    copy_engine_compute_slowdown: float | None = None
    """Fraction by which compute slows while a copy-engine transfer (Transformer Engine's userbuffers ring
    exchange) is in flight: it holds no SMs, only HBM traffic. ``None``: ``comm_compute_slowdown``."""
    sources: Mapping[str, str] = field(default_factory=dict)
    """Field name (or dotted path, e.g. ``peak_tflops.bf16``) -> where the figure comes from."""

    def __post_init__(self) -> None:
        check_text("GPUSpec", "name", self.name)
        check_text("GPUSpec", "description", self.description, allow_empty=True)
        check_positive("GPUSpec", "memory_GiB", self.memory_GiB)
        check_positive("GPUSpec", "hbm_bandwidth_GBps", self.hbm_bandwidth_GBps, allow_inf=True)
        check_fraction("GPUSpec", "hbm_efficiency", self.hbm_efficiency)
        if not self.peak_tflops:
            raise FieldError("peak_tflops", {}, "must list at least one dtype of " + ", ".join(DTYPES),
                             owner="GPUSpec")
        for dtype, tflops in self.peak_tflops.items():
            check_choice("GPUSpec", "peak_tflops", dtype, DTYPES)
            check_positive("GPUSpec", f"peak_tflops.{dtype}", tflops, allow_inf=True)
        object.__setattr__(self, "peak_tflops", FrozenMapping(self.peak_tflops))
        if not isinstance(self.matmul, MatmulEfficiency):
            raise FieldError("matmul", self.matmul, "must be a MatmulEfficiency", owner="GPUSpec")
        if self.fused_attention_efficiency is not None:
            check_fraction("GPUSpec", "fused_attention_efficiency", self.fused_attention_efficiency)
        if self.sm_count is not None:
            check_int_at_least("GPUSpec", "sm_count", self.sm_count, 1)
        check_fraction("GPUSpec", "sustained_clock_fraction", self.sustained_clock_fraction)
        spread = self.chip_speed_spread
        if isinstance(spread, bool) or not isinstance(spread, int | float) or not 0 <= spread < 1:
            raise FieldError("chip_speed_spread", spread, "must be in [0, 1): the (max - min) / mean spread of "
                             "the sustained GEMM rate over one node's GPUs, e.g. 0.045 for 4.5%; 0 for identical "
                             "chips", owner="GPUSpec")
        for name, table in self.fused_attention.items():
            if not isinstance(table, AttentionKernelTable) or table.name != name:
                raise FieldError(f"fused_attention.{name}", table, f"must be an AttentionKernelTable named {name!r}",
                                 owner="GPUSpec")
        object.__setattr__(self, "fused_attention", FrozenMapping(self.fused_attention))
        if self.attention_kernel is not None and self.attention_kernel not in self.fused_attention:
            known = ", ".join(sorted(self.fused_attention)) or "none"
            raise FieldError("attention_kernel", self.attention_kernel,
                             f"must name a fused_attention table (this GPU has: {known})", owner="GPUSpec")
        check_non_negative("GPUSpec", "kernel_overhead_us", self.kernel_overhead_us)
        check_slowdown("GPUSpec", "comm_compute_slowdown", self.comm_compute_slowdown)
        for name in ("p2p_compute_slowdown", "copy_engine_compute_slowdown"):
            if getattr(self, name) is not None:
                check_slowdown("GPUSpec", name, getattr(self, name))
        _freeze_sources("GPUSpec", self)

    @property
    def memory_bytes(self) -> int:
        """Device memory capacity in bytes."""
        return int(self.memory_GiB * GIB)

    @property
    def attention_efficiency(self) -> float:
        """Efficiency of a fused attention core: the profile's figure, else the GEMM plateau."""
        if self.fused_attention_efficiency is None:
            return self.matmul.max_efficiency
        return self.fused_attention_efficiency

    def slowest_of(self, gpus: int) -> GPUSpec:
        """The expected slowest of ``gpus`` chips of this model: the GPU a synchronous job of ``gpus`` GPUs
        computes at. Its sustained rate is the mean's minus the expected shortfall of the minimum of ``gpus``
        draws; the copy's ``chip_speed_spread`` is 0 (one chip), so applying this twice changes nothing."""
        factor = slowest_chip_factor(self.chip_speed_spread, gpus)
        if factor == 1.0:
            return self
        return replace(self, sustained_clock_fraction=self.sustained_clock_fraction * factor, chip_speed_spread=0.0)

    def peak_flops(self, dtype: str) -> float:
        """Dense peak rate for ``dtype`` in FLOP/s."""
        if dtype not in self.peak_tflops:
            known = ", ".join(sorted(self.peak_tflops))
            raise ProfileError(
                f"GPU {self.name!r} has no peak rate for dtype {dtype!r} (it has: {known}); "
                f"use one of those dtypes or add peak_tflops.{dtype} to its profile"
            )
        return self.peak_tflops[dtype] * 1e12


@dataclass(frozen=True, kw_only=True)
class LinkSpec:
    """A link's line rate, latency and achievable efficiency (per direction)."""

    bandwidth_GBps: float
    """Line rate per direction in GB/s (10^9 bytes/s); ``inf`` for an ideal link."""
    latency_us: float
    """Per-transfer (per algorithm step) latency in microseconds; 0 for an ideal link."""
    efficiency: float
    """Achievable fraction of ``bandwidth_GBps`` for bulk transfers."""

    def __post_init__(self) -> None:
        check_positive("LinkSpec", "bandwidth_GBps", self.bandwidth_GBps, allow_inf=True)
        check_non_negative("LinkSpec", "latency_us", self.latency_us)
        check_fraction("LinkSpec", "efficiency", self.efficiency)

    @property
    def effective_bandwidth_GBps(self) -> float:
        """Bandwidth a bulk transfer actually gets: line rate times efficiency."""
        return self.bandwidth_GBps * self.efficiency


@dataclass(frozen=True, kw_only=True)
class NodeSpec:
    """A server: its GPUs, the fabric between them, the host side and the NICs."""

    name: str
    """Profile name, e.g. ``dgx-a100``."""
    description: str
    """One line for humans."""
    gpu: GPUSpec
    """The (identical) GPUs in the node."""
    gpus_per_node: int
    """GPUs per node."""
    intra_fabric: str
    """``nvswitch`` (all-to-all at full per-GPU rate), ``nvlink-mesh`` (direct links) or ``pcie`` (tree)."""
    intra_link: LinkSpec
    """Per-GPU, per-direction link into the intra-node fabric (for NVSwitch: the GPU's NVLink rate)."""
    gpus_per_pcie_switch: int
    """GPUs under one PCIe switch; traffic between switches crosses the CPU root complex."""
    pcie_link: LinkSpec
    """GPU <-> host link, per GPU (optimizer offload, host staging)."""
    host_memory_GiB: float
    """Host (CPU) memory per node in GiB."""
    host_adam_params_per_s: float
    """Parameters per second one node's CPUs update with Adam (ZeRO-Offload's CPU-Adam)."""
    nics_per_node: int
    """Compute-fabric NICs per node (storage/management NICs excluded)."""
    nic_link: LinkSpec
    """One NIC's link to the network, per direction (TOML gives ``nic_bandwidth_Gbps`` in Gb/s)."""
    nvlink_sharp: bool = False
    """The NVSwitch reduces and multicasts in the switch (NVLink SHARP, third-generation NVSwitch of
    H100/H200 nodes and later): NCCL's NVLS algorithm is available inside a node."""
    cpu_vendor: str = "intel"
    """Host CPU vendor (``intel``, ``amd``, ``arm``): NCCL's tuner charges a per-step network posting
    overhead and an LL bandwidth ceiling that depend on it."""
    gpu_arch: str = "ampere"
    """GPU generation as NCCL's tuner groups it (``volta``, ``ampere``, ``hopper``, ``blackwell``):
    LL bandwidth ceiling in one node, NVLS efficiency, ring latency plateau."""
    intra_busbw_curve: BusbwCurve | None = None
    """A published nccl-tests all_reduce curve of this node's GPU fabric; intra-node all-reduce,
    all-gather and reduce-scatter reach at most its fraction of the plateau at their bytes per rank
    (:mod:`simgrid.costs.busbw_curve`). ``None``: NCCL's tuner model alone."""
    sources: Mapping[str, str] = field(default_factory=dict)
    """Field name (or dotted path) -> where the figure comes from."""

    def __post_init__(self) -> None:
        check_text("NodeSpec", "name", self.name)
        check_text("NodeSpec", "description", self.description, allow_empty=True)
        if not isinstance(self.gpu, GPUSpec):
            raise FieldError("gpu", self.gpu, "must be a GPUSpec", owner="NodeSpec")
        check_int_at_least("NodeSpec", "gpus_per_node", self.gpus_per_node, 1)
        check_choice("NodeSpec", "intra_fabric", self.intra_fabric, INTRA_FABRICS)
        check_int_at_least("NodeSpec", "gpus_per_pcie_switch", self.gpus_per_pcie_switch, 1)
        if self.gpus_per_pcie_switch > self.gpus_per_node:
            raise FieldError("gpus_per_pcie_switch", self.gpus_per_pcie_switch,
                             f"must be <= gpus_per_node ({self.gpus_per_node})", owner="NodeSpec")
        check_positive("NodeSpec", "host_memory_GiB", self.host_memory_GiB)
        check_positive("NodeSpec", "host_adam_params_per_s", self.host_adam_params_per_s, allow_inf=True)
        check_int_at_least("NodeSpec", "nics_per_node", self.nics_per_node, 1)
        if not isinstance(self.nvlink_sharp, bool):
            raise FieldError("nvlink_sharp", self.nvlink_sharp, "must be true or false", owner="NodeSpec")
        if self.nvlink_sharp and self.intra_fabric != "nvswitch":
            raise FieldError("nvlink_sharp", self.nvlink_sharp,
                             f"needs intra_fabric = 'nvswitch' (got {self.intra_fabric!r}); set it to false",
                             owner="NodeSpec")
        check_choice("NodeSpec", "cpu_vendor", self.cpu_vendor, CPU_VENDORS)
        check_choice("NodeSpec", "gpu_arch", self.gpu_arch, GPU_ARCHS)
        if self.intra_busbw_curve is not None and not isinstance(self.intra_busbw_curve, BusbwCurve):
            raise FieldError("intra_busbw_curve", self.intra_busbw_curve, "must be a BusbwCurve or None",
                             owner="NodeSpec")
        _freeze_sources("NodeSpec", self)

    @property
    def host_memory_bytes(self) -> int:
        """Host memory per node in bytes."""
        return int(self.host_memory_GiB * GIB)


@dataclass(frozen=True, kw_only=True)
class NetworkSpec:
    """The inter-node fabric."""

    kind: str
    """Technology: ``infiniband-edr/hdr/ndr/xdr``, ``roce``, ``ethernet`` or ``ideal``."""
    topology: str
    """``rail-optimized-fat-tree`` (NIC i of every node on rail switch i), ``fat-tree`` or ``single-switch``."""
    oversubscription: float
    """Ratio of downlink to uplink capacity at the leaf switches (1.0 = full bisection bandwidth)."""
    switch_latency_us: float
    """Latency added per switch hop in microseconds."""
    efficiency: float
    """Fraction of the NICs' achievable rate kept across the fabric (routing, congestion); multiplies
    ``NodeSpec.nic_link.efficiency``. 1.0 for a non-blocking fabric whose losses the NIC figure covers."""

    def __post_init__(self) -> None:
        check_choice("NetworkSpec", "kind", self.kind, NETWORK_KINDS)
        check_choice("NetworkSpec", "topology", self.topology, NETWORK_TOPOLOGIES)
        check_at_least("NetworkSpec", "oversubscription", self.oversubscription, 1.0)
        check_non_negative("NetworkSpec", "switch_latency_us", self.switch_latency_us)
        check_fraction("NetworkSpec", "efficiency", self.efficiency)


@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    """A kind of cluster (node type + network); :meth:`sized` fixes the GPU count for one run."""

    name: str
    """Profile name, e.g. ``dgx-a100-hdr``."""
    description: str
    """One line for humans."""
    node: NodeSpec
    """The (identical) nodes."""
    network: NetworkSpec
    """The fabric between nodes."""
    max_nodes: int | None = None
    """Largest number of nodes the cluster has; ``None`` for no limit."""
    measured: MeasuredTables | None = None
    """Calibrated times that override formulas (written by ``simgrid-exec calibrate``)."""
    sources: Mapping[str, str] = field(default_factory=dict)
    """Field name (or dotted path, e.g. ``network.efficiency``) -> where the figure comes from."""

    def __post_init__(self) -> None:
        check_text("ClusterSpec", "name", self.name)
        check_text("ClusterSpec", "description", self.description, allow_empty=True)
        if not isinstance(self.node, NodeSpec):
            raise FieldError("node", self.node, "must be a NodeSpec", owner="ClusterSpec")
        if not isinstance(self.network, NetworkSpec):
            raise FieldError("network", self.network, "must be a NetworkSpec", owner="ClusterSpec")
        if self.max_nodes is not None:
            check_int_at_least("ClusterSpec", "max_nodes", self.max_nodes, 1)
        if self.measured is not None and not isinstance(self.measured, MeasuredTables):
            raise FieldError("measured", self.measured, "must be MeasuredTables or None", owner="ClusterSpec")
        _freeze_sources("ClusterSpec", self)

    def sized(self, num_gpus: int, *, synchronous_gpus: int | None = None) -> Cluster:
        """This cluster with ``num_gpus`` GPUs, ``synchronous_gpus`` of which step together (see :class:`Cluster`)."""
        return Cluster(spec=self, num_gpus=num_gpus, synchronous_gpus=synchronous_gpus)


@dataclass(frozen=True, kw_only=True)
class Cluster:
    """A cluster spec sized for one run.

    ``num_nodes = ceil(num_gpus / node.gpus_per_node)``; a run smaller than one node uses one node
    holding ``num_gpus`` GPUs. When ``num_gpus`` is not a multiple of the node size the last node is
    partly used (:meth:`gpus_on_node`). :attr:`gpu` is the run's GPU: the expected slowest of the
    ``synchronous_gpus`` chips one step waits on (:meth:`GPUSpec.slowest_of`).
    """

    spec: ClusterSpec
    """The cluster kind."""
    num_gpus: int
    """GPUs used by the run."""
    synchronous_gpus: int | None = None
    """GPUs whose slowest chip paces every step (``None``: all ``num_gpus``, as in synchronous training;
    serving passes one replica's GPUs, since replicas do not wait on each other)."""
    _gpu: GPUSpec = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:  # accept numpy integers from sweeps, but not bools or floats
            count = operator.index(self.num_gpus) if not isinstance(self.num_gpus, bool) else 0
        except TypeError:
            count = 0
        if count < 1:
            raise ProfileError(f"cluster {self.spec.name!r}: gpus = {self.num_gpus!r} must be an integer >= 1")
        object.__setattr__(self, "num_gpus", count)
        sync = self.num_gpus if self.synchronous_gpus is None else self.synchronous_gpus
        check_int_at_least("Cluster", "synchronous_gpus", sync, 1)
        object.__setattr__(self, "_gpu", self.spec.node.gpu.slowest_of(min(sync, self.num_gpus)))
        limit = self.spec.max_nodes
        if limit is not None and self.num_gpus > limit * self.spec.node.gpus_per_node:
            raise ProfileError(
                f"cluster {self.spec.name!r} has at most {limit} nodes x {self.spec.node.gpus_per_node} GPUs = "
                f"{limit * self.spec.node.gpus_per_node} GPUs; gpus = {self.num_gpus} is too many "
                "(ask for fewer GPUs or raise max_nodes in the profile)"
            )

    @property
    def num_nodes(self) -> int:
        """Nodes used: ceil(num_gpus / gpus per node)."""
        return -(-self.num_gpus // self.spec.node.gpus_per_node)

    @property
    def node(self) -> NodeSpec:
        """The node spec."""
        return self.spec.node

    @property
    def gpu(self) -> GPUSpec:
        """The run's GPU: the profile's, at the expected slowest chip's sustained rate (``spec.node.gpu`` is
        the profile as written)."""
        return self._gpu

    @property
    def network(self) -> NetworkSpec:
        """The inter-node network spec."""
        return self.spec.network

    @property
    def gpus_per_node(self) -> int:
        """GPUs per used node: the node's size, or ``num_gpus`` when the run fits in part of one node."""
        return min(self.num_gpus, self.spec.node.gpus_per_node)

    def gpus_on_node(self, node_index: int) -> int:
        """GPUs the run uses on node ``node_index`` (only the last node can be partly used)."""
        if not 0 <= node_index < self.num_nodes:
            raise ProfileError(f"node_index = {node_index} must be in [0, {self.num_nodes})")
        full = self.spec.node.gpus_per_node
        return min(full, self.num_gpus - node_index * full)
