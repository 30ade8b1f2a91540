"""The inter-node fabric: NIC ports, leaf switches and their uplinks to the spine.

Model (two-level folded Clos, the shape of NVIDIA's DGX SuperPOD reference architectures):

* ``rail-optimized-fat-tree``: NIC ``j`` of every node plugs into a leaf switch of rail ``j``; a leaf
  serves ``nodes_per_leaf`` consecutive nodes. Traffic between two NICs on the same rail leaf turns
  around in the leaf; everything else (another leaf group, or another rail) climbs to the spine.
  NCCL's rail-aligned rings keep inter-node hops on one rail, which is why this layout exists
  (NVIDIA DGX SuperPOD reference architecture, "compute fabric", rail-optimised design).
* ``fat-tree``: all NICs of a node go to the same leaf; a leaf serves ``nodes_per_leaf`` nodes.
* ``single-switch``: every NIC on one non-blocking box switch (a small 10 GbE cluster); the
  oversubscription factor does not apply (box switches switch at line rate on all ports).

A leaf's uplink (and downlink) is one :class:`Link` per direction whose rate is the leaf's downlink
capacity divided by the oversubscription factor, so at factor 2 flows that all leave the leaf get half
their NIC rate, which is what the factor means (downlink:uplink capacity). Spine switches themselves
are non-blocking and not modelled as separate links (a full-bisection spine layer).

Leaf size: profiles do not state the switch radix, so it follows from the fabric kind (switch models
of the SuperPOD designs): EDR SB7800 36 ports, HDR QM8700 40 ports (DGX A100 SuperPOD: 20 nodes per
scalable unit), NDR QM9700 64 ports (DGX H100 SuperPOD: 32 nodes per scalable unit), XDR Q3400 144
ports, Ethernet/RoCE 64 ports (Spectrum SN5600 class). Of ``radix`` ports, ``radix * o / (1 + o)`` face
down at oversubscription ``o``.

Latency: the NIC's latency is split between its out and in links; each switch traversal adds the
network's ``switch_latency_us`` (leaf on the out link, spine on the uplink, leaf again on the downlink).
"""

from __future__ import annotations

import math
from functools import cached_property

from simgrid.hardware import Cluster
from simgrid.topology.link import GB, Link, link_from_spec

LEAF_SWITCH_PORTS: dict[str, int] = {
    "infiniband-edr": 36,  # Mellanox SB7800
    "infiniband-hdr": 40,  # Mellanox QM8700 (DGX A100 SuperPOD leaf)
    "infiniband-ndr": 64,  # NVIDIA QM9700 (DGX H100 SuperPOD leaf)
    "infiniband-xdr": 144,  # NVIDIA Q3400
    "roce": 64,  # Spectrum-4 SN5600 class
    "ethernet": 64,
    "ideal": 1 << 30,  # one leaf for any size: an ideal fabric has no spine
}
"""Ports per leaf switch by fabric kind (see module docstring for the switch models)."""


class Fabric:
    """NIC, leaf and spine links of one sized cluster, created on first use."""

    def __init__(self, cluster: Cluster) -> None:
        self._cluster = cluster
        self._node = cluster.node
        self._net = cluster.network
        self._links: dict[tuple[str, int, int, str], Link] = {}

    @property
    def rail_optimized(self) -> bool:
        """Whether NIC j of every node sits on rail switch j."""
        return self._net.topology == "rail-optimized-fat-tree"

    @cached_property
    def nodes_per_leaf(self) -> int:
        """Nodes whose NICs share one leaf switch (per rail when rail-optimised)."""
        if self._net.topology == "single-switch":
            return max(1, self._cluster.num_nodes)
        radix = LEAF_SWITCH_PORTS.get(self._net.kind, 64)
        o = self._net.oversubscription
        down_ports = max(1, math.floor(radix * o / (1.0 + o)))
        if self.rail_optimized:
            return down_ports
        return max(1, down_ports // self._node.nics_per_node)

    def leaf_of(self, node: int) -> int:
        """Leaf group of a node (its index among leaves of one rail)."""
        return node // self.nodes_per_leaf

    def nic_of_local(self, local: int) -> int:
        """NIC a local GPU uses: the nearest one, ``local % nics_per_node`` (one NIC per GPU on DGX)."""
        return local % self._node.nics_per_node

    def nic_out(self, node: int, nic: int) -> Link:
        """NIC transmit link, node -> leaf (carries the first leaf traversal's latency)."""
        key = ("nic", node, nic, "out")
        link = self._links.get(key)
        if link is None:
            lat = self._node.nic_link.latency_us / 2 + self._net.switch_latency_us
            link = link_from_spec(f"node{node}/nic{nic}/out", self._node.nic_link, latency_us=lat,
                                  extra_efficiency=self._net.efficiency)
            self._links[key] = link
        return link

    def nic_in(self, node: int, nic: int) -> Link:
        """NIC receive link, leaf -> node."""
        key = ("nic", node, nic, "in")
        link = self._links.get(key)
        if link is None:
            link = link_from_spec(f"node{node}/nic{nic}/in", self._node.nic_link,
                                  latency_us=self._node.nic_link.latency_us / 2,
                                  extra_efficiency=self._net.efficiency)
            self._links[key] = link
        return link

    def _leaf_link(self, rail: int, leaf: int, direction: str) -> Link:
        key = ("leaf", rail, leaf, direction)
        link = self._links.get(key)
        if link is None:
            ports = self.nodes_per_leaf * (1 if self.rail_optimized else self._node.nics_per_node)
            # Uplink capacity = downlink capacity / oversubscription (the factor's definition).
            share = ports / self._net.oversubscription
            prefix = f"rail{rail}/leaf{leaf}" if self.rail_optimized else f"leaf{leaf}"
            link = link_from_spec(f"{prefix}/{direction}", self._node.nic_link,
                                  latency_us=self._net.switch_latency_us,
                                  extra_efficiency=self._net.efficiency, share=share)
            self._links[key] = link
        return link

    def leaf_up(self, rail: int, leaf: int) -> Link:
        """A leaf's uplinks to the spine, aggregated (``rail`` is 0 unless rail-optimised)."""
        return self._leaf_link(rail, leaf, "up")

    def leaf_down(self, rail: int, leaf: int) -> Link:
        """A leaf's downlinks from the spine, aggregated."""
        return self._leaf_link(rail, leaf, "down")

    def route(self, src_node: int, src_nic: int, dst_node: int, dst_nic: int) -> tuple[Link, ...]:
        """Links from one node's NIC to another node's NIC."""
        out, into = self.nic_out(src_node, src_nic), self.nic_in(dst_node, dst_nic)
        if self._net.topology == "single-switch":
            return (out, into)
        src_leaf, dst_leaf = self.leaf_of(src_node), self.leaf_of(dst_node)
        if self.rail_optimized:
            if src_nic == dst_nic and src_leaf == dst_leaf:
                return (out, into)
            return (out, self.leaf_up(src_nic, src_leaf), self.leaf_down(dst_nic, dst_leaf), into)
        if src_leaf == dst_leaf:
            return (out, into)
        return (out, self.leaf_up(0, src_leaf), self.leaf_down(0, dst_leaf), into)

    def route_class(self, src_node: int, src_nic: int, dst_node: int, dst_nic: int) -> tuple[int, int, bool]:
        """A key equal for two NIC-to-NIC routes whose links have equal rates and latencies in order.

        Every node's NIC links share one spec and every leaf's aggregated links one ``share``, so a
        route's link parameters depend only on the NICs and on whether it climbs to the spine (the
        branches of :meth:`route`). Cheap: no link is made (cost caches key on it at 16,384 ranks).
        """
        if self._net.topology == "single-switch":
            return (src_nic, dst_nic, False)
        same_leaf = self.leaf_of(src_node) == self.leaf_of(dst_node)
        if self.rail_optimized:
            return (src_nic, dst_nic, not (src_nic == dst_nic and same_leaf))
        return (src_nic, dst_nic, not same_leaf)

    def all_links(self) -> list[Link]:
        """Every NIC and leaf link of the cluster (materialises them)."""
        nodes, nics = self._cluster.num_nodes, self._node.nics_per_node
        links: list[Link] = []
        for node in range(nodes):
            for nic in range(nics):
                links += [self.nic_out(node, nic), self.nic_in(node, nic)]
        if self._net.topology == "single-switch":
            return links
        leaves = -(-nodes // self.nodes_per_leaf)
        needs_spine = leaves > 1 or (self.rail_optimized and nics > 1)
        if needs_spine:
            for rail in range(nics if self.rail_optimized else 1):
                for leaf in range(leaves):
                    links += [self.leaf_up(rail, leaf), self.leaf_down(rail, leaf)]
        return links

    def nic_rate_Bps(self) -> float:
        """Achievable rate of one NIC (line rate x NIC efficiency x fabric efficiency)."""
        spec = self._node.nic_link
        return spec.bandwidth_GBps * GB * spec.efficiency * self._net.efficiency
