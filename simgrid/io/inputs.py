"""Read a user's file without surprises: a regular file, bounded in size, UTF-8, parsed with its errors named.

What can go wrong at this boundary and what the user is told (one line, naming the file and the fix):

* the path is missing, a directory, a FIFO, a socket or a device (a FIFO would block ``open`` forever, so
  files are opened non-blocking and checked with ``fstat`` before anything is read), goes through a file
  (``file.json/x``), or is too long for the file system;
* the file is larger than :data:`MAX_INPUT_BYTES`;
* the bytes are not UTF-8 (Latin-1, UTF-16, binary garbage);
* the parser fails: malformed text, nesting deeper than Python's recursion limit, an integer longer than
  Python's 4,300-digit conversion limit, or (for JSON) the non-standard constants ``NaN``/``Infinity``.
"""

from __future__ import annotations

import json
import os
import stat
import tomllib
from pathlib import Path
from typing import Any

from simgrid.errors import SimgridError

MAX_INPUT_BYTES = 512 * 2**20
"""Largest input file read (512 MiB): a program file of the largest allowed size fits, a stray disk image
does not."""
_MAX_SHOWN = 120


def short_path(path: str | os.PathLike[str]) -> str:
    """A path as messages show it: relative to the working directory when under it, long ones elided."""
    text = os.fspath(path)
    try:
        resolved = Path(text).resolve()
        text = str(resolved.relative_to(Path.cwd().resolve()))
    except (ValueError, OSError, RuntimeError):  # elsewhere, a path too long to resolve, or a symlink loop
        pass
    if len(text) > _MAX_SHOWN:
        text = f"{text[:60]}...{text[-50:]} ({len(text)} characters)"
    return text


def _open_regular(path: Path, what: str, error: type[SimgridError]) -> int:
    shown = short_path(path)
    try:
        # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise error(f"{what} {shown} does not exist; check the path") from None
    except NotADirectoryError:
        raise error(f"{what} {shown}: a folder in the path is a file; check the path") from None
    except IsADirectoryError:
        raise error(f"{what} {shown} is a directory, not a file; name a file inside it") from None
    except OSError as exc:
        raise error(f"{what} {shown} cannot be opened: {exc.strerror or exc}") from None
    mode = os.fstat(fd).st_mode
    if stat.S_ISREG(mode):
        return fd
    os.close(fd)
    if stat.S_ISDIR(mode):
        raise error(f"{what} {shown} is a directory, not a file; name a file inside it")
    raise error(f"{what} {shown} is not a regular file (a FIFO, socket or device); give a regular file")


def read_input_bytes(path: str | os.PathLike[str], *, what: str, error: type[SimgridError]) -> bytes:
    """The bytes of a regular file of at most :data:`MAX_INPUT_BYTES`; ``what`` names it ("model file")."""
    target = Path(path)
    if not os.fspath(path):
        raise error(f"{what}: the path is empty; give a file name")
    fd = _open_regular(target, what, error)
    try:
        size = os.fstat(fd).st_size
        if size > MAX_INPUT_BYTES:
            raise error(f"{what} {short_path(target)} is {size:,} bytes; the limit is {MAX_INPUT_BYTES:,} bytes")
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
    except OSError as exc:
        raise error(f"{what} {short_path(target)} cannot be read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    return b"".join(chunks)


def decode_utf8(data: bytes, *, source: str, error: type[SimgridError]) -> str:
    """UTF-8 text of ``data``; other encodings get a message saying which and how to fix it."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
            kind = "it looks like UTF-16"
        else:
            kind = f"byte 0x{data[exc.start]:02x} at offset {exc.start} is not UTF-8"
        raise error(f"{source}: not UTF-8 text ({kind}); save the file as UTF-8") from None


def read_input_text(path: str | os.PathLike[str], *, what: str, error: type[SimgridError]) -> str:
    """The UTF-8 text of a regular file (see :func:`read_input_bytes`)."""
    data = read_input_bytes(path, what=what, error=error)
    return decode_utf8(data, source=f"{what} {short_path(path)}", error=error)


def _refuse_constant(token: str) -> Any:
    raise ValueError(f"the non-standard constant {token} is not JSON; write a finite number")


def parse_json(text: str, *, source: str, error: type[SimgridError], allow_nan: bool = False) -> Any:
    """Parse JSON; ``NaN``/``Infinity`` are refused unless ``allow_nan``. ``source`` starts every message."""
    try:
        if allow_nan:
            return json.loads(text)
        return json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise error(f"{source}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    except RecursionError:
        raise error(f"{source}: nested too deeply to read; flatten the file") from None
    except ValueError as exc:  # an integer beyond the digit limit, or a refused constant
        raise error(f"{source}: {_value_message(exc)}") from None


def parse_toml(text: str, *, source: str, error: type[SimgridError]) -> dict[str, Any]:
    """Parse TOML; malformed text, deep nesting and over-long integers become one-line errors."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{source}: malformed TOML: {exc}") from None
    except RecursionError:
        raise error(f"{source}: nested too deeply to read; flatten the tables and arrays") from None
    except ValueError as exc:
        raise error(f"{source}: {_value_message(exc)}") from None


def _value_message(exc: ValueError) -> str:
    text = str(exc)
    if "digits" in text and "integer" in text:
        return "an integer has more than 4,300 digits; no field takes a number that large"
    return text.splitlines()[0] if text else "a value cannot be read"
