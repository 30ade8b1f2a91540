"""Collective closed forms: NCCL's alpha-beta model by hand (tuning.cc constants written out in each test),
bottleneck links, algorithm and protocol choice, overrides."""

from __future__ import annotations

import math

import pytest

from simgrid.costs import NCCL_BASE_LATENCY_US, Phase, choose, choose_algorithm, collective_time_s, phase_cost
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
    """Simple protocol: NCCL's ring base latency 8.4 us + 2(n-1) hops of the profile's latency a
    (tuning.cc: baseLat + nsteps * hwLat[NVLINK][Ring][Simple], the profile's a standing for that entry)."""
    S, B, a, n = 64e6, 100e9, 3.4e-6, 8
    expected = 2 * (n - 1) / n * S / B + 2 * (n - 1) * a + BASE
    got = collective_time_s("all_reduce", S, range(n), one_node(n, latency_us=3.4), algorithm="ring", protocol="Simple")
    assert got == pytest.approx(expected)


def test_ring_protocols_scale_latency_and_bandwidth_by_nccl_tables() -> None:
    """LL128: base 14.0 us, hop 1.9/3.4 of Simple's, bandwidth x0.92; LL: base 6.6, hop 0.6/3.4,
    bandwidth x0.5 while under LL's 87.7 GB/s ceiling inside one Ampere node (ring busbw here = B =
    100 GB/s, so 50 GB/s). tuning.cc baseLatencies, hwLatencies[NVLINK][Ring], LL/LL128 refinements."""
    S, B, a, n = 8e6, 100e9, 3.4e-6, 8
    topo = one_node(n, latency_us=3.4)
    bw = 2 * (n - 1) / n * S / B
    ll128 = 14.0e-6 + 2 * (n - 1) * a * 1.9 / 3.4 + bw / 0.92
    ll = 6.6e-6 + 2 * (n - 1) * a * 0.6 / 3.4 + bw / 0.5
    assert collective_time_s("all_reduce", S, range(n), topo, algorithm="ring", protocol="LL128") == pytest.approx(ll128)
    assert collective_time_s("all_reduce", S, range(n), topo, algorithm="ring", protocol="LL") == pytest.approx(ll)


def test_protocol_choice_follows_size_inside_one_node() -> None:
    """NCCL's rule, smallest estimated time: LL for kilobytes, LL128 for megabytes, Simple for large
    messages (latencies 15.0 / 40.6 / 56.0 us against bandwidth factors 0.5 / 0.92 / 1 on 100 GB/s)."""
    topo = one_node(8, latency_us=3.4)
    assert choose("all_reduce", 32 * 1024, range(8), topo) == ("ring", "LL")
    assert choose("all_reduce", 4 * 2**20, range(8), topo) == ("ring", "LL128")
    assert choose("all_reduce", GiB, range(8), topo) == ("ring", "Simple")


@pytest.mark.parametrize("kind", ["reduce_scatter", "all_gather"])
def test_ring_reduce_scatter_and_all_gather_formula(kind: str) -> None:
    """Reduce-scatter / all-gather of S (full buffer), Simple: (n-1)/n * S/B + (n-1)*a + base."""
    S, B, a, n = 256e6, 100e9, 2e-6, 8
    expected = (n - 1) / n * S / B + (n - 1) * a + BASE
    got = collective_time_s(kind, S, range(n), one_node(n, latency_us=2.0), protocol="Simple")
    assert got == pytest.approx(expected)


@pytest.mark.parametrize("kind", ["broadcast", "reduce"])
def test_pipelined_broadcast_and_reduce_formula(kind: str) -> None:
    """Pipelined chain, Simple: S/B + base + n hops at the tree's NVLink figure (4.0 of the ring's 3.4:
    NCCL's chunk latency when the ring's channels differ), whatever the root."""
    S, B, a, n = 256e6, 100e9, 2e-6, 8
    expected = S / B + n * a * 4.0 / 3.4 + BASE
    got = collective_time_s(kind, S, range(n), one_node(n, latency_us=2.0), root=5, protocol="Simple")
    assert got == pytest.approx(expected)


def test_all_to_all_formula() -> None:
    """Pairwise all-to-all of S per rank: (n-1)/n * S/B + (n-1)*a + base."""
    S, B, a, n = 256e6, 100e9, 2e-6, 8
    expected = (n - 1) / n * S / B + (n - 1) * a + BASE
    assert collective_time_s("all_to_all", S, range(n), one_node(n, latency_us=2.0)) == pytest.approx(expected)


def test_barrier_is_latency_only() -> None:
    """A barrier moves no data: the fastest call's latency, here the LL ring's 6.6 us + 2(n-1) hops at
    0.6/3.4 of the profile's 2 us (the LL tree's base is 6.8 us), whatever nbytes says."""
    topo = one_node(8, latency_us=2.0)
    assert collective_time_s("barrier", 1e9, range(8), topo) == pytest.approx(6.6e-6 + 14 * 2e-6 * 0.6 / 3.4)


def test_double_binary_tree_formula_one_gpu_per_node() -> None:
    """Tree all-reduce over m single-GPU nodes, Simple: 2 S/B (each NIC sends and receives S in each of
    the two phases over the two trees) at NCCL's tree factor 0.92 (no size correction at 1 GB), plus
    base 8.4 us + 2 floor(log2 m) network hops of a = 5 us (tuning.cc tree latency)."""
    m, S, B = 16, 1e9, 25e9
    topo = Topology(synthetic_cluster(num_gpus=m, gpus_per_node=1, nic_GBps=25, nic_latency_us=5.0))
    expected = 2 * S / B / 0.92 + 2 * math.floor(math.log2(m)) * 5e-6 + BASE
    got = collective_time_s("all_reduce", S, range(m), topo, algorithm="tree", protocol="Simple")
    assert got == pytest.approx(expected)


def test_multi_node_ring_uses_one_channel_per_nic_rail() -> None:
    """4 nodes x 8 GPUs, 8 NICs each: 8 rings (channels) each carry S/8 and leave every node on their own
    rail, so a NIC moves S/(8 n) per step against S/n on each NVLink port. All-gather, Simple:
    (n-1) steps x max(S/(n B_nvl), S/(8 n B_nic)) + base + (n-m) intra steps at max(a_nvl, 3 x 1 us
    network posting overhead on Intel) + (m-1) network steps at a_net (NCCL's ring latency)."""
    g, m, S, B_nvl, B_nic = 8, 4, GiB, 300e9, 25e9
    n = g * m
    topo = Topology(synthetic_cluster(num_gpus=n, intra_GBps=300, nic_GBps=25, intra_latency_us=2.0,
                                      nic_latency_us=10.0))
    step = max(S / (n * B_nvl), S / (g * n * B_nic))
    expected = (n - 1) * step + BASE + (n - m) * 3e-6 + (m - 1) * 10e-6
    got = collective_time_s("all_gather", S, range(n), topo, algorithm="ring", protocol="Simple")
    assert got == pytest.approx(expected)
    # One NIC per node: the ring's inter-node hop carries a whole S/n per step.
    one_nic = Topology(synthetic_cluster(num_gpus=n, intra_GBps=300, nic_GBps=25, nics_per_node=1))
    assert collective_time_s("all_gather", S, range(n), one_nic, algorithm="ring") == pytest.approx(
        (n - 1) * S / (n * B_nic))


def test_multi_node_ring_all_reduce_latency_plateau() -> None:
    """Multi-node ring all-reduce with Simple: NCCL multiplies the latency by 1.4 (Ampere and later) once
    a channel moves >= 64 B per rank (tuning.cc, "plateau effect of ring")."""
    g, m, S = 8, 2, GiB
    n = g * m
    topo = Topology(synthetic_cluster(num_gpus=n, intra_GBps=300, nic_GBps=25, intra_latency_us=2.0,
                                      nic_latency_us=10.0))
    step = max(S / (n * 300e9), S / (g * n * 25e9))
    latency = (BASE + (2 * (n - 1) - 2 * (m - 1)) * 3e-6 + 2 * (m - 1) * 10e-6) * 1.4
    got = collective_time_s("all_reduce", S, range(n), topo, algorithm="ring", protocol="Simple")
    assert got == pytest.approx(2 * (n - 1) * step + latency)


def test_nvls_all_reduce_inside_an_nvlink_sharp_node() -> None:
    """NVLS: every GPU sends S (1 + 1/g) into the NVSwitch and receives as much, at NCCL's Hopper NVLS
    efficiency 0.85 of the port rate; latency the NVLS hop 25 us (25/3.4 of the profile's 3.4 us), no
    base. It beats the ring at 1 GiB (busbw 2(g-1)/(g+1) x 0.85 B = 1.32 B against B) and is what auto
    picks there; all-gather stays on the ring (NVLS moves S per port, the ring (g-1)/g S)."""
    g, S, B = 8, GiB, 450e9 * 0.82
    topo = Topology(synthetic_cluster(num_gpus=g, intra_GBps=450, link_efficiency=0.82, intra_latency_us=3.4,
                                      nvlink_sharp=True, gpu_arch="hopper"))
    expected = 25e-6 + S * (1 + 1 / g) / (B * 0.85)
    assert collective_time_s("all_reduce", S, range(g), topo, algorithm="nvls") == pytest.approx(expected)
    assert choose("all_reduce", S, range(g), topo) == ("nvls", "Simple")
    assert choose("all_gather", S, range(g), topo)[0] == "ring"
    with pytest.raises(SimgridError, match="NVLink SHARP"):
        collective_time_s("all_reduce", S, range(g), one_node(8), algorithm="nvls")


def test_pat_all_gather_one_rank_per_node() -> None:
    """PAT (all-gather with one rank per node): base 8.0 us + floor(log2 m) network hops / 3.5 + 2.8 us
    per rank, at 0.75 of the ring's bandwidth (tuning.cc)."""
    m, S, B = 16, 64e6, 25e9
    topo = Topology(synthetic_cluster(num_gpus=m, gpus_per_node=1, nic_GBps=25, nic_latency_us=5.0))
    expected = 8.0e-6 + 4 * 5e-6 / 3.5 + 2.8e-6 * m + (m - 1) / m * S / B / 0.75
    assert collective_time_s("all_gather", S, range(m), topo, algorithm="pat") == pytest.approx(expected)


def test_hierarchical_formula() -> None:
    """4 nodes x 8 GPUs, S = 1 GiB, latency-free: hierarchical = 2(g-1)/g S/B_nvl + 2(m-1)/m (S/g)/B_nic
    (kept by name for what-if studies; NCCL's rings reach the same NIC load with one channel per rail)."""
    g, m, S, B_nvl, B_nic = 8, 4, GiB, 300e9, 25e9
    topo = Topology(synthetic_cluster(num_gpus=g * m, intra_GBps=300, nic_GBps=25))
    hier = collective_time_s("all_reduce", S, range(g * m), topo, algorithm="hierarchical")
    assert hier == pytest.approx(2 * (g - 1) / g * S / B_nvl + 2 * (m - 1) / m * (S / g) / B_nic)
    assert choose_algorithm("all_reduce", S, range(g * m), topo) != "hierarchical"


def test_auto_prefers_tree_for_small_messages_on_many_nodes() -> None:
    """128 single-GPU nodes, 8 KiB: the tree's log-depth latency wins, as NCCL's tuner picks it."""
    topo = Topology(synthetic_cluster(num_gpus=128, gpus_per_node=1, nic_latency_us=5.0, switch_latency_us=0.5))
    assert choose_algorithm("all_reduce", 8192, range(128), topo) == "tree"
    assert choose_algorithm("all_reduce", 4 * GiB, range(128), topo) == "ring"


def test_tensor_parallel_across_nodes_is_much_slower_than_within() -> None:
    """TP all-reduce of one activation (2048 x 12288 bf16 = 50 MB), tp 16 on two DGX-A100-like nodes vs
    tp 8 inside one: across nodes each node must send at least S (its partial sums of the half the other
    node finishes, then those results) through its 8 x 25 GB/s NICs, which no algorithm beats (the
    double binary tree reaches it: NCCL's choice here); with one NIC per node the NIC carries it all."""
    def topo(nics: int) -> Topology:
        return Topology(synthetic_cluster(num_gpus=16, intra_GBps=300, nic_GBps=25, intra_latency_us=3.4,
                                          nic_latency_us=14.0, nics_per_node=nics))
    S = 2048 * 12288 * 2
    within = collective_time_s("all_reduce", S, range(8), topo(8))
    assert within == pytest.approx(2 * 7 / 8 * S / 300e9 + 14 * 3.4e-6 + BASE)  # Simple wins at 50 MB
    across = collective_time_s("all_reduce", S, range(16), topo(8))
    assert across > S / (8 * 25e9)
    assert across > 1.2 * within
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
    got = collective_time_s("all_reduce", S, range(n), topo, count=k, protocol="Simple")
    assert got == pytest.approx(expected)


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


def test_ring_exchange_step_costs_one_neighbour_copy() -> None:
    """A ring-exchange step (TE userbuffers' copy-engine p2p: every member copies S to its successor at once)
    costs what one send of S to a neighbour costs: S over one NVLink port plus the route latency, with no
    NCCL base latency; ``count`` steps of S / count each pay the latency ``count`` times."""
    from simgrid.costs import p2p_time_s

    S, B, a = 8e6, 100e9, 3.4e-6
    topo = one_node(8, latency_us=3.4)
    got = collective_time_s("ring_exchange", S, range(8), topo)
    assert got == pytest.approx(S / B + a)
    assert got == pytest.approx(p2p_time_s(S, 0, 1, topo))
    assert collective_time_s("ring_exchange", S, range(8), topo, count=4) == pytest.approx(S / B + 4 * a)
    assert collective_time_s("ring_exchange", S, (3,), topo) == 0.0


def test_ring_exchange_over_the_network_is_bound_by_the_nic() -> None:
    """Across nodes the ring's node-crossing copies ride the NICs: slower than the same step inside a node."""
    from simgrid.topology import synthetic_cluster as cluster

    two = Topology(cluster(num_gpus=8, gpus_per_node=4, intra_GBps=300, nic_GBps=25))
    inside = collective_time_s("ring_exchange", 64e6, range(4), two)
    across = collective_time_s("ring_exchange", 64e6, range(8), two)
    assert across > inside
    assert inside == pytest.approx(64e6 / 300e9, rel=0.05)
