"""Shared state of the lowering passes: the model, the layout, cached costs and the step structure.

The passes build the op list of one *pipeline rank* at a time (its "role"), written for the canonical
coordinates ``dp = 0, tp = 0``: every other rank of that pipeline rank issues the same ops with its own
group names and peers, which :mod:`simgrid.schedules.lower.instantiate` substitutes at the end. This
keeps a 1024-rank program as cheap to build as ``pp`` op lists.

A role is a list of :class:`Step` values: one per pipeline action (the ops of one forward or backward
pass of one stage on one micro-batch, plus the communication placed around it), with a prologue and an
epilogue step (``action is None``) for per-step work such as allocating model states and the optimizer.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal

from simgrid.errors import ScheduleError
from simgrid.ir.ops import Op
from simgrid.ir.torch_csv import Action
from simgrid.layout.experts import ExpertCoord
from simgrid.layout.mesh import Mesh, RankCoord
from simgrid.layout.spec import Layout
from simgrid.model.spec import ModelSpec
from simgrid.schedules.buckets import Bucket, grad_buckets
from simgrid.schedules.lower.p2p_megatron import megatron_actions
from simgrid.schedules.pipeline import (
    PipelineOrder,
    flatten_order,
    pipeline_order,
    rank_stages,
    stage_chunk,
    stage_to_rank,
)

if TYPE_CHECKING:
    from simgrid.memory.states import ModelStates
    from simgrid.model import BlockCost

Granularity = Literal["block", "stage"]
GRANULARITIES: tuple[str, ...] = ("block", "stage")


@dataclass
class Step:
    """The ops of one pipeline action (or of the prologue / epilogue when ``action`` is None)."""

    action: Action | None
    """The pipeline action these ops perform, or None for per-step work."""
    ops: list[Op] = field(default_factory=list)
    """Ops in issue order."""


Role = list[Step]
"""The steps of one pipeline rank: prologue, one per action, epilogue."""


@dataclass
class LoweringContext:
    """Everything the passes need to know about (model, layout), with costs cached per block."""

    model: ModelSpec
    layout: Layout
    granularity: Granularity = "block"
    imported_order: PipelineOrder | None = None
    """A compute order to lower instead of the layout schedule's own (e.g. from a torch CSV); it must
    place stages as the layout does (:func:`simgrid.schedules.imported.check_order`)."""

    def __post_init__(self) -> None:
        if self.granularity not in GRANULARITIES:
            raise ScheduleError(
                f"granularity = {self.granularity!r} is not one of {', '.join(GRANULARITIES)}; use 'block' "
                "for one compute op per sub-block or 'stage' for one per pipeline stage"
            )
        self._costs: dict[int, BlockCost] = {}
        self._states: dict[int, ModelStates] = {}
        self._full_activation: dict[int, int] = {}
        self._buckets: dict[tuple[int, bool], list[Bucket]] = {}
        self._blocks: dict[int, range] = {}
        self._units: dict[int, tuple[tuple[int, int], ...]] = {}
        self.memo: dict[str, dict[Any, Any]] = defaultdict(dict)
        """Per-pass memo tables (values that repeat for every micro-batch), keyed by pass name."""

    # -- layout shorthands -----------------------------------------------------------------------
    @property
    def schedule(self) -> str:
        """The pipeline schedule name (``Layout`` fills in the default)."""
        return str(self.layout.schedule)

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per step."""
        return self.layout.num_microbatches

    @cached_property
    def mesh(self) -> Mesh:
        """Rank mesh of the layout."""
        return Mesh(self.layout)

    @cached_property
    def order(self) -> PipelineOrder:
        """Compute-only pipeline order, per pipeline rank."""
        lay = self.layout
        order = self.imported_order
        if order is None and lay.p2p_order != "witness" and lay.schedule == "interleaved-1f1b":  # Megatron's own
            # interleaved order (it differs from torch's when m = pp)
            order = megatron_actions(lay.pp, lay.vpp, self.num_microbatches)
        if order is None:
            order = pipeline_order(self.schedule, lay.pp, self.num_microbatches, lay.vpp)
        # OVERLAP_F_B units run their two computations back to back (torch's runtime default), each its own step.
        return flatten_order(order)

    def coord(self, pp_rank: int) -> RankCoord:
        """Canonical coordinates of a role: the ``dp = 0, tp = 0`` (and ``cp = 0``) rank of the pipeline rank."""
        return RankCoord(pp=pp_rank, dp=0, tp=0, cp=0 if self.layout.cp > 1 else None)

    def expert_coord(self, pp_rank: int) -> ExpertCoord:
        """Expert-mesh coordinates of a role's canonical rank (index 0 of its stage: every expert index 0)."""
        return ExpertCoord(pp=pp_rank, edp=0, ep=0, etp=0)

    def canonical_rank(self, pp_rank: int) -> int:
        """Global rank of a role's canonical coordinates."""
        return self.mesh.rank(pp=pp_rank, dp=0, tp=0)

    def stage_rank(self, stage: int) -> int:
        """Pipeline rank running a global stage."""
        return stage_to_rank(stage, self.layout.pp, self.layout.vpp, self.schedule)

    def stages_of(self, pp_rank: int) -> tuple[int, ...]:
        """Global stages held by a pipeline rank, by local chunk."""
        return rank_stages(pp_rank, self.layout.pp, self.layout.vpp, self.schedule)

    def chunk_of(self, stage: int) -> int:
        """Local chunk index of a global stage."""
        return stage_chunk(stage, self.layout.pp)

    # -- costs -------------------------------------------------------------------------------------
    def blocks(self, stage: int) -> range:
        """Sub-blocks of a global stage (cached: asked once per action, 10^5 times for pp 64)."""
        found = self._blocks.get(stage)
        if found is None:
            from simgrid.model import stage_blocks

            found = self._blocks[stage] = stage_blocks(self.model, self.layout, stage)
        return found

    def cost(self, block: int) -> BlockCost:
        """Per-tp-rank cost of one sub-block for one micro-batch (cached)."""
        found = self._costs.get(block)
        if found is None:
            from simgrid.model import block_cost

            found = self._costs[block] = block_cost(self.model, self.layout, block)
        return found

    def states(self, block: int) -> ModelStates:
        """Per-rank weights, gradients and optimizer bytes of one sub-block (ZeRO sharding applied)."""
        found = self._states.get(block)
        if found is None:
            from simgrid.memory.states import block_state_bytes

            found = self._states[block] = block_state_bytes(self.model, self.layout, block)
        return found

    def full_activation_bytes(self, block: int) -> int:
        """Activation bytes a block holds with recompute off (what a recompute pass rebuilds)."""
        found = self._full_activation.get(block)
        if found is None:
            from simgrid.model import block_cost

            plain = dataclasses.replace(self.layout, recompute="none")
            found = self._full_activation[block] = int(block_cost(self.model, plain, block).activation_bytes)
        return found

    def buckets(self, stage: int, *, experts: bool = False) -> list[Bucket]:
        """Gradient buckets of a global stage (the executor's :func:`grad_buckets`, cached); ``experts``: the
        routed experts' buckets, synced over the expert data-parallel group."""
        found = self._buckets.get((stage, experts))
        if found is None:
            found = self._buckets[(stage, experts)] = grad_buckets(self.model, self.layout, stage, experts=experts)
        return found

    @cached_property
    def p2p_bytes(self) -> int:
        """Bytes of one pipeline activation or gradient transfer."""
        from simgrid.model import p2p_bytes

        return int(p2p_bytes(self.model, self.layout))

    def units(self, stage: int) -> tuple[tuple[int, int], ...]:
        """Compute units of a stage as ``[block_start, block_end)`` pairs in forward order (cached)."""
        found = self._units.get(stage)
        if found is None:
            blocks = self.blocks(stage)
            whole = self.granularity == "stage"
            found = self._units[stage] = ((blocks.start, blocks.stop),) if whole else tuple((b, b + 1) for b in blocks)
            if whole and self.layout.zero == 3 and self.layout.grad_sync_size > 1:
                found = self._units[stage] = self._zero3_units(blocks)
        return found

    def _zero3_units(self, blocks: range) -> tuple[tuple[int, int], ...]:
        """At stage granularity ZeRO-3 still computes per gather unit (its overlap is per unit): one op
        per FSDP2 layer or per sub-block for DeepSpeed (simgrid.schedules.lower.zero3)."""
        from simgrid.model.zero3_units import fsdp2_unit

        units: list[tuple[int, int]] = []
        for b in blocks:
            if units and self.layout.zero_impl == "fsdp2" and fsdp2_unit(self.model, b) == fsdp2_unit(self.model, units[-1][0]) \
                    and units[-1][1] == b:
                units[-1] = (units[-1][0], b + 1)  # the MLP joins its layer's attention
            else:
                units.append((b, b + 1))
        return tuple(units)

