"""Collective phases: structure, total bytes, and agreement with the closed form when simulated alone.

The cross-check simulates each phase with an independent max-min fair-sharing (progressive filling)
solver written here, as the engine's flow mode does, and compares with ``collective_time_s``.
"""

from __future__ import annotations

import pytest

from simgrid.costs import NCCL_BASE_LATENCY_US, Phase, collective_phases, collective_time_s
from simgrid.topology import Topology, synthetic_cluster


def fair_share_time(transfers: tuple[tuple[int, int, float], ...], topo: Topology) -> float:
    """Time until the last of these concurrent flows ends under max-min fair sharing (brute force)."""
    flows = [(topo.route(a, b), s) for a, b, s in transfers if a != b and s > 0]
    remaining = [s for _, s in flows]
    active = set(range(len(flows)))
    now = 0.0
    while active:
        rate: dict[int, float] = {}
        capacity = {link.name: link.bandwidth_Bps for i in active for link in flows[i][0]}
        while len(rate) < len(active):
            users: dict[str, list[int]] = {}
            for i in active - rate.keys():
                for link in flows[i][0]:
                    users.setdefault(link.name, []).append(i)
            name = min(users, key=lambda k: capacity[k] / len(users[k]))
            share = capacity[name] / len(users[name])
            for i in users[name]:
                rate[i] = share
                for link in flows[i][0]:
                    capacity[link.name] -= share
        step = min(remaining[i] / rate[i] for i in active)
        now += step
        for i in list(active):
            remaining[i] -= rate[i] * step
            if remaining[i] <= 1e-9 * flows[i][1]:
                active.discard(i)
    return now


def simulate(phases: list[Phase], topo: Topology) -> float:
    return sum(p.repeat * (p.latency_s + fair_share_time(p.transfers, topo)) for p in phases)


@pytest.fixture(scope="module")
def topo() -> Topology:
    """3 nodes x 4 GPUs, NVLink 300 GB/s (3.4 us), 2 NICs of 25 GB/s per node (9.6 us), 2:1 fabric."""
    return Topology(synthetic_cluster(num_gpus=12, gpus_per_node=4, nics_per_node=2, intra_GBps=300,
                                      intra_latency_us=3.4, nic_GBps=25, nic_latency_us=9.6,
                                      switch_latency_us=0.5, oversubscription=2.0))


@pytest.mark.parametrize(
    ("kind", "algorithm", "ranks"),
    [
        ("all_reduce", "ring", range(4)),
        ("all_reduce", "ring", range(12)),
        ("all_reduce", "hierarchical", range(12)),
        ("all_reduce", "tree", range(12)),
        ("all_reduce", "tree", (0, 4, 8, 9)),
        ("reduce_scatter", "hierarchical", range(12)),
        ("all_gather", "ring", (1, 5, 9)),
        ("broadcast", "ring", range(12)),
        ("all_to_all", "pairwise", range(8)),
        ("ring_exchange", "ring", range(4)),
        ("ring_exchange", "ring", range(12)),
    ],
)
def test_phases_simulated_alone_equal_the_closed_form(kind: str, algorithm: str, ranks: range,
                                                      topo: Topology) -> None:
    """Flow-mode view (phases + fair sharing) and fast-mode closed form agree for an isolated collective."""
    S = 64e6
    phases = collective_phases(kind, S, ranks, topo, algorithm=algorithm)
    assert simulate(phases, topo) == pytest.approx(collective_time_s(kind, S, ranks, topo, algorithm=algorithm))


def test_ring_phase_structure_and_bytes() -> None:
    """Ring all-reduce of 1 GiB on 8 GPUs (Simple wins at that size): a latency phase carrying NCCL's whole
    latency (base 8.4 us + 14 hops of 3.4 us), then one phase of 8 neighbour sends of S/8 repeated
    2(n-1) = 14 times: every rank sends 2(n-1)/n * S in total."""
    topo = Topology(synthetic_cluster(num_gpus=8, intra_latency_us=3.4))
    S = 2**30
    latency, ring = collective_phases("all_reduce", S, range(8), topo, algorithm="ring")
    assert latency.transfers == () and latency.latency_s == pytest.approx((NCCL_BASE_LATENCY_US + 14 * 3.4) * 1e-6)
    assert ring.repeat == 14 and ring.latency_s == 0.0
    assert sorted(ring.transfers) == [(i, (i + 1) % 8, S / 8) for i in range(8)]
    assert ring.total_bytes == pytest.approx(8 * 2 * 7 / 8 * S)


def test_multi_node_ring_phase_rides_every_rail() -> None:
    """2 nodes x 4 GPUs (4 NICs each): 4 channels; channel j visits a node from its j-th GPU, hands the
    chunk back to it over NVLink (PXN) and sends it to the other node's j-th GPU on rail j."""
    topo = Topology(synthetic_cluster(num_gpus=8, gpus_per_node=4))
    (ring,) = collective_phases("all_gather", 8e6, range(8), topo, algorithm="ring")
    chunk = 8e6 / (4 * 8)
    inter = sorted((a, b) for a, b, s in ring.transfers if topo.node_of(a) != topo.node_of(b))
    assert inter == sorted([(j, j + 4) for j in range(4)] + [(j + 4, j) for j in range(4)])
    assert all(topo.nic_of(a) == topo.nic_of(b) for a, b in inter)
    assert {s for _, _, s in ring.transfers} == {chunk}
    assert ring.repeat == 7
    outgoing = [sum(1 for a, b, _ in ring.transfers if a == r and topo.node_of(b) == topo.node_of(r)) for r in range(8)]
    assert outgoing == [4] * 8  # every NVLink port carries one chunk per channel: S/n per step


def test_hierarchical_phase_structure() -> None:
    """2 nodes x 8 GPUs: intra reduce-scatter (7 steps of S/8), 8 inter rings of 2 steps of S/16 each
    (one per rail), intra all-gather (7 steps); no base phase on a latency-free profile."""
    topo = Topology(synthetic_cluster(num_gpus=16))
    S = 16e6
    rs, inter, ag = collective_phases("all_reduce", S, range(16), topo, algorithm="hierarchical")
    assert (rs.repeat, inter.repeat, ag.repeat) == (7, 2, 7)
    assert {s for _, _, s in rs.transfers} == {S / 8}
    assert sorted(inter.transfers) == sorted([(j, j + 8, S / 16) for j in range(8)] +
                                             [(j + 8, j, S / 16) for j in range(8)])
    assert all(topo.nic_of(a) == topo.nic_of(b) for a, b, _ in inter.transfers)


def test_count_scales_latency_in_phases() -> None:
    """count=k folded collectives: the latency phase times k, bytes unchanged (the op's total)."""
    topo = Topology(synthetic_cluster(num_gpus=8, intra_latency_us=3.4))
    one = collective_phases("all_reduce", 8e6, range(8), topo, algorithm="ring")
    four = collective_phases("all_reduce", 8e6, range(8), topo, algorithm="ring", count=4)
    assert [p.latency_s * 4 for p in one] == pytest.approx([p.latency_s for p in four])
    assert [p.total_bytes for p in one] == pytest.approx([p.total_bytes for p in four])


def test_protocol_bandwidth_factor_inflates_the_flow_bytes() -> None:
    """LL128 moves 120 of 128 bytes: its phases carry the bytes / 0.92, so that flow mode alone takes the
    closed-form time (8 MB on 8 GPUs picks LL128)."""
    topo = Topology(synthetic_cluster(num_gpus=8, intra_latency_us=3.4))
    phases = collective_phases("all_reduce", 4 * 2**20, range(8), topo, algorithm="ring", protocol="LL128")
    assert phases[1].total_bytes == pytest.approx(8 * 2 * 7 / 8 * 4 * 2**20 / 0.92)


def test_single_rank_has_no_phases() -> None:
    """A one-rank group does nothing."""
    assert collective_phases("all_reduce", 1e6, [0], Topology(synthetic_cluster(num_gpus=8))) == []
