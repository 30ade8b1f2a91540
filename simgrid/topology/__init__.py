"""Cluster topology: rank placement, directional links (NVLink/NVSwitch ports, PCIe tree, NICs, fabric
switches) and the route between any two ranks. See :mod:`simgrid.topology.topology` for the model."""

from simgrid.topology.fabric import LEAF_SWITCH_PORTS, Fabric
from simgrid.topology.link import Link, link_from_spec, route_bandwidth_Bps, route_latency_s
from simgrid.topology.synthetic import synthetic_cluster
from simgrid.topology.topology import NVSWITCH, HostDirection, Topology

__all__ = [
    "LEAF_SWITCH_PORTS",
    "NVSWITCH",
    "Fabric",
    "HostDirection",
    "Link",
    "Topology",
    "link_from_spec",
    "route_bandwidth_Bps",
    "route_latency_s",
    "synthetic_cluster",
]
