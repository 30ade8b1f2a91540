"""Collective algorithms as sequences of phases of concurrent transfers (the bandwidth part).

A :class:`Phase` is one algorithm step: its transfers start together and share links with whatever
else is in flight (the engine's flow mode); the step ends when the last one arrives. ``repeat = k``
stands for k identical steps back to back, which keeps a ring's 2(n-1) steps one object. Phases carry no
latency of their own (``latency_s`` is 0 here): a collective's latency is NCCL's model of the whole call
(:mod:`simgrid.costs.nccl`), which :func:`simgrid.costs.collective_phases` puts in a leading
transfer-free phase.

Algorithms (``S`` = bytes in the nccl-tests convention of :class:`simgrid.ir.ops.Collective`, ``n``
ranks, ranks sorted so rings follow node-major placement the way NCCL's topology search orders them):

* ring all-reduce: 2(n-1) steps, each rank sends S/n to its ring successor (reduce-scatter then
  all-gather; Thakur, Rabenseifner & Gropp 2005, sec. 4.4; Patarasuk & Yuan 2009). Reduce-scatter and
  all-gather: n-1 such steps. Across nodes, one ring per NIC rail the group uses (:func:`ring_phases`).
* NVLS (NVLink SHARP, NVSwitch of H100-class nodes): the switch reduces and multicasts
  (:func:`nvls_phases`).
* ring broadcast / reduce: a pipelined chain from (to) the root. With the message cut into many small
  segments every chain link carries S once, concurrently (Thakur et al. 2005 sec. 4.1; nccl-tests
  busbw factor 1).
* pairwise all-to-all: every rank sends S/n to every other rank at once (NCCL issues all the
  send/recv pairs in one group call).
* hierarchical (multi-node groups with g ranks on each of m nodes; not an NCCL algorithm, kept for
  explicit what-if use): intra-node ring reduce-scatter, then g concurrent inter-node rings (local rank
  j of every node, one per NIC rail) each all-reducing S/g, then intra-node ring all-gather.
* tree all-reduce: NCCL's double binary trees over nodes with intra-node chains, one per channel
  (Sanders, Speck & Traeff 2009; NCCL 2.4 blog, "Massively scale your deep learning training with NCCL
  2.4", 2019). A reduce phase up, a broadcast phase down; both pipelined, so each moves its data once
  over every edge.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from simgrid.topology import Topology

TransferTriple = tuple[int, int, float]
"""(source rank, destination rank, bytes)."""


@dataclass(frozen=True)
class Phase:
    """One algorithm step: concurrent transfers, then the step latency; ``repeat`` times in a row."""

    transfers: tuple[TransferTriple, ...]
    """(src, dst, bytes) moved concurrently in this step; empty for a pure-latency step."""
    latency_s: float
    """Latency paid once per repetition on top of the transfer time."""
    repeat: int = 1
    """How many identical steps this phase stands for."""

    @property
    def bytes_per_repeat(self) -> float:
        """Bytes moved by one repetition (all transfers)."""
        return sum(t[2] for t in self.transfers)

    @property
    def total_bytes(self) -> float:
        """Bytes moved by all repetitions."""
        return self.bytes_per_repeat * self.repeat


def _ring_pairs(ring: Sequence[int]) -> list[tuple[int, int]]:
    n = len(ring)
    return [(ring[i], ring[(i + 1) % n]) for i in range(n)] if n > 1 else []


def _ring_phase(topo: Topology, rings: Sequence[Sequence[int]], chunk: float, steps: int) -> list[Phase]:
    """``steps`` steps in which every rank of every ring sends ``chunk`` bytes to its successor."""
    pairs = [p for ring in rings for p in _ring_pairs(ring)]
    if not pairs or steps <= 0:
        return []
    transfers = tuple((a, b, chunk) for a, b in pairs)
    return [Phase(transfers, 0.0, steps)]


def ring_phases(kind: str, nbytes: float, ranks: Sequence[int], topo: Topology) -> list[Phase]:
    """NCCL's rings for all_reduce, reduce_scatter and all_gather (steps on S/n chunks).

    In one node, or when the group's nodes hold different numbers of its ranks: one ring over the
    sorted ranks. Across nodes with ``c`` ranks on each: ``c`` rings (NCCL channels), each carrying
    S/c and leaving every node on its own NIC rail: ring ``j`` enters node k at the group's ``j``-th
    local rank, visits the others over NVLink, and the last one hands the chunk back over NVLink to the
    ``j``-th rank (PXN, NCCL >= 2.12), whose NIC sends it to the next node's ``j``-th rank on the same
    rail. So every GPU's NVLink port carries S/n per step, as a flat ring's would, and each NIC S/(c n).
    """
    n = len(ranks)
    steps = 2 * (n - 1) if kind == "all_reduce" else n - 1
    nodes = ranks_by_node(ranks, topo)
    if len(nodes) == 1 or not is_uniform(nodes) or len(nodes[0]) == 1:
        return _ring_phase(topo, [ranks], nbytes / n, steps)
    c = len(nodes[0])
    chunk = nbytes / (c * n)
    transfers: list[TransferTriple] = []
    for j in range(c):
        for k, local in enumerate(nodes):
            order = local[j:] + local[:j]
            transfers += [(order[i], order[i + 1], chunk) for i in range(c - 1)]
            transfers.append((order[-1], order[0], chunk))  # PXN: back to the rail GPU over NVLink
            transfers.append((order[0], nodes[(k + 1) % len(nodes)][j], chunk))
    return [Phase(tuple(transfers), 0.0, steps)] if steps > 0 else []


def nvls_phases(kind: str, nbytes: float, ranks: Sequence[int], topo: Topology) -> list[Phase]:
    """NVLink SHARP in one node (NCCL's NVLS algorithm): the NVSwitch reduces and multicasts.

    All-reduce: each GPU sends its whole buffer S once into the switch, which returns the reduced S/g
    shard it owns (``multimem.ld_reduce``); the GPU stores the reduced shard once and the switch
    multicasts it to all g GPUs (``multimem.st``). NCCL pipelines both halves, so one step moves
    S (1 + 1/g) out of and into every GPU's NVLink port, against 2(g-1)/g S for a ring.
    Reduce-scatter is the first half (out S, in S/g), all-gather the second (out S/g, in S).
    """
    from simgrid.topology.topology import NVSWITCH

    g = len(ranks)
    out_bytes, in_bytes = {"all_reduce": (nbytes * (1 + 1 / g), nbytes * (1 + 1 / g)),
                           "reduce_scatter": (nbytes, nbytes / g),
                           "all_gather": (nbytes / g, nbytes)}[kind]
    transfers = [(r, NVSWITCH, out_bytes) for r in ranks] + [(NVSWITCH, r, in_bytes) for r in ranks]
    return [Phase(tuple(transfers), 0.0, 1)]


def chain_phases(kind: str, nbytes: float, ranks: Sequence[int], topo: Topology, root: int) -> list[Phase]:
    """Pipelined chain broadcast (from ``root``) or reduce (to ``root``)."""
    start = ranks.index(root)
    chain = list(ranks[start:]) + list(ranks[:start])
    pairs = [(chain[i], chain[i + 1]) for i in range(len(chain) - 1)]
    if kind == "reduce":
        pairs = [(b, a) for a, b in reversed(pairs)]
    if not pairs:
        return []
    return [Phase(tuple((a, b, nbytes) for a, b in pairs), 0.0, 1)]


def pairwise_phases(nbytes: float, ranks: Sequence[int], topo: Topology) -> list[Phase]:
    """All-to-all: every rank sends ``nbytes / n`` to each other rank concurrently."""
    n = len(ranks)
    pairs = [(a, b) for a in ranks for b in ranks if a != b]
    if not pairs:
        return []
    return [Phase(tuple((a, b, nbytes / n) for a, b in pairs), 0.0, 1)]


def ranks_by_node(ranks: Sequence[int], topo: Topology) -> list[list[int]]:
    """The group's ranks split by node, nodes in order, ranks in order within each node."""
    by_node: dict[int, list[int]] = {}
    for r in ranks:
        by_node.setdefault(topo.node_of(r), []).append(r)
    return [by_node[k] for k in sorted(by_node)]


def is_uniform(nodes: Sequence[Sequence[int]]) -> bool:
    """Whether every node holds the same number of the group's ranks (needed for hierarchical)."""
    return len({len(local) for local in nodes}) == 1


def hierarchical_phases(kind: str, nbytes: float, ranks: Sequence[int], topo: Topology) -> list[Phase]:
    """Intra-node reduce-scatter, inter-node rings on S/g per local rank, intra-node all-gather."""
    nodes = ranks_by_node(ranks, topo)
    g, m = len(nodes[0]), len(nodes)
    per_local = nbytes / g
    # Inter-node rings: local rank j of every node, so each rides its own NIC (rail) in parallel.
    inter_rings = [[local[j] for local in nodes] for j in range(g)]
    intra_rs = _ring_phase(topo, nodes, per_local, g - 1)
    intra_ag = _ring_phase(topo, nodes, per_local, g - 1)
    if kind == "all_reduce":
        return intra_rs + _ring_phase(topo, inter_rings, per_local / m, 2 * (m - 1)) + intra_ag
    if kind == "reduce_scatter":
        return intra_rs + _ring_phase(topo, inter_rings, per_local / m, m - 1)
    return _ring_phase(topo, inter_rings, per_local / m, m - 1) + intra_ag  # all_gather


def _binary_tree_edges(order: Sequence[int]) -> list[tuple[int, int]]:
    """(child, parent) edges of a balanced binary tree laid out in heap order over ``order``."""
    return [(order[i], order[(i - 1) // 2]) for i in range(1, len(order))]


def tree_phases(nbytes: float, ranks: Sequence[int], topo: Topology) -> list[Phase]:
    """NCCL's double binary tree all-reduce: a reduce phase up, then a broadcast phase down.

    With ``c`` ranks of the group on every node there are ``c`` channels, each carrying S/c: channel
    ``j`` chains the node's ranks into its ``j``-th rank (the node's leader for that channel, on NIC
    rail ``j``), and the leaders form two complementary binary trees of S/(2c) each (the second
    mirrored, so a leader inner in one tree is a leaf in the other; Sanders et al. 2009). Groups with
    uneven nodes use one channel led by each node's first rank.
    """
    nodes = ranks_by_node(ranks, topo)
    c = len(nodes[0]) if is_uniform(nodes) else 1
    up: list[TransferTriple] = []
    for j in range(c):
        rotated = [local[j:] + local[:j] for local in nodes]
        up += [(order[i + 1], order[i], nbytes / c) for order in rotated for i in range(len(order) - 1)]
        leaders = [order[0] for order in rotated]
        if len(leaders) > 1:
            for edges in (_binary_tree_edges(leaders), _binary_tree_edges(leaders[::-1])):
                up += [(child, parent, nbytes / (2 * c)) for child, parent in edges]
    if not up:
        return []
    down = [(b, a, s) for a, b, s in up]
    return [Phase(tuple(up), 0.0, 1), Phase(tuple(down), 0.0, 1)]


def scale_phases(phases: Sequence[Phase], *, bytes_factor: float = 1.0, latency_factor: float = 1.0) -> list[Phase]:
    """Phases with every transfer's bytes and every latency scaled (unit phases -> a real message)."""
    return [
        replace(p, transfers=tuple((a, b, s * bytes_factor) for a, b, s in p.transfers),
                latency_s=p.latency_s * latency_factor)
        for p in phases
    ]


PhaseBuilder = Callable[[str, float, Sequence[int], Topology], list[Phase]]
