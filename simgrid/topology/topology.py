"""Where ranks sit and which links a transfer between two of them crosses.

Placement: node-major, rank ``r`` on node ``r // gpus_per_node`` with local index ``r % gpus_per_node``
(torchrun's default; with the layout's tp-fastest order a TP group sits inside one node).

Intra-node fabric (one :class:`Link` per direction, rates already multiplied by efficiency):

* ``nvswitch``: each GPU has one NVLink port out to the switch and one in, at its full per-direction
  NVLink rate (A100: 12 links x 25 GB/s = 300 GB/s). The switch is non-blocking, so a transfer between
  any pair is ``gpu_a/nvlink-out -> gpu_b/nvlink-in`` and only the ports are shared.
* ``nvlink-mesh``: GPUs are wired directly. Simplification: each GPU's total NVLink rate is one shared
  out port and one in port, as for a switch. This is exact for traffic that spreads over all of a GPU's
  links (NCCL builds several rings over different links) and optimistic for a single pair, which in a
  real mesh only gets the links wired between those two GPUs.
* ``pcie``: ``gpus_per_pcie_switch`` GPUs per PCIe switch, each with its own link to the switch (the
  node's ``intra_link``); switches reach each other through the CPU root complex over one uplink per
  switch (``pcie_link``), which the GPUs under that switch share. One root complex per node: cross-socket
  (UPI/xGMI) hops are not modelled.

Host side (optimizer offload): every node, whatever its GPU fabric, has the same PCIe tree; a host copy
crosses the GPU's link to its PCIe switch and the switch's uplink to the root complex (``pcie_link``).

Inter-node: the GPU's nearest NIC (``local % nics_per_node``) and the fabric of
:mod:`simgrid.topology.fabric`. GPUDirect RDMA data also crosses the PCIe switch the GPU shares with its
NIC; that hop is not a separate link because on every profiled node the NIC is slower than PCIe and the
NIC latency is the end-to-end per-hop network figure (NCCL's ``NET`` hardware latency).

Latency: a route's latency is the sum of its links' ``latency_s``; each traversal's latency is split
over the links of that traversal (NVLink: all on the out port; PCIe: half on each link of a hop).
Everything is built on first use and routes are cached, so a 16,384-GPU topology costs only what the
program touches.
"""

from __future__ import annotations

from numbers import Integral
from typing import Literal

from simgrid.errors import SimgridError
from simgrid.hardware import Cluster
from simgrid.topology.fabric import Fabric
from simgrid.topology.link import Link, link_from_spec, route_bandwidth_Bps, route_latency_s

HostDirection = Literal["d2h", "h2d"]

NVSWITCH = -1
"""Stand-in rank for the NVSwitch itself in a transfer: ``route(r, NVSWITCH)`` is GPU r's NVLink port into
the switch, ``route(NVSWITCH, r)`` the port out of it. NVLink SHARP (NVLS) reduces and multicasts inside
the switch, so its traffic is one GPU's port against the switch, not a GPU pair (simgrid.costs.phases)."""


class Topology:
    """The links of a sized cluster and the route between any two ranks (built lazily, cached)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.num_gpus = cluster.num_gpus
        self.num_nodes = cluster.num_nodes
        self.gpus_per_node = cluster.node.gpus_per_node
        self.fabric = Fabric(cluster)
        self._node = cluster.node
        self._links: dict[tuple[str, int, int], Link] = {}
        self._routes: dict[tuple[int, int], tuple[Link, ...]] = {}
        self._host_routes: dict[tuple[int, str], tuple[Link, ...]] = {}

    # ----------------------------------------------------------------------------------- placement
    def _check_rank(self, rank: int, what: str = "rank") -> None:
        if type(rank) is int and 0 <= rank < self.num_gpus:  # the hot path: skip the slow ABC check
            return
        if not isinstance(rank, Integral) or not 0 <= rank < self.num_gpus:
            raise SimgridError(
                f"{what} = {rank!r} is outside the cluster's {self.num_gpus} GPUs; use a rank in 0..{self.num_gpus - 1}"
            )

    def node_of(self, rank: int) -> int:
        """Node index of a rank (node-major placement)."""
        self._check_rank(rank)
        return rank // self.gpus_per_node

    def local_index(self, rank: int) -> int:
        """Position of a rank inside its node."""
        self._check_rank(rank)
        return rank % self.gpus_per_node

    def same_node(self, a: int, b: int) -> bool:
        """Whether two ranks share a node (and so talk over the intra-node fabric)."""
        return self.node_of(a) == self.node_of(b)

    def nic_of(self, rank: int) -> int:
        """Index (within its node) of the NIC a rank sends and receives through."""
        return self.fabric.nic_of_local(self.local_index(rank))

    def pcie_switch_of(self, rank: int) -> int:
        """Index (within its node) of the PCIe switch a rank's GPU hangs off."""
        return self.local_index(rank) // self._node.gpus_per_pcie_switch

    # ----------------------------------------------------------------------------------- links
    def _gpu_link(self, node: int, local: int, kind: str) -> Link:
        key = (kind, node, local)
        link = self._links.get(key)
        if link is not None:
            return link
        spec_node = self._node
        name = f"node{node}/gpu{local}/{kind}"
        if kind == "nvlink-out":
            link = link_from_spec(name, spec_node.intra_link, latency_us=spec_node.intra_link.latency_us)
        elif kind == "nvlink-in":
            link = link_from_spec(name, spec_node.intra_link, latency_us=0.0)
        elif kind in ("pcie-up", "pcie-down"):
            # On a PCIe-fabric node the GPU's own PCIe link is its intra-node fabric link.
            spec = spec_node.intra_link if spec_node.intra_fabric == "pcie" else spec_node.pcie_link
            link = link_from_spec(name, spec, latency_us=spec.latency_us / 2)
        else:  # "switch-up" / "switch-down": local is the PCIe switch index
            name = f"node{node}/pcie-switch{local}/{kind.removeprefix('switch-')}"
            link = link_from_spec(name, spec_node.pcie_link, latency_us=spec_node.pcie_link.latency_us / 2)
        self._links[key] = link
        return link

    def _intra_route(self, node: int, a: int, b: int) -> tuple[Link, ...]:
        if self._node.intra_fabric in ("nvswitch", "nvlink-mesh"):
            return (self._gpu_link(node, a, "nvlink-out"), self._gpu_link(node, b, "nvlink-in"))
        per_switch = self._node.gpus_per_pcie_switch
        sa, sb = a // per_switch, b // per_switch
        if sa == sb:
            return (self._gpu_link(node, a, "pcie-up"), self._gpu_link(node, b, "pcie-down"))
        return (
            self._gpu_link(node, a, "pcie-up"),
            self._gpu_link(node, sa, "switch-up"),
            self._gpu_link(node, sb, "switch-down"),
            self._gpu_link(node, b, "pcie-down"),
        )

    def route(self, src: int, dst: int) -> tuple[Link, ...]:
        """Links a transfer from ``src`` to ``dst`` crosses, in order; ``()`` when ``src == dst``.

        Either end may be :data:`NVSWITCH` (the other a GPU on an NVSwitch node): the GPU's NVLink port.
        """
        key = (src, dst)
        cached = self._routes.get(key)
        if cached is not None:
            return cached
        if src == NVSWITCH or dst == NVSWITCH:
            return self._switch_route(src, dst)
        self._check_rank(src, "src")
        self._check_rank(dst, "dst")
        g = self.gpus_per_node
        src_node, src_local = divmod(src, g)
        dst_node, dst_local = divmod(dst, g)
        if src == dst:
            route: tuple[Link, ...] = ()
        elif src_node == dst_node:
            route = self._intra_route(src_node, src_local, dst_local)
        else:
            route = self.fabric.route(src_node, self.fabric.nic_of_local(src_local),
                                      dst_node, self.fabric.nic_of_local(dst_local))
        self._routes[key] = route
        return route

    def _switch_route(self, src: int, dst: int) -> tuple[Link, ...]:
        gpu = dst if src == NVSWITCH else src
        self._check_rank(gpu, "rank")
        if self._node.intra_fabric != "nvswitch":
            raise SimgridError(
                f"a transfer through the NVSwitch needs an nvswitch node; {self._node.name!r} has "
                f"intra_fabric = {self._node.intra_fabric!r}"
            )
        node, local = divmod(gpu, self.gpus_per_node)
        route = (self._gpu_link(node, local, "nvlink-out" if dst == NVSWITCH else "nvlink-in"),)
        self._routes[(src, dst)] = route
        return route

    def route_class(self, src: int, dst: int) -> tuple[object, ...]:
        """A key equal for two routes whose links have the same rates and latencies in the same order.

        Lone-transfer times depend only on those, so cost caches can key on the class instead of the
        rank pair. Every node is built from one node spec, so an intra-node route is classed by its two
        local GPU indices and an inter-node one by :meth:`Fabric.route_class`; no link is made.
        """
        if src == dst:
            self._check_rank(src, "src")
            return ("self",)
        self._check_rank(src, "src")
        self._check_rank(dst, "dst")
        src_node, src_local = divmod(src, self.gpus_per_node)
        dst_node, dst_local = divmod(dst, self.gpus_per_node)
        if src_node == dst_node:
            return ("intra", src_local, dst_local)
        nic_of = self.fabric.nic_of_local
        return ("inter", *self.fabric.route_class(src_node, nic_of(src_local), dst_node, nic_of(dst_local)))

    def host_route(self, rank: int, direction: HostDirection) -> tuple[Link, ...]:
        """Links a host copy crosses: ``d2h`` GPU -> PCIe switch -> root complex; ``h2d`` the reverse."""
        key = (rank, direction)
        cached = self._host_routes.get(key)
        if cached is not None:
            return cached
        if direction not in ("d2h", "h2d"):
            raise SimgridError(f"direction = {direction!r} must be 'd2h' (device to host) or 'h2d'")
        node, local = self.node_of(rank), self.local_index(rank)
        switch = local // self._node.gpus_per_pcie_switch
        if direction == "d2h":
            route = (self._gpu_link(node, local, "pcie-up"), self._gpu_link(node, switch, "switch-up"))
        else:
            route = (self._gpu_link(node, switch, "switch-down"), self._gpu_link(node, local, "pcie-down"))
        self._host_routes[key] = route
        return route

    def route_latency_s(self, src: int, dst: int) -> float:
        """Latency of the route from ``src`` to ``dst``."""
        return route_latency_s(self.route(src, dst))

    def route_bandwidth_Bps(self, src: int, dst: int) -> float:
        """Rate a lone transfer from ``src`` to ``dst`` gets (its slowest link)."""
        return route_bandwidth_Bps(self.route(src, dst))

    def all_links(self) -> list[Link]:
        """Every link of the cluster (materialises them all: O(GPUs + NICs + leaves))."""
        links: list[Link] = []
        g = self.gpus_per_node
        switches = -(-g // self._node.gpus_per_pcie_switch)
        for node in range(self.num_nodes):
            on_node = self.cluster.gpus_on_node(node)
            for local in range(on_node):
                if self._node.intra_fabric != "pcie" and on_node > 1:
                    links += [self._gpu_link(node, local, "nvlink-out"), self._gpu_link(node, local, "nvlink-in")]
                links += [self._gpu_link(node, local, "pcie-up"), self._gpu_link(node, local, "pcie-down")]
            for switch in range(min(switches, -(-on_node // self._node.gpus_per_pcie_switch))):
                links += [self._gpu_link(node, switch, "switch-up"), self._gpu_link(node, switch, "switch-down")]
        if self.num_nodes > 1:
            links += self.fabric.all_links()
        return links

    def __repr__(self) -> str:
        return (f"Topology({self.cluster.spec.name!r}, {self.num_gpus} GPUs on {self.num_nodes} nodes, "
                f"{self._node.intra_fabric}, {self.cluster.network.topology})")
