"""Program files, op lines and CSVs at the edge: 64-bit integers, finite numbers, bounded bytes and counts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simgrid import Layout, build_program
from simgrid.errors import ProgramError
from simgrid.ir import jsonio
from simgrid.ir.jsonio import load_program, program_to_dict, save_program
from simgrid.ir.text import MAX_TEXT_INT, format_op, parse_op
from simgrid.ir.torch_csv import actions_from_csv, from_csv
from simgrid.ir.validate import MAX_OP_BYTES, validate_program
from simgrid.model import get_model


def _program() -> object:
    return build_program(get_model("tiny-gpt"), Layout(pp=2, global_batch_size=2))


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (f"SEND peer=1 bytes={10**40} key=0>1:F:0 handle=h", r"bytes='10{40}' is not valid; expected an integer "
                                                              r"within \+-9223372036854775807 \(64-bit\)"),
        ("SEND peer=1 bytes=" + "9" * 5000 + " key=0>1:F:0 handle=h", r"\(5,039 characters\).*64-bit"),
        ("F stage=0 mb=0 chunk=0 blocks=0:1 flops=nan hbm=0", r"flops='nan' is not valid; expected a finite number"),
        ("F stage=0 mb=0 chunk=0 blocks=0:1 flops=1e400 hbm=0", r"flops='1e400' is not valid; expected a finite"),
        ("F stage=0 mb=0 chunk=0 blocks=0:1 flops=1 hbm=0 gemm=" + "9" * 30 + "x1x1", r"64-bit"),
    ],
)
def test_op_lines_with_huge_or_non_finite_values(line: str, message: str) -> None:
    """Integers past 64 bits (10^40, 5,000 digits) and nan/inf costs are parse errors, with long lines elided."""
    with pytest.raises(ProgramError, match=message) as info:
        parse_op(line)
    assert len(str(info.value)) < 400


def test_formatting_refuses_what_parsing_would() -> None:
    """The text form round-trips exactly, so it cannot write a value it would refuse to read."""
    op = parse_op("SEND peer=1 bytes=8 key=0>1:F:0 handle=h")
    import dataclasses

    with pytest.raises(ProgramError, match="64-bit"):
        format_op(dataclasses.replace(op, bytes=MAX_TEXT_INT + 1))


def test_validation_refuses_bytes_beyond_any_device() -> None:
    """A program built in Python with a 2^50-byte transfer fails validation naming the limit."""
    import dataclasses

    program = _program()
    ranks = [list(ops) for ops in program.ranks]  # type: ignore[attr-defined]
    index = next(i for i, op in enumerate(ranks[0]) if type(op).__name__ == "Send")
    ranks[0][index] = dataclasses.replace(ranks[0][index], bytes=2**50)
    with pytest.raises(ProgramError, match=f"bytes = {2**50} is above the limit of {MAX_OP_BYTES}"):
        validate_program(dataclasses.replace(program, ranks=tuple(tuple(r) for r in ranks)))  # type: ignore[type-var]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda text: text.replace('"version": 1', '"version": ' + "1" * 5000), "more than 4,300 digits"),
        (lambda text: "[" * 100_000 + "]" * 100_000, "nested too deeply to read"),
        (lambda text: text.replace('"bucket_size_MB": 25.0', '"bucket_size_MB": NaN'), "constant NaN is not JSON"),
        (lambda text: text.replace('"gated_mlp": false', '"gated_mlp": "no"'), "gated_mlp = 'no' must be true or "
                                                                               "false"),
        (lambda text: text.replace('"sequence_parallel": false', '"sequence_parallel": "no"'),
         "sequence_parallel = 'no' must be true or false"),
    ],
)
def test_program_files_that_cannot_be_read(tmp_path: Path, edit: object, message: str) -> None:
    """Each is one line naming the file; the 5,000-digit and deep-nesting files do not raise Python errors."""
    path = tmp_path / "p.json"
    path.write_text(edit(json.dumps(program_to_dict(_program()))))  # type: ignore[operator, arg-type]
    with pytest.raises(ProgramError, match=message) as info:
        load_program(path)
    assert "\n" not in str(info.value)


def test_rank_and_op_counts_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file with more ranks or ops than the limits is refused before any op is parsed."""
    data = program_to_dict(_program())
    monkeypatch.setattr(jsonio, "MAX_WORLD_SIZE", 1)
    with pytest.raises(ProgramError, match="ranks has 2 entries; the limit is 1 ranks"):
        jsonio.program_from_dict(data, "f")
    monkeypatch.setattr(jsonio, "MAX_WORLD_SIZE", 10)
    monkeypatch.setattr(jsonio, "MAX_OPS", 5)
    with pytest.raises(ProgramError, match=r"the ranks hold \d+ ops; the limit is 5"):
        jsonio.program_from_dict(data, "f")


def test_save_is_atomic_and_names_the_flag(tmp_path: Path) -> None:
    """Saving into a missing folder is a ProgramError naming --out; a good save leaves only the file."""
    with pytest.raises(ProgramError, match=r"--out .*missing/p\.json: directory .*missing does not exist"):
        save_program(_program(), tmp_path / "missing" / "p.json", flag="--out")  # type: ignore[arg-type]
    save_program(_program(), tmp_path / "p.json")  # type: ignore[arg-type]
    assert [p.name for p in tmp_path.iterdir()] == ["p.json"]


@pytest.mark.parametrize(
    ("reader", "text", "message"),
    [
        (actions_from_csv, "1" * 5000 + "F0\n", "stage and micro-batch must have at most 9 digits"),
        (actions_from_csv, "0F" + "0" * 200_000 + "\n", r"not a readable CSV \(field larger than field limit"),
        (from_csv, f"SEND peer=1 bytes={10**40} key=0>1:F:0 handle=h\n", "64-bit"),
        (from_csv, "F stage=0 mb=0 chunk=0 blocks=0:1 flops=inf hbm=0\n", "finite number"),
    ],
)
def test_csv_readers_refuse_huge_cells(reader: object, text: str, message: str) -> None:
    """torch's schedule CSV and our op CSV: 5,000-digit stages, 200 kB cells, 10^40 bytes, infinite costs."""
    with pytest.raises(ProgramError, match=message) as info:
        reader(text, "s.csv")  # type: ignore[operator]
    assert len(str(info.value)) < 400
