"""Collective communication time: NCCL's cost model with the bandwidth taken from the topology.

A call of S bytes (nccl-tests convention) with algorithm ``a`` and protocol ``p`` costs

    time = latency(a, p)  +  S * (seconds per byte on the topology, Simple protocol) / factor(a, p, S)

as NCCL's tuner estimates it (``ncclTopoGetAlgoTime``, NVIDIA/nccl src/graph/tuning.cc; Hockney's
alpha-beta form). The latency grows with the algorithm's steps: a ring all-reduce has 2(n-1) steps, a
ring all-gather or reduce-scatter n-1, a tree 2 log2(m) network hops; the constants and the protocol
factors are NCCL's (:mod:`simgrid.costs.nccl`). The bandwidth term is not a constant either: the steps
of :mod:`simgrid.costs.phases` are laid on the topology's routes and each step takes ``max over links
of (bytes crossing the link / link bandwidth)``, so a ring that spans nodes is limited by the NICs it
uses (one ring per NIC rail, as NCCL's channels), a ring inside an NVSwitch node by the GPU's NVLink
port, NVLS by the port's traffic to the switch. For these symmetric algorithms this equals the flow-mode
result of simulating the same phases with fair sharing. Uniform links reduce it to the textbook forms
(Thakur, Rabenseifner & Gropp 2005, Table 1): ring all-reduce 2(n-1)/n S/B, all-gather and
reduce-scatter (n-1)/n S/B, pipelined broadcast S/B, tree all-reduce 2 S/B.

Algorithm and protocol choice (``algorithm="auto"``): every pair NCCL would consider is timed and the
fastest taken, as NCCL's tuner does: ring and tree for all-reduce (NVLS too inside an NVSwitch node with
NVLink SHARP), ring for all-gather and reduce-scatter (NVLS in such a node, PAT with one rank per
node), ring (a pipelined chain) for broadcast and reduce; protocols LL, LL128 (NVLink nodes) and Simple.
All-to-all is NCCL's grouped send/receive, which its tuner does not price: pairwise exchange with NCCL's
Simple base latency and (n-1) route latencies. ``hierarchical`` (intra-node reduce-scatter, inter-node
rings, intra-node all-gather) is not an NCCL algorithm; it stays available by name for what-if studies.
Not modelled: CollNet/SHARP in the InfiniBand switches, NVLS across nodes (NVLS-tree), NCCL's
per-channel bandwidth caps. A latency-free profile (every link and switch latency 0, e.g. ``ideal``)
has no latency at all.

Message-size efficiency inside a node: where the node profile carries a published nccl-tests curve of
its GPU fabric (``[intra_busbw_curve]``), an all-reduce, all-gather or reduce-scatter whose group sits in
one node takes at least the time at which its bus bandwidth is that curve's fraction of the model's own
large-message bandwidth, at the call's bytes per rank (:mod:`simgrid.costs.busbw_curve`). Inter-node
calls are unchanged (no published multi-node curve is used).

Measured tables: when the cluster profile has measured times for (kind, group size) and the algorithm is
"auto", they replace the formula (times ``count``).

``ring_exchange`` is not an NCCL call: one step of the peer-to-peer ring exchange that Transformer Engine's
userbuffers (``CommOverlapP2P``) run beside their GEMM chunks: ``userbuffers_send`` is a ``cudaMemcpyAsync``
into the peer's registered buffer plus a one-thread flag kernel (TE userbuffers, ``use_ce = True``, the
default of ``initialize_ub``). Every member copies ``S`` bytes to its
ring successor at once: the step costs the route latency (one copy crosses it once; no NCCL protocol or
base latency) plus the transfer time on the busiest link, as a send/receive of ``S`` bytes would
(:func:`simgrid.costs.p2p_time_s`).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

from simgrid.costs import nccl
from simgrid.costs.busbw_curve import size_fraction
from simgrid.costs.phases import (
    Phase,
    chain_phases,
    hierarchical_phases,
    is_uniform,
    nvls_phases,
    pairwise_phases,
    ranks_by_node,
    ring_phases,
    scale_phases,
    tree_phases,
)
from simgrid.errors import SimgridError
from simgrid.ir.ops import COLLECTIVE_KINDS
from simgrid.topology import Topology

NCCL_BASE_LATENCY_US = nccl.BASE_LATENCY_US["ring"][2]
"""Fixed cost of one NCCL ring call with the Simple protocol (``baseLat``, 8.4 us, tuning.cc)."""

ALGORITHMS: dict[str, tuple[str, ...]] = {
    "all_reduce": ("ring", "tree", "nvls", "hierarchical"),
    "reduce_scatter": ("ring", "nvls", "pat", "hierarchical"),
    "all_gather": ("ring", "nvls", "pat", "hierarchical"),
    "broadcast": ("ring",),
    "reduce": ("ring",),
    "all_to_all": ("pairwise",),
    "barrier": ("ring", "tree", "nvls", "hierarchical"),
    "ring_exchange": ("ring",),
}
"""Algorithms each collective kind supports (besides ``auto``)."""

_BUSBW_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n,
                 "all_gather": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n}

_Plan = tuple[float, nccl.GroupShape]  # (seconds per byte of S, Simple protocol; the group's shape)
_plans: weakref.WeakKeyDictionary[Topology, dict[tuple[object, ...], _Plan]] = weakref.WeakKeyDictionary()
_exact_plans: weakref.WeakKeyDictionary[Topology, dict[tuple[object, ...], _Plan]] = weakref.WeakKeyDictionary()
_candidate_memo: weakref.WeakKeyDictionary[Topology, dict[tuple[str, tuple[int, ...]], tuple[str, ...]]] = (
    weakref.WeakKeyDictionary()
)
_call_memo: weakref.WeakKeyDictionary[Topology, dict[tuple[object, ...], float]] = weakref.WeakKeyDictionary()
"""Seconds of one call by (kind, group shape, algorithm, protocol, root index, size): groups of one shape
have one answer (the symmetry check asks about every replica's group)."""
_peak_memo: weakref.WeakKeyDictionary[Topology, dict[tuple[object, ...], float]] = weakref.WeakKeyDictionary()
"""Large-message bus bandwidth (GB/s) of a group by (kind, group shape), for the size-efficiency floor."""
_CURVE_KINDS = ("all_reduce", "all_gather", "reduce_scatter")


def base_latency_s(topo: Topology) -> float:
    """NCCL's ring/Simple base latency, or 0 on a latency-free profile (which then has no latency at all)."""
    node, net = topo.cluster.node, topo.cluster.network
    latencies = (node.intra_link.latency_us, node.pcie_link.latency_us, node.nic_link.latency_us,
                 net.switch_latency_us)
    return NCCL_BASE_LATENCY_US * 1e-6 if any(lat > 0 for lat in latencies) else 0.0


def _check(kind: str, ranks: Sequence[int], algorithm: str, count: int, nbytes: float,
           root: int | None = None) -> tuple[int, ...]:
    if kind not in COLLECTIVE_KINDS:
        raise SimgridError(f"collective kind = {kind!r} is unknown; use one of {', '.join(COLLECTIVE_KINDS)}")
    if algorithm != "auto" and algorithm not in ALGORITHMS[kind]:
        raise SimgridError(
            f"algorithm = {algorithm!r} is not available for {kind}; use 'auto' or one of "
            + ", ".join(repr(a) for a in ALGORITHMS[kind])
        )
    if not ranks:
        raise SimgridError("ranks = () is empty; a collective needs at least one rank")
    if len(set(ranks)) != len(ranks):
        raise SimgridError(f"ranks = {tuple(ranks)!r} repeats a rank; list each group member once")
    if not isinstance(count, int) or count < 1:
        raise SimgridError(f"count = {count!r} must be an integer >= 1 (collectives folded into one op)")
    if nbytes < 0:
        raise SimgridError(f"nbytes = {nbytes!r} must be >= 0")
    if root is not None and root not in ranks:
        raise SimgridError(f"root = {root!r} is not in the group {tuple(ranks)!r}; pick a member as root")
    return tuple(sorted(ranks))


def _usable(kind: str, algorithm: str, ranks: tuple[int, ...], topo: Topology) -> str | None:
    """Why ``algorithm`` cannot run this group (None when it can)."""
    nodes = ranks_by_node(ranks, topo)
    node = topo.cluster.node
    if algorithm == "hierarchical" and not is_uniform(nodes):
        return (f"needs the same number of group ranks on every node; this group has "
                f"{sorted({len(n) for n in nodes})} ranks per node")
    if algorithm == "nvls":
        if not node.nvlink_sharp or node.gpu_arch not in nccl.NVLS_EFFICIENCY:
            return f"needs an NVSwitch with NVLink SHARP (node {node.name!r} has nvlink_sharp = false)"
        if len(nodes) > 1:
            return "runs inside one node (NVLS across nodes needs CollNet, which is not modelled)"
    if algorithm == "pat" and len(nodes) != len(ranks):
        return "needs one group rank per node (NCCL's PAT condition)"
    return None


def _unit_phases(kind: str, ranks: tuple[int, ...], topo: Topology, algorithm: str,
                 root: int | None) -> list[Phase]:
    """Phases for S = 1 byte (bytes scale linearly)."""
    if len(ranks) == 1:
        return []
    if kind in ("broadcast", "reduce"):
        return chain_phases(kind, 1.0, ranks, topo, ranks[0] if root is None else root)
    if kind == "all_to_all":
        return pairwise_phases(1.0, ranks, topo)
    op = "all_reduce" if kind == "barrier" else kind
    why = _usable(op, algorithm, ranks, topo)
    if why is not None:
        raise SimgridError(f"algorithm = {algorithm!r} {why}; use algorithm='auto' or 'ring'")
    if algorithm == "tree":
        return tree_phases(1.0, ranks, topo)
    if algorithm == "hierarchical":
        return hierarchical_phases(op, 1.0, ranks, topo)
    if algorithm == "nvls":
        return nvls_phases(op, 1.0, ranks, topo)
    return ring_phases(op, 1.0, ranks, topo)  # ring and PAT move the same bytes


def ring_exchange_phase(nbytes: float, ranks: Sequence[int]) -> Phase:
    """The one transfer phase of a ring-exchange step: every rank sends ``nbytes`` to its successor in
    ``ranks`` order (the group's order, as TE's ``_next_rank`` = rank + 1 in the tensor-parallel domain)."""
    n = len(ranks)
    return Phase(tuple((ranks[i], ranks[(i + 1) % n], float(nbytes)) for i in range(n)), 0.0, 1)


def _ring_exchange_costs(nbytes: float, ranks: tuple[int, ...], topo: Topology) -> tuple[float, float]:
    """(transfer seconds, latency seconds) of one ring-exchange step of ``nbytes`` per rank."""
    memo = _call_memo.setdefault(topo, {})
    key = ("ring_exchange", group_signature(ranks, topo), nbytes)
    found = memo.get(key)
    if found is None:
        transfer = phase_cost(ring_exchange_phase(nbytes, ranks), topo)[0] if nbytes > 0 else 0.0
        latency = max(topo.route_latency_s(a, b) for a, b in zip(ranks, ranks[1:] + ranks[:1], strict=True))
        memo[key] = transfer
        memo[(*key, "latency")] = latency
        return transfer, latency
    return found, memo[(*key, "latency")]


def phase_cost(phase: Phase, topo: Topology) -> tuple[float, float]:
    """(transfer seconds, latency seconds) of one repetition: bytes on the busiest link over its rate."""
    load: dict[object, float] = {}
    rate: dict[object, float] = {}
    for src, dst, nbytes in phase.transfers:
        for link in topo.route(src, dst):
            load[link.name] = load.get(link.name, 0.0) + nbytes
            rate[link.name] = link.bandwidth_Bps
    transfer = max((load[k] / rate[k] for k in load if load[k] > 0), default=0.0)
    return transfer, phase.latency_s


def group_signature(ranks: tuple[int, ...], topo: Topology) -> tuple[tuple[int, int, int], ...]:
    """Shape of a group on the topology: per rank (node offset, leaf offset, local index) from the first.

    All nodes and leaves of a cluster are identical, so two groups with the same signature cross
    isomorphic links and have the same cost plan (e.g. the data-parallel groups of every pipeline stage
    of a 16,384-GPU job share one plan per tensor-parallel index).
    """
    g = topo.gpus_per_node
    node0 = ranks[0] // g
    leaf0 = topo.fabric.leaf_of(node0)
    return tuple((r // g - node0, topo.fabric.leaf_of(r // g) - leaf0, r % g) for r in ranks)


def group_shape(ranks: tuple[int, ...], topo: Topology) -> nccl.GroupShape:
    """What NCCL's latency model needs: sizes, hop classes and their latencies (from the routes the
    group's rings use: consecutive ranks inside the first node, rail hops between consecutive nodes)."""
    nodes = ranks_by_node(ranks, topo)
    node = topo.cluster.node
    intra = [topo.route_latency_s(a, b) for a, b in zip(nodes[0], nodes[0][1:], strict=False)]
    intra_us = max(intra) * 1e6 if intra else node.intra_link.latency_us
    inter = [topo.route_latency_s(nodes[k][0], nodes[(k + 1) % len(nodes)][0]) for k in range(len(nodes))]
    net_us = max(inter) * 1e6 if len(nodes) > 1 else 0.0
    return nccl.GroupShape(
        ranks=len(ranks), nodes=len(nodes),
        intra_hw="pci" if node.intra_fabric == "pcie" else "nvlink",
        intra_hop_us=intra_us, net_hop_us=net_us, cpu_vendor=node.cpu_vendor, arch=node.gpu_arch,
        channels=len(nodes[0]) if len(nodes) > 1 and is_uniform(nodes) else 1,
    )


def _plan(kind: str, ranks: tuple[int, ...], topo: Topology, algorithm: str, root: int | None) -> _Plan:
    exact = _exact_plans.setdefault(topo, {})
    exact_key = (kind, ranks, algorithm, root)
    plan = exact.get(exact_key)
    if plan is not None:
        return plan
    per_topo = _plans.setdefault(topo, {})
    root_index = ranks.index(root) if root is not None and kind in ("broadcast", "reduce") else None
    key = (kind, group_signature(ranks, topo), algorithm, root_index)
    plan = per_topo.get(key)
    if plan is None:
        per_byte = sum(phase_cost(phase, topo)[0] * phase.repeat
                       for phase in _unit_phases(kind, ranks, topo, algorithm, root))
        plan = (per_byte, group_shape(ranks, topo))
        per_topo[key] = plan
    exact[exact_key] = plan
    return plan


def _latency_s(kind: str, algorithm: str, proto: str, shape: nccl.GroupShape, size: float,
               topo: Topology, ranks: tuple[int, ...]) -> float:
    """Latency of one call (0 on a latency-free profile)."""
    if base_latency_s(topo) == 0:
        return 0.0
    op = "all_reduce" if kind == "barrier" else kind
    if op == "all_to_all":
        hops = max(topo.route_latency_s(a, b) for a in ranks[:1] for b in ranks if b != a)
        return NCCL_BASE_LATENCY_US * 1e-6 + (shape.ranks - 1) * hops
    if algorithm == "hierarchical":
        per_node, m = shape.ranks // shape.nodes, shape.nodes
        intra = nccl.GroupShape(per_node, 1, shape.intra_hw, shape.intra_hop_us, 0.0, shape.cpu_vendor,
                                shape.arch, 1)
        inter = nccl.GroupShape(m, m, shape.intra_hw, shape.intra_hop_us, shape.net_hop_us, shape.cpu_vendor,
                                shape.arch, 1)
        parts = {"all_reduce": [("reduce_scatter", intra), ("all_reduce", inter), ("all_gather", intra)],
                 "reduce_scatter": [("reduce_scatter", intra), ("reduce_scatter", inter)],
                 "all_gather": [("all_gather", inter), ("all_gather", intra)]}[op]
        return sum(nccl.latency_us(k, "ring", "Simple", s, size) for k, s in parts if s.ranks > 1) * 1e-6
    return nccl.latency_us(op, algorithm, proto, shape, size) * 1e-6


def _protocols(algorithm: str, shape: nccl.GroupShape, latency_free: bool) -> tuple[str, ...]:
    if latency_free or algorithm in ("hierarchical", "pairwise"):
        return ("Simple",)  # without latency the highest-bandwidth protocol always wins
    return tuple(p for p in nccl.PROTOCOLS if nccl.protocol_enabled(p, algorithm, shape.intra_hw))


def _call_time(kind: str, algorithm: str, proto: str, size: float, plan: _Plan, topo: Topology,
               ranks: tuple[int, ...]) -> float:
    """Seconds of one call of ``size`` bytes with (algorithm, protocol)."""
    per_byte, shape = plan
    data = 0.0 if kind == "barrier" else size
    lat = _latency_s(kind, algorithm, proto, shape, data, topo, ranks)
    if data == 0 or per_byte == 0:
        return lat
    factor = 1.0
    if algorithm not in ("hierarchical", "pairwise") and kind not in ("broadcast", "reduce"):
        busbw = _BUSBW_FACTOR.get(kind, lambda n: 1.0)(shape.ranks) / per_byte / 1e9
        factor = nccl.bandwidth_factor(kind, algorithm, proto, shape, data, busbw)
    return lat + per_byte * data / factor


def _peak_busbw_GBps(kind: str, group: tuple[int, ...], topo: Topology) -> float:
    """The model's large-message bus bandwidth of this group: the best NCCL algorithm with Simple."""
    memo = _peak_memo.setdefault(topo, {})
    key = (kind, group_signature(group, topo))
    found = memo.get(key)
    if found is None:
        found = 0.0
        for algo in _candidates(kind, group, topo):
            per_byte, shape = _plan(kind, group, topo, algo, None)
            if per_byte > 0:
                bus = _BUSBW_FACTOR[kind](shape.ranks) / per_byte / 1e9
                found = max(found, bus * nccl.bandwidth_factor(kind, algo, "Simple", shape, 2.0**50, bus))
        memo[key] = found
    return found


def _size_floor_s(kind: str, size: float, group: tuple[int, ...], topo: Topology) -> float:
    """Least time of an intra-node call of ``size`` bytes under the node's published busbw curve (0 when
    the node has none, the group spans nodes, or the kind has no ring steps)."""
    curve = topo.cluster.node.intra_busbw_curve
    if curve is None or kind not in _CURVE_KINDS or size <= 0 or len(ranks_by_node(group, topo)) > 1:
        return 0.0
    peak = _peak_busbw_GBps(kind, group, topo)
    if peak <= 0:
        return 0.0
    n = len(group)
    return _BUSBW_FACTOR[kind](n) * size / (size_fraction(curve, size / n) * peak * 1e9)


def _priced(kind: str, algorithm: str, proto: str, size: float, plan: _Plan, topo: Topology,
            ranks: tuple[int, ...]) -> float:
    """Seconds of one call: NCCL's model, bounded below by the node's published busbw curve."""
    return max(_call_time(kind, algorithm, proto, size, plan, topo, ranks), _size_floor_s(kind, size, ranks, topo))


def _candidates(kind: str, ranks: tuple[int, ...], topo: Topology) -> tuple[str, ...]:
    """Algorithms "auto" chooses among for this group (see module docstring), memoised per group."""
    memo = _candidate_memo.setdefault(topo, {})
    found = memo.get((kind, ranks))
    if found is None:
        op = "all_reduce" if kind == "barrier" else kind
        if op in ("all_reduce", "reduce_scatter", "all_gather"):
            options = [a for a in ALGORITHMS[op] if a != "hierarchical"]
            found = tuple(a for a in options if _usable(op, a, ranks, topo) is None)
        else:
            found = ALGORITHMS[kind][:1]
        memo[(kind, ranks)] = found
    return found


def choose(kind: str, nbytes: float, ranks: Sequence[int], topo: Topology, *, root: int | None = None,
           algorithm: str = "auto", protocol: str = "auto") -> tuple[str, str]:
    """(algorithm, protocol) of the fastest modelled call of ``nbytes`` (NCCL's tuner rule); a named
    ``algorithm`` or ``protocol`` fixes that half of the choice."""
    group = _check(kind, ranks, algorithm, 1, nbytes, root)
    if protocol != "auto" and protocol not in nccl.PROTOCOLS:
        raise SimgridError(f"protocol = {protocol!r} is not one of auto, {', '.join(nccl.PROTOCOLS)}")
    if len(group) == 1:
        return ("ring" if algorithm == "auto" else algorithm, "Simple" if protocol == "auto" else protocol)
    latency_free = base_latency_s(topo) == 0
    best, best_time = ("", ""), float("inf")
    for algo in (_candidates(kind, group, topo) if algorithm == "auto" else (algorithm,)):
        plan = _plan(kind, group, topo, algo, root)
        protocols = _protocols(algo, plan[1], latency_free) if protocol == "auto" else (protocol,)
        for proto in protocols:
            t = _call_time(kind, algo, proto, nbytes, plan, topo, group)
            if t < best_time:
                best, best_time = (algo, proto), t
    if not best[0]:
        raise SimgridError(f"protocol = {protocol!r} does not run {kind} with algorithm {algorithm!r} here; "
                           "use protocol='auto'")
    return best


def choose_algorithm(kind: str, nbytes: float, ranks: Sequence[int], topo: Topology, *,
                     root: int | None = None) -> str:
    """The algorithm "auto" uses for one call of ``nbytes`` (see :func:`choose`)."""
    return choose(kind, nbytes, ranks, topo, root=root)[0]


def collective_time_s(kind: str, nbytes: float, ranks: Sequence[int], topo: Topology, *, count: int = 1,
                      algorithm: str = "auto", root: int | None = None, protocol: str = "auto") -> float:
    """Seconds one collective op takes on an otherwise idle network (closed form, fast mode).

    ``nbytes`` is the op's total in the nccl-tests convention; it stands for ``count`` back-to-back calls
    of ``nbytes / count`` each, so latencies count ``count`` times. ``root`` is the global root rank of
    broadcast/reduce (default: the lowest rank). ``algorithm`` / ``protocol`` pin NCCL's choice.
    """
    group = _check(kind, ranks, algorithm, count, nbytes, root)
    n = len(group)
    if n == 1:
        return 0.0
    if kind == "ring_exchange":
        transfer, latency = _ring_exchange_costs(nbytes / count, group, topo)
        return count * (transfer + latency)
    measured = topo.cluster.spec.measured
    if measured is not None and algorithm == "auto" and protocol == "auto":
        t_us = measured.collective_time_us(kind, n, nbytes / count)
        if t_us is not None:
            return t_us * 1e-6 * count
    size = nbytes / count
    root_index = group.index(root) if root is not None and kind in ("broadcast", "reduce") else None
    memo = _call_memo.setdefault(topo, {})
    key = (kind, group_signature(group, topo), algorithm, protocol, root_index, size)
    one = memo.get(key)
    if one is None:
        algo, proto = choose(kind, size, group, topo, root=root, algorithm=algorithm, protocol=protocol)
        one = memo[key] = _priced(kind, algo, proto, size, _plan(kind, group, topo, algo, root), topo, group)
    return count * one


def collective_phases(kind: str, nbytes: float, ranks: Sequence[int], topo: Topology, *,
                      algorithm: str = "auto", count: int = 1, root: int | None = None,
                      protocol: str = "auto") -> list[Phase]:
    """The steps of the collective for the engine's flow mode (see :mod:`simgrid.costs.phases`).

    A leading transfer-free phase carries the latency of all ``count`` calls; the transfer phases carry
    the bytes divided by the protocol's bandwidth factor, so that, simulated alone with fair link
    sharing, the phases take :func:`collective_time_s` (without measured-table overrides).
    """
    group = _check(kind, ranks, algorithm, count, nbytes, root)
    if len(group) == 1:
        return []
    size = nbytes / count
    if kind == "ring_exchange":
        step_latency = _ring_exchange_costs(size, group, topo)[1]
        head = [Phase((), step_latency * count, 1)] if step_latency > 0 else []
        return head + ([ring_exchange_phase(nbytes, group)] if nbytes > 0 else [])
    algo, proto = choose(kind, size, group, topo, root=root, algorithm=algorithm, protocol=protocol)
    plan = _plan(kind, group, topo, algo, root)
    latency = _latency_s(kind, algo, proto, plan[1], 0.0 if kind == "barrier" else size, topo, group)
    phases: list[Phase] = [Phase((), latency * count, 1)] if latency > 0 else []
    if kind == "barrier" or nbytes == 0 or plan[0] == 0:
        return phases
    bandwidth_only = _priced(kind, algo, proto, size, plan, topo, group) - latency
    inflate = bandwidth_only / (plan[0] * size)
    return phases + scale_phases(_unit_phases(kind, group, topo, algo, root), bytes_factor=nbytes * inflate)


def bus_bandwidth_GBps(kind: str, nbytes: float, n: int, time_s: float) -> float:
    """nccl-tests bus bandwidth of a measured or predicted time (PERFORMANCE.md): algbw times
    2(n-1)/n for all-reduce, (n-1)/n for reduce-scatter, all-gather and all-to-all, 1 otherwise."""
    factor = _BUSBW_FACTOR[kind](n) if kind in _BUSBW_FACTOR else 1.0
    return nbytes / time_s * factor / 1e9 if time_s > 0 else float("inf")
