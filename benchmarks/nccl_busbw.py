"""Predicted nccl-tests bus bandwidth against published measurements (issue 12, item 2).

Run from the repository root::

    python benchmarks/nccl_busbw.py            # the comparison table, then the predicted curves

Each published point names its source beside the data. The prediction is ``simgrid.costs``' closed form
(NCCL's tuner model with the topology's bandwidth) on the shipped profile of that machine, converted to
busbw with nccl-tests' factors (PERFORMANCE.md). Nothing here is fitted: the profiles' link efficiencies
come from their own sources (hardware_profiles/), NCCL's constants from its tuning.cc.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from simgrid.costs import bus_bandwidth_GBps, choose, collective_time_s
from simgrid.hardware import Cluster, load_cluster
from simgrid.topology import Topology

KiB, MiB, GiB = 2**10, 2**20, 2**30


@dataclass(frozen=True)
class Point:
    """One published nccl-tests figure."""

    system: str
    """Which profile (and size) predicts it."""
    kind: str
    """nccl-tests collective (all_reduce, all_gather)."""
    gpus: int
    """Ranks in the test."""
    nbytes: int
    """Message size S."""
    busbw_GBps: float
    """Published bus bandwidth."""
    source: str
    """Where the figure is published."""


H200 = "shared/reference/hardware.md: 8xH200 all_reduce with NVLS"
POINTS: tuple[Point, ...] = (
    Point("hgx-h200-ndr", "all_reduce", 8, 16 * GiB, 482.0, H200),
    Point("hgx-h200-ndr", "all_reduce", 8, GiB, 464.0, H200),
    Point("hgx-h200-ndr", "all_reduce", 8, 16 * MiB, 220.0, H200),
    Point("hgx-h200-ndr", "all_reduce", 8, 32 * KiB, 1.4, H200),
    Point("dgx-h100-ndr", "all_reduce", 8, 8 * GiB, 480.0,
          "NVIDIA (S. Jeaugey), nccl-tests issue #212: 8 H100 with NVLS reach a peak busbw of ~480 GB/s"),
    Point("dgx-h100-ndr", "all_gather", 8, 16 * GiB, 360.0,
          "NVIDIA (S. Jeaugey), nccl-tests issue #326: 360 GB/s all_gather busbw on 8 H100 is as expected"),
    Point("dgx-a100-hdr", "all_reduce", 8, GiB, 200.0,
          "nccl-tests issue #149: 8x A100 80GB SXM (HPE Apollo 6500, NCCL 2.18) busbw ~200 GB/s at 1 GiB"),
    Point("3x dgx-a100-40gb, 4 HDR NICs, Intel", "all_reduce", 24, 128 * MiB, 96.0,
          "nccl-tests issue #119: 3 nodes of 8x A100 40GB, 4x HDR 200 Gb/s, 2x Xeon 8358: peak ~96 GB/s "
          "(average 84.8) up to 128 MB"),
)
"""Published points; the last row's machine is built below from the shipped A100 40GB node."""


def cluster_for(system: str, gpus: int) -> Cluster:
    """The shipped profile, or the 4-NIC Intel variant of the DGX A100 40GB node for issue #119."""
    if system.startswith("3x dgx-a100-40gb"):
        base = load_cluster("dgx-a100-40gb-hdr", gpus=gpus)
        node = dataclasses.replace(base.node, nics_per_node=4, cpu_vendor="intel")
        return dataclasses.replace(base.spec, node=node).sized(gpus)
    return load_cluster(system, gpus=gpus)


def predicted(point: Point) -> tuple[float, str]:
    """(predicted busbw, NCCL algorithm/protocol chosen) for one point."""
    topo = Topology(cluster_for(point.system, point.gpus))
    ranks = range(point.gpus)
    t = collective_time_s(point.kind, point.nbytes, ranks, topo)
    algo, proto = choose(point.kind, point.nbytes, ranks, topo)
    return bus_bandwidth_GBps(point.kind, point.nbytes, point.gpus, t), f"{algo}/{proto}"


def _size(n: int) -> str:
    for unit, name in ((GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB")):
        if n >= unit:
            return f"{n // unit} {name}"
    return f"{n} B"


def main() -> None:
    print("| system | collective | GPUs | size | published busbw | predicted | error | NCCL choice | source |")
    print("|---|---|---|---|---|---|---|---|---|")
    for point in POINTS:
        bus, choice = predicted(point)
        error = (bus - point.busbw_GBps) / point.busbw_GBps
        print(f"| {point.system} | {point.kind} | {point.gpus} | {_size(point.nbytes)} | {point.busbw_GBps:.1f} | "
              f"{bus:.1f} | {error:+.0%} | {choice} | {point.source} |")
    print()
    print("Predicted curves (busbw GB/s; algorithm/protocol):")
    sizes = [2**k for k in range(10, 35, 3)]
    for system, gpus, kind in (("dgx-a100-hdr", 8, "all_reduce"), ("dgx-a100-hdr", 64, "all_reduce"),
                               ("dgx-a100-hdr", 1536, "all_gather"), ("hgx-h200-ndr", 8, "all_reduce"),
                               ("dgx-h100-ndr", 64, "all_reduce")):
        topo = Topology(load_cluster(system, gpus=gpus))
        cells = []
        for size in sizes:
            t = collective_time_s(kind, size, range(gpus), topo)
            algo, proto = choose(kind, size, range(gpus), topo)
            cells.append(f"{_size(size)}: {bus_bandwidth_GBps(kind, size, gpus, t):.1f} {algo}/{proto}")
        print(f"  {system} x{gpus} {kind}: " + "; ".join(cells))


if __name__ == "__main__":
    main()
