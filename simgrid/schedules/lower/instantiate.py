"""Turn a role's op list (written for the canonical ``dp = 0, tp = 0`` rank) into every rank's op list.

Ranks of one pipeline rank issue the same ops; they differ only in the names of their tensor-parallel,
data-parallel and embedding groups, the roots of rooted collectives (the data-parallel group's first
rank) and their pipeline peers. Only those ops are rebuilt; every other op value is shared between the
ranks, and collectives are rebuilt once per distinct group (once per tensor-parallel group, not per
rank). The per-rank lists are patched copies of the template made with numpy fancy indexing.
:func:`simgrid.schedules.build_program` asks for a rank's list only when something reads it (a
:class:`~simgrid.ir.program.LazyRanks`), and the template is indexed on the first replica asked for, so
a symmetric simulation touches the ``pp`` canonical lists only.
"""

from __future__ import annotations

import numpy as np

from simgrid.ir.ops import Collective, Op, Recv, Send
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
    """Rebuilds the rank-specific ops of one role's template for each (dp, tp) coordinate."""

    def __init__(self, mesh: Mesh, pp_rank: int, template: list[Op]) -> None:
        self.mesh = mesh
        self.pp_rank = pp_rank
        self.template = template
        self._canonical: tuple[Op, ...] | None = None
        self._prepared = False
        self._dp_patches: dict[int, np.ndarray] = {}
        self._tp_patches: dict[int, np.ndarray] = {}

    def _prepare(self) -> None:
        # Indexing the template costs a pass over it; symmetric simulation only ever asks for the
        # canonical rank, so this runs on the first replica asked for.
        template, mesh, pp_rank = self.template, self.mesh, self.pp_rank
        self._array = _object_array(template)
        canonical = RankCoord(pp=pp_rank, dp=0, tp=0)
        tp_name, dp_name, embed_name = Mesh.tp_group_name(canonical), Mesh.dp_group_name(canonical), embed_group_name(0, 0)
        self._by_dp: list[int] = []
        self._by_tp: list[int] = []
        self._by_rank: list[int] = []
        for i, op in enumerate(template):
            kind = type(op)
            if kind is Collective:
                group = op.group  # type: ignore[union-attr]
                if group == tp_name:
                    self._by_dp.append(i)
                elif group == dp_name:
                    self._by_tp.append(i)
                elif group == embed_name:
                    self._by_rank.append(i)
            elif kind is Send or kind is Recv:
                self._by_rank.append(i)
        pp_of_rank = {mesh.rank(pp=q, dp=0, tp=0): q for q in range(mesh.layout.pp)}
        # (op, its fields, pipeline rank of its peer or -1 for an embedding collective)
        self._rank_specs = [
            (op, op.__dict__, pp_of_rank[op.peer] if isinstance(op, (Send, Recv)) else -1)
            for op in (template[i] for i in self._by_rank)
        ]
        self._prepared = True

    def _patch_dp(self, dp: int) -> np.ndarray:
        found = self._dp_patches.get(dp)
        if found is None:
            name = Mesh.tp_group_name(RankCoord(pp=self.pp_rank, dp=dp, tp=0))
            found = _object_array([replaced(self.template[i], group=name) for i in self._by_dp])
            self._dp_patches[dp] = found
        return found

    def _patch_tp(self, tp: int) -> np.ndarray:
        found = self._tp_patches.get(tp)
        if found is None:
            name = Mesh.dp_group_name(RankCoord(pp=self.pp_rank, dp=0, tp=tp))
            root = self.mesh.rank(pp=self.pp_rank, dp=0, tp=tp)
            ops = []
            for i in self._by_tp:
                op = self.template[i]
                assert isinstance(op, Collective)  # _by_tp holds collectives only
                ops.append(replaced(op, group=name, root=None if op.root is None else root))
            found = self._tp_patches[tp] = _object_array(ops)
        return found

    def _patch_rank(self, dp: int, tp: int) -> list[Op]:
        lay = self.mesh.layout
        # rank = tp + TP * (dp + DP * pp) (Mesh): a peer on pipeline rank q is base + stride * q.
        base, stride = tp + lay.tp * dp, lay.tp * lay.dp
        embed = embed_group_name(dp, tp)
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

    def ops(self, dp: int, tp: int) -> tuple[Op, ...]:
        """The op list of the rank at ``(pp_rank, dp, tp)``."""
        if dp == 0 and tp == 0:
            if self._canonical is None:
                self._canonical = tuple(self.template)
            return self._canonical
        if not self._prepared:
            self._prepare()
        array = self._array.copy()
        if dp and self._by_dp:
            array[self._by_dp] = self._patch_dp(dp)
        if tp and self._by_tp:
            array[self._by_tp] = self._patch_tp(tp)
        if self._by_rank:
            patch = np.empty(len(self._by_rank), dtype=object)
            patch[:] = self._patch_rank(dp, tp)
            array[self._by_rank] = patch
        return tuple(array.tolist())
