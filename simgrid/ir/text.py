"""One-line text form of every IR op, and its exact inverse.

Grammar: ``MNEMONIC key=value key=value ...`` separated by whitespace, e.g.::

    F stage=1 mb=0 chunk=0 blocks=3:5 flops=123.0 hbm=4.5 gemm=2048x3072x768 kernels=6
    SEND peer=1 bytes=1024 key=0>1:F:3 handle=sF0
    RECV peer=1 bytes=1024 key=1>0:B:3 handle=rB0 grouped=true
    ALL_REDUCE group=tp/pp0-dp0 bytes=4096 purpose=tp handle=ar7 label=b3:fwd
    D2H bytes=4096 handle=g0 label=grads
    WAIT handle=sF0
    ALLOC name=act.mb0 bytes=4096 category=activations
    FREE name=act.mb0

Mnemonics: the compute kind (``F B I W R OPT``), ``SEND``, ``RECV``, the collective kind in capitals
(``ALL_REDUCE`` ...), the transfer direction in capitals (``D2H``, ``H2D``), ``WAIT``, ``ALLOC``, ``FREE``.
Fields with a default are written only when they differ from it. Integers are written in decimal and
floats with ``repr``, booleans as ``true`` / ``false`` (so ``parse_op(format_op(op)) == op`` exactly, int/float type included: a token that
is a plain integer parses as ``int``). Strings are written bare unless empty, containing whitespace or
non-printable characters, or a ``"``; then they are JSON-quoted (``label="a b"``).
Structured fields: ``key=SRC>DST:DIR:MB``, ``blocks=START:END``, ``gemm=MxNxK``, ``attnshape=SQxSKVxD``
and ``gemms=MxNxKxCOUNT,...`` (every matrix multiply of a compute op; ``accgemms=`` those that accumulate into
an ``acc=BYTES``-wide buffer).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from simgrid.errors import ProgramError
from simgrid.ir.ops import (
    COLLECTIVE_KINDS,
    COMM_KERNELS,
    COMM_PURPOSES,
    COMPUTE_KINDS,
    MEMORY_CATEGORIES,
    Alloc,
    Collective,
    Compute,
    Free,
    Op,
    P2PKey,
    Recv,
    Send,
    Transfer,
    Wait,
)

_INT_RE = re.compile(r"[+-]?[0-9]+")
_KEY_RE = re.compile(r"(-?[0-9]+)>(-?[0-9]+):([FB]):(-?[0-9]+)")
_BLOCKS_RE = re.compile(r"(-?[0-9]+):(-?[0-9]+)")
_GEMM_RE = re.compile(r"(-?[0-9]+)x(-?[0-9]+)x(-?[0-9]+)")
_GEMMS_RE = re.compile(r"([0-9]+)x([0-9]+)x([0-9]+)x([0-9]+)")
_JSON = json.JSONDecoder()


class _BadValue(ValueError):
    """A token that does not fit its field; the message says what was expected."""


@dataclass(frozen=True)
class _Codec:
    expected: str
    encode: Callable[[Any], str]
    decode: Callable[[str], Any]


#: Integers in op lines are 64-bit (what torch and NCCL count bytes in); longer digit strings are refused
#: before conversion, so a 5,000-digit number is a one-line error, not Python's digit-limit ValueError.
MAX_TEXT_INT = 2**63 - 1


def _enc_int(v: Any) -> str:
    if not isinstance(v, int) or isinstance(v, bool):
        raise _BadValue("an integer")
    if abs(v) > MAX_TEXT_INT:
        raise _BadValue(f"an integer within +-{MAX_TEXT_INT} (64-bit)")
    return str(v)


def _int_token(s: str) -> int:
    if len(s.lstrip("+-")) > 19 or abs(value := int(s)) > MAX_TEXT_INT:
        raise _BadValue(f"an integer within +-{MAX_TEXT_INT} (64-bit)")
    return value


def _dec_int(s: str) -> int:
    if not _INT_RE.fullmatch(s):
        raise _BadValue("an integer")
    return _int_token(s)


def _enc_num(v: Any) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _BadValue("a number")
    if isinstance(v, int):
        return _enc_int(v)
    if not math.isfinite(v):
        raise _BadValue("a finite number (not nan or inf)")
    return repr(v)


def _dec_num(s: str) -> int | float:
    if _INT_RE.fullmatch(s):
        return _int_token(s)
    try:
        value = float(s)
    except ValueError:
        raise _BadValue("a number (integer or float such as 1.5e9)") from None
    if not math.isfinite(value):
        raise _BadValue("a finite number (not nan or inf)")
    return value


def _needs_quotes(s: str) -> bool:
    return not s or '"' in s or not s.isprintable() or any(c.isspace() for c in s)


def _enc_str(v: Any) -> str:
    if not isinstance(v, str):
        raise _BadValue("a string")
    return json.dumps(v, ensure_ascii=False) if _needs_quotes(v) else v


def _dec_str(s: str) -> str:
    return s  # quoted strings are unquoted by the tokenizer


def _choice(values: tuple[str, ...]) -> _Codec:
    def enc(v: Any) -> str:
        if v not in values:
            raise _BadValue(f"one of {', '.join(values)}")
        return str(v)

    def dec(s: str) -> str:
        if s not in values:
            raise _BadValue(f"one of {', '.join(values)}")
        return s

    return _Codec(f"one of {', '.join(values)}", enc, dec)


def _enc_key(k: Any) -> str:
    if not isinstance(k, P2PKey):
        raise _BadValue("a P2PKey")
    parts = (_enc_int(k.src_stage), _enc_int(k.dst_stage), _enc_int(k.microbatch))
    if k.direction not in ("F", "B"):
        raise _BadValue("a key with direction F or B")
    return f"{parts[0]}>{parts[1]}:{k.direction}:{parts[2]}"


def _dec_key(s: str) -> P2PKey:
    m = _KEY_RE.fullmatch(s)
    if not m:
        raise _BadValue("SRC>DST:DIR:MB, e.g. 0>1:F:3 (stages, direction F or B, micro-batch)")
    return P2PKey(src_stage=_int_token(m[1]), dst_stage=_int_token(m[2]), direction=m[3],  # type: ignore[arg-type]
                  microbatch=_int_token(m[4]))


def _enc_blocks(v: Any) -> str:
    return f"{_enc_int(v[0])}:{_enc_int(v[1])}"


def _dec_blocks(s: str) -> tuple[int, int]:
    m = _BLOCKS_RE.fullmatch(s)
    if not m:
        raise _BadValue("START:END sub-block range, e.g. 3:5")
    return _int_token(m[1]), _int_token(m[2])


def _enc_gemm(v: Any) -> str:
    if not isinstance(v, tuple) or len(v) != 3:
        raise _BadValue("an (M, N, K) tuple")
    return "x".join(_enc_int(x) for x in v)


def _dec_gemm(s: str) -> tuple[int, int, int]:
    m = _GEMM_RE.fullmatch(s)
    if not m:
        raise _BadValue("MxNxK, e.g. 2048x3072x768")
    return _int_token(m[1]), _int_token(m[2]), _int_token(m[3])


def _enc_bool(v: Any) -> str:
    if type(v) is not bool:
        raise _BadValue("true or false")
    return "true" if v else "false"


def _dec_bool(s: str) -> bool:
    if s not in ("true", "false"):
        raise _BadValue("true or false")
    return s == "true"


_INT = _Codec("an integer", _enc_int, _dec_int)
_NUM = _Codec("a number", _enc_num, _dec_num)
_STR = _Codec("a string (JSON-quoted if it has spaces)", _enc_str, _dec_str)
_KEY = _Codec("SRC>DST:DIR:MB", _enc_key, _dec_key)
_BOOL = _Codec("true or false", _enc_bool, _dec_bool)
_BLOCKS = _Codec("START:END", _enc_blocks, _dec_blocks)
_GEMM = _Codec("MxNxK", _enc_gemm, _dec_gemm)


def _enc_gemms(v: Any) -> str:
    if not isinstance(v, tuple) or not v or not all(isinstance(g, tuple) and len(g) == 4 for g in v):
        raise _BadValue("a non-empty tuple of (M, N, K, COUNT) tuples")
    return ",".join("x".join(_enc_int(x) for x in g) for g in v)


def _dec_gemms(s: str) -> tuple[tuple[int, int, int, int], ...]:
    out = []
    for part in s.split(","):
        m = _GEMMS_RE.fullmatch(part)
        if not m:
            raise _BadValue("MxNxKxCOUNT[,MxNxKxCOUNT...], e.g. 2048x3072x768x1,2048x2048x64x32")
        out.append((int(m[1]), int(m[2]), int(m[3]), int(m[4])))
    return tuple(out)


_GEMMS = _Codec("MxNxKxCOUNT[,...]", _enc_gemms, _dec_gemms)

_REQUIRED = object()


@dataclass(frozen=True)
class _Field:
    key: str
    """Name in the text form."""
    attrs: tuple[str, ...]
    """Dataclass attributes it carries (two for ``blocks``)."""
    codec: _Codec
    default: Any = _REQUIRED


def _f(key: str, attr: str | tuple[str, ...], codec: _Codec, default: Any = _REQUIRED) -> _Field:
    return _Field(key, attr if isinstance(attr, tuple) else (attr,), codec, default)


_FIELDS: dict[type, tuple[_Field, ...]] = {
    Compute: (
        _f("stage", "stage", _INT),
        _f("mb", "microbatch", _INT),
        _f("chunk", "chunk", _INT),
        _f("blocks", ("block_start", "block_end"), _BLOCKS),
        _f("flops", "flops", _NUM),
        _f("hbm", "hbm_bytes", _NUM),
        _f("gemm", "gemm_mnk", _GEMM, (0, 0, 0)),
        _f("attn", "attention_flops", _NUM, 0.0),
        _f("kernels", "kernels", _INT, 1),
        _f("gemms", "gemms", _GEMMS, ()),
        _f("accgemms", "accumulate_gemms", _GEMMS, ()),
        _f("acc", "accumulate_bytes", _INT, 0),
        _f("fp8gemms", "fp8_gemms", _GEMMS, ()),
        _f("fp8accgemms", "fp8_accumulate_gemms", _GEMMS, ()),
        _f("attnshape", "attention_shape", _GEMM, (0, 0, 0)),
        _f("streams", "gemm_streams", _INT, 1),
        _f("device", "device", _choice(("gpu", "cpu")), "gpu"),
        _f("host", "host_s", _NUM, 0.0),
    ),
    Send: (_f("peer", "peer", _INT), _f("bytes", "bytes", _INT), _f("key", "key", _KEY), _f("handle", "handle", _STR),
          _f("grouped", "grouped", _BOOL, False)),
    Recv: (_f("peer", "peer", _INT), _f("bytes", "bytes", _INT), _f("key", "key", _KEY), _f("handle", "handle", _STR),
          _f("grouped", "grouped", _BOOL, False)),
    Collective: (
        _f("group", "group", _STR),
        _f("bytes", "bytes", _INT),
        _f("purpose", "purpose", _choice(COMM_PURPOSES)),
        _f("handle", "handle", _STR),
        _f("root", "root", _INT, None),
        _f("count", "count", _INT, 1),
        _f("label", "label", _STR, ""),
        _f("kernel", "kernel", _choice(COMM_KERNELS), "nccl"),
    ),
    Transfer: (_f("bytes", "bytes", _INT), _f("handle", "handle", _STR), _f("label", "label", _STR, "")),
    Wait: (_f("handle", "handle", _STR),),
    Alloc: (
        _f("name", "name", _STR),
        _f("bytes", "bytes", _INT),
        _f("category", "category", _choice(MEMORY_CATEGORIES)),
    ),
    Free: (_f("name", "name", _STR),),
}

# Mnemonic -> (op class, fixed constructor arguments implied by the mnemonic).
_MNEMONICS: dict[str, tuple[type, dict[str, str]]] = {
    **{k: (Compute, {"kind": k}) for k in COMPUTE_KINDS},
    "SEND": (Send, {}),
    "RECV": (Recv, {}),
    **{k.upper(): (Collective, {"kind": k}) for k in COLLECTIVE_KINDS},
    "D2H": (Transfer, {"direction": "d2h"}),
    "H2D": (Transfer, {"direction": "h2d"}),
    "WAIT": (Wait, {}),
    "ALLOC": (Alloc, {}),
    "FREE": (Free, {}),
}
_FIELDS_BY_KEY: dict[type, dict[str, _Field]] = {cls: {f.key: f for f in fs} for cls, fs in _FIELDS.items()}


def mnemonic(op: Op) -> str:
    """The first word of an op's text form, e.g. ``F``, ``SEND``, ``ALL_REDUCE``, ``D2H``."""
    if isinstance(op, Compute):
        return op.kind
    if isinstance(op, Collective):
        return op.kind.upper()
    if isinstance(op, Transfer):
        return op.direction.upper()
    return type(op).__name__.upper()


def format_op(op: Op) -> str:
    """The one-line text form of an op (see the module docstring)."""
    fields = _FIELDS.get(type(op))
    if fields is None:
        raise ProgramError(f"format_op: {op!r} is not an IR op")
    name = mnemonic(op)
    if name not in _MNEMONICS or _MNEMONICS[name][0] is not type(op):
        raise ProgramError(f"format_op: {op!r} has an unknown kind/direction {name!r}")
    parts = [name]
    for f in fields:
        value: Any = getattr(op, f.attrs[0]) if len(f.attrs) == 1 else tuple(getattr(op, a) for a in f.attrs)
        if f.default is not _REQUIRED and value == f.default and type(value) is type(f.default):
            continue
        try:
            parts.append(f"{f.key}={f.codec.encode(value)}")
        except _BadValue as exc:
            raise ProgramError(
                f"format_op: {type(op).__name__}.{'/'.join(f.attrs)} = {value!r} must be {exc}"
            ) from None
    return " ".join(parts)


def format_ranks(ranks: Sequence[Sequence[Op]]) -> list[list[str]]:
    """Every rank's ops as text lines; equal ops (common across tp/dp ranks) are formatted once."""
    memo: dict[Op, str] = {}
    out: list[list[str]] = []
    for ops in ranks:
        lines: list[str] = []
        for op in ops:
            try:
                text = memo.get(op)
            except TypeError:  # an op holding an unhashable (wrongly typed) field: format_op explains
                text = format_op(op)
            if text is None:
                text = memo[op] = format_op(op)
            lines.append(text)
        out.append(lines)
    return out


def _tokenize(line: str, where: str) -> list[tuple[str, bool]]:
    """Split on whitespace into ``(token, was_quoted)``, unquoting JSON-quoted values (``key="a b"``)."""
    if '"' not in line:
        return [(t, False) for t in line.split()]
    tokens: list[tuple[str, bool]] = []
    i, n = 0, len(line)
    while i < n:
        if line[i].isspace():
            i += 1
            continue
        j = i
        while j < n and not line[j].isspace() and line[j] != '"':
            j += 1
        if j < n and line[j] == '"':
            if j == i or line[j - 1] != "=":
                raise ProgramError(
                    f"{where}cannot parse op {_shown(line)}: stray quote at column {j + 1}; "
                    'expected quotes only around a whole value, as in label="a b"'
                )
            try:
                value, end = _JSON.raw_decode(line, j)
            except json.JSONDecodeError:
                raise ProgramError(
                    f"{where}cannot parse op {_shown(line)}: unterminated or malformed quoted value at column "
                    f'{j + 1}; expected a JSON string such as "a b"'
                ) from None
            if not isinstance(value, str) or (end < n and not line[end].isspace()):
                raise ProgramError(
                    f"{where}cannot parse op {_shown(line)}: bad quoted value at column {j + 1}; "
                    "expected a JSON string followed by a space or the end of the line"
                )
            tokens.append((line[i:j] + value, True))
            i = end
        else:
            tokens.append((line[i:j], False))
            i = j
    return tokens


def parse_op(line: str, where: str = "") -> Op:
    """Parse one op from its text form; ``where`` (e.g. ``"f.json: ranks[3][17]: "``) prefixes errors."""
    tokens = _tokenize(line, where)
    if not tokens:
        raise ProgramError(f"{where}empty op line; expected e.g. 'F stage=0 mb=0 chunk=0 blocks=0:3 flops=1.0 hbm=0'")
    head, head_quoted = tokens[0]
    entry = None if head_quoted else _MNEMONICS.get(head)
    if entry is None:
        raise ProgramError(
            f"{where}cannot parse op {_shown(line)}: unknown op {head!r}; expected one of {', '.join(_MNEMONICS)}"
        )
    cls, kwargs = entry
    kwargs = dict(kwargs)
    fields = _FIELDS_BY_KEY[cls]
    seen: set[str] = set()
    for tok, quoted in tokens[1:]:
        key, eq, raw = tok.partition("=")
        if not eq:
            raise ProgramError(f"{where}cannot parse op {_shown(line)}: token {_shown(tok)} is not key=value")
        f = fields.get(key)
        if f is None:
            raise ProgramError(
                f"{where}cannot parse op {_shown(line)}: unknown field {key!r} for {head}; expected {', '.join(fields)}"
            )
        if key in seen:
            raise ProgramError(f"{where}cannot parse op {_shown(line)}: field {key!r} given twice")
        seen.add(key)
        if quoted and f.codec is not _STR:
            raise ProgramError(f"{where}cannot parse op {_shown(line)}: field {key!r} must be {f.codec.expected}, unquoted")
        try:
            value = f.codec.decode(raw)
        except _BadValue as exc:
            raise ProgramError(f"{where}cannot parse op {_shown(line)}: {key}={_shown(raw)} is not valid; expected {exc}") from None
        if len(f.attrs) == 1:
            kwargs[f.attrs[0]] = value
        else:
            kwargs.update(zip(f.attrs, value, strict=True))
    missing = [k for k, f in fields.items() if f.default is _REQUIRED and k not in seen]
    if missing:
        raise ProgramError(
            f"{where}cannot parse op {_shown(line)}: {head} is missing field(s) {', '.join(missing)}; "
            f"expected fields {', '.join(fields)}"
        )
    try:
        op: Op = cls(**kwargs)
    except ProgramError as exc:
        raise ProgramError(f"{where}cannot parse op {_shown(line)}: {exc}") from None
    return op


def _shown(text: str, limit: int = 120) -> str:
    """``repr(text)``, elided in the middle when long (a 1 MB line must not flood the terminal)."""
    shown = repr(text)
    return shown if len(shown) <= limit else f"{shown[: limit - 40]}...{shown[-30:]} ({len(text):,} characters)"


def short_op(op: Op, width: int = 24) -> str:
    """A compact label for grids and plots, e.g. ``1F0``, ``SEND>1 0>1:F:3``, ``AR tp/pp0-dp0``."""
    if isinstance(op, Compute):
        text = f"{op.kind}-step" if op.kind == "OPT" else f"{op.stage}{op.kind}{op.microbatch}"
        if op.kind != "OPT" and op.block_end - op.block_start > 0:
            text += f"[{op.block_start}:{op.block_end}]"
    elif isinstance(op, Send):
        text = f"SEND>{op.peer} {_enc_key(op.key)}"
    elif isinstance(op, Recv):
        text = f"RECV<{op.peer} {_enc_key(op.key)}"
    elif isinstance(op, Collective):
        abbrev = "".join(w[0] for w in op.kind.split("_")).upper() if "_" in op.kind else op.kind.upper()
        text = f"{abbrev} {op.group}"
    elif isinstance(op, Transfer):
        text = f"{op.direction.upper()} {op.label or op.handle}"
    elif isinstance(op, Wait):
        text = f"WAIT {op.handle}"
    elif isinstance(op, Alloc):
        text = f"ALLOC {op.name}"
    else:
        text = f"FREE {op.name}"
    return text if len(text) <= width else text[: width - 1] + "~"
