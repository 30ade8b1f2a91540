"""Point-to-point and host-transfer costs: route latency plus bytes over the slowest link."""

from __future__ import annotations

import pytest

from simgrid.costs import p2p_time_s, transfer_time_s
from simgrid.errors import SimgridError
from simgrid.hardware import MeasuredTables, P2PRow
from simgrid.topology import Topology, synthetic_cluster


def test_p2p_within_and_across_nodes() -> None:
    """Same node: NVLink latency + S/B_nvl; other node: NIC latency + switch hop + S/B_nic."""
    topo = Topology(synthetic_cluster(num_gpus=16, intra_GBps=300, intra_latency_us=3.4, nic_GBps=25,
                                      nic_latency_us=9.6, switch_latency_us=0.5))
    S = 100e6
    assert p2p_time_s(S, 0, 1, topo) == pytest.approx(3.4e-6 + S / 300e9)
    assert p2p_time_s(S, 0, 8, topo) == pytest.approx(9.6e-6 + 0.5e-6 + S / 25e9)
    assert p2p_time_s(S, 4, 4, topo) == 0.0


def test_p2p_measured_table_overrides() -> None:
    """A calibrated p2p table replaces the formula (interpolated in bytes)."""
    table = MeasuredTables(p2p=(P2PRow(bytes=0, time_us=10.0), P2PRow(bytes=1000, time_us=20.0)))
    topo = Topology(synthetic_cluster(num_gpus=2, gpus_per_node=2, measured=table))
    assert p2p_time_s(500, 0, 1, topo) == pytest.approx(15e-6)


def test_host_transfer_over_pcie() -> None:
    """Offload copy of 1 GB at 32 GB/s x 0.8 efficiency: PCIe latency + 1e9 / 25.6e9."""
    topo = Topology(synthetic_cluster(num_gpus=8, pcie_GBps=32, pcie_latency_us=5.7, link_efficiency=0.8))
    assert transfer_time_s(1e9, 3, "d2h", topo) == pytest.approx(5.7e-6 + 1e9 / 25.6e9)
    assert transfer_time_s(1e9, 3, "h2d", topo) == pytest.approx(5.7e-6 + 1e9 / 25.6e9)


def test_negative_bytes_rejected() -> None:
    """A negative size names the argument."""
    with pytest.raises(SimgridError, match="nbytes = -5 must be >= 0"):
        p2p_time_s(-5, 0, 1, Topology(synthetic_cluster(num_gpus=2)))
