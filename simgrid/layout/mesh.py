"""Global rank <-> (pp, dp, cp, tp) coordinates and process-group membership.

Order: tp fastest, then cp, then dp, then pp (Megatron-LM's ``tp-cp-ep-dp-pp`` default), so a
tensor-parallel group is a run of consecutive ranks and sits inside one node whenever tp <= GPUs per node,
and a context-parallel group comes next. ``rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))``.

Groups: tp (same pp, dp, cp), cp (same pp, dp, tp), pp (same dp, cp, tp) and the data-parallel group,
which spans dp *and* cp (same pp, tp): context-parallel ranks hold the same parameters, so gradients are
summed and ZeRO shards over both (Megatron-LM's data-parallel-with-context-parallel group). Without context
parallelism (cp = 1) the names carry no cp part, so programs of cp = 1 layouts are unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from simgrid.errors import LayoutError
from simgrid.layout.spec import Layout


@dataclass(frozen=True, kw_only=True)
class RankCoord:
    """Position of one rank in the 3-D mesh."""

    pp: int
    """Pipeline rank (which stage group of layers)."""
    dp: int
    """Data-parallel replica index."""
    tp: int
    """Tensor-parallel shard index."""
    cp: int | None = None
    """Context-parallel index (which part of every sequence); ``None`` when the layout has no context
    parallelism (cp = 1), which also keeps the cp part out of group names."""


@dataclass(frozen=True)
class Mesh:
    """The rank mesh of a layout."""

    layout: Layout

    @property
    def world_size(self) -> int:
        """Number of ranks."""
        return self.layout.world_size

    def coords(self, rank: int) -> RankCoord:
        """Mesh coordinates of a global rank."""
        if not 0 <= rank < self.world_size:
            raise LayoutError(f"rank {rank} is outside the world of {self.world_size} ranks")
        lay = self.layout
        tp, rest = rank % lay.tp, rank // lay.tp
        cp, rest = rest % lay.cp, rest // lay.cp
        dp, pp = rest % lay.dp, rest // lay.dp
        return RankCoord(pp=pp, dp=dp, tp=tp, cp=cp if lay.cp > 1 else None)

    def rank(self, *, pp: int, dp: int, tp: int, cp: int | None = None) -> int:
        """Global rank at mesh coordinates (``cp=None`` is context-parallel index 0)."""
        lay = self.layout
        cp = cp or 0
        if not (0 <= pp < lay.pp and 0 <= dp < lay.dp and 0 <= tp < lay.tp and 0 <= cp < lay.cp):
            raise LayoutError(
                f"coordinates pp={pp}, dp={dp}, cp={cp}, tp={tp} are outside the mesh "
                f"{lay.pp}x{lay.dp}x{lay.cp}x{lay.tp}"
            )
        return tp + lay.tp * (cp + lay.cp * (dp + lay.dp * pp))

    def tp_group(self, rank: int) -> tuple[int, ...]:
        """Ranks sharing this rank's pipeline stage, replica and sequence part (its tensor-parallel group)."""
        c = self.coords(rank)
        return tuple(self.rank(pp=c.pp, dp=c.dp, cp=c.cp, tp=t) for t in range(self.layout.tp))

    def cp_group(self, rank: int) -> tuple[int, ...]:
        """Ranks holding the other parts of this rank's sequences (its context-parallel group)."""
        c = self.coords(rank)
        return tuple(self.rank(pp=c.pp, dp=c.dp, cp=k, tp=c.tp) for k in range(self.layout.cp))

    def dp_group(self, rank: int) -> tuple[int, ...]:
        """Ranks holding the same parameter shard: other replicas and other sequence parts (the gradient-sync
        and ZeRO group, ``dp * cp`` ranks)."""
        c = self.coords(rank)
        return tuple(self.rank(pp=c.pp, dp=d, cp=k, tp=c.tp) for d in range(self.layout.dp)
                     for k in range(self.layout.cp))

    def pp_group(self, rank: int) -> tuple[int, ...]:
        """Ranks forming this rank's pipeline, in stage order."""
        c = self.coords(rank)
        return tuple(self.rank(pp=p, dp=c.dp, cp=c.cp, tp=c.tp) for p in range(self.layout.pp))

    @staticmethod
    def tp_group_name(c: RankCoord) -> str:
        """Name of the tensor-parallel group containing coordinates ``c``."""
        return f"tp/pp{c.pp}-dp{c.dp}" + _cp_part(c)

    @staticmethod
    def cp_group_name(c: RankCoord) -> str:
        """Name of the context-parallel group containing coordinates ``c``."""
        return f"cp/pp{c.pp}-dp{c.dp}-tp{c.tp}"

    @staticmethod
    def dp_group_name(c: RankCoord) -> str:
        """Name of the data-parallel group containing coordinates ``c``."""
        return f"dp/pp{c.pp}-tp{c.tp}"

    @staticmethod
    def pp_group_name(c: RankCoord) -> str:
        """Name of the pipeline group containing coordinates ``c``."""
        return f"pp/dp{c.dp}-tp{c.tp}" + _cp_part(c)

    def groups(self) -> dict[str, tuple[int, ...]]:
        """Every named process group: ``world``, and each tp, dp, pp (and cp) group (sorted by name)."""
        out: dict[str, tuple[int, ...]] = {"world": tuple(range(self.world_size))}
        for r in range(self.world_size):
            c = self.coords(r)
            # Each group is built once, by its first member: O(world) rather than O(world x group size).
            if c.tp == 0:
                out[self.tp_group_name(c)] = self.tp_group(r)
            if c.dp == 0 and not c.cp:
                out[self.dp_group_name(c)] = self.dp_group(r)
            if c.pp == 0:
                out[self.pp_group_name(c)] = self.pp_group(r)
            if c.cp == 0:
                out[self.cp_group_name(c)] = self.cp_group(r)
        return dict(sorted(out.items()))


def _cp_part(c: RankCoord) -> str:
    return f"-cp{c.cp}" if c.cp is not None else ""
