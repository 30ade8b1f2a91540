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

_AZURE = ("Azure/AI-benchmarking-guide (8fd0c6e) Azure_Results/{}_results.md, 'NCCL Bandwidth' "
          "(all_reduce in-place, NCCL {})")
_AZURE_SIZES = tuple(2**k for k in range(10, 34))  # the table's 1K, 2K, ..., 8G are 2^10 .. 2^33 bytes
CURVES: dict[tuple[str, str], tuple[tuple[float, ...], str]] = {
    ("ND A100 v4 (8x A100 80GB)", "dgx-a100-hdr"): (
        (0.04, 0.08, 0.17, 0.33, 0.67, 1.37, 2.70, 5.15, 10.11, 19.24, 36.22, 53.54, 71.43, 89.99, 109.22,
         132.77, 166.63, 174.18, 213.87, 221.58, 228.10, 230.22, 230.48, 231.58),
        _AZURE.format("ND_A100_v4", "2.18.5")),
    ("ND H100 v5 (8x H100)", "dgx-h100-ndr"): (
        (0.07, 0.14, 0.27, 0.53, 0.95, 1.71, 2.72, 5.40, 10.86, 21.35, 43.70, 81.93, 128.73, 172.13, 234.45,
         295.53, 361.78, 400.61, 423.38, 438.46, 466.35, 472.36, 475.54, 478.87),
        _AZURE.format("ND_H100_v5", "2.18.5")),
    ("ND H200 v5 (8x H200)", "hgx-h200-ndr"): (
        (0.06, 0.12, 0.23, 0.47, 0.93, 1.84, 3.72, 7.39, 14.75, 29.38, 52.96, 88.78, 138.44, 181.94, 240.41,
         300.91, 368.11, 412.45, 432.24, 442.72, 467.58, 472.57, 477.41, 479.98),
        _AZURE.format("ND_H200_v5", "2.20.5")),
}
"""Whole published 8-GPU all_reduce curves, (Azure VM, profile) -> (busbw GB/s at 1 KiB .. 8 GiB, source).
The A100 and H100 curves are the profiles' own ``[intra_busbw_curve]`` (in-sample: they read near 0%
by construction); the H200 curve is not in any profile (the H200 node uses the H100 curve: one per
NVLink4 fabric) and is the held-out check."""

BANDS: tuple[tuple[str, int, int], ...] = (("< 1 MiB", 0, MiB), ("1-64 MiB", MiB, 64 * MiB),
                                           ("64-512 MiB", 64 * MiB, 512 * MiB), (">= 512 MiB", 512 * MiB, 2**62))
"""Size bands of the summary (S, nccl-tests convention): latency-bound, medium (tensor-parallel
all-reduces), large, plateau."""


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


def curve_summary() -> None:
    """Model against each published whole curve: mean absolute and mean signed error per size band."""
    print("Whole published curves (8-GPU all_reduce busbw, one node): mean absolute / mean signed error by "
          "size band")
    print("| system | profile | " + " | ".join(name for name, _, _ in BANDS) + " | all | source |")
    print("|---|---|" + "---|" * (len(BANDS) + 2))
    for (system, profile), (values, source) in CURVES.items():
        errors = []
        for size, value in zip(_AZURE_SIZES, values, strict=True):
            bus, _ = predicted(Point(profile, "all_reduce", 8, size, value, source))
            errors.append((size, (bus - value) / value))
        cells = []
        for _, low, high in (*BANDS, ("all", 0, 2**62)):
            band = [e for size, e in errors if low <= size < high]
            cells.append(f"{sum(abs(e) for e in band) / len(band):.0%} / {sum(band) / len(band):+.0%}")
        print(f"| {system} | {profile} | " + " | ".join(cells) + f" | {source} |")
    print()
    print("Per size (published -> predicted busbw GB/s, error):")
    for (system, profile), (values, _) in CURVES.items():
        cells = []
        for size, value in zip(_AZURE_SIZES, values, strict=True):
            if size in (KiB, 32 * KiB, MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB, GiB, 8 * GiB):
                bus, _ = predicted(Point(profile, "all_reduce", 8, size, value, ""))
                cells.append(f"{_size(size)} {value:g}->{bus:.1f} ({(bus - value) / value:+.0%})")
        print(f"  {system} on {profile}: " + "; ".join(cells))


def main() -> None:
    print("| system | collective | GPUs | size | published busbw | predicted | error | NCCL choice | source |")
    print("|---|---|---|---|---|---|---|---|---|")
    for point in POINTS:
        bus, choice = predicted(point)
        error = (bus - point.busbw_GBps) / point.busbw_GBps
        print(f"| {point.system} | {point.kind} | {point.gpus} | {_size(point.nbytes)} | {point.busbw_GBps:.1f} | "
              f"{bus:.1f} | {error:+.0%} | {choice} | {point.source} |")
    print()
    curve_summary()
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
