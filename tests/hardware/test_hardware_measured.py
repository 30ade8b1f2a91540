"""Measured tables: interpolation and extrapolation in bytes, lookups, validation, and [measured] in TOML."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simgrid.errors import ProfileError
from simgrid.hardware import CollectiveRow, ComputeRow, MeasuredTables, P2PRow, load_cluster_spec

TABLES = MeasuredTables(
    collectives=(
        CollectiveRow(kind="all_reduce", group_size=2, bytes=4000, time_us=30.0),  # deliberately unsorted
        CollectiveRow(kind="all_reduce", group_size=2, bytes=1000, time_us=10.0),
        CollectiveRow(kind="all_reduce", group_size=2, bytes=2000, time_us=14.0),
        CollectiveRow(kind="all_reduce", group_size=4, bytes=1000, time_us=50.0),
        CollectiveRow(kind="all_gather", group_size=2, bytes=1000, time_us=7.0),
    ),
    p2p=(P2PRow(bytes=1000, time_us=5.0),),
    compute=(ComputeRow(key="F:layer:mbs=1", time_us=120.0),),
    memory_bandwidth_GBps=20.0,
)


def test_collective_interpolates_between_measured_sizes() -> None:
    """1500 B is halfway from 1000 (10 us) to 2000 (14 us); 3000 B halfway from 2000 (14) to 4000 (30)."""
    assert TABLES.collective_time_us("all_reduce", 2, 1500) == pytest.approx(12.0)
    assert TABLES.collective_time_us("all_reduce", 2, 3000) == pytest.approx(22.0)
    assert TABLES.collective_time_us("all_reduce", 2, 2000) == pytest.approx(14.0)


def test_collective_extrapolates_with_last_slope_and_clamps_below() -> None:
    """Beyond 4000 B the slope (30-14)/2000 us/B continues; below 1000 B the 1000 B time holds."""
    assert TABLES.collective_time_us("all_reduce", 2, 6000) == pytest.approx(30.0 + 16.0)
    assert TABLES.collective_time_us("all_reduce", 2, 10) == pytest.approx(10.0)


def test_collective_lookup_is_per_kind_and_group_size() -> None:
    """Other group sizes and kinds have their own rows; unmeasured ones give None."""
    assert TABLES.collective_time_us("all_reduce", 4, 1000) == 50.0
    assert TABLES.collective_time_us("all_gather", 2, 1000) == 7.0
    assert TABLES.collective_time_us("all_reduce", 8, 1000) is None
    assert TABLES.collective_time_us("broadcast", 2, 1000) is None


def test_single_row_scales_proportionally_above_and_holds_below() -> None:
    """With one p2p row there is no slope: larger sizes scale as pure bandwidth."""
    assert TABLES.p2p_time_us(2000) == pytest.approx(10.0)
    assert TABLES.p2p_time_us(10) == pytest.approx(5.0)
    assert MeasuredTables().p2p_time_us(10) is None


def test_compute_lookup_by_key() -> None:
    """Exact signature match, None otherwise."""
    assert TABLES.compute_time_us("F:layer:mbs=1") == 120.0
    assert TABLES.compute_time_us("B:layer:mbs=1") is None


def test_duplicate_rows_and_unknown_kinds_are_rejected() -> None:
    """One row per (kind, group size, bytes); kinds are the IR's collective names."""
    row = CollectiveRow(kind="all_reduce", group_size=2, bytes=1000, time_us=10.0)
    with pytest.raises(ProfileError, match=r"collectives\[1\] = \['all_reduce', 2, 1000\] duplicates an earlier row"):
        MeasuredTables(collectives=(row, row))
    with pytest.raises(ProfileError, match=r"CollectiveRow.kind = 'allreduce' must be one of 'all_reduce'"):
        CollectiveRow(kind="allreduce", group_size=2, bytes=1, time_us=1.0)


MEASURED_CLUSTER = """
kind = "cluster"
name = "localhost"
description = "calibrated"
node = "rtx4090-workstation"

[network]
kind = "ethernet"
topology = "single-switch"
oversubscription = 1.0
switch_latency_us = 2.0
efficiency = 1.0

[measured]
memory_bandwidth_GBps = 12.5

[[measured.collectives]]
kind = "all_reduce"
group_size = 2
bytes = 1024
time_us = 40.0

[[measured.collectives]]
kind = "all_reduce"
group_size = 2
bytes = 2048
time_us = 60.0

[[measured.p2p]]
bytes = 1024
time_us = 20.0

[[measured.compute]]
key = "F:layer"
time_us = 300.0
"""


def test_measured_tables_load_from_toml(tmp_path: Path) -> None:
    """[[measured.*]] arrays of tables become MeasuredTables on the cluster spec."""
    path = tmp_path / "localhost.toml"
    path.write_text(MEASURED_CLUSTER)
    measured = load_cluster_spec(path).measured
    assert measured is not None
    assert measured.collective_time_us("all_reduce", 2, 1536) == pytest.approx(50.0)
    assert measured.p2p_time_us(1024) == 20.0
    assert measured.compute_time_us("F:layer") == 300.0
    assert measured.memory_bandwidth_GBps == 12.5


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ('kind = "all_reduce"\ngroup_size = 2\nbytes = 1024', 'kind = "allreduce"\ngroup_size = 2\nbytes = 1024',
         r"measured\.collectives\[0\]\.kind = 'allreduce' must be one of"),
        ("bytes = 2048\ntime_us = 60.0", "bytes = 2048\ntime_us = -60.0",
         r"measured\.collectives\[1\]\.time_us = -60\.0 must be >= 0"),
        ("key = \"F:layer\"", "key = \"F:layer\"\nshape = 3", r"measured\.compute\[0\]\.shape is not a known key"),
        ("bytes = 1024\ntime_us = 20.0", "bytes = 1024.5\ntime_us = 20.0",
         r"measured\.p2p\[0\]\.bytes = 1024\.5 must be an integer"),
    ],
)
def test_bad_measured_rows_name_the_row(tmp_path: Path, old: str, new: str, message: str) -> None:
    """Errors point at the offending row by index."""
    assert old in MEASURED_CLUSTER
    path = tmp_path / "m.toml"
    path.write_text(MEASURED_CLUSTER.replace(old, new, 1))
    with pytest.raises(ProfileError, match=r"m\.toml: " + message):
        load_cluster_spec(path)


@given(st.lists(st.tuples(st.integers(0, 1 << 30), st.one_of(st.just(0.0), st.floats(1e-6, 1e6))), min_size=1,
                max_size=8, unique_by=lambda row: row[0]))
def test_interpolation_reproduces_every_measured_point(rows: list[tuple[int, float]]) -> None:
    """Asking for a measured size returns exactly its measured time, whatever the row order."""
    sizes, times = sorted(b for b, _ in rows), sorted(t for _, t in rows)
    rows = list(zip(sizes, times, strict=True))[::-1]  # times grow with size (the monotonicity rule)
    tables = MeasuredTables(collectives=tuple(CollectiveRow(kind="all_gather", group_size=3, bytes=b, time_us=t)
                                              for b, t in rows))
    for size, time_us in rows:
        assert tables.collective_time_us("all_gather", 3, size) == pytest.approx(time_us, abs=1e-6)
