"""Multi-node collective bandwidth against published nccl-tests figures (issue 12, item 2: netcurve).

Usage::

    python benchmarks/nccl_multinode.py               # print, and write docs/nccl_multinode.md
    python benchmarks/nccl_multinode.py --skip-write  # print only

Each published figure names its machine, node count, GPUs per node, size and source. The prediction is the code
path the simulator uses for a data-parallel group: :func:`simgrid.costs.collective_time_s` (NCCL's tuner model
with the topology's bandwidth, ``algorithm="auto"``) on the shipped cluster profile, for the group the test ran
(every GPU of every node, or one GPU per node: local GPU 0, as a data-parallel group of one tensor-parallel rank
sits on one rail), converted to busbw with nccl-tests' factors (PERFORMANCE.md). Error = predicted / published - 1
(+ = model faster). Nothing here is fitted: NCCL's constants are its tuning.cc, the link efficiencies the
profiles' own sources. ``status`` says how a row is summarised: ``headline`` (InfiniBand/RoCE, a mechanism the
model has), ``calibration`` (the single-NIC figures the profiles' ``nic_efficiency`` 0.96 is read from: circular),
``scaling`` (a user's series by node count whose size is not stated), ``not-modelled`` (SHARP /
NVLS-tree in the switches, which the model lacks) and ``out-of-family`` (another fabric); all are printed.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))  # published_doc_cli lives beside this script

import published_doc_cli

from simgrid.costs import bus_bandwidth_GBps, choose, collective_time_s
from simgrid.hardware import load_cluster
from simgrid.topology import Topology

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "nccl_multinode.md"
KiB, MiB, GiB = 2**10, 2**20, 2**30
STATUSES = ("headline", "calibration", "scaling", "not-modelled", "out-of-family")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Point:
    """One published multi-node nccl-tests figure."""

    machine: str
    """The measured machine, in the source's words."""
    system: str
    """Shipped cluster profile that predicts it."""
    kind: str
    """nccl-tests collective: all_reduce, all_gather or reduce_scatter."""
    nodes: int
    """Nodes in the test."""
    gpus_per_node: int
    """Ranks per node (1: one GPU and its NIC per node)."""
    nbytes: int
    """Message size S (nccl-tests convention)."""
    busbw_GBps: float
    """Published bus bandwidth."""
    nccl: str
    """NCCL version, or "not stated"."""
    status: str
    """headline, scaling, not-modelled or out-of-family (see the module docstring)."""
    source: str
    """Where the figure is published (file, slide, issue and comment)."""
    caveat: str = ""
    """What the source leaves open and what was assumed (empty for none)."""


_GTC24 = ("NVIDIA GTC 2024 session S62129, slide 12 'Collective Communication Bandwidth' (NCCL Tests Allreduce Bus "
          "Bandwidth in GB/s), reproduced in stas00/ml-engineering (744d01e) "
          "network/benchmarks/images/all-reduce-multi-node-bandwidth.png")
_GTC25 = ("NVIDIA GTC 2025 session S72583, slide 12 (NCCL Tests Allreduce Bus Bandwidth in GB/s, 32 GPUs), "
          "reproduced in stas00/ml-engineering (744d01e) network/images/all-reduce-bw-2025.png")
_PLATEAU = "size not stated: a plateau figure, compared at 8 GiB"
_ONE_NIC = ("a single-NIC figure (one GPU per node); node count not stated, compared on 4 nodes of one GPU "
            "at 8 GiB")
_RS_1229 = ("NVIDIA/nccl issue #1229 (H100 cluster, 400 Gb/s NICs, 2024-03): reduce_scatter busbw 360, 345, 320, "
            "300, 280, 260 GB/s on 4, 8, 16, 32, 64, 128 nodes")
_STAS = ("stas00/ml-engineering (744d01e) network/README.md, 'Inter-node speed depends on intra-node speed': 4x AWS "
         "P6-B200 (8x B200, 8x 400 Gb/s EFA v4 per node), all_reduce_bench.py, torch 2.9.1, NCCL 2.27.7")
_EFA = ("AWS EFA (SRD, aws-ofi-nccl and its own tuner), not InfiniBand; predicted on the InfiniBand hgx-b200 "
        "profile (same 8x 400 Gb/s per node)")

POINTS: tuple[Point, ...] = (
    Point(machine="400 Gb/s RDMA NIC (IB/RoCE)", system="dgx-h100-ndr", kind="all_reduce", nodes=4, gpus_per_node=1,
          nbytes=8 * GiB, busbw_GBps=48.0, nccl="not stated", status="calibration", source=_GTC24
          + "; NVIDIA maintainers: 'For NDR @ 400Gbps you should see 46-48GB/s per NIC' (NVIDIA/nccl-tests #290, "
          "2025-03-03), 'CX-7 NICs at NDR rate (400Gbps) should achieve up to 48-49GB/s per NIC' (nccl-tests "
          "#267, 2025-01-23)", caveat=_ONE_NIC),
    Point(machine="200 Gb/s RDMA NIC (IB/RoCE)", system="dgx-a100-hdr", kind="all_reduce", nodes=4, gpus_per_node=1,
          nbytes=8 * GiB, busbw_GBps=24.0, nccl="not stated", status="calibration", source=_GTC24
          + "; NVIDIA maintainer: 20 GB/s per HDR NIC 'is not 24 (what we see ourselves in general on perfect "
          "setups)' (NVIDIA/nccl-tests #160, 2023-08-01)", caveat=_ONE_NIC),
    Point(machine="DGX A100, 8x 200 Gb/s RDMA", system="dgx-a100-hdr", kind="all_reduce", nodes=4, gpus_per_node=8,
          nbytes=8 * GiB, busbw_GBps=192.0, nccl="not stated", status="headline", source=_GTC25
          + "; the same 192 in GTC24 S62129 slide 12 and from an NVIDIA maintainer: 'On an Nvidia DGX-A100 "
          "system we have 8x200Gbit/s IB cards and we measure 192GB/s AllReduce BusBW' (NVIDIA/nccl #812, "
          "2023-03-31)", caveat=_PLATEAU),
    Point(machine="DGX H100, 8x 400 Gb/s RDMA", system="dgx-h100-ndr", kind="all_reduce", nodes=4, gpus_per_node=8,
          nbytes=8 * GiB, busbw_GBps=370.0, nccl="not stated", status="headline", source=_GTC25,
          caveat=_PLATEAU),
    Point(machine="DGX H100, 8x 400 Gb/s RDMA", system="dgx-h100-ndr", kind="all_reduce", nodes=4, gpus_per_node=8,
          nbytes=8 * GiB, busbw_GBps=380.0, nccl="not stated", status="headline", source=_GTC24,
          caveat=_PLATEAU + "; node count not stated on this slide, 4 nodes (32 GPUs) as on the GTC25 slide"),
    Point(machine="DGX H100, 8x 400 Gb/s RDMA, SHARP", system="dgx-h100-ndr", kind="all_reduce", nodes=4,
          gpus_per_node=8, nbytes=8 * GiB, busbw_GBps=480.0, nccl="not stated", status="not-modelled",
          source=_GTC25, caveat="NVLink SHARP inside the node plus SHARP in the InfiniBand switches (NVLS-tree / "
          "CollNet), which the model does not have; " + _PLATEAU),
    *(Point(machine="H100 nodes, 8 GPUs, 400 Gb/s NICs", system="dgx-h100-ndr", kind="reduce_scatter", nodes=nodes,
            gpus_per_node=8, nbytes=8 * GiB, busbw_GBps=bw, nccl="not stated", status="scaling", source=_RS_1229,
            caveat="a user's figures: size, NCCL version and NIC count not stated; compared at 8 GiB, the usual "
            "top of an nccl-tests sweep")
      for nodes, bw in ((4, 360.0), (8, 345.0), (16, 320.0), (32, 300.0), (64, 280.0), (128, 260.0))),
    *(Point(machine="4x P6-B200, 8x 400 Gb/s EFA v4", system="hgx-b200", kind="all_reduce", nodes=4, gpus_per_node=8,
            nbytes=size, busbw_GBps=bw, nccl="2.27.7", status="out-of-family", source=_STAS, caveat=_EFA)
      for size, bw in ((1 * MiB, 5.37), (16 * MiB, 64.43), (64 * MiB, 156.74), (128 * MiB, 197.94),
                       (256 * MiB, 229.09), (512 * MiB, 326.90), (1 * GiB, 361.99), (4 * GiB, 377.34),
                       (16 * GiB, 381.80))),
)
"""Published multi-node points. Single-NIC figures are modelled as one GPU per node on the node's rail (a
data-parallel group's case); 8-GPU figures as every GPU of every node."""

BUCKET_BYTES = 159_000_000
"""The megatron-h100-32b data-parallel bucket (docs/design.md, session 11): about 159 MB per all-gather and
reduce-scatter over 48 nodes, one GPU per node."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Row:
    """One point compared."""

    point: Point
    predicted_GBps: float
    """The simulator's busbw for the same group and size."""
    choice: str
    """NCCL algorithm/protocol the model's tuner picks."""

    @property
    def error(self) -> float:
        """predicted / published - 1 (+ = model faster)."""
        return self.predicted_GBps / self.point.busbw_GBps - 1.0


def group(nodes: int, gpus_per_node: int, node_size: int) -> list[int]:
    """Global ranks of the test's group: the first ``gpus_per_node`` GPUs of each of ``nodes`` nodes."""
    return [k * node_size + i for k in range(nodes) for i in range(gpus_per_node)]


def predict(system: str, kind: str, nodes: int, gpus_per_node: int, nbytes: float) -> tuple[float, str]:
    """(busbw GB/s, "algorithm/protocol") the simulator gives this group and size on ``system``."""
    probe = load_cluster(system, gpus=1)
    size = probe.node.gpus_per_node
    topo = Topology(load_cluster(system, gpus=nodes * size))
    ranks = group(nodes, gpus_per_node, size)
    t = collective_time_s(kind, nbytes, ranks, topo)
    algo, proto = choose(kind, nbytes, ranks, topo)
    return bus_bandwidth_GBps(kind, nbytes, len(ranks), t), f"{algo}/{proto}"


def compare(points: Iterable[Point] = POINTS) -> list[Row]:
    """Every point priced."""
    rows = []
    for p in points:
        bus, choice = predict(p.system, p.kind, p.nodes, p.gpus_per_node, p.nbytes)
        rows.append(Row(point=p, predicted_GBps=bus, choice=choice))
    return rows


def _size(n: float) -> str:
    for unit, name in ((GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB")):
        if n >= unit and n % unit == 0:
            return f"{int(n // unit)} {name}"
    return f"{n / 1e6:g} MB"


def _stats(rows: Sequence[Row]) -> str:
    if not rows:
        return "| 0 | - | - | - |"
    errors = [r.error for r in rows]
    within = sum(abs(e) <= 0.10 for e in errors)
    return (f"| {len(errors)} | {statistics.mean(errors):+.1%} | {statistics.mean(abs(e) for e in errors):.1%} | "
            f"{within}/{len(errors)} |")


def _bands(rows: Sequence[Row]) -> list[str]:
    bands = (("< 64 MiB", 0, 64 * MiB), ("64-512 MiB", 64 * MiB, 512 * MiB), (">= 512 MiB", 512 * MiB, 2**62))
    return [f"| out-of-family, {name} {_stats([r for r in rows if lo <= r.point.nbytes < hi])}"
            for name, lo, hi in bands]


def _scaling(rows: Sequence[Row]) -> list[str]:
    """Measured and modelled busbw relative to the series' first (smallest) node count."""
    if not rows:
        return []
    first = rows[0]
    cells = [f"{r.point.nodes} nodes {r.point.busbw_GBps / first.point.busbw_GBps:.2f} / "
             f"{r.predicted_GBps / first.predicted_GBps:.2f}" for r in rows]
    return ["", f"Scaling with node count (busbw relative to {first.point.nodes} nodes, published / model): "
            + "; ".join(cells) + "."]


def _dp_bucket() -> list[str]:
    """The model at the megatron-h100-32b data-parallel shape, for which no published figure was found."""
    lines = ["", "Model only (no published figure found): one GPU per node on dgx-h100-ndr, the megatron-h100-32b "
             f"data-parallel bucket ({BUCKET_BYTES / 1e6:g} MB) and 8 GiB:", "",
             "| nodes | collective | busbw at bucket | choice | busbw at 8 GiB |", "|---|---|---|---|---|"]
    for nodes in (4, 16, 48):
        for kind in ("all_gather", "reduce_scatter"):
            bus, choice = predict("dgx-h100-ndr", kind, nodes, 1, BUCKET_BYTES)
            big, _ = predict("dgx-h100-ndr", kind, nodes, 1, 8 * GiB)
            lines.append(f"| {nodes} | {kind} | {bus:.1f} | {choice} | {big:.1f} |")
    return lines


def report(rows: Sequence[Row]) -> str:
    """The markdown report: every point, the summaries by status, the scaling series, the model at the DP bucket."""
    lines = ["| # | machine | profile | collective | nodes x GPUs | size | published | predicted | error | "
             "NCCL choice | NCCL | status |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(rows, 1):
        p = r.point
        lines.append(f"| {i} | {p.machine} | {p.system} | {p.kind} | {p.nodes} x {p.gpus_per_node} | "
                     f"{_size(p.nbytes)} | {p.busbw_GBps:g} | {r.predicted_GBps:.1f} | {r.error:+.1%} | {r.choice} | "
                     f"{p.nccl} | {p.status} |")
    by = {s: [r for r in rows if r.point.status == s] for s in STATUSES}
    lines += ["", "Summary (error = predicted / published - 1; + = model faster):", "",
              "| group | points | mean signed | MAE | within 10% |", "|---|---|---|---|---|",
              f"| headline (InfiniBand/RoCE plateau, 8 GPUs per node) {_stats(by['headline'])}",
              f"| calibration (one NIC: nic_efficiency's source, circular) {_stats(by['calibration'])}",
              f"| scaling series (nccl #1229) {_stats(by['scaling'])}",
              f"| not modelled (SHARP) {_stats(by['not-modelled'])}", *_bands(by["out-of-family"])]
    lines += _scaling(by["scaling"])
    lines += _dp_bucket()
    return "\n".join(lines)


def sources(rows: Sequence[Row]) -> str:
    """Numbered sources and caveats, one per point."""
    out = []
    for i, r in enumerate(rows, 1):
        p = r.point
        note = f" Caveat: {p.caveat}." if p.caveat else ""
        out.append(f"{i}. {p.machine}, {p.kind} {_size(p.nbytes)} on {p.nodes} x {p.gpus_per_node}: {p.source}.{note}")
    return "\n".join(out)


DOC_HEAD = """# Multi-node collectives against published nccl-tests figures

Generated by `python benchmarks/nccl_multinode.py` (do not edit by hand). Each row is one published multi-node
nccl-tests bus bandwidth; `predicted` is what the simulator charges the same group (all GPUs of every node, or one
GPU per node on its rail, as a data-parallel group) for the same size: `simgrid.costs.collective_time_s` on the
row's cluster profile, converted to busbw with nccl-tests' factors. `error` = predicted / published - 1 (+ = model
faster). `status`: `headline` (InfiniBand/RoCE, mechanism modelled), `calibration` (the single-NIC figures the
profiles' `nic_efficiency` = 0.96 is read from: circular), `scaling` (a user's series by node count,
size not stated), `not-modelled` (SHARP in the switches), `out-of-family` (AWS EFA, another fabric). Decisions:
docs/design.md, "Multi-node collectives against nccl-tests (session 12)".

"""


def main(argv: Sequence[str] | None = None) -> int:
    return published_doc_cli.run(sys.modules[__name__], argv)


if __name__ == "__main__":
    raise SystemExit(main())
