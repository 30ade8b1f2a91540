"""Collective closed forms: alpha-beta formulas by hand, bottleneck links, algorithm choice, overrides."""

from __future__ import annotations

import math

import pytest

from simgrid.costs import NCCL_BASE_LATENCY_US, Phase, choose_algorithm, collective_time_s, phase_cost
from simgrid.errors import SimgridError
from simgrid.hardware import CollectiveRow, MeasuredTables
from simgrid.topology import Topology, synthetic_cluster

GiB = 2**30
BASE = NCCL_BASE_LATENCY_US * 1e-6


def one_node(n: int = 8, *, bandwidth_GBps: float = 100.0, latency_us: float = 0.0) -> Topology:
    return Topology(synthetic_cluster(num_gpus=n, gpus_per_node=n, intra_GBps=bandwidth_GBps,
                                      intra_latency_us=latency_us))


def test_ring_all_reduce_matches_alpha_beta_formula_without_latency() -> None:
    """Ring all-reduce of S on n GPUs over links of bandwidth B: 2(n-1)/n * S/B (latency-free profile)."""
    S, B = 1e9, 100e9
    for n in (2, 4, 8):
        assert collective_time_s("all_reduce", S, range(n), one_node(n), algorithm="ring") == pytest.approx(
            2 * (n - 1) / n * S / B)


def test_ring_all_reduce_matches_alpha_beta_formula_with_latency() -> None:
    """With per-hop latency a: 2(n-1)/n * S/B + 2(n-1)*a, plus NCCL's base latency once."""
    S, B, a, n = 64e6, 100e9, 3.4e-6, 8
    expected = 2 * (n - 1) / n * S / B + 2 * (n - 1) * a + BASE
    assert collective_time_s("all_reduce", S, range(n), one_node(n, latency_us=3.4)) == pytest.approx(expected)


@pytest.mark.parametrize("kind", ["reduce_scatter", "all_gather"])
def test_ring_reduce_scatter_and_all_gather_formula(kind: str) -> None:
    """Reduce-scatter / all-gather of S (full buffer): (n-1)/n * S/B + (n-1)*a + base."""
    S, B, a, n = 256e6, 100e9, 2e-6, 8
    expected = (n - 1) / n * S / B + (n - 1) * a + BASE
    assert collective_time_s(kind, S, range(n), one_node(n, latency_us=2.0)) == pytest.approx(expected)


@pytest.mark.parametrize("kind", ["broadcast", "reduce"])
def test_pipelined_broadcast_and_reduce_formula(kind: str) -> None:
    """Pipelined chain: S/B + (n-1)*a + base, whatever the root."""
    S, B, a, n = 256e6, 100e9, 2e-6, 8
    expected = S / B + (n - 1) * a + BASE
    assert collective_time_s(kind, S, range(n), one_node(n, latency_us=2.0), root=5) == pytest.approx(expected)


def test_all_to_all_formula() -> None:
    """Pairwise all-to-all of S per rank: (n-1)/n * S/B + (n-1)*a + base."""
    S, B, a, n = 256e6, 100e9, 2e-6, 8
    expected = (n - 1) / n * S / B + (n - 1) * a + BASE
    assert collective_time_s("all_to_all", S, range(n), one_node(n, latency_us=2.0)) == pytest.approx(expected)


def test_barrier_is_latency_only() -> None:
    """A barrier moves no data: 2(n-1) ring steps of latency plus base, whatever nbytes says."""
    topo = one_node(8, latency_us=2.0)
    assert collective_time_s("barrier", 1e9, range(8), topo) == pytest.approx(2 * 7 * 2e-6 + BASE)


def test_double_binary_tree_formula_one_gpu_per_node() -> None:
    """Tree all-reduce over m single-GPU nodes: 2*S/B + 2*ceil(log2 m)*a_net + base (NCCL tuning model)."""
    m, S, B = 16, 1e9, 25e9
    topo = Topology(synthetic_cluster(num_gpus=m, gpus_per_node=1, nic_GBps=25, nic_latency_us=5.0))
    expected = 2 * S / B + 2 * math.ceil(math.log2(m)) * 5e-6 + BASE
    assert collective_time_s("all_reduce", S, range(m), topo, algorithm="tree") == pytest.approx(expected)


def test_hierarchical_formula_and_beats_flat_ring_across_nodes() -> None:
    """4 nodes x 8 GPUs, S = 1 GiB: hierarchical = 2(g-1)/g S/B_nvl + 2(m-1)/m (S/g)/B_nic, far below
    the flat single ring bounded by one NIC: 2(n-1)/n S/B_nic."""
    g, m, S, B_nvl, B_nic = 8, 4, GiB, 300e9, 25e9
    topo = Topology(synthetic_cluster(num_gpus=g * m, intra_GBps=300, nic_GBps=25))
    hier = collective_time_s("all_reduce", S, range(g * m), topo, algorithm="hierarchical")
    ring = collective_time_s("all_reduce", S, range(g * m), topo, algorithm="ring")
    assert hier == pytest.approx(2 * (g - 1) / g * S / B_nvl + 2 * (m - 1) / m * (S / g) / B_nic)
    assert ring == pytest.approx(2 * (g * m - 1) / (g * m) * S / B_nic)
    assert hier < ring / 4
    assert choose_algorithm("all_reduce", S, range(g * m), topo) == "hierarchical"


def test_auto_prefers_tree_for_small_messages_on_many_nodes() -> None:
    """128 single-GPU nodes, 8 KiB: the tree's log-depth latency wins, as NCCL's tuner picks it."""
    topo = Topology(synthetic_cluster(num_gpus=128, gpus_per_node=1, nic_latency_us=5.0, switch_latency_us=0.5))
    assert choose_algorithm("all_reduce", 8192, range(128), topo) == "tree"
    assert choose_algorithm("all_reduce", 4 * GiB, range(128), topo) == "ring"


def test_tensor_parallel_across_nodes_is_much_slower_than_within() -> None:
    """TP all-reduce of one activation (2048 x 12288 bf16 = 50 MB), tp 16 on 8-GPU DGX-A100-like nodes vs
    tp 8 inside a node. With 8 HDR NICs per node (200 GB/s) the inter-node half of the hierarchical
    algorithm adds S/(8 x 25 GB/s) = 0.25 ms to the 0.29 ms NVLink part, plus 9.6 us network steps;
    with one NIC per node the NIC carries all of it: 2 ms, over 5x."""
    def topo(nics: int) -> Topology:
        return Topology(synthetic_cluster(num_gpus=16, intra_GBps=300, nic_GBps=25, intra_latency_us=3.4,
                                          nic_latency_us=9.6, nics_per_node=nics))
    S = 2048 * 12288 * 2
    within = collective_time_s("all_reduce", S, range(8), topo(8))
    assert within == pytest.approx(2 * 7 / 8 * S / 300e9 + 14 * 3.4e-6 + BASE)
    across = collective_time_s("all_reduce", S, range(16), topo(8))
    hier_bandwidth = 2 * 7 / 8 * S / 300e9 + 2 * (1 / 2) * (S / 8) / 25e9
    assert across == pytest.approx(hier_bandwidth + 2 * 7 * 3.4e-6 + 2 * 9.6e-6 + BASE)
    assert across > 1.7 * within
    assert collective_time_s("all_reduce", S, range(16), topo(1)) > 5 * within


def test_ten_gigabit_ethernet_is_twenty_times_slower_than_hdr() -> None:
    """Cross-node all-reduce of 1 GiB over 1-GPU nodes: 10 GbE (1.25 GB/s) vs HDR (25 GB/s) = 20x."""
    def cluster(nic: float, topology: str) -> Topology:
        return Topology(synthetic_cluster(num_gpus=8, gpus_per_node=1, nic_GBps=nic, network_topology=topology))
    slow = collective_time_s("all_reduce", GiB, range(8), cluster(1.25, "single-switch"))
    fast = collective_time_s("all_reduce", GiB, range(8), cluster(25.0, "rail-optimized-fat-tree"))
    assert slow / fast == pytest.approx(20.0)


@pytest.mark.parametrize(("oversubscription", "nodes_per_leaf"), [(1.0, 20), (2.0, 26)])
def test_oversubscription_halves_cross_leaf_bandwidth_at_factor_two(oversubscription: float,
                                                                    nodes_per_leaf: int) -> None:
    """Every node of leaf 0 sends S to its twin in leaf 1 at once (HDR 40-port leaves: 20 or 26 nodes
    down): at full bisection each gets its NIC's 25 GB/s, at 2:1 the shared uplink gives each half."""
    n = 2 * nodes_per_leaf
    topo = Topology(synthetic_cluster(num_gpus=n, gpus_per_node=1, nic_GBps=25, oversubscription=oversubscription))
    assert topo.fabric.nodes_per_leaf == nodes_per_leaf
    S = 1e9
    phase = Phase(tuple((i, i + nodes_per_leaf, S) for i in range(nodes_per_leaf)), 0.0)
    transfer_s, _ = phase_cost(phase, topo)
    assert transfer_s == pytest.approx(oversubscription * S / 25e9)


def test_count_multiplies_latency_not_bandwidth() -> None:
    """count=k folded collectives with nbytes total: k x latency terms + bandwidth on the total."""
    S, B, a, n, k = 64e6, 100e9, 3.4e-6, 8, 24
    topo = one_node(n, latency_us=3.4)
    expected = 2 * (n - 1) / n * S / B + k * (2 * (n - 1) * a + BASE)
    assert collective_time_s("all_reduce", S, range(n), topo, count=k) == pytest.approx(expected)


def test_measured_table_overrides_the_formula() -> None:
    """A calibrated (kind, group size) row replaces the model, per collective, times count."""
    table = MeasuredTables(collectives=(CollectiveRow(kind="all_reduce", group_size=4, bytes=1000, time_us=50.0),
                                        CollectiveRow(kind="all_reduce", group_size=4, bytes=2000, time_us=70.0)))
    topo = Topology(synthetic_cluster(num_gpus=4, gpus_per_node=4, measured=table))
    assert collective_time_s("all_reduce", 1500, range(4), topo) == pytest.approx(60e-6)
    assert collective_time_s("all_reduce", 3000, range(4), topo, count=2) == pytest.approx(2 * 60e-6)
    # Other group sizes and explicit algorithms fall back to the model.
    assert collective_time_s("all_reduce", 1500, range(2), topo) == pytest.approx(1500 / 300e9)


def test_ideal_cluster_gives_zero_communication_time() -> None:
    """Infinite links and zero latency everywhere: every collective is free (no base latency either)."""
    inf = float("inf")
    topo = Topology(synthetic_cluster(num_gpus=32, intra_GBps=inf, nic_GBps=inf, pcie_GBps=inf))
    for kind in ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all", "barrier"):
        assert collective_time_s(kind, GiB, range(32), topo) == 0.0


def test_single_rank_group_costs_nothing() -> None:
    """A group of one rank does no communication."""
    assert collective_time_s("all_reduce", GiB, [3], one_node(8, latency_us=3.0)) == 0.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kind": "gossip"}, "collective kind = 'gossip' is unknown"),
        ({"algorithm": "tree", "kind": "all_gather"}, "algorithm = 'tree' is not available for all_gather"),
        ({"ranks": ()}, r"ranks = \(\) is empty"),
        ({"ranks": (1, 1)}, "repeats a rank"),
        ({"count": 0}, "count = 0 must be an integer >= 1"),
        ({"nbytes": -1}, "nbytes = -1 must be >= 0"),
        ({"kind": "broadcast", "root": 9}, "root = 9 is not in the group"),
    ],
)
def test_bad_arguments_are_rejected_with_the_field(kwargs: dict, message: str) -> None:
    """Bad user input raises a SimgridError that names the argument and its value."""
    call = {"kind": "all_reduce", "nbytes": 1e6, "ranks": (0, 1, 2, 3)} | kwargs
    root = call.pop("root", None)
    with pytest.raises(SimgridError, match=message):
        collective_time_s(call["kind"], call["nbytes"], call["ranks"], one_node(8),
                          algorithm=call.get("algorithm", "auto"), count=call.get("count", 1), root=root)


def test_hierarchical_needs_equal_ranks_per_node() -> None:
    """Explicit hierarchical on 8 + 1 ranks per node fails with how to fix it; auto falls back to ring."""
    topo = Topology(synthetic_cluster(num_gpus=16))
    ranks = list(range(9))
    with pytest.raises(SimgridError, match=r"same number of group ranks on every node.*\[1, 8\].*'ring'"):
        collective_time_s("all_reduce", GiB, ranks, topo, algorithm="hierarchical")
    assert choose_algorithm("all_reduce", GiB, ranks, topo) in ("ring", "tree")


def test_groups_of_the_same_shape_share_a_plan_but_leaf_boundaries_matter() -> None:
    """Plans are shared between groups with the same (node, leaf, local) shape; a group straddling a
    leaf boundary has another shape and, with a 4:1 fabric and 1-NIC nodes, a slower all-to-all."""
    from simgrid.costs.collectives import group_signature

    def topo() -> Topology:  # HDR 40-port leaves at 4:1: 32 single-GPU nodes per leaf, uplink 8 x 25 GB/s
        return Topology(synthetic_cluster(num_gpus=64, gpus_per_node=1, oversubscription=4.0,
                                          network_topology="fat-tree"))
    shared = topo()
    inside, straddling = tuple(range(0, 32)), tuple(range(16, 48))
    assert group_signature(inside, shared) != group_signature(straddling, shared)
    assert group_signature(tuple(range(32, 64)), shared) == group_signature(inside, shared)
    S = 1e9
    t_inside = collective_time_s("all_to_all", S, inside, shared)
    t_straddling = collective_time_s("all_to_all", S, straddling, shared)
    assert t_inside == pytest.approx(31 / 32 * S / 25e9)  # NIC bound
    # 16 nodes send 16 x S/32 each across the leaf: 8 S over an uplink of 32 x 25 / 4 = 200 GB/s.
    assert t_straddling == pytest.approx(8 * S / 200e9)
    assert collective_time_s("all_to_all", S, straddling, topo()) == t_straddling  # fresh cache, same answer
