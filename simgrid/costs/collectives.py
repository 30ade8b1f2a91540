"""Collective communication time: the alpha-beta model evaluated on the topology's bottleneck links.

Model (Hockney 1994 alpha-beta; Thakur, Rabenseifner & Gropp 2005, "Optimization of collective
communication operations in MPICH", IJHPCA 19(1), Table 1 / sec. 4): a collective is a sequence of steps;
a step costs its per-step latency ``a`` plus its bytes over the bandwidth ``B`` they get. With ``S`` the
message size in the nccl-tests convention (docs: nccl-tests PERFORMANCE.md, "busbw") and ``n`` ranks:

* ring all-reduce            2(n-1)/n * S/B + 2(n-1) * a
* ring reduce-scatter        (n-1)/n * S/B + (n-1) * a          (S = full input)
* ring all-gather            (n-1)/n * S/B + (n-1) * a          (S = full output)
* pipelined broadcast/reduce S/B + (n-1) * a
* pairwise all-to-all        (n-1)/n * S/B + (n-1) * a
* double binary tree         2 * S/B + 2 * ((g-1) * a_intra + ceil(log2 m) * a_inter)   (NCCL tuning.cc)
* hierarchical all-reduce    2(g-1)/g * S/B_intra + 2(m-1)/m * (S/g)/B_inter + latencies of each part
* barrier                    latency only (NCCL runs it as a 1-element all-reduce)

plus NCCL's base latency once per collective (``NCCL_BASE_LATENCY_US``). ``B`` is not a parameter: the
steps of :mod:`simgrid.costs.phases` are laid on the topology's routes and each step takes
``max over links of (bytes crossing the link / link bandwidth)``, so a ring that spans nodes is limited by
the NIC (and by leaf uplinks divided by the oversubscription factor when it crosses leaves), a ring inside
an NVSwitch node by the GPU's NVLink port. For the symmetric algorithms here this equals the flow-mode
result of simulating the same phases with fair sharing, and on uniform links it reduces to the formulas
above (tests/costs check them by hand).

Algorithm choice (``algorithm="auto"``): NCCL's tuner estimates each algorithm's time with a model of
this shape and picks the fastest (src/graph/tuning.cc, ``ncclTopoTuneModel``/``getAlgoInfo``); "auto"
does the same over the algorithms implemented here: a group inside one node uses a ring; a multi-node
all-reduce takes the fastest of ring, hierarchical and tree (tree wins small messages on many nodes,
hierarchical large ones), reduce-scatter/all-gather the faster of ring and hierarchical; broadcast and
reduce use the pipelined ring (chain); all-to-all is pairwise. NVLS (in-switch reduction on H100-class
NVSwitch) and SHARP are not modelled: on those machines the prediction for intra-node all-reduce is a
ring's, see ``test_h200_allreduce_vs_published`` for the size of the gap.

Measured tables: when the cluster profile has measured times for (kind, group size) and the algorithm is
"auto", they replace the formula (times ``count``).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

from simgrid.costs.phases import (
    Phase,
    chain_phases,
    hierarchical_phases,
    is_uniform,
    pairwise_phases,
    ranks_by_node,
    ring_phases,
    scale_phases,
    tree_phases,
)
from simgrid.errors import SimgridError
from simgrid.ir.ops import COLLECTIVE_KINDS
from simgrid.topology import Topology

NCCL_BASE_LATENCY_US = 8.4
"""Fixed cost of launching one NCCL collective: ``baseLat`` for Ring/Simple in NCCL's
src/graph/tuning.cc (8.4 us; shared/reference/hardware.md: "base about 8 us"). Not applied on a
latency-free profile (every link and switch latency 0, e.g. the ``ideal`` cluster)."""

ALGORITHMS: dict[str, tuple[str, ...]] = {
    "all_reduce": ("ring", "hierarchical", "tree"),
    "reduce_scatter": ("ring", "hierarchical"),
    "all_gather": ("ring", "hierarchical"),
    "broadcast": ("ring",),
    "reduce": ("ring",),
    "all_to_all": ("pairwise",),
    "barrier": ("ring", "hierarchical", "tree"),
}
"""Algorithms each collective kind supports (besides ``auto``)."""

_Plan = tuple[float, float]  # (seconds per byte of S, latency seconds excluding the base latency)
_PlanKey = tuple[str, tuple[tuple[int, int, int], ...], str, int | None]
_plans: weakref.WeakKeyDictionary[Topology, dict[_PlanKey, _Plan]] = (
    weakref.WeakKeyDictionary()
)
_exact_plans: weakref.WeakKeyDictionary[Topology, dict[tuple[str, tuple[int, ...], str, int | None], _Plan]] = (
    weakref.WeakKeyDictionary()
)
_candidate_memo: weakref.WeakKeyDictionary[Topology, dict[tuple[str, tuple[int, ...]], tuple[str, ...]]] = (
    weakref.WeakKeyDictionary()
)


def base_latency_s(topo: Topology) -> float:
    """NCCL's per-collective base latency, or 0 on a latency-free profile."""
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


def _unit_phases(kind: str, ranks: tuple[int, ...], topo: Topology, algorithm: str,
                 root: int | None) -> list[Phase]:
    """Phases for S = 1 byte (bytes scale linearly), without the base latency."""
    if len(ranks) == 1:
        return []
    if kind in ("broadcast", "reduce"):
        return chain_phases(kind, 1.0, ranks, topo, ranks[0] if root is None else root)
    if kind == "all_to_all":
        return pairwise_phases(1.0, ranks, topo)
    op = "all_reduce" if kind == "barrier" else kind
    if algorithm == "tree":
        return tree_phases(1.0, ranks, topo)
    if algorithm == "hierarchical":
        nodes = ranks_by_node(ranks, topo)
        if not is_uniform(nodes):
            sizes = sorted({len(n) for n in nodes})
            raise SimgridError(
                f"algorithm = 'hierarchical' needs the same number of group ranks on every node; this group "
                f"has {sizes} ranks per node; use algorithm='ring' or 'auto'"
            )
        return hierarchical_phases(op, 1.0, ranks, topo)
    return ring_phases(op, 1.0, ranks, topo)


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
        per_byte = latency = 0.0
        for phase in _unit_phases(kind, ranks, topo, algorithm, root):
            transfer, lat = phase_cost(phase, topo)
            per_byte += transfer * phase.repeat
            latency += lat * phase.repeat
        plan = (per_byte, latency)
        per_topo[key] = plan
    exact[exact_key] = plan
    return plan


def _candidates(kind: str, ranks: tuple[int, ...], topo: Topology) -> tuple[str, ...]:
    """Algorithms "auto" chooses among for this group (see module docstring), memoised per group."""
    memo = _candidate_memo.setdefault(topo, {})
    found = memo.get((kind, ranks))
    if found is None:
        found = memo[(kind, ranks)] = _candidates_uncached(kind, ranks, topo)
    return found


def _candidates_uncached(kind: str, ranks: tuple[int, ...], topo: Topology) -> tuple[str, ...]:
    if kind not in ("all_reduce", "reduce_scatter", "all_gather", "barrier"):
        return ALGORITHMS[kind][:1]
    nodes = ranks_by_node(ranks, topo)
    if len(nodes) == 1:
        return ("ring",)
    options = ["ring"]
    if is_uniform(nodes):
        options.append("hierarchical")
    if kind in ("all_reduce", "barrier"):
        options.append("tree")
    return tuple(options)


def choose_algorithm(kind: str, nbytes: float, ranks: Sequence[int], topo: Topology, *,
                     root: int | None = None) -> str:
    """The algorithm "auto" uses: the fastest modelled candidate (NCCL's tuner rule)."""
    group = _check(kind, ranks, "auto", 1, nbytes, root)
    size = 0.0 if kind == "barrier" else nbytes
    best, best_time = "", float("inf")
    for algo in _candidates(kind, group, topo):
        per_byte, latency = _plan(kind, group, topo, algo, root)
        t = per_byte * size + latency
        if t < best_time:
            best, best_time = algo, t
    return best


def collective_time_s(kind: str, nbytes: float, ranks: Sequence[int], topo: Topology, *, count: int = 1,
                      algorithm: str = "auto", root: int | None = None) -> float:
    """Seconds one collective op takes on an otherwise idle network (closed form, fast mode).

    ``nbytes`` is the op's total in the nccl-tests convention; ``count`` back-to-back collectives share
    it, so latencies count ``count`` times and bandwidth applies to the total. ``root`` is the global root
    rank of broadcast/reduce (default: the lowest rank).
    """
    group = _check(kind, ranks, algorithm, count, nbytes, root)
    n = len(group)
    if n == 1:
        return 0.0
    measured = topo.cluster.spec.measured
    if measured is not None and algorithm == "auto":
        t_us = measured.collective_time_us(kind, n, nbytes / count)
        if t_us is not None:
            return t_us * 1e-6 * count
    algo = choose_algorithm(kind, nbytes / count, group, topo, root=root) if algorithm == "auto" else algorithm
    per_byte, latency = _plan(kind, group, topo, algo, root)
    size = 0.0 if kind == "barrier" else nbytes
    return per_byte * size + (latency + base_latency_s(topo)) * count


def collective_phases(kind: str, nbytes: float, ranks: Sequence[int], topo: Topology, *,
                      algorithm: str = "auto", count: int = 1, root: int | None = None) -> list[Phase]:
    """The steps of the collective for the engine's flow mode (see :mod:`simgrid.costs.phases`).

    A leading transfer-free phase carries NCCL's base latency. Simulated alone with fair link sharing,
    the phases take :func:`collective_time_s` (without measured-table overrides).
    """
    group = _check(kind, ranks, algorithm, count, nbytes, root)
    if len(group) == 1:
        return []
    algo = choose_algorithm(kind, nbytes / count, group, topo, root=root) if algorithm == "auto" else algorithm
    size = 0.0 if kind == "barrier" else nbytes
    phases = scale_phases(_unit_phases(kind, group, topo, algo, root), bytes_factor=size, latency_factor=count)
    base = base_latency_s(topo) * count
    return ([Phase((), base, 1)] if base > 0 else []) + phases


def bus_bandwidth_GBps(kind: str, nbytes: float, n: int, time_s: float) -> float:
    """nccl-tests bus bandwidth of a measured or predicted time (PERFORMANCE.md): algbw times
    2(n-1)/n for all-reduce, (n-1)/n for reduce-scatter, all-gather and all-to-all, 1 otherwise."""
    factor = {"all_reduce": 2 * (n - 1) / n, "reduce_scatter": (n - 1) / n, "all_gather": (n - 1) / n,
              "all_to_all": (n - 1) / n}.get(kind, 1.0)
    return nbytes / time_s * factor / 1e9 if time_s > 0 else float("inf")
