"""NCCL's own cost model (its tuner), as the latency and protocol part of collective costs.

NCCL chooses an (algorithm, protocol) pair per call by estimating ``time = latency + bytes / bandwidth``
for every enabled pair and taking the smallest (``ncclTopoTuneModel`` and ``ncclTopoGetAlgoTime`` in
NVIDIA/nccl ``src/graph/tuning.cc``, read at commit 5067397, 2026-06). This module holds the constants of
that file and the formulas that use them; :mod:`simgrid.costs.collectives` supplies the bandwidth from
the topology (the busiest link of the algorithm's steps) and takes the minimum.

Latency (microseconds), per algorithm ``a`` and protocol ``p``:

* ring all-reduce / reduce-scatter / all-gather on n ranks over m nodes:
  ``base[a][p] + (nsteps - nInter) * intra + nInter * inter`` with nsteps = 2(n-1) (all-reduce) or n-1,
  nInter = 2(m-1) or m-1 inter-node steps, ``intra = max(hop latency, net overhead)`` once the ring
  leaves the node (a proxy thread posts every network step: 1 us on Intel, 2 us on AMD hosts, x3 for
  Simple), ``inter`` the network hop (the tree's figure when each node holds one rank, as NCCL does);
* ring broadcast / reduce: ``base + n * hop`` (the tree's hop figure for Simple, the chunk latency
  NCCL adds when the channels differ);
* tree all-reduce: ``base + 2 * ((n/m - 1) * intra + floor(log2 m) * inter)``;
* NVLS (NVLink SHARP, one node): the NVLS hop latency alone, no base; PAT (all-gather / reduce-scatter
  with one rank per node): ``base + floor(log2 m) * inter / 3.5 + 2.8 n``.

Hop latencies: NCCL tabulates them per hardware class (NVLink, PCI, network), algorithm and protocol.
Here a profile states the Simple-protocol ring hop of its own hardware (``intra_link.latency_us``,
``nic_latency_us``; a route's switch latencies add to the network hop), and the other entries scale it by
NCCL's ratio to its ring/Simple entry of the same class, so a slower network slows every protocol alike.

Bandwidth: NCCL's ``busBw`` of the Simple protocol comes from its topology search; here it is the
topology's (see :mod:`simgrid.costs.collectives`). The protocol and algorithm refinements below are
NCCL's: LL moves 8 bytes per 16 (ring x0.5, capped at ``llMaxBw``; tree x1/3.8), LL128 120 of 128
(x0.92 ring; tree x120/128 across nodes, x7/9 in one node), tree all-reduce x0.92 and a size-dependent
correction, PAT x0.75, NVLS at ``nvlsEfficiency`` of the NVLink rate (Hopper 0.85, Blackwell 0.74).
Per-channel caps (``perChMax*Bw``) need NCCL's channel counts, which the topology does not give; they are
not applied.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

PROTOCOLS: tuple[str, ...] = ("LL", "LL128", "Simple")
"""NCCL's protocols: LL (8-byte stores with an inline flag), LL128 (128-byte lines), Simple (bulk)."""

_P = {p: i for i, p in enumerate(PROTOCOLS)}

BASE_LATENCY_US: dict[str, tuple[float, float, float]] = {
    "tree": (6.8, 14.0, 8.4),
    "ring": (6.6, 14.0, 8.4),
    "nvls": (0.0, 0.0, 0.0),
    "pat": (8.0, 8.0, 8.0),
}
"""``baseLatencies`` of tuning.cc, (LL, LL128, Simple) per algorithm: the fixed cost of one call."""

HW_LATENCY_US: dict[tuple[str, str], tuple[float, float, float]] = {
    ("nvlink", "tree"): (0.6, 1.25, 4.0),
    ("nvlink", "ring"): (0.6, 1.9, 3.4),
    ("nvlink", "nvls"): (0.0, 0.0, 25.0),
    ("nvlink", "pat"): (0.0, 0.0, 4.0),
    ("pci", "tree"): (1.0, 1.9, 4.0),
    ("pci", "ring"): (1.0, 2.5, 5.7),
    ("pci", "pat"): (0.0, 0.0, 4.0),
    ("net", "tree"): (5.0, 8.5, 14.0),
    ("net", "ring"): (2.7, 4.0, 14.0),
    ("net", "nvls"): (0.0, 0.0, 18.0),
    ("net", "pat"): (0.0, 0.0, 14.0),
}
"""``hwLatencies`` of tuning.cc: per-hop latency by (hardware class, algorithm), (LL, LL128, Simple)."""

NET_OVERHEAD_US: dict[str, float] = {"intel": 1.0, "amd": 2.0, "arm": 1.0}
"""``getNetOverhead``: host time to post one network step, by CPU vendor (x3 for Simple)."""

LL_MAX_BW_GBPS_ONE_NODE: dict[str, float] = {"volta": 39.0, "ampere": 87.7, "hopper": 141.0, "blackwell": 282.0}
"""``llMaxBws[compCap][0]``: LL's bus-bandwidth ceiling inside one node, by GPU generation."""

LL_MAX_BW_GBPS_NODES: dict[str, tuple[float, float]] = {"intel": (39.0, 20.4), "amd": (22.5, 19.0),
                                                        "arm": (39.0, 20.4)}
"""``llMaxBws[cpu][1 or 2]``: LL's ceiling across 2 nodes and across more, by CPU vendor (Intel row
for other vendors, as NCCL's index does)."""

NVLS_EFFICIENCY: dict[str, float] = {"hopper": 0.85, "blackwell": 0.74}
"""``nvlsEfficiency``: fraction of the NVLink rate NVLS reaches; Volta and Ampere have no NVLS."""

TREE_CORRECTION: tuple[tuple[float, ...], ...] = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9),
)
"""``treeCorrectionFactor[protocol][log2(bytes / 64)]``: NCCL's static correction of tree all-reduce
bandwidth at medium sizes (powers of two from 64 B; 1.0 beyond the table)."""

RING_PLATEAU = {"pre-ampere": 1.9, "ampere+": 1.4}
"""Multi-node ring/Simple all-reduce latency factor once each channel moves >= 64 B per rank."""


@dataclass(frozen=True)
class GroupShape:
    """What NCCL's model needs to know about a group on the topology."""

    ranks: int
    """n: ranks in the group."""
    nodes: int
    """m: nodes the group spans."""
    intra_hw: str
    """``nvlink`` or ``pci``: the class of the hops inside a node."""
    intra_hop_us: float
    """Simple ring hop latency inside a node (the profile's intra-node link latency)."""
    net_hop_us: float
    """Simple ring hop latency between nodes (NIC plus switches on the group's routes); 0 in one node."""
    cpu_vendor: str
    """Host CPU vendor (network posting overhead, LL ceiling across nodes)."""
    arch: str
    """GPU generation (LL ceiling in one node, NVLS efficiency, ring plateau factor)."""
    channels: int
    """Rings (or trees) the group runs in parallel: one per NIC rail the group uses across nodes."""


def _scaled(hw: str, algo: str, proto: str, hop_us: float) -> float:
    """A profile's Simple ring hop latency scaled to (algorithm, protocol) by NCCL's table ratio."""
    simple_ring = HW_LATENCY_US[(hw, "ring")][2]
    return hop_us * HW_LATENCY_US[(hw, algo)][_P[proto]] / simple_ring


def latency_us(kind: str, algo: str, proto: str, shape: GroupShape, nbytes: float) -> float:
    """NCCL's latency for one call of ``kind`` with (``algo``, ``proto``) on a group of ``shape``.

    ``kind`` is one of ``all_reduce``, ``reduce_scatter``, ``all_gather``, ``broadcast``, ``reduce``;
    ``nbytes`` (the call's size in the nccl-tests convention) matters only for the ring plateau.
    """
    n, m = shape.ranks, shape.nodes
    p = _P[proto]
    base = BASE_LATENCY_US[algo][p]
    intra_hw = shape.intra_hw
    if algo == "nvls":
        lat = _scaled("nvlink", "nvls", "Simple", shape.intra_hop_us)
        return lat + (_scaled("net", "nvls", "Simple", shape.net_hop_us) if m > 1 else 0.0)
    if algo == "tree":
        intra = _scaled(intra_hw, "tree", proto, shape.intra_hop_us)
        inter = _scaled("net", "tree", proto, shape.net_hop_us)
        return base + 2 * ((n / m - 1) * intra + (int(math.log2(m)) if m > 1 else 0) * inter)
    if algo == "pat":
        inter = _scaled("net", "pat", "Simple", shape.net_hop_us)
        return base + (int(math.log2(m)) if m > 1 else 0) * inter / 3.5 + 2.8 * n
    # ring
    if kind in ("broadcast", "reduce"):
        hw, hop = ("net", shape.net_hop_us) if m > 1 else (intra_hw, shape.intra_hop_us)
        return base + n * _scaled(hw, "tree" if proto == "Simple" else "ring", proto, hop)
    nsteps = 2 * (n - 1) if kind == "all_reduce" else n - 1
    n_inter = 0 if m == 1 else (2 * (m - 1) if kind == "all_reduce" else m - 1)
    intra = _scaled(intra_hw, "ring", proto, shape.intra_hop_us)
    if m > 1:
        overhead = NET_OVERHEAD_US.get(shape.cpu_vendor, 1.0) * (3 if proto == "Simple" else 1)
        intra = max(intra, overhead)
    # With one rank per node every hop is exposed: NCCL prices it with the tree's network figure.
    inter = _scaled("net", "tree" if n == m else "ring", proto, shape.net_hop_us)
    lat = base + (nsteps - n_inter) * intra + n_inter * inter
    if kind == "all_reduce" and proto == "Simple" and m > 1 and nbytes / (shape.channels * n) >= 64:
        lat *= RING_PLATEAU["pre-ampere" if shape.arch == "volta" else "ampere+"]
    return lat


def protocol_enabled(proto: str, algo: str, intra_hw: str) -> bool:
    """Whether NCCL runs this protocol by default: LL128 only where the GPUs talk over NVLink (NCCL
    enables it up to ``PATH_NVB`` inside a node); NVLS and PAT only with Simple."""
    if algo in ("nvls", "pat"):
        return proto == "Simple"
    if proto == "LL128":
        return intra_hw == "nvlink"
    return True


def bandwidth_factor(kind: str, algo: str, proto: str, shape: GroupShape, nbytes: float,
                     simple_busbw_GBps: float) -> float:
    """Multiplier on the topology's Simple-protocol bandwidth for (algorithm, protocol) at this size.

    ``simple_busbw_GBps`` is the Simple bus bandwidth of the algorithm on the topology (needed for the
    absolute LL ceiling). NVLS's efficiency is applied by the caller to its own traffic pattern.
    """
    bus = simple_busbw_GBps
    if algo == "ring":
        if proto == "LL":
            return _capped(bus, 0.5, _ll_max(shape))
        return 0.92 if proto == "LL128" else 1.0
    if algo == "pat":
        return 0.75
    if algo == "nvls":
        return NVLS_EFFICIENCY.get(shape.arch, 0.0)
    # tree (all-reduce only)
    factor = 0.92
    if proto == "LL":
        factor = _capped(bus * factor, 1 / 3.8, _ll_max(shape)) * factor
    elif proto == "LL128":
        factor *= 7 / 9 if shape.nodes == 1 else 120 / 128
    log_size = int(math.log2(nbytes / 64)) if nbytes >= 64 else -1
    if 0 <= log_size < 23:
        factor *= TREE_CORRECTION[_P[proto]][log_size]
    return factor


def _capped(bus_GBps: float, factor: float, cap_GBps: float) -> float:
    """``min(bus * factor, cap) / bus``: a factor with an absolute ceiling, as a factor."""
    if bus_GBps <= 0 or math.isinf(bus_GBps):
        return factor
    return min(bus_GBps * factor, cap_GBps) / bus_GBps


def _ll_max(shape: GroupShape) -> float:
    if shape.nodes == 1:
        return LL_MAX_BW_GBPS_ONE_NODE.get(shape.arch, LL_MAX_BW_GBPS_ONE_NODE["ampere"])
    two, more = LL_MAX_BW_GBPS_NODES.get(shape.cpu_vendor, LL_MAX_BW_GBPS_NODES["intel"])
    return two if shape.nodes == 2 else more
