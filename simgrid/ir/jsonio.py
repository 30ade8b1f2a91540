"""Whole programs as JSON files, round-tripping exactly.

Shape (version 1)::

    {"format": "simgrid-program", "version": 1,
     "model": {...ModelSpec.to_dict()...} | null,
     "layout": {...Layout.to_dict()...} | null,
     "meta": {"schedule": "1f1b", ...},
     "groups": {"tp/pp0-dp0": [0, 1], ...},
     "ranks": [["F stage=0 mb=0 ...", "SEND peer=1 ..."], ...]}

Ops are stored in their one-line text form (:mod:`simgrid.ir.text`) so files stay readable and diffable.
Errors name the file, the JSON path (e.g. ``ranks[3][17]``) and what to do about it.
"""

from __future__ import annotations

import json
import os
from typing import Any

from simgrid.errors import LayoutError, ModelError, ProgramError
from simgrid.ir.ops import Op
from simgrid.ir.program import Program
from simgrid.ir.text import format_ranks, parse_op
from simgrid.layout.spec import Layout
from simgrid.limits import MAX_OPS, MAX_WORLD_SIZE
from simgrid.model.spec import ModelSpec

PROGRAM_FORMAT = "simgrid-program"
"""Value of the ``format`` key that marks a program file."""
PROGRAM_VERSION = 1
"""The file-format version this module writes and reads."""

_KEYS = ("format", "version", "model", "layout", "meta", "groups", "ranks")


def program_to_dict(program: Program) -> dict[str, Any]:
    """The JSON-ready mapping of a program (ops as text lines)."""
    return {
        "format": PROGRAM_FORMAT,
        "version": PROGRAM_VERSION,
        "model": program.model.to_dict() if program.model is not None else None,
        "layout": program.layout.to_dict() if program.layout is not None else None,
        "meta": dict(program.meta),
        "groups": {name: list(members) for name, members in program.groups.items()},
        "ranks": format_ranks(program.ranks),
    }


def program_to_json(program: Program, *, indent: int | None = 1) -> str:
    """The program as JSON text (one op line per JSON line with the default indent)."""
    try:
        return json.dumps(program_to_dict(program), indent=indent, ensure_ascii=False, allow_nan=False) + "\n"
    except ValueError as exc:  # NaN or infinity in meta, model or layout: not representable in JSON
        raise ProgramError(f"program_to_json: {exc}; replace NaN/infinite values in meta, model or layout") from None


def program_from_dict(data: Any, source: str = "<program>") -> Program:
    """Rebuild a program from :func:`program_to_dict` output; errors name ``source`` and the JSON path."""
    if not isinstance(data, dict):
        raise ProgramError(f"{source}: top level must be a JSON object with keys {', '.join(_KEYS)}")
    if data.get("format") != PROGRAM_FORMAT:
        raise ProgramError(
            f"{source}: format = {data.get('format')!r}; expected {PROGRAM_FORMAT!r} — is this a simgrid program "
            "file? Write one with `simgrid program ... --out F.json` or simgrid.ir.save_program"
        )
    if data.get("version") != PROGRAM_VERSION:
        raise ProgramError(
            f"{source}: version = {data.get('version')!r}; this simgrid reads version {PROGRAM_VERSION}; "
            "regenerate the file with this version of simgrid"
        )
    missing = [k for k in _KEYS if k not in data]
    if missing:
        raise ProgramError(f"{source}: missing key(s) {', '.join(missing)}; a program file has {', '.join(_KEYS)}")
    unknown = sorted(set(data) - set(_KEYS))
    if unknown:
        raise ProgramError(f"{source}: unknown key(s) {', '.join(unknown)}; a program file has {', '.join(_KEYS)}")
    model = _spec(data["model"], ModelSpec, "model", source)
    layout = _spec(data["layout"], Layout, "layout", source)
    meta = data["meta"]
    if not isinstance(meta, dict):
        raise ProgramError(f"{source}: meta must be an object of JSON scalars, got {type(meta).__name__}")
    for key, value in meta.items():
        if isinstance(value, (dict, list)):
            raise ProgramError(f"{source}: meta[{key!r}] = {value!r} must be a scalar (string, number, bool, null)")
    groups = data["groups"]
    if not isinstance(groups, dict):
        raise ProgramError(f"{source}: groups must map group names to lists of ranks, got {type(groups).__name__}")
    for name, members in groups.items():
        if not isinstance(members, list) or not all(isinstance(r, int) and not isinstance(r, bool) for r in members):
            raise ProgramError(f"{source}: groups[{name!r}] = {members!r} must be a list of integer ranks")
    ranks_data = data["ranks"]
    if not isinstance(ranks_data, list):
        raise ProgramError(f"{source}: ranks must be a list (one list of op lines per rank)")
    if len(ranks_data) > MAX_WORLD_SIZE:
        raise ProgramError(f"{source}: ranks has {len(ranks_data):,} entries; the limit is {MAX_WORLD_SIZE:,} ranks")
    total_ops = sum(len(lines) for lines in ranks_data if isinstance(lines, list))
    if total_ops > MAX_OPS:
        raise ProgramError(f"{source}: the ranks hold {total_ops:,} ops; the limit is {MAX_OPS:,}")
    ranks: list[tuple[Op, ...]] = []
    memo: dict[str, Op] = {}  # equal lines parse to equal (immutable) ops, so share them
    for rank, lines in enumerate(ranks_data):
        if not isinstance(lines, list):
            raise ProgramError(f"{source}: ranks[{rank}] must be a list of op lines, got {type(lines).__name__}")
        ops: list[Op] = []
        for index, line in enumerate(lines):
            op = memo.get(line) if isinstance(line, str) else None
            if op is None:
                where = f"{source}: ranks[{rank}][{index}] (rank {rank}, op {index}): "
                if not isinstance(line, str):
                    raise ProgramError(f"{where}op must be a text line such as 'WAIT handle=h0', got {line!r}")
                op = memo[line] = parse_op(line, where)
            ops.append(op)
        ranks.append(tuple(ops))
    try:
        return Program(model=model, layout=layout, groups=groups, ranks=tuple(ranks), meta=meta)
    except ProgramError as exc:
        raise ProgramError(f"{source}: {exc}") from None


def program_from_json(text: str, source: str = "<file>") -> Program:
    """Parse a program from JSON text; ``source`` names the file in error messages."""
    from simgrid.io.inputs import parse_json

    data = parse_json(text, source=source, error=ProgramError)
    return program_from_dict(data, source)


def save_program(program: Program, path: str | os.PathLike[str], *, flag: str = "program file") -> None:
    """Write a program file atomically: a temporary file in the same directory, then a rename.

    A failure (a missing directory, a full disk) raises a ProgramError naming ``flag`` and leaves nothing.
    """
    from simgrid.io.atomic import atomic_write_text

    atomic_write_text(path, program_to_json(program), flag=flag, error=ProgramError)


def load_program(path: str | os.PathLike[str]) -> Program:
    """Read a program file written by :func:`save_program` (a regular UTF-8 JSON file)."""
    from simgrid.io.inputs import read_input_text, short_path

    text = read_input_text(path, what="program file", error=ProgramError)
    return program_from_json(text, short_path(path))


def _spec(value: Any, cls: type[ModelSpec] | type[Layout], key: str, source: str) -> Any:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ProgramError(f"{source}: {key} must be an object (the {cls.__name__} fields) or null")
    try:
        return cls.from_dict(value)
    except (ModelError, LayoutError) as exc:
        raise ProgramError(f"{source}: {key}: {exc}; fix the {key} object or set it to null") from None
    except TypeError as exc:  # a field given with the wrong type trips the dataclass before its checks
        raise ProgramError(f"{source}: {key}: {exc}; fix the {key} object or set it to null") from None
