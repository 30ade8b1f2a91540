"""Atomic output: checks before work, and a failed write leaves neither a partial target nor a temporary file."""

from __future__ import annotations

import errno
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from simgrid.errors import SimgridError
from simgrid.io import atomic_output, atomic_write_text, check_output_path, check_output_paths


def test_write_replaces_the_target_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    """The text arrives whole, with the umask's permissions, and only the target is in the folder."""
    target = tmp_path / "out.json"
    atomic_write_text(target, "new", flag="--out")
    assert target.read_text() == "new"
    assert os.listdir(tmp_path) == ["out.json"]
    mask = os.umask(0)
    os.umask(mask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~mask


def test_failing_writer_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    """A writer that wrote half its data then hit ENOSPC: the old content stays, no temporary remains,
    and the error is one line naming the flag, the file and the cause."""
    target = tmp_path / "out.csv"
    target.write_text("old")
    with pytest.raises(SimgridError, match=r"--out out\.csv: cannot write the file: No space left on device; "
                                           r"nothing was written"), atomic_output(target, flag="--out") as temp:
        os.chdir(tmp_path)
        temp.write_text("half")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["out.csv"]


def test_other_exceptions_also_remove_the_temporary(tmp_path: Path) -> None:
    """An exception that is not an OSError (a bug, Ctrl-C) propagates unchanged and cleans up too."""
    with pytest.raises(KeyboardInterrupt), atomic_output(tmp_path / "g.png") as temp:
        temp.write_bytes(b"\x89PNG")
        raise KeyboardInterrupt
    assert os.listdir(tmp_path) == []


def test_temporary_keeps_the_suffix_for_format_sniffing_writers(tmp_path: Path) -> None:
    """matplotlib and pandas pick the format from the suffix, so the temporary file keeps it."""
    with atomic_output(tmp_path / "gantt.svg") as temp:
        assert temp.suffix == ".svg" and temp.parent == tmp_path and temp.name.startswith(".")
        temp.write_text("<svg/>")


@pytest.mark.parametrize(
    ("make", "path", "message"),
    [
        (lambda d: None, "missing/t.json", r"directory missing does not exist; create it first"),
        (lambda d: (d / "f").write_text("x"), "f/t.json", r"f is not a directory; check the path"),
        (lambda d: (d / "t.json").mkdir(), "t.json", r"t\.json is a directory; give a file name inside it"),
        (lambda d: os.mkfifo(d / "t.json"), "t.json", r"exists and is not a regular file"),
        (lambda d: None, "x" * 300 + ".json", r"the file name is longer than the file system allows"),
        (lambda d: None, "", r"the path is empty"),
    ],
)
def test_unusable_output_paths_are_refused_before_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       make: object, path: str, message: str) -> None:
    """Each problem is one line naming the flag; nothing is created."""
    monkeypatch.chdir(tmp_path)
    make(tmp_path)  # type: ignore[operator]
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(SimgridError, match=message) as info:
        check_output_path(path, flag="--trace")
    assert str(info.value).startswith("--trace") and "\n" not in str(info.value)
    assert sorted(os.listdir(tmp_path)) == before


def test_suffix_and_duplicate_outputs(tmp_path: Path) -> None:
    """An unsupported suffix names the choices; two flags naming one file are refused."""
    with pytest.raises(SimgridError, match=r"--gantt .*g\.txt: the suffix '\.txt' is not supported; use one of "
                                           r"\.png, \.svg"):
        check_output_path(tmp_path / "g.txt", flag="--gantt", suffixes=(".png", ".svg"))
    with pytest.raises(SimgridError, match="--gantt and --trace both name"):
        check_output_paths([("--trace", tmp_path / "x.png"), ("--gantt", tmp_path / "x.png")])


@pytest.mark.skipif(not hasattr(resource, "RLIMIT_FSIZE"), reason="needs RLIMIT_FSIZE (POSIX)")
def test_full_disk_leaves_nothing_behind_in_a_real_command(tmp_path: Path) -> None:
    """`simgrid simulate --trace t.json --gantt g.png` with a 64-byte file-size limit (writes fail with
    EFBIG, as with ENOSPC on a full disk): exit 2, one line, and no file at all in the folder."""
    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))

    done = subprocess.run(
        [sys.executable, "-m", "simgrid", "simulate", "--model", "tiny-gpt", "--cluster", "dgx-a100-hdr", "--gpus",
         "2", "--trace", "t.json", "--gantt", "g.png"],
        cwd=tmp_path, capture_output=True, text=True, preexec_fn=limit, timeout=120,
        env={**os.environ, "MPLCONFIGDIR": str(tmp_path.parent / "mpl")},
    )
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if "error" in line]
    assert errors == [errors[0]] and "cannot write the file: File too large; nothing was written" in errors[0]
    assert os.listdir(tmp_path) == []
