"""Turn a role's op list (written for the canonical ``dp = 0, tp = 0, cp = 0`` rank) into every rank's op list.

Ranks of one pipeline rank issue the same ops; they differ only in the names of their tensor-parallel,
context-parallel, data-parallel and embedding groups, the roots of rooted collectives (the data-parallel group's first
rank) and their pipeline peers. Only those ops are rebuilt; every other op value is shared between the
ranks, and collectives are rebuilt once per distinct group (once per tensor-parallel group, not per
rank). The per-rank lists are patched copies of the template made with numpy fancy indexing.
:func:`simgrid.schedules.build_program` asks for a rank's list only when something reads it (a
:class:`~simgrid.ir.program.LazyRanks`), and the template is indexed on the first replica asked for, so
a symmetric simulation touches the ``pp`` canonical lists only.

:class:`MicrobatchTemplate` does the same along the other axis: the ops a lowering pass makes for one compute
op, built once and copied for every micro-batch with the micro-batch and handles patched.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from simgrid.ir.ops import Collective, Compute, Op, Recv, Send
from simgrid.layout.experts import (
    ExpertCoord,
    edp_group_name,
    ep_group_name,
    etp_group_name,
    expert_coords_of,
)
from simgrid.layout.mesh import Mesh, RankCoord
from simgrid.schedules.lower.optimizer import embed_group_name


def replaced(op: Op, **changes: object) -> Op:
    """A copy of ``op`` with some fields changed (a fast :func:`dataclasses.replace` for IR ops)."""
    # The op classes are frozen dataclasses without __slots__: copying the field dict is an exact,
    # several times faster equivalent of dataclasses.replace for these plain values.
    new = object.__new__(type(op))
    new.__dict__.update(op.__dict__)
    new.__dict__.update(changes)
    return new


def _object_array(items: list[Op]) -> np.ndarray:
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array


class RoleInstantiator:
    """Rebuilds the rank-specific ops of one role's template for each (dp, tp, cp) coordinate."""

    def __init__(self, mesh: Mesh, pp_rank: int, template: list[Op]) -> None:
        self.mesh = mesh
        self.pp_rank = pp_rank
        self.template = template
        self._canonical: tuple[Op, ...] | None = None
        self._prepared = False
        self._with_cp = mesh.layout.cp > 1
        self._tp_group_patches: dict[tuple[int, int], np.ndarray] = {}
        self._dp_group_patches: dict[int, np.ndarray] = {}
        self._cp_group_patches: dict[tuple[int, int], np.ndarray] = {}
        self._expert_patches: dict[str, np.ndarray] = {}

    def _coord(self, dp: int, tp: int, cp: int) -> RankCoord:
        return RankCoord(pp=self.pp_rank, dp=dp, tp=tp, cp=cp if self._with_cp else None)

    def _prepare(self) -> None:
        # Indexing the template costs a pass over it; symmetric simulation only ever asks for the
        # canonical rank, so this runs on the first replica asked for.
        template, mesh = self.template, self.mesh
        self._array = _object_array(template)
        canonical = self._coord(0, 0, 0)
        tp_name, dp_name = Mesh.tp_group_name(canonical), Mesh.dp_group_name(canonical)
        cp_name = Mesh.cp_group_name(canonical) if self._with_cp else None
        embed_name = embed_group_name(0, 0, canonical.cp)
        self._in_tp_group: list[int] = []  # differ by (dp, cp)
        self._in_dp_group: list[int] = []  # differ by tp
        self._in_cp_group: list[int] = []  # differ by (dp, tp)
        # MoE parallel folding: ep, etp and edp groups differ by the rank's expert coordinates.
        expert = ExpertCoord(pp=self.pp_rank, edp=0, ep=0, etp=0)
        expert_names = {ep_group_name(expert): ep_group_name, etp_group_name(expert): etp_group_name,
                        edp_group_name(expert): edp_group_name}
        self._in_expert_group: dict[str, list[int]] = {name: [] for name in expert_names}
        self._expert_namers = expert_names
        self._by_rank: list[int] = []
        for i, op in enumerate(template):
            kind = type(op)
            if kind is Collective:
                group = op.group  # type: ignore[union-attr]
                if group == tp_name:
                    self._in_tp_group.append(i)
                elif group == dp_name:
                    self._in_dp_group.append(i)
                elif group == cp_name:
                    self._in_cp_group.append(i)
                elif group == embed_name:
                    self._by_rank.append(i)
                elif group in self._in_expert_group:
                    self._in_expert_group[group].append(i)
            elif kind is Send or kind is Recv:
                self._by_rank.append(i)
        pp_of_rank = {mesh.rank(pp=q, dp=0, tp=0): q for q in range(mesh.layout.pp)}
        # (op, its fields, pipeline rank of its peer or -1 for an embedding collective)
        self._rank_specs = [
            (op, op.__dict__, pp_of_rank[op.peer] if isinstance(op, (Send, Recv)) else -1)
            for op in (template[i] for i in self._by_rank)
        ]
        self._prepared = True

    def _renamed(self, indices: list[int], name: str) -> np.ndarray:
        return _object_array([replaced(self.template[i], group=name) for i in indices])

    def _patch_tp_group(self, dp: int, cp: int) -> np.ndarray:
        found = self._tp_group_patches.get((dp, cp))
        if found is None:
            name = Mesh.tp_group_name(self._coord(dp, 0, cp))
            found = self._tp_group_patches[(dp, cp)] = self._renamed(self._in_tp_group, name)
        return found

    def _patch_cp_group(self, dp: int, tp: int) -> np.ndarray:
        found = self._cp_group_patches.get((dp, tp))
        if found is None:
            name = Mesh.cp_group_name(self._coord(dp, tp, 0))
            found = self._cp_group_patches[(dp, tp)] = self._renamed(self._in_cp_group, name)
        return found

    def _patch_dp_group(self, tp: int) -> np.ndarray:
        found = self._dp_group_patches.get(tp)
        if found is None:
            name = Mesh.dp_group_name(self._coord(0, tp, 0))
            root = self.mesh.rank(pp=self.pp_rank, dp=0, tp=tp)
            ops = []
            for i in self._in_dp_group:
                op = self.template[i]
                assert isinstance(op, Collective)  # _in_dp_group holds collectives only
                ops.append(replaced(op, group=name, root=None if op.root is None else root))
            found = self._dp_group_patches[tp] = _object_array(ops)
        return found

    def _patch_expert_group(self, canonical: str, coord: ExpertCoord) -> np.ndarray:
        name = self._expert_namers[canonical](coord)
        found = self._expert_patches.get(name)
        if found is None:
            found = self._expert_patches[name] = self._renamed(self._in_expert_group[canonical], name)
        return found

    def _patch_rank(self, dp: int, tp: int, cp: int) -> list[Op]:
        lay = self.mesh.layout
        # rank = tp + TP * (cp + CP * (dp + DP * pp)) (Mesh): a peer on pipeline rank q is base + stride * q.
        base, stride = tp + lay.tp * (cp + lay.cp * dp), lay.tp * lay.cp * lay.dp
        embed = embed_group_name(dp, tp, cp if self._with_cp else None)
        out: list[Op] = []
        append, new = out.append, object.__new__
        for op, fields, q in self._rank_specs:
            copy = new(type(op))
            values = copy.__dict__
            values.update(fields)
            if q < 0:
                values["group"] = embed
            else:
                values["peer"] = base + stride * q
            append(copy)
        return out

    def ops(self, dp: int, tp: int, cp: int = 0) -> tuple[Op, ...]:
        """The op list of the rank at ``(pp_rank, dp, tp, cp)``."""
        if dp == 0 and tp == 0 and cp == 0:
            if self._canonical is None:
                self._canonical = tuple(self.template)
            return self._canonical
        if not self._prepared:
            self._prepare()
        array = self._array.copy()
        if (dp or cp) and self._in_tp_group:
            array[self._in_tp_group] = self._patch_tp_group(dp, cp)
        if tp and self._in_dp_group:
            array[self._in_dp_group] = self._patch_dp_group(tp)
        if (dp or tp) and self._in_cp_group:
            array[self._in_cp_group] = self._patch_cp_group(dp, tp)
        if any(self._in_expert_group.values()):
            coord = expert_coords_of(self.mesh.layout, pp=self.pp_rank, dp=dp, tp=tp, cp=cp)
            for canonical, indices in self._in_expert_group.items():
                if indices:
                    array[indices] = self._patch_expert_group(canonical, coord)
        if self._by_rank:
            patch = np.empty(len(self._by_rank), dtype=object)
            patch[:] = self._patch_rank(dp, tp, cp)
            array[self._by_rank] = patch
        return tuple(array.tolist())


_StampSpec = tuple[type, tuple[tuple[str, object], ...], str, tuple[tuple[str, object], ...], "str | None", str]
"""(op class, the fields before the patched one, the patched field's name, the fields after it, and the
handle's text before and after the micro-batch; no text before: the patched field is ``Compute.microbatch``)."""


class MicrobatchTemplate:
    """The ops one compute op lowers to, built once and stamped for every other micro-batch.

    A pass whose output for a compute op depends on the micro-batch only through ``Compute.microbatch`` and
    the ``:m<microbatch>:`` part of its handles (as :mod:`.tp_overlap`'s chunk ops, collectives and waits do)
    builds the ops for the first micro-batch it meets and copies them for the others, patching those two
    fields, as :class:`RoleInstantiator` patches the rank-specific fields for ranks. :meth:`of` returns None
    when the ops do not have that form (a compute op of another micro-batch, a handle without exactly one
    ``:m<microbatch>:``): the caller then builds every micro-batch's ops itself.
    """

    def __init__(self, microbatch: int, specs: list[_StampSpec]) -> None:
        self.microbatch = microbatch
        self._specs = specs

    @classmethod
    def of(cls, ops: list[Op], microbatch: int) -> MicrobatchTemplate | None:
        """The template of ``ops`` (built for ``microbatch``), or None when they cannot be stamped."""
        token = f":m{microbatch}:"
        specs: list[_StampSpec] = []
        for op in ops:
            # Read through the dataclass fields, not op.__dict__, which would make the op keep a dict.
            fields = tuple((f.name, getattr(op, f.name)) for f in dataclasses.fields(op))
            if type(op) is Compute:
                if op.microbatch != microbatch:
                    return None
                key, prefix, suffix = "microbatch", None, ""
            else:
                handle = getattr(op, "handle", None)
                if not isinstance(handle, str) or handle.count(token) != 1:
                    return None
                cut = handle.index(token) + 2
                key, prefix, suffix = "handle", handle[:cut], handle[cut + len(str(microbatch)):]
            at = [name for name, _ in fields].index(key)
            specs.append((type(op), fields[:at], key, fields[at + 1:], prefix, suffix))
        return cls(microbatch, specs)

    def stamp(self, microbatch: int) -> list[Op]:
        """The ops for ``microbatch``: fresh copies of the template's with its micro-batch and handles."""
        # A copy without __init__ (these plain frozen dataclasses have no __post_init__), each field set by
        # object.__setattr__ in declaration order, as __init__ sets them: CPython then keeps the values inline
        # in the object. Filling op.__dict__ instead (as replaced() does) is faster here but makes a dict per
        # op: more memory, and the engine's attribute reads measurably slower (docs/performance.md).
        text, new, setattr_ = str(microbatch), object.__new__, object.__setattr__
        out: list[Op] = []
        append = out.append
        for kind, before, key, after, prefix, suffix in self._specs:
            op: Op = new(kind)
            for name, value in before:
                setattr_(op, name, value)
            setattr_(op, key, microbatch if prefix is None else prefix + text + suffix)
            for name, value in after:
                setattr_(op, name, value)
            append(op)
        return out
