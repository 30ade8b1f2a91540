"""The published intra-node busbw curve (``[intra_busbw_curve]``): its reading (fraction by bytes per rank),
how it bounds intra-node collectives, what it leaves alone, and its profile errors."""

from __future__ import annotations

import dataclasses
import itertools
import re
from pathlib import Path

import pytest

from simgrid.costs import bus_bandwidth_GBps, collective_phases, collective_time_s, phase_cost
from simgrid.costs.busbw_curve import size_fraction
from simgrid.errors import ProfileError
from simgrid.hardware import Cluster, load_cluster, load_node
from simgrid.hardware.busbw_curve import BusbwCurve
from simgrid.topology import Topology

MiB, GiB = 2**20, 2**30
NODES = Path(__file__).resolve().parents[2] / "hardware_profiles" / "nodes"
CURVE = BusbwCurve(ranks=8, bytes=(1024, 8192, 65536), busbw_GBps=(1.0, 10.0, 100.0))


def _without_curve(cluster: Cluster) -> Cluster:
    node = dataclasses.replace(cluster.node, intra_busbw_curve=None)
    return dataclasses.replace(cluster.spec, node=node).sized(cluster.num_gpus)


def _busbw(kind: str, size: float, gpus: int, topo: Topology) -> float:
    return bus_bandwidth_GBps(kind, size, gpus, collective_time_s(kind, size, range(gpus), topo))


def test_fraction_interpolates_in_log_bytes_per_rank() -> None:
    """At a point the fraction is busbw / plateau at x = S / ranks; halfway in log2 it is the mean;
    above the largest point 1; below the smallest the per-step time stays constant (fraction ~ x)."""
    assert size_fraction(CURVE, 1024 / 8) == pytest.approx(0.01)
    assert size_fraction(CURVE, 8192 / 8) == pytest.approx(0.1)
    assert size_fraction(CURVE, 2 ** 14.5 / 8) == pytest.approx(0.55)
    assert size_fraction(CURVE, 65536 / 8) == 1.0
    assert size_fraction(CURVE, 1e12) == 1.0
    assert size_fraction(CURVE, 1024 / 8 / 4) == pytest.approx(0.0025)


@pytest.mark.parametrize("cluster,kind", [("dgx-a100-hdr", "all_reduce"), ("dgx-h100-ndr", "all_reduce"),
                                          ("dgx-h100-ndr", "all_gather"), ("dgx-a100-hdr", "reduce_scatter")])
@pytest.mark.parametrize("gpus", [2, 4, 8])
def test_intra_node_busbw_never_falls_with_size(cluster: str, kind: str, gpus: int) -> None:
    topo = Topology(load_cluster(cluster, gpus=gpus))
    curve = [_busbw(kind, 2.0**k, gpus, topo) for k in range(10, 36)]
    assert all(b >= a * (1 - 1e-9) for a, b in itertools.pairwise(curve)), curve


@pytest.mark.parametrize("cluster", ["dgx-a100-hdr", "hgx-h200-ndr"])
def test_large_messages_and_inter_node_calls_are_unchanged(cluster: str) -> None:
    """At 8 GiB (beyond the curve) and for a group across two nodes the curve changes nothing."""
    with_curve = load_cluster(cluster, gpus=16)
    assert with_curve.node.intra_busbw_curve is not None
    topo, bare = Topology(with_curve), Topology(_without_curve(with_curve))
    for kind, size, ranks in (("all_reduce", 8 * GiB, range(8)), ("all_gather", 8 * GiB, range(8)),
                              ("all_reduce", 16 * MiB, range(16)), ("all_gather", 4 * MiB, range(0, 16, 8))):
        assert collective_time_s(kind, size, ranks, topo) == collective_time_s(kind, size, ranks, bare)


def test_medium_all_reduce_follows_the_published_a100_curve() -> None:
    """8x A100 all_reduce at 16 MiB: Azure ND A100 v4 measured 109.22 GB/s busbw; NCCL's tuner model
    alone says ~164. With the curve the prediction is the curve's fraction of the model's plateau."""
    cluster = load_cluster("dgx-a100-hdr", gpus=8)
    topo, bare = Topology(cluster), Topology(_without_curve(cluster))
    plateau = _busbw("all_reduce", 2.0**40, 8, bare)
    assert _busbw("all_reduce", 16 * MiB, 8, bare) > 150
    assert _busbw("all_reduce", 16 * MiB, 8, topo) == pytest.approx(109.22 / 231.58 * plateau, rel=1e-5)


def test_key_is_bytes_per_rank_across_group_sizes_and_kinds() -> None:
    """A 2-GPU all-reduce of 4 MiB, a 4-GPU one of 8 MiB and an 8-GPU all-gather of 16 MiB move 2 MiB per
    rank per step, as the 8-GPU 16 MiB all-reduce of the curve: each reaches the same fraction of its own
    plateau."""
    cluster = load_cluster("dgx-a100-hdr", gpus=8)
    topo, bare = Topology(cluster), Topology(_without_curve(cluster))
    expected = size_fraction(cluster.node.intra_busbw_curve, 2 * MiB)  # type: ignore[arg-type]
    for kind, size, gpus in (("all_reduce", 4 * MiB, 2), ("all_reduce", 8 * MiB, 4), ("all_gather", 16 * MiB, 8)):
        ratio = _busbw(kind, size, gpus, topo) / _busbw(kind, 2.0**40, gpus, bare)
        assert ratio == pytest.approx(expected, rel=1e-5), (kind, gpus)


def test_flow_phases_carry_the_curve() -> None:
    """The engine's flow-mode phases stretch their bytes so that, alone, they take the curve-bound time."""
    topo = Topology(load_cluster("dgx-a100-hdr", gpus=8))
    size = 16 * MiB
    phases = collective_phases("all_reduce", size, range(8), topo)
    total = sum((phase_cost(p, topo)[0] + p.latency_s) * p.repeat for p in phases)
    assert total == pytest.approx(collective_time_s("all_reduce", size, range(8), topo), rel=1e-9)


def _node_with(tmp_path: Path, block: str) -> Path:
    text = (NODES / "dgx-a100.toml").read_text()
    start = text.index("[intra_busbw_curve]")
    end = text.index("[sources]")
    path = tmp_path / "bad-node.toml"
    path.write_text(text[:start] + block + "\n" + text[end:])
    return path


@pytest.mark.parametrize("block,message", [
    ("[intra_busbw_curve]\nranks = 8\nbytes = [1024, 2048]\nbusbw_GBps = [2.0, 1.0]\n",
     "intra_busbw_curve.busbw_GBps[1] = 1.0 is below the previous size's 2; a curve must not decrease with size"),
    ("[intra_busbw_curve]\nranks = 8\nbytes = [2048, 1024]\nbusbw_GBps = [1.0, 2.0]\n",
     "intra_busbw_curve.bytes = [2048, 1024] must be strictly ascending"),
    ("[intra_busbw_curve]\nranks = 8\nbytes = [1024, 2048]\nbusbw_GBps = [1.0]\n",
     "intra_busbw_curve.busbw_GBps = [1.0] must have 2 values, one per entry of bytes"),
    ("[intra_busbw_curve]\nranks = 1\nbytes = [1024, 2048]\nbusbw_GBps = [1.0, 2.0]\n",
     "intra_busbw_curve.ranks = 1 must be"),
    ("[intra_busbw_curve]\nranks = 8\nbytes = [1024, 2048]\nbusbw_GBps = [1.0, 2.0]\nsize_GB = 3\n",
     "intra_busbw_curve.size_GB is not a known key; known keys here: ranks, bytes, busbw_GBps"),
])
def test_bad_curve_is_one_line_naming_the_field(tmp_path: Path, block: str, message: str) -> None:
    with pytest.raises(ProfileError, match=re.escape(message)):
        load_node(_node_with(tmp_path, block))
