"""Typed, path-aware access to one TOML table, for the profile loader.

A :class:`TableReader` hands out values with type checks, remembers which keys were asked for, and
rejects the rest (:meth:`finish`), so a typo such as ``bandwith_GBps`` fails loudly with the list of
known keys. Every error names the file, the full field path, the value and the rule.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from simgrid.errors import ProfileError
from simgrid.hardware.rules import MAX_MAGNITUDE, FieldError, format_value
from simgrid.hardware.search import display_path

T = TypeVar("T")
_MISSING = object()


class TableReader:
    """Reads one TOML table at a field path (``prefix``, e.g. ``"node.intra_link."``) of a file."""

    def __init__(self, data: Mapping[str, Any], *, file: Path, prefix: str = "") -> None:
        self.data = data
        self.file = file
        self.prefix = prefix
        self.known: list[str] = []

    # -- errors ---------------------------------------------------------------------------------
    def error(self, key: str, value: object, rule: str) -> ProfileError:
        """A ProfileError for ``key`` (relative to this table)."""
        return ProfileError(f"{display_path(self.file)}: {self.prefix}{key} = {format_value(value)} {rule}")

    def located(self, exc: FieldError, rename: Mapping[str, str] | None = None) -> ProfileError:
        """Re-raise a spec's FieldError with this file and path (``rename`` maps spec fields to TOML keys)."""
        head, dot, rest = exc.field.partition(".")
        field = (rename or {}).get(head, head) + dot + rest
        return ProfileError(f"{display_path(self.file)}: {self.prefix}{field} = {format_value(exc.value)} {exc.rule}")

    def build(self, factory: Callable[..., T], **fields: Any) -> T:
        """Construct a spec, turning its range errors into located ProfileErrors."""
        try:
            return factory(**fields)
        except FieldError as exc:
            raise self.located(exc) from None

    # -- raw access -----------------------------------------------------------------------------
    def has(self, key: str) -> bool:
        """Whether ``key`` is present (and mark it known)."""
        self._know(key)
        return key in self.data

    def raw(self, key: str, default: object = _MISSING) -> Any:
        """The value of ``key``; a 'missing' error if absent and no default is given."""
        self._know(key)
        if key in self.data:
            return self.data[key]
        if default is _MISSING:
            near = difflib.get_close_matches(key, [k for k in self.data if k not in self.known], n=1)
            hint = f"; found {self.prefix}{near[0]} instead, a typo?" if near else ""
            raise ProfileError(f"{display_path(self.file)}: {self.prefix}{key} is missing (required field){hint}")
        return default

    def _know(self, key: str) -> None:
        if key not in self.known:
            self.known.append(key)

    # -- typed access ---------------------------------------------------------------------------
    def number(self, key: str, default: object = _MISSING) -> float:
        """A float (TOML ints accepted; ``inf`` allowed here, ranges are checked by the spec)."""
        value = self.raw(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.error(key, value, "must be a number")
        if isinstance(value, float) and math.isnan(value):
            raise self.error(key, value, "must be a number, not nan")
        try:
            return float(value)
        except OverflowError:  # an integer beyond float range: no field takes it
            raise self.error(key, value, f"is out of range: magnitudes above {MAX_MAGNITUDE:g} are refused") from None

    def optional_number(self, key: str) -> float | None:
        """A float or ``None`` when absent."""
        return self.number(key) if self.has(key) else None

    def integer(self, key: str, default: object = _MISSING) -> int:
        """An int (``8``, not ``8.0``)."""
        value = self.raw(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(key, value, "must be an integer")
        return value

    def boolean(self, key: str, default: object = _MISSING) -> bool:
        """A TOML boolean (``true`` / ``false``)."""
        value = self.raw(key, default)
        if not isinstance(value, bool):
            raise self.error(key, value, "must be true or false")
        return value

    def text(self, key: str, default: object = _MISSING) -> str:
        """A string."""
        value = self.raw(key, default)
        if not isinstance(value, str):
            raise self.error(key, value, "must be a string")
        return value

    def number_list(self, key: str, *, integers: bool = False) -> tuple[Any, ...]:
        """An array of numbers (of integers when ``integers``)."""
        value = self.raw(key)
        if not isinstance(value, list):
            raise self.error(key, value, "must be an array of numbers")
        for i, item in enumerate(value):
            bad = isinstance(item, bool) or not isinstance(item, int if integers else int | float)
            if bad:
                raise self.error(f"{key}[{i}]", item, "must be an integer" if integers else "must be a number")
            if not integers and isinstance(item, int) and abs(item) > MAX_MAGNITUDE:
                raise self.error(f"{key}[{i}]", item, f"is out of range: magnitudes above {MAX_MAGNITUDE:g} are refused")
        return tuple(item if integers else float(item) for item in value)

    def number_grid(self, key: str) -> tuple[tuple[float, ...], ...]:
        """An array of arrays of numbers (a table's rows), e.g. ``[[1, 2], [3, 4]]``."""
        value = self.raw(key)
        if not isinstance(value, list) or not all(isinstance(row, list) for row in value):
            raise self.error(key, value, "must be an array of arrays of numbers, one inner array per row")
        rows = []
        for i, row in enumerate(value):
            for j, item in enumerate(row):
                if isinstance(item, bool) or not isinstance(item, int | float):
                    raise self.error(f"{key}[{i}][{j}]", item, "must be a number")
            rows.append(tuple(float(item) for item in row))
        return tuple(rows)

    def table(self, key: str) -> TableReader:
        """A sub-table as a reader with the extended path."""
        value = self.raw(key)
        if not isinstance(value, dict):
            raise self.error(key, value, "must be a table")
        return TableReader(value, file=self.file, prefix=f"{self.prefix}{key}.")

    def table_list(self, key: str) -> list[TableReader]:
        """An array of tables (``[[key]]``), empty when absent."""
        value = self.raw(key, [])
        if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
            raise self.error(key, value, f"must be an array of tables ([[{self.prefix}{key}]])")
        return [TableReader(item, file=self.file, prefix=f"{self.prefix}{key}[{i}].") for i, item in enumerate(value)]

    def sources(self) -> dict[str, str]:
        """The ``[sources]`` table: each key names a field of this table (dotted paths allowed)."""
        if not self.has("sources"):
            return {}
        reader = self.table("sources")
        fields = [k for k in self.known if k != "sources"]
        result: dict[str, str] = {}
        for key, line in reader.data.items():
            if key.split(".")[0] not in fields:
                raise reader.error(key, line, "names no field of this profile; known fields: " + ", ".join(fields))
            result[key] = reader.text(key)
        return result

    def finish(self) -> None:
        """Reject keys nobody asked for, listing the known ones."""
        for key in self.data:
            if key not in self.known:
                raise ProfileError(
                    f"{display_path(self.file)}: {self.prefix}{key} is not a known key; "
                    f"known keys here: {', '.join(self.known)}"
                )
