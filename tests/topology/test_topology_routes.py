"""Topology: placement, routes over NVSwitch / PCIe / NICs / fat-tree leaves, laziness at scale."""

from __future__ import annotations

import math
import time

import pytest

from simgrid.errors import SimgridError
from simgrid.topology import Topology, route_bandwidth_Bps, route_latency_s, synthetic_cluster


def names(route: tuple) -> list[str]:
    return [link.name for link in route]


def test_placement_is_node_major() -> None:
    """Rank r sits on node r // gpus_per_node at local index r % gpus_per_node."""
    topo = Topology(synthetic_cluster(num_gpus=32, gpus_per_node=8))
    assert [topo.node_of(r) for r in (0, 7, 8, 31)] == [0, 0, 1, 3]
    assert [topo.local_index(r) for r in (0, 7, 8, 31)] == [0, 7, 0, 7]
    assert topo.same_node(8, 15) and not topo.same_node(7, 8)


def test_rank_outside_cluster_is_rejected_with_its_value() -> None:
    """A rank beyond the cluster raises a SimgridError naming the rank and the valid range."""
    topo = Topology(synthetic_cluster(num_gpus=16))
    with pytest.raises(SimgridError, match=r"dst = 16 is outside the cluster's 16 GPUs; use a rank in 0..15"):
        topo.route(0, 16)


def test_same_node_nvswitch_route_is_out_port_then_in_port() -> None:
    """Within an NVSwitch node any pair goes GPU-out -> GPU-in at the per-GPU rate times efficiency."""
    topo = Topology(synthetic_cluster(num_gpus=8, intra_GBps=300, intra_latency_us=3.0, link_efficiency=0.8))
    route = topo.route(2, 5)
    assert names(route) == ["node0/gpu2/nvlink-out", "node0/gpu5/nvlink-in"]
    assert route_bandwidth_Bps(route) == pytest.approx(300e9 * 0.8)
    assert route[0].raw_bandwidth_Bps == pytest.approx(300e9)
    assert route_latency_s(route) == pytest.approx(3.0e-6)
    assert topo.route(3, 3) == ()


def test_cross_node_same_rail_route_turns_around_in_the_leaf() -> None:
    """GPU i -> GPU i on another node of the same leaf: NIC i out, NIC i in, one switch hop."""
    topo = Topology(synthetic_cluster(num_gpus=32, nic_GBps=25, nic_latency_us=2.0, switch_latency_us=0.5))
    route = topo.route(3, 8 + 3)
    assert names(route) == ["node0/nic3/out", "node1/nic3/in"]
    assert route_bandwidth_Bps(route) == pytest.approx(25e9)
    assert route_latency_s(route) == pytest.approx((2.0 + 0.5) * 1e-6)


def test_cross_rail_route_climbs_to_the_spine() -> None:
    """On a rail-optimised fabric GPU 7 -> GPU 0 of another node changes rail via the spine (3 switch hops)."""
    topo = Topology(synthetic_cluster(num_gpus=16, nic_latency_us=2.0, switch_latency_us=0.5))
    route = topo.route(7, 8)
    assert names(route) == ["node0/nic7/out", "rail7/leaf0/up", "rail0/leaf0/down", "node1/nic0/in"]
    assert route_latency_s(route) == pytest.approx((2.0 + 3 * 0.5) * 1e-6)


def test_fat_tree_route_uses_spine_only_between_leaves() -> None:
    """Plain fat tree: HDR leaf of 40 ports, 20 down = 2 nodes of 8 NICs, so nodes 0,1 share leaf 0."""
    topo = Topology(synthetic_cluster(num_gpus=64, network_topology="fat-tree"))
    assert topo.fabric.nodes_per_leaf == 20 // 8
    assert names(topo.route(0, 8 + 5)) == ["node0/nic0/out", "node1/nic5/in"]
    assert names(topo.route(0, 16)) == ["node0/nic0/out", "leaf0/up", "leaf1/down", "node2/nic0/in"]


def test_leaf_uplink_is_downlink_capacity_over_oversubscription() -> None:
    """Rail leaf uplink rate = nodes per leaf x NIC rate / oversubscription (HDR 40-port leaf at 2:1: 26 down)."""
    topo = Topology(synthetic_cluster(num_gpus=8 * 64, nic_GBps=25, oversubscription=2.0))
    assert topo.fabric.nodes_per_leaf == math.floor(40 * 2 / 3)
    assert topo.fabric.leaf_up(0, 0).bandwidth_Bps == pytest.approx(26 * 25e9 / 2)


def test_single_switch_route_is_nic_to_nic() -> None:
    """A 10 GbE box switch: NIC out -> NIC in at 1.25 GB/s whatever the node pair."""
    topo = Topology(synthetic_cluster(num_gpus=40, gpus_per_node=4, nics_per_node=1, nic_GBps=1.25,
                                      network_kind="ethernet", network_topology="single-switch"))
    route = topo.route(1, 37)
    assert names(route) == ["node0/nic0/out", "node9/nic0/in"]
    assert route_bandwidth_Bps(route) == pytest.approx(1.25e9)


def test_pcie_routes_cross_the_root_complex_between_switches() -> None:
    """PCIe node, 2 GPUs per switch: same switch = up/down; across switches = via both switch uplinks."""
    topo = Topology(synthetic_cluster(num_gpus=4, gpus_per_node=4, intra_fabric="pcie", intra_GBps=32,
                                      pcie_GBps=32, pcie_latency_us=2.0, intra_latency_us=2.0,
                                      gpus_per_pcie_switch=2))
    assert names(topo.route(0, 1)) == ["node0/gpu0/pcie-up", "node0/gpu1/pcie-down"]
    cross = topo.route(1, 2)
    assert names(cross) == ["node0/gpu1/pcie-up", "node0/pcie-switch0/up", "node0/pcie-switch1/down",
                            "node0/gpu2/pcie-down"]
    assert route_latency_s(cross) == pytest.approx(2 * 2.0e-6)  # two switch traversals
    # GPUs under one switch share its uplink: the same Link object on both routes.
    assert topo.route(0, 3)[1] is topo.route(1, 2)[1]


def test_host_routes_go_through_the_pcie_switch_uplink() -> None:
    """Offload copies: d2h = GPU -> switch -> root complex; h2d the reverse, at the PCIe rate."""
    topo = Topology(synthetic_cluster(num_gpus=8, pcie_GBps=32, gpus_per_pcie_switch=2))
    assert names(topo.host_route(5, "d2h")) == ["node0/gpu5/pcie-up", "node0/pcie-switch2/up"]
    assert names(topo.host_route(5, "h2d")) == ["node0/pcie-switch2/down", "node0/gpu5/pcie-down"]
    assert route_bandwidth_Bps(topo.host_route(5, "h2d")) == pytest.approx(32e9)
    with pytest.raises(SimgridError, match="direction = 'up' must be 'd2h'"):
        topo.host_route(5, "up")  # type: ignore[arg-type]


def test_all_links_lists_each_link_once() -> None:
    """all_links on 2 DGX-like nodes: 8 GPUs x (2 NVLink + 2 PCIe) + 1 PCIe switch x 2 + 8 NICs x 2 per node,
    plus 8 rails x 1 leaf x (up, down) for cross-rail traffic."""
    topo = Topology(synthetic_cluster(num_gpus=16))
    links = topo.all_links()
    assert len({link.name for link in links}) == len(links)
    assert len(links) == 2 * (8 * 4 + 2 + 8 * 2) + 8 * 2


def test_routes_are_lazy_and_cached_at_16k_gpus() -> None:
    """A 16,384-GPU topology builds nothing up front; a route is computed once and then reused."""
    start = time.perf_counter()
    topo = Topology(synthetic_cluster(num_gpus=16384, network_kind="infiniband-ndr"))
    first = topo.route(0, 16383)
    assert topo.route(0, 16383) is first
    assert names(first)[0] == "node0/nic0/out" and names(first)[-1] == "node2047/nic7/in"
    assert time.perf_counter() - start < 0.5


def test_nvlink_mesh_shares_each_gpus_total_nvlink_rate() -> None:
    """nvlink-mesh (DGX-1 style) is modelled as one out and one in port per GPU at its total NVLink rate:
    two transfers leaving the same GPU share its out port (the documented simplification)."""
    topo = Topology(synthetic_cluster(num_gpus=8, intra_fabric="nvlink-mesh", intra_GBps=150))
    a, b = topo.route(0, 3), topo.route(0, 6)
    assert a[0] is b[0] and a[0].name == "node0/gpu0/nvlink-out"
    assert route_bandwidth_Bps(a) == pytest.approx(150e9)


@pytest.mark.parametrize(("profile", "gpus"), [("dgx-h100-ndr", 16384), ("dgx-a100-hdr", 4096),
                                               ("rtx4090-10gbe", 96), ("dgx1-v100-edr", 256)])
def test_routes_of_one_route_class_have_equal_link_parameters(profile: str, gpus: int) -> None:
    """route_class is a safe cache key: brute force over intra-node pairs, pairs across leaves and rails
    and random pairs, every route of one class has the same (bandwidth, latency) link sequence; ranks
    that are not ints still get the usual error."""
    import random

    from simgrid.hardware import load_cluster

    topo = Topology(load_cluster(profile, gpus=gpus))
    g = topo.gpus_per_node
    rng = random.Random(7)
    pairs = [(a, b) for a in range(2 * g) for b in range(2 * g)]
    pairs += [(rng.randrange(gpus), rng.randrange(gpus)) for _ in range(3000)]
    pairs += [(a, gpus - 1 - a) for a in range(0, gpus, max(1, gpus // 200))]
    seen: dict[object, list[tuple[float, float]]] = {}
    for src, dst in pairs:
        params = [(link.bandwidth_Bps, link.latency_s) for link in topo.route(src, dst)]
        assert seen.setdefault(topo.route_class(src, dst), params) == params, (src, dst)
    assert len(seen) > 3
    with pytest.raises(SimgridError, match=r"src = 1.5 is outside the cluster"):
        topo.route_class(1.5, 0)  # type: ignore[arg-type]
