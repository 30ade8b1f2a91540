"""Global rank <-> (pp, dp, tp) coordinates and process-group membership.

Order: tp fastest, then dp, then pp (Megatron-LM's default), so a tensor-parallel group is a run of
consecutive ranks and sits inside one node whenever tp <= GPUs per node.
``rank = tp_rank + tp * (dp_rank + dp * pp_rank)``.
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
        tp, rest = rank % self.layout.tp, rank // self.layout.tp
        dp, pp = rest % self.layout.dp, rest // self.layout.dp
        return RankCoord(pp=pp, dp=dp, tp=tp)

    def rank(self, *, pp: int, dp: int, tp: int) -> int:
        """Global rank at mesh coordinates."""
        lay = self.layout
        if not (0 <= pp < lay.pp and 0 <= dp < lay.dp and 0 <= tp < lay.tp):
            raise LayoutError(f"coordinates pp={pp}, dp={dp}, tp={tp} are outside the mesh {lay.pp}x{lay.dp}x{lay.tp}")
        return tp + lay.tp * (dp + lay.dp * pp)

    def tp_group(self, rank: int) -> tuple[int, ...]:
        """Ranks sharing this rank's pipeline stage and replica (its tensor-parallel group)."""
        c = self.coords(rank)
        return tuple(self.rank(pp=c.pp, dp=c.dp, tp=t) for t in range(self.layout.tp))

    def dp_group(self, rank: int) -> tuple[int, ...]:
        """Ranks holding the same parameter shard in other replicas (its data-parallel group)."""
        c = self.coords(rank)
        return tuple(self.rank(pp=c.pp, dp=d, tp=c.tp) for d in range(self.layout.dp))

    def pp_group(self, rank: int) -> tuple[int, ...]:
        """Ranks forming this rank's pipeline, in stage order."""
        c = self.coords(rank)
        return tuple(self.rank(pp=p, dp=c.dp, tp=c.tp) for p in range(self.layout.pp))

    @staticmethod
    def tp_group_name(c: RankCoord) -> str:
        """Name of the tensor-parallel group containing coordinates ``c``."""
        return f"tp/pp{c.pp}-dp{c.dp}"

    @staticmethod
    def dp_group_name(c: RankCoord) -> str:
        """Name of the data-parallel group containing coordinates ``c``."""
        return f"dp/pp{c.pp}-tp{c.tp}"

    @staticmethod
    def pp_group_name(c: RankCoord) -> str:
        """Name of the pipeline group containing coordinates ``c``."""
        return f"pp/dp{c.dp}-tp{c.tp}"

    def groups(self) -> dict[str, tuple[int, ...]]:
        """Every named process group: ``world``, and each tp, dp and pp group (sorted by name)."""
        out: dict[str, tuple[int, ...]] = {"world": tuple(range(self.world_size))}
        for r in range(self.world_size):
            c = self.coords(r)
            # Each group is built once, by its first member: O(world) rather than O(world x group size).
            if c.tp == 0:
                out[self.tp_group_name(c)] = self.tp_group(r)
            if c.dp == 0:
                out[self.dp_group_name(c)] = self.dp_group(r)
            if c.pp == 0:
                out[self.pp_group_name(c)] = self.pp_group(r)
        return dict(sorted(out.items()))
