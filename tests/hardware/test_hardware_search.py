"""The search path and profile files as a user's mistakes deliver them: FIFOs, directories, broken files,
non-UTF-8 bytes, self references, extreme numbers and falling measured tables (issue 19)."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import pytest

from simgrid.errors import ProfileError
from simgrid.hardware import (
    CollectiveRow,
    MeasuredTables,
    P2PRow,
    ProfileWarning,
    list_profiles,
    load_cluster_spec,
    load_gpu,
)
from simgrid.hardware.measured import MONOTONE_FLOOR

BUILTIN = Path(__file__).resolve().parents[2] / "hardware_profiles"
CLUSTER = (BUILTIN / "clusters" / "dgx-a100-hdr.toml").read_text()
GPU = (BUILTIN / "gpus" / "a100-80gb-sxm.toml").read_text()


@pytest.fixture
def search_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty folder put first on $SIMGRID_PROFILE_PATH."""
    folder = tmp_path / "profiles"
    folder.mkdir()
    monkeypatch.setenv("SIMGRID_PROFILE_PATH", str(folder))
    return folder


@pytest.mark.parametrize("kind", ["fifo", "directory", "malformed", "latin-1", "deep", "huge-int"])
def test_a_bad_file_on_the_search_path_does_not_break_other_lookups(search_dir: Path, kind: str) -> None:
    """A FIFO or directory named x.toml, or an unreadable x.toml: built-in lookups still work (without
    blocking on the FIFO), listing skips it with a warning naming it, and loading it by name is an error."""
    path = search_dir / "x.toml"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        path.write_bytes({"malformed": b"kind = \n", "latin-1": b'kind = "cluster"\nname = "\xe9"\n',
                          "deep": b"x = " + b"[" * 5000 + b"]" * 5000, "huge-int": b"x = " + b"1" * 5000}[kind])
    start = time.monotonic()
    with pytest.warns(ProfileWarning, match=r"x\.toml"):
        assert load_cluster_spec("dgx-a100-hdr").name == "dgx-a100-hdr"
    with pytest.warns(ProfileWarning, match=r"x\.toml"):
        names = {info.name for info in list_profiles()}
    assert "dgx-a100-hdr" in names and "x" not in names
    skipped = kind in ("fifo", "directory")  # not a file: skipped (warned), so the name is unknown
    with pytest.raises(ProfileError, match="no cluster profile named 'x'" if skipped else r"x\.toml: "), \
            pytest.warns(ProfileWarning) if skipped else contextlib.nullcontext():
        load_cluster_spec("x")
    assert time.monotonic() - start < 5.0


def test_a_broken_file_shadowing_a_builtin_name_is_reported_not_skipped(search_dir: Path) -> None:
    """The user meant their own dgx-a100-hdr.toml: its error is raised instead of silently using the built-in."""
    (search_dir / "dgx-a100-hdr.toml").write_text("kind = = 1\n")
    with pytest.raises(ProfileError, match=r"dgx-a100-hdr\.toml: malformed TOML"):
        load_cluster_spec("dgx-a100-hdr")


@pytest.mark.parametrize(
    ("make", "reference", "message"),
    [
        (lambda d: (d / "sub").mkdir(), "sub", r"'sub' is a directory, not a cluster profile"),
        (lambda d: None, ".", r"'\.' is a directory, not a cluster profile"),
        (lambda d: (d / "d.toml").mkdir(), "d.toml", r"d\.toml is a directory, not a cluster profile file"),
        (lambda d: os.mkfifo(d / "f.toml"), "f.toml", r"f\.toml is not a regular file \(a FIFO"),
        (lambda d: (d / "c.toml").write_bytes(CLUSTER.encode("utf-16")), "c.toml", r"not UTF-8 text"),
        (lambda d: (d / "c.toml").write_text(CLUSTER), "c.toml/x.toml", r"profile file .*cannot be used: Not a dir"),
        (lambda d: None, "n" * 5000 + ".toml", r"cannot be used: File name too long"),
    ],
)
def test_cluster_arguments_that_are_not_profile_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      make: object, reference: str, message: str) -> None:
    """A directory (by name or path), a FIFO, UTF-16 bytes, a path through a file, an over-long name."""
    monkeypatch.chdir(tmp_path)
    make(tmp_path)  # type: ignore[operator]
    with pytest.raises(ProfileError, match=message) as info:
        load_cluster_spec(reference)
    assert "\n" not in str(info.value) and len(str(info.value)) < 400


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ('node = "dgx-a100"', 'node = "c.toml"', r"c\.toml: kind = 'cluster' but a node profile was expected"),
        ('node = "dgx-a100"', 'node = "c"', r"'c' is a cluster profile .* not a node profile"),
        ('node = "dgx-a100"', 'node = "a\\u0000b"', r"no node profile named 'a\\x00b'"),
    ],
)
def test_a_cluster_referring_to_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, old: str, new: str,
                                       message: str) -> None:
    """node = the cluster's own file (by path or by name) is a kind error, not a recursion."""
    monkeypatch.setenv("SIMGRID_PROFILE_PATH", str(tmp_path))
    (tmp_path / "c.toml").write_text(CLUSTER.replace(old, new))
    with pytest.raises(ProfileError, match=message):
        load_cluster_spec(tmp_path / "c.toml")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("hbm_bandwidth_GBps", "5e-324", r"hbm_bandwidth_GBps = 5e-324 is out of range: non-zero magnitudes below "
                                         r"1e-12 are refused"),
        ("kernel_overhead_us", "1e308", r"kernel_overhead_us = 1e\+308 is out of range: magnitudes above 1e\+15"),
        ("memory_GiB", "1" * 400, r"memory_GiB = <an integer of about 400 digits> is out of range"),
        ("memory_GiB", "1" * 5000, r"an integer has more than 4,300 digits"),
    ],
)
def test_extreme_numbers_in_a_profile_are_refused(tmp_path: Path, field: str, value: str, message: str) -> None:
    """Rule-valid but unphysical magnitudes (a subnormal bandwidth, a 1e308 us overhead, integers of hundreds
    or thousands of digits) are refused, so no derived time can become infinite."""
    head, sources = GPU.split("[sources]")
    lines = [f"{field} = {value}" if line.startswith(f"{field} =") else line for line in head.splitlines()]
    path = tmp_path / "g.toml"
    path.write_text("\n".join(lines) + "\n[sources]" + sources)
    with pytest.raises(ProfileError, match=message):
        load_gpu(path)


def _rows(times: list[float]) -> tuple[CollectiveRow, ...]:
    return tuple(CollectiveRow(kind="all_reduce", group_size=2, bytes=b, time_us=t)
                 for b, t in zip((1024, 65536, 1 << 20, 1 << 24), times, strict=True))


def test_measured_times_may_dip_within_the_tolerance_but_not_fall() -> None:
    """A dip to MONOTONE_FLOOR of the slowest smaller size is accepted (in-situ rows meet micro-benchmark
    rows); below it the row is refused, naming the row, the time, the size it undercuts and the fix."""
    MeasuredTables(collectives=_rows([20.0, 60.0, 400.0, 400.0 * MONOTONE_FLOOR]))
    with pytest.raises(ProfileError, match=r"collectives\[3\]\.time_us = 100\.0 is below 0\.4 x the 400 us measured "
                                           r"at 1048576 bytes \(all_reduce on 2 ranks, a smaller size\).*re-run the "
                                           r"calibration"):
        MeasuredTables(collectives=_rows([20.0, 60.0, 400.0, 100.0]))
    with pytest.raises(ProfileError, match=r"p2p\[1\]\.time_us = 1\.0 is below"):
        MeasuredTables(p2p=(P2PRow(bytes=1, time_us=10.0), P2PRow(bytes=2, time_us=1.0)))


def test_extrapolation_beyond_the_largest_size_never_falls() -> None:
    """A last segment that dips (within the tolerance) extrapolates flat, never towards negative times."""
    tables = MeasuredTables(collectives=_rows([20.0, 60.0, 400.0, 300.0]))
    assert tables.collective_time_us("all_reduce", 2, 1 << 30) == 300.0
