"""Collective algorithms as sequences of phases of concurrent transfers.

A :class:`Phase` is one algorithm step: its transfers start together, share links with whatever else is
in flight (the engine's flow mode), and the step ends when the last one arrives plus ``latency_s`` (the
per-step latency of the slowest hop: link latencies plus protocol handshake). A phase with
``repeat = k`` happens k times back to back, which keeps a ring's 2(n-1) identical steps one object.

Algorithms (``S`` = bytes in the nccl-tests convention of :class:`simgrid.ir.ops.Collective`, ``n``
ranks, ranks sorted so rings follow node-major placement the way NCCL's topology search orders them):

* ring all-reduce: 2(n-1) steps, each rank sends S/n to its ring successor (reduce-scatter then
  all-gather; Thakur, Rabenseifner & Gropp 2005, sec. 4.4; Patarasuk & Yuan 2009). Reduce-scatter and
  all-gather: n-1 such steps.
* ring broadcast / reduce: a pipelined chain from (to) the root. With the message cut into many small
  segments every chain link carries S once, concurrently, so one phase moves S over each hop and its
  latency is the chain's n-1 hops (Thakur et al. 2005 sec. 4.1; nccl-tests busbw factor 1).
* pairwise all-to-all: every rank sends S/n to every other rank at once (NCCL issues all the
  send/recv pairs in one group call); latency (n-1) steps as in Thakur et al.'s pairwise exchange.
* hierarchical (multi-node groups with g ranks on each of m nodes): intra-node ring reduce-scatter,
  then g concurrent inter-node rings (local rank j of every node, one per NIC on a rail-optimised
  fabric) each all-reducing S/g, then intra-node ring all-gather. Reduce-scatter / all-gather use the
  matching half.
* tree all-reduce: NCCL's double binary tree over nodes (Sanders, Speck & Traeff 2009; NCCL 2.4 blog,
  "Massively scale your deep learning training with NCCL 2.4", 2019) with an intra-node chain. Each tree
  carries S/2; a reduce phase up both trees then a broadcast phase down them. Both phases are
  pipelined, so each moves its data once over every edge; the latency per phase is the chain depth
  (g-1 intra-node hops) plus the tree depth (ceil(log2 m) inter-node hops), as in NCCL's tuning model
  (src/graph/tuning.cc: ``2 * ((nRanks/nNodes-1) * intraLat + log2i(nNodes) * interLat)`` for both).
  Tree edges use the node leader (the group's first rank on each node), i.e. one NIC per node: a
  single channel, which is why NCCL only prefers trees for small and medium sizes.
"""

from __future__ import annotations

import math
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


def _hop_latency_s(topo: Topology, pairs: Sequence[tuple[int, int]]) -> float:
    """Per-step latency: the slowest hop of the step (all hops run in parallel)."""
    return max((topo.route_latency_s(a, b) for a, b in pairs), default=0.0)


def _ring_pairs(ring: Sequence[int]) -> list[tuple[int, int]]:
    n = len(ring)
    return [(ring[i], ring[(i + 1) % n]) for i in range(n)] if n > 1 else []


def _ring_phase(topo: Topology, rings: Sequence[Sequence[int]], chunk: float, steps: int) -> list[Phase]:
    """``steps`` steps in which every rank of every ring sends ``chunk`` bytes to its successor."""
    pairs = [p for ring in rings for p in _ring_pairs(ring)]
    if not pairs or steps <= 0:
        return []
    transfers = tuple((a, b, chunk) for a, b in pairs)
    return [Phase(transfers, _hop_latency_s(topo, pairs), steps)]


def ring_phases(kind: str, nbytes: float, ranks: Sequence[int], topo: Topology) -> list[Phase]:
    """Flat single ring over all ranks (all_reduce, reduce_scatter, all_gather)."""
    n = len(ranks)
    steps = 2 * (n - 1) if kind == "all_reduce" else n - 1
    return _ring_phase(topo, [ranks], nbytes / n, steps)


def chain_phases(kind: str, nbytes: float, ranks: Sequence[int], topo: Topology, root: int) -> list[Phase]:
    """Pipelined chain broadcast (from ``root``) or reduce (to ``root``)."""
    start = ranks.index(root)
    chain = list(ranks[start:]) + list(ranks[:start])
    pairs = [(chain[i], chain[i + 1]) for i in range(len(chain) - 1)]
    if kind == "reduce":
        pairs = [(b, a) for a, b in reversed(pairs)]
    if not pairs:
        return []
    latency = sum(topo.route_latency_s(a, b) for a, b in pairs)
    return [Phase(tuple((a, b, nbytes) for a, b in pairs), latency, 1)]


def pairwise_phases(nbytes: float, ranks: Sequence[int], topo: Topology) -> list[Phase]:
    """All-to-all: every rank sends ``nbytes / n`` to each other rank concurrently."""
    n = len(ranks)
    pairs = [(a, b) for a in ranks for b in ranks if a != b]
    if not pairs:
        return []
    # Step latency of the pairwise exchange: n-1 steps (Thakur et al. 2005, sec. 4.5).
    latency = (n - 1) * _hop_latency_s(topo, pairs)
    return [Phase(tuple((a, b, nbytes / n) for a, b in pairs), latency, 1)]


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
    """Double binary tree all-reduce over node leaders plus intra-node chains (reduce up, broadcast down)."""
    nodes = ranks_by_node(ranks, topo)
    leaders = [local[0] for local in nodes]
    # Second tree: the first mirrored, so a leader internal in one tree is a leaf in the other
    # (Sanders et al. 2009: every PE sends and receives at most one block per step).
    trees = [_binary_tree_edges(leaders), _binary_tree_edges(leaders[::-1])] if len(leaders) > 1 else []
    chain_edges = [(local[i + 1], local[i]) for local in nodes for i in range(len(local) - 1)]
    up: list[TransferTriple] = [(a, b, nbytes) for a, b in chain_edges]
    for edges in trees:
        up += [(c, p, nbytes / 2) for c, p in edges]
    down = [(b, a, s) for a, b, s in up]
    g_depth = max(len(local) for local in nodes) - 1
    m = len(nodes)
    intra_lat = _hop_latency_s(topo, chain_edges)
    inter_lat = _hop_latency_s(topo, [e for edges in trees for e in edges])
    latency = g_depth * intra_lat + math.ceil(math.log2(m)) * inter_lat if m > 1 else g_depth * intra_lat
    if not up:
        return []
    return [Phase(tuple(up), latency, 1), Phase(tuple(down), latency, 1)]


def scale_phases(phases: Sequence[Phase], *, bytes_factor: float = 1.0, latency_factor: float = 1.0) -> list[Phase]:
    """Phases with every transfer's bytes and every latency scaled (unit phases -> a real message)."""
    return [
        replace(p, transfers=tuple((a, b, s * bytes_factor) for a, b, s in p.transfers),
                latency_s=p.latency_s * latency_factor)
        for p in phases
    ]


PhaseBuilder = Callable[[str, float, Sequence[int], Topology], list[Phase]]
