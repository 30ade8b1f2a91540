"""Expert-parallel rank groups under MoE parallel folding (Megatron-Core).

Attention and dense MLPs lay the ranks of one pipeline stage out as ``tp x cp x dp`` (:mod:`.mesh`); the
MoE layers lay the *same* ranks out again as ``etp x ep x edp`` with the same pipeline (Liu et al. 2025,
"MoE Parallel Folding", arXiv:2504.14960, section 3; Megatron-Core's second ``RankGenerator`` with order
``tp-ep-dp-pp`` for experts). With ``j = rank mod (tp * cp * dp)`` the rank's index inside its stage,

    j = etp_rank + etp * (ep_rank + ep * edp_rank)

so an expert tensor-parallel group is a run of consecutive ranks (inside a node like a TP group), an
expert-parallel group strides by ``etp`` and the expert data-parallel group by ``etp * ep``. Groups:

* ``ep/pp{p}-edp{e}-etp{t}``: the ranks that all-to-all tokens to one another's experts;
* ``etp/pp{p}-edp{e}-ep{k}``: the ranks splitting the same experts' MLPs (all-gather / reduce-scatter of
  the routed tokens around the experts);
* ``edp/pp{p}-ep{k}-etp{t}``: the ranks holding the same expert shard (expert gradient sync and ZeRO).

A program for a MoE model has these groups besides the mesh's (:func:`expert_groups`).
"""

from __future__ import annotations

from dataclasses import dataclass

from simgrid.errors import LayoutError
from simgrid.layout.spec import Layout


@dataclass(frozen=True, kw_only=True)
class ExpertCoord:
    """Position of one rank in the expert mesh of its pipeline stage."""

    pp: int
    """Pipeline rank."""
    edp: int
    """Expert data-parallel index (which copy of the expert shard)."""
    ep: int
    """Expert-parallel index (which experts: ``num_experts / ep`` of them)."""
    etp: int
    """Expert tensor-parallel index (which slice of each expert's MLP)."""


def stage_ranks(layout: Layout) -> int:
    """Ranks of one pipeline stage: ``tp * cp * dp`` (= ``etp * ep * edp``)."""
    return layout.tp * layout.cp * layout.dp


def expert_coords(layout: Layout, rank: int) -> ExpertCoord:
    """Expert-mesh coordinates of a global rank (module docstring)."""
    if not 0 <= rank < layout.world_size:
        raise LayoutError(f"rank {rank} is outside the world of {layout.world_size} ranks")
    pp, j = divmod(rank, stage_ranks(layout))
    etp, rest = j % layout.expert_tp, j // layout.expert_tp
    ep, edp = rest % layout.ep, rest // layout.ep
    return ExpertCoord(pp=pp, edp=edp, ep=ep, etp=etp)


def expert_coords_of(layout: Layout, *, pp: int, dp: int, tp: int, cp: int = 0) -> ExpertCoord:
    """Expert-mesh coordinates of the rank at attention-mesh coordinates ``(pp, dp, cp, tp)``."""
    return expert_coords(layout, tp + layout.tp * (cp + layout.cp * (dp + layout.dp * pp)))


def expert_rank(layout: Layout, c: ExpertCoord) -> int:
    """Global rank at expert-mesh coordinates."""
    return stage_ranks(layout) * c.pp + c.etp + layout.expert_tp * (c.ep + layout.ep * c.edp)


def ep_group_name(c: ExpertCoord) -> str:
    """Name of the expert-parallel (all-to-all) group containing ``c``."""
    return f"ep/pp{c.pp}-edp{c.edp}-etp{c.etp}"


def etp_group_name(c: ExpertCoord) -> str:
    """Name of the expert tensor-parallel group containing ``c``."""
    return f"etp/pp{c.pp}-edp{c.edp}-ep{c.ep}"


def edp_group_name(c: ExpertCoord) -> str:
    """Name of the expert data-parallel (expert gradient sync) group containing ``c``."""
    return f"edp/pp{c.pp}-ep{c.ep}-etp{c.etp}"


def expert_groups(layout: Layout) -> dict[str, tuple[int, ...]]:
    """Every ep, etp and edp group of the layout (each built once, from its lowest member)."""
    out: dict[str, tuple[int, ...]] = {}
    etp, ep, edp = layout.expert_tp, layout.ep, layout.edp
    for p in range(layout.pp):
        for e in range(edp):
            for t in range(etp):
                c = ExpertCoord(pp=p, edp=e, ep=0, etp=t)
                out[ep_group_name(c)] = tuple(expert_rank(layout, ExpertCoord(pp=p, edp=e, ep=k, etp=t))
                                              for k in range(ep))
            for k in range(ep):
                c = ExpertCoord(pp=p, edp=e, ep=k, etp=0)
                out[etp_group_name(c)] = tuple(expert_rank(layout, ExpertCoord(pp=p, edp=e, ep=k, etp=t))
                                               for t in range(etp))
        for k in range(ep):
            for t in range(etp):
                c = ExpertCoord(pp=p, edp=0, ep=k, etp=t)
                out[edp_group_name(c)] = tuple(expert_rank(layout, ExpertCoord(pp=p, edp=e, ep=k, etp=t))
                                               for e in range(edp))
    return out
