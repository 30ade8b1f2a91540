"""Write output files atomically, and check every output path before any work starts.

:func:`atomic_output` hands the writer a temporary file *in the target's directory* (same file system, so
the final :func:`os.replace` is atomic) and renames it onto the target only after the writer finished and
the data reached the disk (``fsync``). If anything fails (a full disk, a file-size limit, an exception in
the writer, Ctrl-C) the temporary file is removed and the target is untouched: a reader sees either the
old file or the complete new one, never a truncated one.

:func:`check_output_path` is called for every output a command will write *before* it simulates or
draws anything, so ``--trace ok.json --gantt missing/g.png`` fails at once and writes neither file.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path

from simgrid.errors import SimgridError
from simgrid.io.inputs import short_path

_STEM_CHARS = 60  # temporary names stay short, whatever the target's length


def _name_max(folder: Path) -> int:
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        return 255


def check_output_path(path: str | os.PathLike[str], *, flag: str, suffixes: Sequence[str] = (),
                      error: type[SimgridError] = SimgridError) -> Path:
    """Refuse an output path that cannot be written, before any work: one line naming ``flag`` and the fix.

    Checks: a non-empty path; its directory exists, is a directory and is writable; the target, if it
    exists, is a regular file (never replace a directory, FIFO or device); the name fits the file system;
    and, when ``suffixes`` are given, the suffix is one of them.
    """
    text = os.fspath(path)
    if not text:
        raise error(f"{flag}: the path is empty; give a file name")
    target = Path(text)
    shown = short_path(target)
    folder = target.parent
    if suffixes and target.suffix.lower() not in suffixes:
        raise error(f"{flag} {shown}: the suffix {target.suffix or '(none)'!r} is not supported; use one of "
                    + ", ".join(suffixes))
    try:
        folder_mode = os.stat(folder).st_mode
    except FileNotFoundError:
        raise error(f"{flag} {shown}: directory {short_path(folder)} does not exist; create it first") from None
    except NotADirectoryError:
        raise error(f"{flag} {shown}: a folder in the path is a file; check the path") from None
    except OSError as exc:
        raise error(f"{flag} {shown}: cannot use directory {short_path(folder)}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(folder_mode):
        raise error(f"{flag} {shown}: {short_path(folder)} is not a directory; check the path")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise error(f"{flag} {shown}: directory {short_path(folder)} is not writable; choose another directory")
    if len(os.fsencode(target.name)) > _name_max(folder):
        raise error(f"{flag} {shown}: the file name is longer than the file system allows "
                    f"({_name_max(folder)} bytes); choose a shorter name")
    try:
        mode = os.lstat(target).st_mode
    except FileNotFoundError:
        return target
    except OSError as exc:
        raise error(f"{flag} {shown}: cannot use this path: {exc.strerror or exc}") from None
    if stat.S_ISDIR(mode):
        raise error(f"{flag} {shown} is a directory; give a file name inside it")
    if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
        raise error(f"{flag} {shown} exists and is not a regular file (a FIFO, socket or device); "
                    "choose another name")
    return target


def check_output_paths(outputs: Sequence[tuple[str, str | os.PathLike[str] | None]], *,
                       suffixes: dict[str, Sequence[str]] | None = None,
                       error: type[SimgridError] = SimgridError) -> None:
    """Check several ``(flag, path)`` outputs (``None`` paths skipped) and refuse two flags naming one file."""
    seen: dict[str, str] = {}
    for flag, path in outputs:
        if path is None:
            continue
        target = check_output_path(path, flag=flag, suffixes=(suffixes or {}).get(flag, ()), error=error)
        key = os.path.abspath(target)
        if key in seen:
            raise error(f"{flag} and {seen[key]} both name {short_path(target)}; give each output its own file")
        seen[key] = flag


def _default_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike[str], *, flag: str = "output",
                  error: type[SimgridError] = SimgridError) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success it replaces ``path``, on any failure it is removed.

    The temporary name keeps the target's suffix (matplotlib and pandas choose the format from it) and
    starts with a dot. An ``OSError`` while writing or renaming becomes ``error`` naming ``flag``.
    """
    target = check_output_path(path, flag=flag, error=error)
    folder = target.parent
    stem = target.stem[:_STEM_CHARS]
    suffix = target.suffix[:16]
    temp = folder / f".{stem}.{secrets.token_hex(4)}.tmp{suffix}"
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), _default_mode())
        os.close(fd)
    except OSError as exc:
        raise error(f"{flag} {short_path(target)}: cannot create a file in {short_path(folder)}: "
                    f"{exc.strerror or exc}") from None
    try:
        yield temp
        fd = os.open(temp, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, target)
    except OSError as exc:
        temp.unlink(missing_ok=True)
        raise error(f"{flag} {short_path(target)}: cannot write the file: {exc.strerror or exc}; "
                    "nothing was written") from None
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str, *, flag: str = "output",
                      error: type[SimgridError] = SimgridError) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically; returns the path."""
    with atomic_output(path, flag=flag, error=error) as temp, open(temp, "w", encoding="utf-8", newline="") as handle:
        handle.write(text)
    return Path(path)
