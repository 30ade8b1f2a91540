"""to_toml / write_profile: self-contained profiles that load back to equal specs."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest

from simgrid.hardware import (
    CollectiveRow,
    ComputeRow,
    MeasuredTables,
    P2PRow,
    load_cluster_spec,
    load_gpu,
    load_node,
    to_toml,
    write_profile,
)

CLUSTERS = ["dgx-a100-hdr", "dgx1-v100-edr", "rtx4090-10gbe", "ideal", "hgx-b200"]


@pytest.mark.parametrize("name", CLUSTERS)
def test_cluster_round_trip_is_equal(tmp_path: Path, name: str) -> None:
    """Write a shipped cluster inline (node and GPU included) and load it back: equal spec, no references."""
    spec = load_cluster_spec(name)
    text = to_toml(spec)
    data = tomllib.loads(text)
    assert isinstance(data["node"], dict) and isinstance(data["node"]["gpu"], dict)
    assert load_cluster_spec(write_profile(spec, tmp_path / "out.toml")) == spec


def test_round_trip_keeps_measured_tables_and_awkward_strings(tmp_path: Path) -> None:
    """Measured rows, quotes, backslashes and control characters in keys survive the trip."""
    measured = MeasuredTables(
        collectives=(CollectiveRow(kind="reduce_scatter", group_size=2, bytes=1 << 20, time_us=123.456789),
                     CollectiveRow(kind="barrier", group_size=2, bytes=0, time_us=30.0)),
        p2p=(P2PRow(bytes=4096, time_us=1 / 3),),
        compute=(ComputeRow(key='F "attn" \\ tab\there\nnewline \x7f é', time_us=0.1),),
        memory_bandwidth_GBps=17.25,
    )
    spec = dataclasses.replace(load_cluster_spec("rtx4090-10gbe"), name="localhost", measured=measured,
                               description='calibrated "here"', max_nodes=None)
    assert load_cluster_spec(write_profile(spec, tmp_path / "nested" / "localhost.toml")) == spec


def test_node_and_gpu_round_trip(tmp_path: Path) -> None:
    """Node and GPU specs write as top-level profiles of their own kind."""
    node = load_node("dgx-h100")
    assert load_node(write_profile(node, tmp_path / "n.toml")) == node
    gpu = load_gpu("ideal-gpu")
    text = to_toml(gpu)
    assert "hbm_bandwidth_GBps = inf" in text
    assert load_gpu(write_profile(gpu, tmp_path / "g.toml")) == gpu


def test_fp8_matmul_efficiency_round_trips(tmp_path: Path) -> None:
    """``matmul.max_efficiency_fp8`` is written only where the profile has it, and reads back equal."""
    gpu = load_gpu("h100-sxm")
    assert "max_efficiency_fp8 = 0.77" in to_toml(gpu)
    assert load_gpu(write_profile(gpu, tmp_path / "h.toml")) == gpu
    assert "max_efficiency_fp8" not in to_toml(load_gpu("a100-80gb-sxm"))


def test_nic_rate_is_written_in_gigabits() -> None:
    """The file keeps the datasheet unit: 200 Gb/s HDR, not 25 GB/s."""
    data = tomllib.loads(to_toml(load_cluster_spec("dgx-a100-hdr")))
    assert data["node"]["nic_bandwidth_Gbps"] == 200
