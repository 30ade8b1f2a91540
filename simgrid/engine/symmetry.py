"""Which ranks to simulate: every rank, or one representative per pipeline rank when that is exact.

Symmetric mode simulates rank ``(pp=p, dp=0, tp=0)`` for each pipeline rank ``p`` and lets it stand for
every rank with the same ``p``. That is exact (not an approximation) when the check below passes,
because then, by induction over events, every replica issues the same ops at the same times as its
representative:

* no per-rank speed factors, and the fast (closed-form) communication model: flow contention between
  replicas that are not simulated cannot be reproduced, so flow mode always runs every rank;
* the program has a layout (so the mesh says who represents whom);
* every rank's op list equals its representative's op for op, except that a collective may name
  another group and a send/receive another peer, provided (a) the group's members are represented by
  the same representatives (as a multiset) and its closed-form time is equal, (b) the peer is
  represented by the representative's peer and the transfer time is equal;
* "equal" times allow a relative difference up to :data:`TIME_TOLERANCE`: on a fat tree, a pipeline
  transfer between nodes under one leaf switch and one crossing to the next leaf differ by a switch
  hop (about 0.02 % of a 25 MB transfer). Symmetric mode then uses the representatives' times and the
  plan carries a note with the largest difference (exact only when it is 0); beyond the tolerance it
  runs every rank;
* every point-to-point peer of a representative is itself a representative.

Programs made by :func:`simgrid.schedules.build_program` (``meta["generator"]``) are symmetric in
structure by construction: every rank's list is its pipeline rank's template with only group names,
roots and peers substituted (``simgrid.schedules.lower.instantiate``; a parameter server is the one
exception and is treated as asymmetric). For those the op-by-op comparison, which costs seconds at
10,000+ ranks, is replaced by the timing part only: every group of the same shape spanning the same
representatives, and every replica pipeline transfer, must take the representative's time. Tests check
that the op-by-op comparison agrees on built programs.

A collective whose other members are not simulated starts when its simulated members have issued it;
by the argument above the others would have been ready at the same instant.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from simgrid.engine.costmodel import DurationCache
from simgrid.ir import Collective, Program, Recv, Send
from simgrid.ir.ops import Op
from simgrid.layout.mesh import Mesh

BUILDER = "simgrid.schedules.build_program"
"""``meta["generator"]`` of programs whose structural symmetry holds by construction."""

TIME_TOLERANCE = 0.01
"""Largest relative difference between a replica's and its representative's op times still treated
as symmetric (placement effects such as an extra switch hop, far below model error)."""


@dataclass(frozen=True, kw_only=True)
class RankPlan:
    """The ranks the engine simulates and how many ranks each stands for."""

    mode: str
    """Mode actually used: ``symmetric`` or ``full``."""
    simulated: tuple[int, ...]
    """Ranks simulated, ascending."""
    multiplicity: Mapping[int, int]
    """Simulated rank -> number of ranks it stands for (1 in full mode)."""
    notes: tuple[str, ...] = ()
    """Why symmetric mode was not used, when it was asked for."""


def full_plan(world_size: int, notes: tuple[str, ...] = ()) -> RankPlan:
    """Simulate every rank."""
    ranks = tuple(range(world_size))
    return RankPlan(mode="full", simulated=ranks, multiplicity=dict.fromkeys(ranks, 1), notes=notes)


def plan_ranks(program: Program, *, mode: str, comm_model: str, has_speed_factors: bool,
               durations: DurationCache) -> RankPlan:
    """Choose the simulated ranks for ``mode``; falls back to full mode with a note when not symmetric."""
    world = program.world_size
    if mode == "full":
        return full_plan(world)
    if comm_model == "flow":
        return full_plan(world, ("symmetric mode needs the fast comm model (flow contention between replicas "
                                 "is only seen when every rank runs); ran in full mode",))
    if has_speed_factors:
        return full_plan(world, ("per-rank speed factors break symmetry; ran in full mode",))
    if program.layout is None:
        return full_plan(world, ("the program has no layout, so replicas are unknown; ran in full mode",))
    mesh = Mesh(program.layout)
    # rank = tp + tp_size * (cp + cp_size * (dp + dp_size * pp)): rank (pp, 0, 0, 0) starts each run of
    # tp_size * cp_size * dp_size ranks
    block = program.layout.tp * program.layout.cp * program.layout.dp
    rep_of = [r - r % block for r in range(world)]
    worst = [0.0]
    layout = program.layout
    built = program.meta.get("generator") == BUILDER and not (layout.dp_mode == "parameter-server" and layout.dp > 1)
    if built:
        reason = _timing_asymmetry(program, rep_of, mesh, durations, worst)
    else:
        reason = _asymmetry(program, rep_of, durations, worst)
    if reason is not None:
        return full_plan(world, (f"program is not symmetric ({reason}); ran in full mode",))
    counts = Counter(rep_of)
    sim = tuple(sorted(counts))
    notes: tuple[str, ...] = ()
    if worst[0] > 0:
        notes = (f"replicas' communication times differ from their representatives' by up to {worst[0]:.3%} "
                 "(placement on the fabric); symmetric mode used the representatives' times",)
    return RankPlan(mode="symmetric", simulated=sim, multiplicity={r: counts[r] for r in sim}, notes=notes)


def _relative_gap(a: float, b: float) -> float:
    return 0.0 if a == b else abs(a - b) / max(abs(a), abs(b))


def _asymmetry(program: Program, rep_of: list[int], durations: DurationCache, worst: list[float]) -> str | None:
    """``None`` when every rank mirrors its representative, else the first difference found.
    ``worst[0]`` receives the largest relative time difference tolerated."""
    reps = set(rep_of)
    groups = program.groups
    signature_cache: dict[str, tuple[int, ...]] = {}

    def signature(group: str) -> tuple[int, ...]:
        sig = signature_cache.get(group)
        if sig is None:
            sig = signature_cache[group] = tuple(sorted(rep_of[m] for m in groups[group]))
        return sig

    for rep in reps:
        for op in program.ranks[rep]:
            if isinstance(op, (Send, Recv)) and op.peer not in reps:
                return f"rank {rep} exchanges with rank {op.peer}, which no representative stands for"
    for rank, ops in enumerate(program.ranks):
        rep = rep_of[rank]
        if rank == rep:
            continue
        rep_ops = program.ranks[rep]
        if ops is rep_ops:
            continue
        if len(ops) != len(rep_ops):
            return f"rank {rank} issues {len(ops)} ops, its representative {rep} issues {len(rep_ops)}"
        for index, (a, b) in enumerate(zip(ops, rep_ops, strict=True)):
            if a is b:
                continue
            t = type(a)
            if t is not type(b):
                return f"rank {rank} op {index} is a {t.__name__}, rank {rep} has a {type(b).__name__}"
            if t is Collective:
                assert isinstance(a, Collective) and isinstance(b, Collective)  # narrowed for mypy
                if (a.kind, a.bytes, a.count, a.purpose, a.handle) != (b.kind, b.bytes, b.count, b.purpose, b.handle):
                    return f"rank {rank} op {index} differs from rank {rep}'s"
                if a.group != b.group:
                    if a.group not in groups or b.group not in groups:
                        return f"rank {rank} op {index} names an unknown group"
                    if signature(a.group) != signature(b.group):
                        return f"groups {a.group} and {b.group} span different pipeline ranks"
                    gap = _relative_gap(durations.collective(a), durations.collective(b))
                    if gap > TIME_TOLERANCE:
                        return f"collectives on {a.group} and {b.group} take times {gap:.1%} apart"
                    worst[0] = max(worst[0], gap)
                if (a.root is None) != (b.root is None) or (a.root is not None and b.root is not None
                                                            and rep_of[a.root] != rep_of[b.root]):
                    return f"rank {rank} op {index} has a different root"
            elif t is Send or t is Recv:
                assert isinstance(a, (Send, Recv)) and isinstance(b, (Send, Recv))  # narrowed for mypy
                if (a.bytes, a.key, a.handle) != (b.bytes, b.key, b.handle) or rep_of[a.peer] != b.peer:
                    return f"rank {rank} op {index} ({t.__name__}) does not mirror rank {rep}'s"
                src_a, dst_a = (rank, a.peer) if t is Send else (a.peer, rank)
                src_b, dst_b = (rep, b.peer) if t is Send else (b.peer, rep)
                gap = _relative_gap(durations.p2p(a.bytes, src_a, dst_a), durations.p2p(b.bytes, src_b, dst_b))
                if gap > TIME_TOLERANCE:
                    return f"transfers {src_a}->{dst_a} and {src_b}->{dst_b} take times {gap:.1%} apart"
                worst[0] = max(worst[0], gap)
            elif a != b:
                return f"rank {rank} op {index} differs from rank {rep}'s"
    return None


def _shape(group: str) -> str:
    """A group name with its indices blanked: ``tp/pp3-dp1`` -> ``tp/pp#-dp#`` (groups of one kind)."""
    return re.sub(r"[0-9]+", "#", group)


def _timing_asymmetry(program: Program, rep_of: list[int], mesh: Mesh, durations: DurationCache,
                      worst: list[float]) -> str | None:
    """Timing half of the symmetry check for programs symmetric in structure by construction."""
    groups = program.groups
    by_shape: dict[tuple[str, tuple[int, ...]], list[str]] = {}
    for name, members in groups.items():
        by_shape.setdefault((_shape(name), tuple(sorted(rep_of[m] for m in members))), []).append(name)
    reps = sorted(set(rep_of))
    rep_set = frozenset(reps)
    block = mesh.layout.dp * mesh.layout.cp * mesh.layout.tp  # ranks of one pipeline rank: rep .. rep + block - 1
    seen_coll: set[tuple[object, ...]] = set()
    seen_p2p: set[tuple[int, int, int]] = set()
    for rep in reps:
        for op in program.ranks[rep]:
            # IR op types are final: an identity test is exact and far cheaper than isinstance.
            if type(op) is Collective:
                key = (op.kind, op.bytes, op.count, op.root, op.group)
                if key in seen_coll:
                    continue
                seen_coll.add(key)
                if op.group not in groups:
                    return f"rank {rep} uses group {op.group!r}, which the program does not define"
                base = durations.collective(op)
                members = groups[op.group]
                root_index = members.index(op.root) if op.root is not None and op.root in members else None
                shape = (_shape(op.group), tuple(sorted(rep_of[m] for m in members)))
                for other in by_shape.get(shape, ()):
                    if other == op.group:
                        continue
                    if op.root is None:
                        # The closed form reads the members, not the name: ask the cost model directly
                        # instead of making a renamed op per group (thousands per layout at 2,520 GPUs).
                        other_s = durations.cost.collective_s(op, tuple(groups[other]))
                    else:
                        root = groups[other][root_index] if root_index is not None else op.root
                        twin: Op = Collective(kind=op.kind, group=other, bytes=op.bytes, purpose=op.purpose,
                                              handle=op.handle, root=root, count=op.count)
                        other_s = durations.collective(twin)  # type: ignore[arg-type]
                    gap = _relative_gap(base, other_s)
                    if gap > TIME_TOLERANCE:
                        return f"collectives on {op.group} and {other} take times {gap:.1%} apart"
                    worst[0] = max(worst[0], gap)
            elif type(op) is Send:
                if op.peer not in rep_set:
                    return f"rank {rep} sends to rank {op.peer}, which no representative stands for"
                if (op.bytes, rep, op.peer) in seen_p2p:
                    continue
                seen_p2p.add((op.bytes, rep, op.peer))
                base = durations.p2p(op.bytes, rep, op.peer)
                # rank = tp + tp_size * (dp + dp_size * pp): a replica's peer is the same offset away.
                shift = op.peer - rep
                for rank in range(rep + 1, rep + block):
                    gap = _relative_gap(base, durations.p2p(op.bytes, rank, rank + shift))
                    if gap > TIME_TOLERANCE:
                        return f"pipeline transfers from rank {rank} and rank {rep} take times {gap:.1%} apart"
                    worst[0] = max(worst[0], gap)
            elif type(op) is Recv and op.peer not in rep_set:
                return f"rank {rep} receives from rank {op.peer}, which no representative stands for"
    return None
