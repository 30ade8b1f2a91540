"""A whole schedule IR program: metadata, process groups and each rank's ordered op list.

A :class:`Program` is a plain value: two programs with the same fields compare equal and hash equal,
so tests can compare a round-tripped program with the original directly. Construction checks only the
shape (types, rank numbering); the cross-rank rules (send/recv pairing, collective sequences, handles,
memory) are checked by :func:`simgrid.ir.validate.validate_program`, and deadlocks by
:func:`simgrid.ir.dryrun.dry_run`.

``ranks`` may also be a :class:`LazyRanks`: a builder that derives most ranks from a few templates
(:func:`simgrid.schedules.build_program`) hands over a recipe, and each rank's op tuple is produced the
first time it is read and kept. The program is the same value either way (equal to, and hashing like, one
built with the tuples); the symmetric engine then pays only for the ranks it simulates.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from simgrid.errors import ProgramError
from simgrid.ir.ops import Alloc, Collective, CommOp, Compute, Free, Op, Recv, Send, Transfer, Wait
from simgrid.layout.mesh import Mesh
from simgrid.layout.spec import Layout
from simgrid.model.spec import ModelSpec

MetaValue = str | int | float | bool | None
"""A free-form metadata value: a JSON scalar."""

OP_TYPES: tuple[type, ...] = (Compute, Send, Recv, Collective, Transfer, Wait, Alloc, Free)
"""Every concrete op class (the members of :data:`simgrid.ir.ops.Op`)."""

HANDLE_OP_TYPES: tuple[type, ...] = (Send, Recv, Collective, Transfer)
"""Op classes that carry a handle a :class:`Wait` can name."""

_OP_TYPE_SET = frozenset(OP_TYPES)


def _check_op_types(rank: int, ops: tuple[Op, ...]) -> None:
    if not set(map(type, ops)) <= _OP_TYPE_SET:
        index, o = next((i, o) for i, o in enumerate(ops) if type(o) not in _OP_TYPE_SET)
        raise ProgramError(
            f"program: ranks[{rank}][{index}] = {o!r} is not an IR op; use one of "
            f"{', '.join(t.__name__ for t in OP_TYPES)}"
        )


class LazyRanks(Sequence[tuple[Op, ...]]):
    """Per-rank op tuples produced by ``make(rank)`` on first access and kept (a read-only sequence).

    ``lengths[rank]`` must be the length of ``make(rank)``: it answers :attr:`Program.num_ops` without
    producing every rank. Equality and hashing are those of the tuple of all ranks, so a program holding
    a ``LazyRanks`` equals one holding the same ops as tuples. Op types are checked as each rank is made.
    """

    __slots__ = ("_lengths", "_made", "_make")

    def __init__(self, make: Callable[[int], tuple[Op, ...]], lengths: Sequence[int]) -> None:
        self._make = make
        self._lengths = tuple(lengths)
        self._made: list[tuple[Op, ...] | None] = [None] * len(self._lengths)

    def __len__(self) -> int:
        return len(self._lengths)

    @overload
    def __getitem__(self, index: int) -> tuple[Op, ...]: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[tuple[Op, ...], ...]: ...

    def __getitem__(self, index: int | slice) -> tuple[Op, ...] | tuple[tuple[Op, ...], ...]:
        if isinstance(index, slice):
            return tuple(self[i] for i in range(*index.indices(len(self._made))))
        found = self._made[index]  # IndexError / TypeError exactly as a tuple raises them
        if found is None:
            rank = index % len(self._made)
            found = tuple(self._make(rank))
            if len(found) != self._lengths[rank]:
                raise ProgramError(
                    f"program: lazily made ranks[{rank}] has {len(found)} ops but {self._lengths[rank]} "
                    "were announced; the builder's lengths must match what it makes"
                )
            _check_op_types(rank, found)
            self._made[rank] = found
        return found

    def __iter__(self) -> Iterator[tuple[Op, ...]]:
        for rank in range(len(self._made)):
            yield self[rank]

    @property
    def total_ops(self) -> int:
        """Ops over all ranks, without making any rank."""
        return sum(self._lengths)

    @property
    def made(self) -> int:
        """How many ranks have been made so far (diagnostics and tests)."""
        return sum(ops is not None for ops in self._made)

    def __eq__(self, other: object) -> bool:
        if other is self:
            return True
        if isinstance(other, LazyRanks):
            return self._lengths == other._lengths and all(a == b for a, b in zip(self, other, strict=True))
        if isinstance(other, tuple):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return repr(tuple(self))


@dataclass(frozen=True, kw_only=True)
class Program:
    """Everything one training step issues, rank by rank, plus what it was built from."""

    model: ModelSpec | None = None
    """The model the program trains; ``None`` for hand-built or imported programs."""
    layout: Layout | None = None
    """The parallel layout it was generated for; ``None`` for hand-built or imported programs."""
    groups: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    """Process groups: name -> global ranks (stored sorted by name, members as a tuple in the given order)."""
    ranks: Sequence[tuple[Op, ...]] = ()
    """One tuple of ops per global rank, in issue order (lists are accepted and converted to a tuple of
    tuples; a :class:`LazyRanks` is kept as it is)."""
    meta: Mapping[str, Any] = field(default_factory=dict)
    """Free-form :data:`MetaValue` JSON scalars: schedule name, granularity, generator, ... (sorted by key;
    checked at construction)."""
    _handle_index: list[dict[str, int] | None] | None = field(
        default=None, init=False, repr=False, compare=False, hash=False
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "ranks", _normalise_ranks(self.ranks))
        object.__setattr__(self, "groups", _normalise_groups(self.groups))
        object.__setattr__(self, "meta", _normalise_meta(self.meta))
        if self.model is not None and not isinstance(self.model, ModelSpec):
            raise ProgramError(f"program: model = {self.model!r} must be a ModelSpec or None")
        if self.layout is not None:
            if not isinstance(self.layout, Layout):
                raise ProgramError(f"program: layout = {self.layout!r} must be a Layout or None")
            if self.layout.world_size != len(self.ranks):
                raise ProgramError(
                    f"program: the layout has world size {self.layout.world_size} "
                    f"(dp {self.layout.dp} x tp {self.layout.tp} x pp {self.layout.pp}) but the program "
                    f"has {len(self.ranks)} rank op lists; give one op list per rank"
                )

    def __reduce__(self) -> tuple[Any, ...]:
        # mappingproxy cannot be pickled; rebuild from plain dicts (executor workers receive programs).
        kwargs = {
            "model": self.model,
            "layout": self.layout,
            "groups": dict(self.groups),
            "ranks": tuple(self.ranks),
            "meta": dict(self.meta),
        }
        return (_rebuild, (kwargs,))

    def __hash__(self) -> int:
        return hash((self.model, self.layout, tuple(self.groups.items()), self.ranks, tuple(self.meta.items())))

    # -- sizes and access ----------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        """Number of ranks (one op list each)."""
        return len(self.ranks)

    @property
    def num_ops(self) -> int:
        """Ops over all ranks."""
        if isinstance(self.ranks, LazyRanks):
            return self.ranks.total_ops
        return sum(len(ops) for ops in self.ranks)

    @property
    def mesh(self) -> Mesh | None:
        """Rank <-> (pp, dp, tp) mapping of the layout, or ``None`` without a layout."""
        return Mesh(self.layout) if self.layout is not None else None

    def ops(self, rank: int) -> tuple[Op, ...]:
        """The ops of one rank, in issue order."""
        self._check_rank(rank)
        return self.ranks[rank]

    def op(self, rank: int, index: int) -> Op:
        """One op by rank and position."""
        ops = self.ops(rank)
        if not 0 <= index < len(ops):
            raise ProgramError(f"program: rank {rank} has {len(ops)} ops; op index {index} is out of range")
        return ops[index]

    def group(self, name: str) -> tuple[int, ...]:
        """Members of a named process group."""
        try:
            return self.groups[name]
        except KeyError:
            raise ProgramError(
                f"program: no process group named {name!r}; known groups: {_short_list(sorted(self.groups))}"
            ) from None

    # -- handles -------------------------------------------------------------------------------
    def handle_index(self, rank: int, handle: str) -> int:
        """Position on ``rank`` of the op issuing ``handle`` (the first one if a handle repeats)."""
        self._check_rank(rank)
        index = self._handle_index
        if index is None:
            index = [None] * len(self.ranks)
            object.__setattr__(self, "_handle_index", index)
        by_handle = index[rank]
        if by_handle is None:  # built per rank on first use: a lazy program makes only the ranks asked about
            by_handle = {}
            for i, o in enumerate(self.ranks[rank]):
                if isinstance(o, HANDLE_OP_TYPES):
                    by_handle.setdefault(o.handle, i)  # type: ignore[union-attr]
            index[rank] = by_handle
        try:
            return by_handle[handle]
        except KeyError:
            raise ProgramError(f"program: rank {rank} issues no op with handle {handle!r}") from None

    def op_by_handle(self, rank: int, handle: str) -> CommOp:
        """The asynchronous op on ``rank`` that carries ``handle``."""
        found = self.ranks[rank][self.handle_index(rank, handle)]
        assert isinstance(found, HANDLE_OP_TYPES)  # handle_index only records handle-carrying ops
        return found  # type: ignore[return-value]

    # -- iteration -----------------------------------------------------------------------------
    def iter_ops(self) -> Iterator[tuple[int, int, Op]]:
        """Every op as ``(rank, index, op)``, rank by rank."""
        for rank, ops in enumerate(self.ranks):
            for index, o in enumerate(ops):
                yield rank, index, o

    def collectives(self, group: str, rank: int | None = None) -> Iterator[tuple[int, int, Collective]]:
        """Collectives on ``group`` as ``(rank, index, op)``; only those of ``rank`` when given."""
        members = self.group(group)
        for r in members if rank is None else (rank,):
            self._check_rank(r)
            for index, o in enumerate(self.ranks[r]):
                if isinstance(o, Collective) and o.group == group:
                    yield r, index, o

    def compute_ops(self, rank: int) -> Iterator[tuple[int, Compute]]:
        """Compute ops of one rank as ``(index, op)``."""
        for index, o in enumerate(self.ops(rank)):
            if isinstance(o, Compute):
                yield index, o

    def groups_of(self, rank: int) -> tuple[str, ...]:
        """Names of the groups ``rank`` belongs to."""
        return tuple(name for name, members in self.groups.items() if rank in members)

    def _check_rank(self, rank: int) -> None:
        if not isinstance(rank, int) or not 0 <= rank < len(self.ranks):
            raise ProgramError(
                f"program: rank {rank!r} is outside the world of {len(self.ranks)} ranks (0..{len(self.ranks) - 1})"
            )


def _rebuild(kwargs: dict[str, Any]) -> Program:
    return Program(**kwargs)


def _normalise_ranks(ranks: Any) -> Sequence[tuple[Op, ...]]:
    if isinstance(ranks, LazyRanks):
        return ranks
    if isinstance(ranks, (str, bytes)) or not isinstance(ranks, Sequence):
        raise ProgramError(f"program: ranks must be a sequence of per-rank op sequences, got {type(ranks).__name__}")
    out: list[tuple[Op, ...]] = []
    checked: set[int] = set()  # builders share one tuple between identical ranks: check it once
    for rank, ops in enumerate(ranks):
        if isinstance(ops, (str, bytes)) or not isinstance(ops, Sequence):
            raise ProgramError(f"program: ranks[{rank}] must be a sequence of ops, got {type(ops).__name__}")
        ops = tuple(ops)
        if id(ops) not in checked:
            _check_op_types(rank, ops)
            checked.add(id(ops))
        out.append(ops)
    return tuple(out)


def _normalise_groups(groups: Any) -> Mapping[str, tuple[int, ...]]:
    if not isinstance(groups, Mapping):
        raise ProgramError(f"program: groups must map a group name to its ranks, got {type(groups).__name__}")
    out: dict[str, tuple[int, ...]] = {}
    for name in sorted(groups):
        if not isinstance(name, str) or not name:
            raise ProgramError(f"program: group name {name!r} must be a non-empty string")
        members = groups[name]
        if isinstance(members, (str, bytes)) or not isinstance(members, Sequence):
            raise ProgramError(f"program: group {name!r} must list its ranks, got {members!r}")
        for r in members:
            if not isinstance(r, int) or isinstance(r, bool):
                raise ProgramError(f"program: group {name!r} member {r!r} must be an integer rank")
        out[name] = tuple(members)
    return types.MappingProxyType(out)


def _normalise_meta(meta: Any) -> Mapping[str, MetaValue]:
    if not isinstance(meta, Mapping):
        raise ProgramError(f"program: meta must map names to JSON scalars, got {type(meta).__name__}")
    out: dict[str, MetaValue] = {}
    for key in sorted(meta):
        value = meta[key]
        if not isinstance(key, str):
            raise ProgramError(f"program: meta key {key!r} must be a string")
        if value is not None and not isinstance(value, (str, int, float, bool)):
            raise ProgramError(
                f"program: meta[{key!r}] = {value!r} must be a JSON scalar (string, number, bool or null)"
            )
        out[key] = value
    return types.MappingProxyType(out)


def _short_list(items: Sequence[str], limit: int = 12) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f", ... ({len(items)} in all)" if len(items) > limit else "") if items else "(none)"
