"""Range rules shared by the spec dataclasses and the profile loader.

A spec checks its own fields in ``__post_init__`` with these helpers, so a spec built in Python is as
safe as one loaded from TOML. A violation raises :class:`FieldError`, which knows the field, the value
and the rule; the loader catches it and re-raises a :class:`ProfileError` that also names the file and
the full field path (``hardware_profiles/nodes/x.toml: intra_link.bandwidth_GBps = -3.0 must be > 0``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TypeVar

from simgrid.errors import ProfileError

K = TypeVar("K")
V = TypeVar("V")


MAX_MAGNITUDE = 1e15
"""Largest finite magnitude a profile number may have (in its own unit). No physical quantity a profile
states comes near it (the largest are host throughputs of ~1e10 parameters/s), so a larger value is a
unit mistake or a typo, and refusing it keeps every derived time finite."""
MIN_MAGNITUDE = 1e-12
"""Smallest non-zero magnitude a profile number may have (``5e-324`` is a typo, and its reciprocal is
infinite)."""
_MAX_SHOWN = 60


def format_value(value: object) -> str:
    """Render a value as it appears in an error message (floats keep their sign and ``inf``; long values
    are elided so a 5,000-digit integer does not flood the terminal)."""
    if isinstance(value, tuple):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value).bit_length() > 200:
        return f"{'-' if value < 0 else ''}<an integer of about {int(abs(value).bit_length() * 0.30103) + 1} digits>"
    text = repr(value)
    if len(text) > _MAX_SHOWN:
        return f"{text[:40]}...{text[-12:]}"
    return text


class FieldError(ProfileError):
    """One field breaks one rule; ``owner`` is the spec class when raised outside the loader."""

    def __init__(self, field: str, value: object, rule: str, *, owner: str = "") -> None:
        self.field = field
        self.value = value
        self.rule = rule
        where = f"{owner}.{field}" if owner else field
        super().__init__(f"{where} = {format_value(value)} {rule}")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _need_number(owner: str, field: str, value: object) -> float:
    """The value as a float; refuses non-numbers, nan, and finite magnitudes outside
    [MIN_MAGNITUDE, MAX_MAGNITUDE] (zero and infinities are left to the caller's rule)."""
    if not _is_number(value):
        raise FieldError(field, value, "must be a number", owner=owner)
    try:
        number = float(value)  # type: ignore[arg-type]
    except OverflowError:
        number = math.inf
    if math.isnan(number):
        raise FieldError(field, value, "must be a number, not nan", owner=owner)
    magnitude = abs(number)
    if (magnitude > MAX_MAGNITUDE and not isinstance(value, float)) or MAX_MAGNITUDE < magnitude < math.inf:
        raise FieldError(field, value, f"is out of range: magnitudes above {MAX_MAGNITUDE:g} are refused "
                         "(check the unit in the key name)", owner=owner)
    if 0 < magnitude < MIN_MAGNITUDE:
        raise FieldError(field, value, f"is out of range: non-zero magnitudes below {MIN_MAGNITUDE:g} are "
                         "refused (check the unit in the key name)", owner=owner)
    return number


def check_positive(owner: str, field: str, value: object, *, allow_inf: bool = False) -> None:
    """``value > 0``; ``inf`` only where an ideal machine needs it (bandwidths, throughputs)."""
    number = _need_number(owner, field, value)
    if number <= 0:
        raise FieldError(field, value, "must be > 0", owner=owner)
    if math.isinf(number) and not allow_inf:
        raise FieldError(field, value, "must be finite", owner=owner)


def check_non_negative(owner: str, field: str, value: object) -> None:
    """``0 <= value < inf`` (latencies, overheads)."""
    number = _need_number(owner, field, value)
    if number < 0 or math.isinf(number):
        raise FieldError(field, value, "must be >= 0 and finite", owner=owner)


def check_fraction(owner: str, field: str, value: object) -> None:
    """``0 < value <= 1`` (efficiencies: the achieved fraction of a peak)."""
    number = _need_number(owner, field, value)
    if not 0 < number <= 1:
        raise FieldError(field, value, "must be in (0, 1]", owner=owner)


def check_slowdown(owner: str, field: str, value: object) -> None:
    """``0 <= value < 1`` (a fractional slowdown; 1 would mean compute stops)."""
    number = _need_number(owner, field, value)
    if not 0 <= number < 1:
        raise FieldError(field, value, "must be in [0, 1)", owner=owner)


def check_at_least(owner: str, field: str, value: object, minimum: float) -> None:
    """``minimum <= value < inf``."""
    number = _need_number(owner, field, value)
    if number < minimum or math.isinf(number):
        raise FieldError(field, value, f"must be >= {minimum:g} and finite", owner=owner)


def check_int_at_least(owner: str, field: str, value: object, minimum: int) -> None:
    """An integer ``>= minimum`` (counts of GPUs, NICs, nodes)."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise FieldError(field, value, "must be an integer", owner=owner)
    if value < minimum:
        raise FieldError(field, value, f"must be an integer >= {minimum}", owner=owner)
    if value > MAX_MAGNITUDE:
        raise FieldError(field, value, f"is out of range: integers above {MAX_MAGNITUDE:g} are refused",
                         owner=owner)


def check_strictly_ascending(owner: str, field: str, values: Sequence[int]) -> None:
    """Every entry an integer >= 1, each larger than the one before (a curve's or a table's axis)."""
    for i, value in enumerate(values):
        check_int_at_least(owner, f"{field}[{i}]", value, 1)
        if i and value <= values[i - 1]:
            raise FieldError(field, values, "must be strictly ascending", owner=owner)


def piecewise_linear(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear in ``xs`` (callers pass log2 of sizes or lengths), clamped at both ends."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    for i in range(1, len(xs)):
        if x <= xs[i]:
            t = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
            return ys[i - 1] + t * (ys[i] - ys[i - 1])
    return ys[-1]


def check_choice(owner: str, field: str, value: object, choices: Iterable[str]) -> None:
    """One of a fixed set of names."""
    options = tuple(choices)
    if value not in options:
        raise FieldError(field, value, "must be one of " + ", ".join(repr(c) for c in options), owner=owner)


def check_text(owner: str, field: str, value: object, *, allow_empty: bool = False) -> None:
    """A string (names must not be empty)."""
    if not isinstance(value, str):
        raise FieldError(field, value, "must be a string", owner=owner)
    if not allow_empty and not value.strip():
        raise FieldError(field, value, "must not be empty", owner=owner)


class FrozenMapping(Mapping[K, V]):
    """A read-only, hashable dict, so specs holding tables stay hashable (usable as cache keys)."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[K, V] | Iterable[tuple[K, V]] = ()) -> None:
        self._data: dict[K, V] = dict(data)

    def __getitem__(self, key: K) -> V:
        return self._data[key]

    def __iter__(self) -> Iterator[K]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __hash__(self) -> int:
        return hash(frozenset(self._data.items()))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return self._data == dict(other.items())
        return NotImplemented

    def __repr__(self) -> str:
        return f"FrozenMapping({self._data!r})"
