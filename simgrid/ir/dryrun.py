"""Dependency-only dry run: interpret a program with abstract op costs and find deadlocks.

Semantics (those of :mod:`simgrid.ir.ops`, with no bandwidth and no contention):

* Each rank issues its ops in order. Issuing never blocks except at a :class:`Wait`, which holds the
  rank's issuing (and so everything after it) until the named op has completed, as ``work.wait()``
  blocks the host thread on gloo. This gives the same times as ops.py's "a WAIT blocks the compute
  stream": an op after the WAIT could not start earlier anyway, since compute follows the stream and
  communication starts only after everything issued before it on the compute stream.
* Compute ops run one after another on their stream (``compute``, or ``host`` for ``device=cpu``) and
  take ``cost(op)`` time units. Alloc/Free sit on the compute stream too (cost 0 by default).
* A communication op is *ready* once every compute op issued before it has finished, the previous op on
  its own stream (:func:`simgrid.ir.ops.stream_of`) has completed and the rank has issued it.
* A SEND and its RECV (same channel and key, matched first-come first-served) complete together at the
  later of their ready times plus the cost: a rendezvous, because gloo has no buffering, so a send
  cannot finish before the receiver is there. A collective completes when every member of its group
  is ready with it (the n-th collective of a group on one rank matches the n-th on every other member).
  A host transfer needs no partner.

With the default :func:`unit_cost` (compute 1, everything else 0) the makespan is the length of the
critical path in compute steps, which is what textbook pipeline-bubble counts use.

Every event is resolved as soon as its inputs are known (a longest-path evaluation over the dependency
graph), so the run costs O(ops + collective members) and handles 10^5+ ops in well under a second.
If no rank can make progress while ops remain, :class:`~simgrid.errors.ProgramError` reports the
deadlock with a step x rank grid (see :mod:`simgrid.ir.deadlock`).
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from simgrid.errors import ProgramError
from simgrid.ir.deadlock import deadlock_report
from simgrid.ir.ops import Alloc, Collective, Compute, Free, Op, P2PKey, Recv, Send, Transfer, Wait, stream_of
from simgrid.ir.program import Program

CostFn = Callable[[Op], float]
"""Time an op takes in the dry run, in arbitrary units."""


def unit_cost(op: Op) -> float:
    """Every compute op takes one unit; communication and memory ops take none."""
    return 1.0 if isinstance(op, Compute) else 0.0


def cost_by_kind(units: Mapping[str, float], default: float = 0.0) -> CostFn:
    """Compute ops cost ``units[kind]`` (e.g. ``{"F": 1, "B": 2}``), ``default`` for other kinds; comm 0."""

    def cost(op: Op) -> float:
        return float(units.get(op.kind, default)) if isinstance(op, Compute) else 0.0

    return cost


def action_cost(program: Program, units: Mapping[str, float]) -> CostFn:
    """Each pipeline action (stage, kind, micro-batch) costs ``units[kind]`` in total, however many layer
    ops it is split into: an op gets ``units[kind] / n`` for the ``n`` distinct block ranges of its action.

    This is the unit-time model of textbook bubble counts (Narayanan et al. SC'21, section 2.2: F = 1,
    B = 2 per micro-batch per stage) applied to a layer-granular program; kinds not in ``units``
    (e.g. R, OPT) and communication cost 0.
    """
    blocks: dict[tuple[int, str, int], set[tuple[int, int]]] = defaultdict(set)
    for ops in program.ranks:
        for op in ops:
            if isinstance(op, Compute):
                blocks[(op.stage, op.kind, op.microbatch)].add((op.block_start, op.block_end))

    def cost(op: Op) -> float:
        if not isinstance(op, Compute) or op.kind not in units:
            return 0.0
        return float(units[op.kind]) / len(blocks[(op.stage, op.kind, op.microbatch)])

    return cost


@dataclass(frozen=True, kw_only=True)
class DryRunResult:
    """When every op ran in a dry run, rank by rank, and how busy each rank was."""

    starts: tuple[tuple[float, ...], ...]
    """Per rank, per op: start time (compute: start on its stream; comm: when all partners were ready;
    wait: when it was issued)."""
    ends: tuple[tuple[float, ...], ...]
    """Per rank, per op: completion time (wait: when the rank resumed issuing)."""
    makespan: float
    """Time the last op on any rank completed."""
    busy: tuple[float, ...]
    """Per rank: time its GPU compute stream was running compute ops."""

    @property
    def world_size(self) -> int:
        """Number of ranks."""
        return len(self.busy)

    @property
    def idle(self) -> tuple[float, ...]:
        """Per rank: ``makespan - busy``, the time its compute stream sat idle."""
        return tuple(self.makespan - b for b in self.busy)

    @property
    def bubble_fraction(self) -> float:
        """Idle share of all ranks' compute-stream time: ``sum(idle) / (world_size * makespan)``."""
        if self.makespan <= 0 or not self.busy:
            return 0.0
        return sum(self.idle) / (len(self.busy) * self.makespan)


class _Run:
    """Mutable state of one dry run; see the module docstring for the rules it applies."""

    def __init__(self, program: Program, cost: CostFn) -> None:
        self.program = program
        self.cost = cost
        world = program.world_size
        self.pc = [0] * world
        self.cursor = [0.0] * world
        self.compute_done = [0.0] * world
        self.busy = [0.0] * world
        self.stream_free: list[dict[str, float]] = [{} for _ in range(world)]
        self.starts = [[0.0] * len(ops) for ops in program.ranks]
        self.ends = [[-1.0] * len(ops) for ops in program.ranks]
        self.base_ready = [[0.0] * len(ops) for ops in program.ranks]
        self.ready = [[-1.0] * len(ops) for ops in program.ranks]
        self.handles: list[dict[str, int]] = [{} for _ in range(world)]
        self.queues: list[dict[str, deque[int]]] = [defaultdict(deque) for _ in range(world)]
        self.coll_seq: list[dict[str, int]] = [defaultdict(int) for _ in range(world)]
        self.coll_slot: dict[tuple[int, int], tuple[str, int]] = {}
        self.coll_arrived: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)
        self.p2p_arrived: dict[tuple[int, int, P2PKey, bool], deque[int]] = defaultdict(deque)
        self.group_size = {name: len(set(members)) for name, members in program.groups.items()}
        self.blocked_on: list[int | None] = [None] * world
        self.runnable: deque[int] = deque(range(world))
        self.activations: list[tuple[int, int]] = []

    # -- issuing -------------------------------------------------------------------------------
    def advance(self, rank: int) -> None:
        ops = self.program.ranks[rank]
        starts, ends = self.starts[rank], self.ends[rank]
        free = self.stream_free[rank]
        cost = self.cost
        while self.pc[rank] < len(ops):
            index = self.pc[rank]
            op = ops[index]
            if isinstance(op, Compute):
                stream = "host" if op.device == "cpu" else "compute"
                start = max(self.cursor[rank], free.get(stream, 0.0))
                end = start + cost(op)
                starts[index], ends[index] = start, end
                free[stream] = end
                if end > self.compute_done[rank]:
                    self.compute_done[rank] = end
                if stream == "compute":
                    self.busy[rank] += end - start
            elif isinstance(op, (Alloc, Free)):
                start = max(self.cursor[rank], free.get("compute", 0.0))
                end = start + cost(op)
                starts[index], ends[index] = start, end
                free["compute"] = end
                if end > self.compute_done[rank]:
                    self.compute_done[rank] = end
            elif isinstance(op, Wait):
                target = self.handles[rank].get(op.handle)
                if target is None:
                    raise ProgramError(
                        f"dry run: rank {rank} op {index} waits on handle {op.handle!r}, which no earlier op "
                        "on the rank issued; run validate_program for the full list of problems"
                    )
                if ends[target] < 0:
                    self.blocked_on[rank] = target
                    return
                starts[index] = self.cursor[rank]
                self.cursor[rank] = max(self.cursor[rank], ends[target])
                ends[index] = self.cursor[rank]
            else:
                self.issue_comm(rank, index, op)
            self.pc[rank] = index + 1

    def issue_comm(self, rank: int, index: int, op: Send | Recv | Collective | Transfer) -> None:
        self.handles[rank][op.handle] = index
        if isinstance(op, (Send, Recv)) and not (0 <= op.peer < self.program.world_size and op.peer != rank):
            raise ProgramError(
                f"dry run: rank {rank} op {index} names peer {op.peer}, which is not another rank of the "
                f"{self.program.world_size}; run validate_program"
            )
        self.base_ready[rank][index] = max(self.cursor[rank], self.compute_done[rank])
        if isinstance(op, Collective):
            size = self.group_size.get(op.group)
            if size is None or rank not in self.program.groups[op.group]:
                raise ProgramError(
                    f"dry run: rank {rank} op {index} issues a collective on group {op.group!r}, which "
                    f"{'does not exist' if size is None else 'does not contain the rank'}; run validate_program"
                )
            seq = self.coll_seq[rank][op.group]
            self.coll_seq[rank][op.group] = seq + 1
            self.coll_slot[(rank, index)] = (op.group, seq)
        stream = stream_of(op)
        queue = self.queues[rank][stream]
        queue.append(index)
        if len(queue) == 1:
            self.ready[rank][index] = max(self.base_ready[rank][index], self.stream_free[rank].get(stream, 0.0))
            self.activations.append((rank, index))
            self.pump()

    # -- completion ----------------------------------------------------------------------------
    def pump(self) -> None:
        """Resolve every rendezvous that became possible, cascading through stream queues."""
        while self.activations:
            rank, index = self.activations.pop()
            op = self.program.ranks[rank][index]
            if isinstance(op, Transfer):
                ready = self.ready[rank][index]
                self.complete([(rank, index)], ready, ready + self.cost(op))
            elif isinstance(op, Collective):
                slot = self.coll_slot[(rank, index)]
                arrived = self.coll_arrived[slot]
                arrived.append((rank, index))
                if len(arrived) == self.group_size[slot[0]]:
                    del self.coll_arrived[slot]
                    start = max(self.ready[r][i] for r, i in arrived)
                    duration = max(self.cost(self.program.ranks[r][i]) for r, i in arrived)
                    self.complete(arrived, start, start + duration)
            else:
                self.arrive_p2p(rank, index, op)  # type: ignore[arg-type]

    def arrive_p2p(self, rank: int, index: int, op: Send | Recv) -> None:
        is_send = isinstance(op, Send)
        src, dst = (rank, op.peer) if is_send else (op.peer, rank)
        partners = self.p2p_arrived.get((src, dst, op.key, not is_send))
        if not partners:
            self.p2p_arrived[(src, dst, op.key, is_send)].append(index)
            return
        other = partners.popleft()
        peer_op = self.program.ranks[op.peer][other]
        start = max(self.ready[rank][index], self.ready[op.peer][other])
        end = start + max(self.cost(op), self.cost(peer_op))
        self.complete([(rank, index), (op.peer, other)], start, end)

    def complete(self, members: list[tuple[int, int]], start: float, end: float) -> None:
        for rank, index in members:
            self.starts[rank][index] = start
            self.ends[rank][index] = end
            stream = stream_of(self.program.ranks[rank][index])
            self.stream_free[rank][stream] = end
            queue = self.queues[rank][stream]
            queue.popleft()  # a stream runs its ops in issue order, so the completed op is the head
            if queue:
                nxt = queue[0]
                self.ready[rank][nxt] = max(self.base_ready[rank][nxt], end)
                self.activations.append((rank, nxt))
            if self.blocked_on[rank] == index:
                self.blocked_on[rank] = None
                self.runnable.append(rank)

    def run(self) -> DryRunResult:
        while self.runnable:
            self.advance(self.runnable.popleft())
        stuck = [r for r in range(self.program.world_size) if self.pc[r] < len(self.program.ranks[r])]
        pending = [(r, i) for r in range(self.program.world_size) for q in self.queues[r].values() for i in q]
        if stuck or pending:
            raise ProgramError(deadlock_report(self, stuck, pending))
        makespan = max((e for ends in self.ends for e in ends), default=0.0)
        return DryRunResult(
            starts=tuple(tuple(s) for s in self.starts),
            ends=tuple(tuple(e) for e in self.ends),
            makespan=max(makespan, 0.0),
            busy=tuple(self.busy),
        )


def dry_run(program: Program, cost: CostFn | None = None) -> DryRunResult:
    """Run ``program`` with abstract costs (default :func:`unit_cost`); raise :class:`ProgramError` on deadlock."""
    return _Run(program, cost if cost is not None else unit_cost).run()
