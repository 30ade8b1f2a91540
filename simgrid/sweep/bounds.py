"""Admissible lower bounds on a layout's step time, cheap enough to compute for every layout of a search.

A branch-and-bound search simulates layouts in increasing order of their bound and skips every layout
whose bound exceeds the K-th best step time simulated so far: such a layout cannot enter the best K.
That is safe only if the bound never exceeds the simulated step time, which follows from the IR's
semantics (docs/design.md, "IR semantics") and the lowering passes:

* A rank runs its pipeline actions in order (one step of ops per action). Each compute op takes at least
  its nominal duration (the engine only ever slows compute, by ``comm_compute_slowdown`` while
  communication runs). Megatron's tensor- and context-parallel collectives and the MoE dispatcher's
  all-to-alls are issued and waited at once around their compute op (:mod:`simgrid.schedules.lower.tensor_parallel`,
  :mod:`simgrid.schedules.lower.moe`), so the walk cannot pass their WAIT before post time + duration:
  they add serially (only a collective followed at once by its WAIT is counted). Together: an action's ops take at least
  ``eff`` = compute durations + those collectives' durations. With ``tp_comm_overlap`` the actions are lowered
  by :mod:`simgrid.schedules.lower.tp_overlap` instead: its GEMM chunks are compute ops (each at least its
  nominal time) and its ring steps and pipelined reduce-scatters run beside them (not waited at once, so
  not counted); only what it leaves exposed, waited at once, adds serially.
* The receive that feeds an action is waited before its first op, and the matching send is posted after
  the producing action's last op (:mod:`simgrid.schedules.lower.p2p`), so the consumer starts at least
  one point-to-point duration after the producer ends (0 for stages on the same rank).
* Everything else (ZeRO gathers, gradient sync, optimizer, memory ops) only adds time, and is left out; with
  ``overlap_param_gather`` the ZeRO-1 gathers move into the forward as WAITs before their first use, which
  also only add time.

So the relaxed graph "actions in rank order, producer -> consumer edges weighted by the transfer time,
nodes weighted by ``eff``" has a longest path no longer than the simulated step. :meth:`BoundModel.dag`
computes it (one pass over the actions); :meth:`BoundModel.quick` takes two of its paths per pipeline
rank (the forward chain to the rank's first action plus all its work; its work up to its last backward
plus the gradient chain down to stage 0) at a cost independent of the micro-batch count.

Every duration comes from the engine's own cost model, through the same lowering functions the program
builder calls; nothing here is a cost formula. Costs are shared between layouts that differ only in
``dp``, ``zero`` and the global batch (the degrees no per-block cost reads): ``tests/sweep/test_bounds.py``
checks the bound against the simulated step time, and the shared tables against fresh ones, over
hundreds of layouts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from simgrid.engine.costmodel import CostModel, DurationCache
from simgrid.errors import ScheduleError
from simgrid.ir.ops import Collective, Compute, Wait
from simgrid.ir.torch_csv import Action
from simgrid.layout.experts import ExpertCoord, expert_coords, expert_rank
from simgrid.layout.mesh import Mesh
from simgrid.layout.spec import Layout
from simgrid.model.spec import ModelSpec
from simgrid.schedules.build import add_model_parallel_comm
from simgrid.schedules.lower.compute import action_compute_ops, add_recompute
from simgrid.schedules.lower.context import LoweringContext, Step
from simgrid.schedules.pipeline import flatten_order, pipeline_order

COST_FREE_FIELDS = ("dp", "pp", "vpp", "zero", "global_batch_size", "schedule", "overlap_param_gather")
"""Layout fields no per-block cost (:func:`simgrid.model.block_cost`) reads, beyond whether ``pp > 1`` (the
tied head's duplicate): layouts equal in every other field share their block costs and action costs."""

_BACKWARD = ("B", "I")
_KINDS = ("F", "B", "I", "W")


def cost_class(layout: Layout) -> tuple[Any, ...]:
    """The layout without :data:`COST_FREE_FIELDS` (any field added later is kept: the safe side)."""
    return (layout.pp > 1, *((f.name, getattr(layout, f.name)) for f in dataclasses.fields(layout)
                             if f.name not in COST_FREE_FIELDS))


class _SharedContext(LoweringContext):
    """A lowering context whose block costs and per-block memo tables are those of its cost class.

    Only the tables keyed by block range (``compute`` and ``block-collective-folds``, read by the passes
    this module runs) are shared; every other memo table stays private to the layout."""

    _SHARED_MEMOS = ("compute", "block-collective-folds")

    def __init__(self, model: ModelSpec, layout: Layout, granularity: str, tables: dict[str, Any]) -> None:
        super().__init__(model=model, layout=layout, granularity=granularity)  # type: ignore[arg-type]
        self._costs = tables.setdefault("block-costs", {})
        for name in self._SHARED_MEMOS:
            self.memo[name] = tables.setdefault(name, {})


@dataclass
class _Action:
    """What one (stage, kind) action costs on its pipeline rank, independent of ``dp``."""

    compute_s: float
    """Nominal seconds of its compute ops (recompute included)."""
    collectives: list[Collective]
    """Collectives issued and waited at once around them (their group named for some pipeline rank)."""


@dataclass
class _Shape:
    """Stages of one (cost class, pp, vpp, schedule): their ranks and actions."""

    stage_rank: list[int]
    """Pipeline rank of each global stage."""
    actions: list[dict[str, _Action]]
    """Per stage, its action of each kind (F, B, I, W)."""
    p2p_bytes: int
    """Bytes of one pipeline transfer."""
    kinds: list[frozenset[str]]
    """Per stage, the action kinds the schedule runs there (F with B, or F with I and W)."""


@dataclass
class _Order:
    """A pipeline order as the relaxed dependency graph :meth:`BoundModel.dag` walks."""

    num_ranks: int
    keys: list[tuple[int, str]] = field(default_factory=list)
    """The distinct (stage, kind) of the order; ``topo`` refers to them by index."""
    topo: list[tuple[int, int, int, int, int, int]] = field(default_factory=list)
    """Every action as (rank, key index, cross-stage dep, same-stage dep, dep stage, own stage), dependencies
    first; deps are indices into ``topo`` or -1."""


class BoundModel:
    """Lower bounds on the step time of layouts of one model on one cluster."""

    def __init__(self, model: ModelSpec, cluster: Any, *, granularity: str = "stage",
                 cost_model: Callable[[str, str], CostModel]) -> None:
        self.model = model
        self.cluster = cluster
        self.granularity = granularity
        self._cost_model = cost_model
        self._tables: dict[tuple[Any, ...], dict[str, Any]] = {}
        self._actions: dict[tuple[Any, ...], dict[str, _Action]] = {}
        self._kinds: dict[tuple[int, int, str], list[frozenset[str]]] = {}
        self._splits: dict[tuple[Any, ...], tuple[list[tuple[tuple[int, int], ...]], list[int]]] = {}
        self._shapes: dict[tuple[Any, ...], _Shape] = {}
        self._orders: dict[tuple[str, int, int, int], _Order] = {}
        self._eff: dict[tuple[int, int], dict[str, float]] = {}
        self._p2p: dict[tuple[int, int, int], float] = {}

    # -- public ------------------------------------------------------------------------------------
    def quick(self, layout: Layout) -> float:
        """A bound from two dependency chains per pipeline rank, without the pipeline order.

        Every schedule runs each micro-batch's forward and backward (B, or I then W) on every stage once,
        and a rank's first action is a forward and its last backward follows all its forwards. So a rank
        cannot start before the forward chain has reached its lowest stage, runs all its actions, and
        after its last backward (preceded by all its work but possibly W's) the gradient still has to
        travel down to stage 0. Where the schedule could use either backward form the cheaper is taken.
        """
        shape = self._shape(layout)
        eff, hop = self._durations(layout, shape)
        m = layout.num_microbatches
        stages = len(shape.stage_rank)
        # Per stage, one micro-batch's backward (all its backward actions) and the action producing the
        # input gradient; min over the forms the schedule uses there (B alone, or I then W).
        backward, grad = [], []
        for s in range(stages):
            kinds, e = shape.kinds[s], eff[s]
            forms = ([(e["B"], e["B"])] if "B" in kinds else []) + ([(e["I"] + e["W"], e["I"])] if "I" in kinds else [])
            backward.append(min(f[0] for f in forms))
            grad.append(min(f[1] for f in forms))
        forward_chain = [0.0] * stages  # forward_chain[s]: earliest start of stage s's first forward
        for s in range(1, stages):
            forward_chain[s] = forward_chain[s - 1] + eff[s - 1]["F"] + hop(s - 1, s)
        grad_chain = [0.0] * stages  # grad_chain[s]: time from stage s's gradient to stage 0's
        for s in range(1, stages):
            grad_chain[s] = grad_chain[s - 1] + hop(s, s - 1) + grad[s - 1]
        own: dict[int, list[int]] = {}
        for s, rank in enumerate(shape.stage_rank):
            own.setdefault(rank, []).append(s)
        best = 0.0
        for mine in own.values():
            low = min(mine)
            work = m * sum(eff[s]["F"] + backward[s] for s in mine)
            before_last_grad = m * sum(eff[s]["F"] + grad[s] for s in mine)
            best = max(best, forward_chain[low] + work, forward_chain[low] + before_last_grad + grad_chain[low])
        return best

    def dag(self, layout: Layout) -> float:
        """The longest path of the relaxed action graph of the layout's pipeline order (one pass over its
        actions; at least :meth:`quick`)."""
        shape = self._shape(layout)
        order = self._order(layout)
        eff, hop = self._durations(layout, shape)
        weight = [eff[stage][kind] for stage, kind in order.keys]
        hops: dict[tuple[int, int], float] = {}
        clock = [0.0] * order.num_ranks
        finish: list[float] = []
        for rank, index, cross, same, dep_stage, stage in order.topo:
            start = clock[rank]
            if cross >= 0:
                d = hops.get((dep_stage, stage))
                if d is None:
                    d = hops[(dep_stage, stage)] = hop(dep_stage, stage)
                start = max(start, finish[cross] + d)
            if same >= 0:
                start = max(start, finish[same])
            end = start + weight[index]
            clock[rank] = end
            finish.append(end)
        return max(clock, default=0.0)

    # -- per layout ------------------------------------------------------------------------------
    def _durations(self, layout: Layout, shape: _Shape) -> tuple[list[dict[str, float]], Callable[[int, int], float]]:
        cost = self._cost_model(layout.precision, layout.attention_kernel)
        block = layout.tp * layout.cp * layout.dp  # ranks per pipeline rank; rank p's canonical rank is p * block
        eff_cache = self._eff
        eff: list[dict[str, float]] = []
        for stage, actions in enumerate(shape.actions):
            base = shape.stage_rank[stage] * block
            key = (id(actions), base)
            row = eff_cache.get(key)
            if row is None:
                row = eff_cache[key] = self._effective(layout, actions, base, cost)
            eff.append(row)
        nbytes, stage_rank, p2p_cache = shape.p2p_bytes, shape.stage_rank, self._p2p

        def hop(src_stage: int, dst_stage: int) -> float:
            src, dst = stage_rank[src_stage] * block, stage_rank[dst_stage] * block
            if src == dst:
                return 0.0
            key = (nbytes, src, dst)
            d = p2p_cache.get(key)
            if d is None:
                d = p2p_cache[key] = cost.p2p_s(nbytes, src, dst)
            return d

        return eff, hop

    @staticmethod
    def _effective(layout: Layout, actions: dict[str, _Action], base: int, cost: CostModel) -> dict[str, float]:
        """Seconds of each action of a stage whose pipeline rank's canonical rank is ``base``."""
        groups: dict[str, tuple[int, ...]] = {}
        row: dict[str, float] = {}
        for kind, action in actions.items():
            total = action.compute_s
            for coll in action.collectives:
                prefix = coll.group.split("/", 1)[0]
                members = groups.get(prefix)
                if members is None:
                    members = groups[prefix] = _canonical_group(layout, prefix, base)
                if len(members) > 1:
                    total += cost.collective_s(coll, members)
            row[kind] = total
        return row

    # -- shared tables ---------------------------------------------------------------------------
    def _shape(self, layout: Layout) -> _Shape:
        cls = cost_class(layout)
        # zero is cost-free but ZeRO-3 cuts the stages into its gather units (see _make_shape): the units join the key.
        key = (cls, layout.pp, layout.vpp, layout.schedule, self._zero3_units(layout))
        found = self._shapes.get(key)
        if found is None:
            found = self._shapes[key] = self._make_shape(layout, cls)
        return found

    def _make_shape(self, layout: Layout, cls: tuple[Any, ...]) -> _Shape:
        tables = self._tables.get(cls)
        if tables is None:
            tables = self._tables[cls] = {"interned": {}, "signature": {}}
        ctx = _SharedContext(self.model, layout, self.granularity, tables)
        # ZeRO-3 over more than one rank cuts a stage-granularity stage into its gather units
        # (LoweringContext.units), so the split depends on it too.
        split_key = (layout.pp, layout.vpp, str(layout.schedule), self._zero3_units(layout))
        split = self._splits.get(split_key)
        if split is None:
            split = self._splits[split_key] = (
                [ctx.units(s) for s in range(layout.num_stages)],
                [ctx.stage_rank(s) for s in range(layout.num_stages)],
            )
        units, stage_rank = split
        durations: DurationCache | None = None
        actions: list[dict[str, _Action]] = []
        for stage, stage_units in enumerate(units):
            # An action's ops depend on its blocks only through their costs, so stages whose blocks cost
            # the same (every middle stage of a uniform model) share one lowering.
            key = (cls, tuple(tuple(_signature(ctx, tables, b) for b in range(start, end)) for start, end in stage_units))
            found = self._actions.get(key)
            if found is None:
                if durations is None:
                    durations = DurationCache(self._cost_model(layout.precision, layout.attention_kernel), {})
                found = self._actions[key] = _stage_actions(ctx, stage, stage_rank[stage], durations)
            actions.append(found)
        return _Shape(stage_rank=stage_rank, actions=actions, p2p_bytes=ctx.p2p_bytes if layout.pp > 1 else 0,
                      kinds=self._stage_kinds(layout))

    def _zero3_units(self, layout: Layout) -> str | None:
        """The ZeRO-3 implementation whose gather units cut a stage-granularity stage, or None (no cut)."""
        cut = layout.zero == 3 and layout.grad_sync_size > 1 and self.granularity == "stage"
        return layout.zero_impl if cut else None

    def _stage_kinds(self, layout: Layout) -> list[frozenset[str]]:
        """Per stage, the kinds of action the schedule runs there, read off an order with pp micro-batches
        (the schedule's pattern without the cost of the real count), or the real order if pp is refused."""
        key = (layout.pp, layout.vpp, str(layout.schedule))
        found = self._kinds.get(key)
        if found is None:
            try:
                rows = flatten_order(pipeline_order(key[2], layout.pp, layout.pp, layout.vpp))
            except ScheduleError:
                rows = flatten_order(pipeline_order(key[2], layout.pp, layout.num_microbatches, layout.vpp))
            kinds: dict[int, set[str]] = {}
            for row in rows:
                for a in row:
                    if a.kind in _KINDS:  # bookkeeping actions (UNSHARD, REDUCE_GRAD, ...) compute nothing
                        kinds.setdefault(a.stage, set()).add(a.kind)
            if len(kinds) != layout.num_stages or any("F" not in ks or not ks & {"B", "I"} for ks in kinds.values()):
                raise ScheduleError(f"bounds: schedule {key[2]!r} skips a stage's forward or backward; the bound "
                                    "assumes every stage runs both")
            found = self._kinds[key] = [frozenset(kinds[s]) for s in range(layout.num_stages)]
        return found

    def _order(self, layout: Layout) -> _Order:
        key = (str(layout.schedule), layout.pp, layout.num_microbatches, layout.vpp)
        found = self._orders.get(key)
        if found is None:
            # The order the program builder lowers (its context flattens OVERLAP_F_B units into their parts).
            order = LoweringContext(model=self.model, layout=layout, granularity=self.granularity).order  # type: ignore[arg-type]
            found = self._orders[key] = _make_order(order, key)
        return found


def _stage_actions(ctx: LoweringContext, stage: int, pp_rank: int, durations: DurationCache) -> dict[str, _Action]:
    """The F, B, I and W actions of one stage, lowered by the program builder's own passes."""
    role = [Step(action=Action(stage=stage, kind=kind, microbatch=0)) for kind in _KINDS]
    for step in role:
        assert step.action is not None
        step.ops = action_compute_ops(ctx, step.action)
    # The builder's own pass: with TP overlap, chunked GEMMs with their collectives on the side. Only a
    # collective waited at once (the I op's exposed reduce-scatter) then adds serially; the wrapped ones
    # counted as blocking would overstate the step and the bound would not be one.
    role = add_model_parallel_comm(ctx, add_recompute(ctx, role), pp_rank)
    return {kind: _action(step.ops, durations) for kind, step in zip(_KINDS, role, strict=True)}


def _action(ops: list[Any], durations: DurationCache) -> _Action:
    """Nominal compute seconds of a step's ops and the collectives it waits for at once."""
    compute = 0.0
    blocking: list[Collective] = []
    for index, op in enumerate(ops):
        if type(op) is Compute:
            compute += durations.compute(op, 1.0)
        elif type(op) is Collective:
            follower = ops[index + 1] if index + 1 < len(ops) else None
            if type(follower) is Wait and follower.handle == op.handle:
                blocking.append(op)
    return _Action(compute_s=compute, collectives=blocking)


def _canonical_group(layout: Layout, prefix: str, base: int) -> tuple[int, ...]:
    """Members of the group of kind ``prefix`` (tp, cp, ep, etp) that the canonical rank ``base`` of a
    pipeline rank (dp = tp = cp = 0, hence edp = ep = etp = 0) belongs to."""
    if prefix == "tp":
        return Mesh(layout).tp_group(base)
    if prefix == "cp":
        return Mesh(layout).cp_group(base)
    if prefix in ("ep", "etp"):
        c = expert_coords(layout, base)
        if prefix == "ep":
            return tuple(expert_rank(layout, ExpertCoord(pp=c.pp, edp=c.edp, ep=k, etp=c.etp)) for k in range(layout.ep))
        return tuple(expert_rank(layout, ExpertCoord(pp=c.pp, edp=c.edp, ep=c.ep, etp=t))
                     for t in range(layout.expert_tp))
    raise ScheduleError(f"bounds: unexpected {prefix!r} group around a compute op")


def _signature(ctx: LoweringContext, tables: dict[str, Any], block: int) -> int:
    """A small integer equal for blocks of one cost class whose :class:`~simgrid.model.BlockCost` is equal."""
    found: int | None = tables["signature"].get(block)
    if found is None:
        interned = tables["interned"]
        found = tables["signature"][block] = interned.setdefault(ctx.cost(block), len(interned))
    return found


def _make_order(order_rows: list[list[Action]], key: tuple[Any, ...]) -> _Order:
    """The order's compute actions with the unit-time dependency rules of :mod:`simgrid.schedules.unit_time`
    (F after the previous stage's F; B/I after the next stage's B/I and its own F; W after its own I),
    listed so that every action comes after its dependencies. Bookkeeping actions are left out."""
    rows = [[a for a in row if a.kind in _KINDS] for row in order_rows]
    order = _Order(num_ranks=len(rows))
    num_stages = 1 + max((a.stage for row in rows for a in row), default=0)
    key_index: dict[tuple[int, str], int] = {}
    node_of: dict[tuple[int, str, int], int] = {}  # (stage, F|G|W, micro-batch) -> node
    position = [0] * len(rows)
    sleepers: dict[tuple[int, str, int], list[int]] = {}
    runnable = list(range(len(rows) - 1, -1, -1))
    while runnable:
        rank = runnable.pop()
        row = rows[rank]
        while position[rank] < len(row):
            action = row[position[rank]]
            s, kind, mb = action.stage, action.kind, action.microbatch
            cross: tuple[int, str, int] | None
            same: tuple[int, str, int] | None
            if kind == "F":
                cross, same = ((s - 1, "F", mb) if s > 0 else None), None
            elif kind == "W":
                cross, same = None, (s, "G", mb)
            else:
                cross, same = ((s + 1, "G", mb) if s + 1 < num_stages else None), (s, "F", mb)
            missing = next((k for k in (cross, same) if k is not None and k not in node_of), None)
            if missing is not None:
                sleepers.setdefault(missing, []).append(rank)
                break
            index = key_index.setdefault((s, kind), len(key_index))
            produced = (s, "G" if kind in _BACKWARD else kind, mb)
            node_of[produced] = len(order.topo)
            order.topo.append((rank, index, node_of[cross] if cross is not None else -1,
                               node_of[same] if same is not None else -1, cross[0] if cross is not None else s, s))
            position[rank] += 1
            woken = sleepers.pop(produced, None)
            if woken is not None:
                runnable.extend(woken)
    if len(order.topo) != sum(len(row) for row in rows):
        raise ScheduleError(f"bounds: pipeline order {key} deadlocks")
    order.keys = list(key_index)
    return order
