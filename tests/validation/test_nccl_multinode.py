"""benchmarks/nccl_multinode.py: every published multi-node point is well-formed, physically possible and sourced;
the script prices the group the test ran, the modelled plateau holds NVIDIA's published figures, and it writes its
doc."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
from script_modules import load_benchmark, written_doc

from simgrid.hardware import load_cluster


def _load() -> ModuleType:
    return load_benchmark("nccl_multinode", "nccl_multinode_benchmark")


def test_points_are_well_formed_physical_and_sourced() -> None:
    """Known collective and status, at least 2 nodes, a group that fits the profile's node, a figure below what
    the node's NICs can carry (busbw of a ring across nodes is bounded by the NICs the group uses; SHARP rows,
    which reduce in the switches, and EFA rows excepted), a source naming where the number is read, a caveat on
    every row that is not headline, no duplicates; at least 3 headline rows and 2 one-GPU-per-node rows."""
    bench = _load()
    points = bench.POINTS
    assert sum(p.status == "headline" for p in points) >= 3
    assert sum(p.gpus_per_node == 1 for p in points) >= 2
    for p in points:
        assert p.kind in ("all_reduce", "all_gather", "reduce_scatter") and p.status in bench.STATUSES, p
        assert p.nodes >= 2 and p.nbytes > 0 and p.busbw_GBps > 0, p
        node = load_cluster(p.system, gpus=8).node
        assert 1 <= p.gpus_per_node <= node.gpus_per_node, p
        if p.status in ("headline", "calibration", "scaling"):
            nics = min(p.gpus_per_node, node.nics_per_node)
            assert p.busbw_GBps <= nics * node.nic_link.bandwidth_GBps, p
        assert len(p.source) > 40 and any(ch.isdigit() for ch in p.source), p
        assert p.status == "headline" or p.caveat, p
    keys = [(p.machine, p.kind, p.nodes, p.gpus_per_node, p.nbytes, p.busbw_GBps, p.source) for p in points]
    assert len(set(keys)) == len(keys)


def test_group_is_the_first_gpus_of_every_node() -> None:
    """One GPU per node takes local GPU 0 of each node (one rail, as a data-parallel group); 8 take them all."""
    bench = _load()
    assert bench.group(4, 1, 8) == [0, 8, 16, 24]
    assert bench.group(2, 8, 8) == list(range(16))
    assert bench.group(3, 2, 8) == [0, 1, 8, 9, 16, 17]


def test_headline_plateaus_match_nvidias_published_figures() -> None:
    """The 8-GPU-per-node rows (DGX A100 192 GB/s, DGX H100 370 and 380 GB/s all_reduce busbw across 4 nodes) are
    predicted within 5%: the NIC efficiency is read from the single-NIC figures, these check it together with
    NVLink and the ring's channels per rail."""
    bench = _load()
    for row in bench.compare([p for p in bench.POINTS if p.status == "headline"]):
        assert abs(row.error) <= 0.05, (row.point.machine, row.predicted_GBps)
        assert row.choice == "ring/Simple"


def test_modelled_busbw_falls_with_node_count() -> None:
    """The scaling series: at a fixed size the model's reduce-scatter busbw falls as nodes are added (the ring's
    latency grows with its steps), as the published series does; how much faster the published one falls is
    printed, not asserted (its size is not stated)."""
    bench = _load()
    rows = bench.compare([p for p in bench.POINTS if p.status == "scaling"])
    modelled = [r.predicted_GBps for r in sorted(rows, key=lambda r: r.point.nodes)]
    published = [r.point.busbw_GBps for r in sorted(rows, key=lambda r: r.point.nodes)]
    assert modelled == sorted(modelled, reverse=True) and published == sorted(published, reverse=True)
    assert modelled[-1] < modelled[0]


def test_report_and_doc_on_a_subset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The report lists every point, the summary rows and the model at the DP bucket; main() writes the doc (to a
    temporary path here) with numbered sources, and --skip-write leaves it alone."""
    bench = _load()
    subset = [p for p in bench.POINTS if p.status in ("headline", "calibration")][:4]
    rows = bench.compare(subset)
    text = bench.report(rows)
    assert text.count("\n| ") >= len(subset) and "| headline (InfiniBand/RoCE plateau" in text
    assert "megatron-h100-32b" in text
    written = written_doc(bench, rows, tmp_path, monkeypatch)
    assert written.startswith("# Multi-node collectives against published") and "## Sources" in written
    assert f"{len(subset)}. " in written
