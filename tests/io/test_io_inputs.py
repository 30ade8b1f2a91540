"""Reading user files: only regular UTF-8 files of bounded size, parser failures as one-line errors."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from simgrid.errors import SimgridError
from simgrid.io import inputs
from simgrid.io.inputs import parse_json, parse_toml, read_input_text, short_path


def _read(path: Path | str) -> str:
    return read_input_text(path, what="test file", error=SimgridError)


def test_regular_utf8_file_is_read(tmp_path: Path) -> None:
    """The common case: the text comes back unchanged."""
    (tmp_path / "a.json").write_text('{"x": "caf\u00e9"}', encoding="utf-8")
    assert _read(tmp_path / "a.json") == '{"x": "caf\u00e9"}'


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: None, r"test file .*a\.json does not exist; check the path"),
        (lambda p: p.mkdir(), r"test file .*a\.json is a directory, not a file; name a file inside it"),
        (lambda p: os.mkfifo(p), r"is not a regular file \(a FIFO, socket or device\)"),
        (lambda p: p.write_bytes(b'{"x": "caf\xe9"}'), r"not UTF-8 text \(byte 0xe9 at offset 10 is not UTF-8\)"),
        (lambda p: p.write_text("{}", encoding="utf-16"), r"not UTF-8 text \(it looks like UTF-16\)"),
    ],
)
def test_files_that_are_not_regular_utf8_are_one_line_errors(tmp_path: Path, make: object, message: str) -> None:
    """Missing, a directory, a FIFO (which must not block), Latin-1 and UTF-16 bytes: each says what it is."""
    path = tmp_path / "a.json"
    make(path)  # type: ignore[operator]
    start = time.monotonic()
    with pytest.raises(SimgridError, match=message) as info:
        _read(path)
    assert "\n" not in str(info.value)
    assert time.monotonic() - start < 2.0


def test_path_through_a_file_and_overlong_names(tmp_path: Path) -> None:
    """``file/x`` and a 5,000-character name are errors naming the problem, with the name elided."""
    (tmp_path / "f").write_text("x")
    with pytest.raises(SimgridError, match="a folder in the path is a file"):
        _read(tmp_path / "f" / "x.json")
    with pytest.raises(SimgridError, match=r"cannot be opened: File name too long") as info:
        _read(tmp_path / ("n" * 5000))
    assert len(str(info.value)) < 300
    with pytest.raises(SimgridError, match="the path is empty"):
        _read("")


def test_oversized_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file larger than the limit is refused with both sizes (limit lowered to keep the test small)."""
    monkeypatch.setattr(inputs, "MAX_INPUT_BYTES", 10)
    (tmp_path / "big.json").write_text("x" * 11)
    with pytest.raises(SimgridError, match="is 11 bytes; the limit is 10 bytes"):
        _read(tmp_path / "big.json")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", r"f: not valid JSON \(Expecting property name enclosed in double quotes at line 1, column 2\)"),
        ("[" * 100_000 + "]" * 100_000, "f: nested too deeply to read"),
        ('{"n": ' + "9" * 5000 + "}", "f: an integer has more than 4,300 digits"),
        ('{"x": NaN}', "f: the non-standard constant NaN is not JSON"),
        ('{"x": -Infinity}', "f: the non-standard constant -Infinity is not JSON"),
    ],
)
def test_json_parser_failures(text: str, message: str) -> None:
    """Malformed JSON, deep nesting, 5,000-digit integers and NaN/Infinity: one line each."""
    with pytest.raises(SimgridError, match=message):
        parse_json(text, source="f", error=SimgridError)


def test_json_constants_allowed_on_request() -> None:
    """``allow_nan`` keeps Python's reading of NaN for files that legitimately hold it."""
    assert parse_json('{"x": Infinity}', source="f", error=SimgridError, allow_nan=True) == {"x": float("inf")}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("x = ", "f: malformed TOML"),
        ("x = " + "[" * 5000 + "]" * 5000, "f: nested too deeply to read"),
        ("x = " + "{a = " * 5000 + "1" + "}" * 5000, "f: nested too deeply to read"),
        ("x = " + "1" * 5000, "f: an integer has more than 4,300 digits"),
    ],
)
def test_toml_parser_failures(text: str, message: str) -> None:
    """Malformed TOML, deep arrays and inline tables, 5,000-digit integers: one line each."""
    with pytest.raises(SimgridError, match=message):
        parse_toml(text, source="f", error=SimgridError)


def test_short_path_is_relative_and_elided(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Paths under the working directory are shown relative; very long ones keep both ends and the length."""
    monkeypatch.chdir(tmp_path)
    assert short_path(tmp_path / "a" / "b.json") == "a/b.json"
    shown = short_path("x" * 5000)
    assert shown.startswith("xxx") and shown.endswith("(5000 characters)") and len(shown) < 150
