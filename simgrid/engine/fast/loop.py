"""A SimPy-free event loop for the fast (closed-form) communication model, equal to the SimPy interpreter.

:class:`simgrid.engine.interpreter.Interpreter` spends most of its time in SimPy's event machinery and in
the objects it makes per op (a ``_Comm`` per communication op, a SimPy event per timer). This loop runs
the same state machine with plain lists instead of objects. It is a transcription, not a new model:
every rule (the walk, stream FIFOs, collective and send/receive matching, the compute slow-down
re-timing, WAIT exposure, memory events) is the interpreter's, in the same order, so events run in the
sequence SimPy would run them and ties break the same way. The result is the same trace row for row,
bit for bit; the test ``tests/engine/test_fast_equivalence.py`` checks that over hundreds of generated
layouts.

The event queue: SimPy runs events by (time, insertion order). Here the events due at one time sit in
that time's list in insertion order, and a heap holds the distinct times only: a full-mode step of
thousands of ranks in lock step has millions of events but a few thousand distinct times, so most
events cost a dict lookup and an append instead of a heap operation on a tuple.

Durations come from the same :class:`~simgrid.engine.costmodel.DurationCache` the interpreter uses, so
this module holds no cost formula. Flow mode (link sharing) is not handled here: it stays on SimPy. An op
class the loop does not know stops it with :class:`UnsupportedProgram` (``simulate_program(engine="auto")``
then runs the program on SimPy), never with a guessed answer.

What it records: always the reductions the step metrics read from a trace
(:class:`~simgrid.trace.TraceAggregates`, the same additions in the same order as
:func:`~simgrid.trace.aggregate_rows` makes over the rows) and each rank's memory peak; with
``rows=True`` also a flat *tape* of the values each trace row is made of and the time of each Alloc/Free,
from which :mod:`simgrid.engine.fast.tape` makes the rows and memory timelines only when something
reads them.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Sequence
from heapq import heappop, heappush
from typing import Any

from simgrid.engine.costmodel import DurationCache
from simgrid.engine.deadlock import SHOWN_RANKS, blocked_at, deadlock_message
from simgrid.engine.overlap import COLLECTIVE_WEIGHT as _COLL_WEIGHT
from simgrid.engine.overlap import COPY_ENGINE_WEIGHT as _CE_WEIGHT
from simgrid.engine.overlap import P2P_WEIGHT as _P2P_WEIGHT
from simgrid.engine.overlap import USERBUFFERS_WEIGHT as _UB_WEIGHT
from simgrid.engine.overlap import OverlapModel
from simgrid.errors import SimulationError
from simgrid.ir import Alloc, Collective, Compute, Free, Op, Program, Recv, Send, Transfer, Wait, format_op
from simgrid.ir.ops import p2p_stream_key
from simgrid.trace import PIPELINE_KINDS, PURPOSE_TO_COMM_KIND, TraceAggregates

_ROWLESS = frozenset({Alloc, Free, Wait})
"""Op classes that make no trace row by themselves (a WAIT's row needs a communication op as well)."""

_HANDLE_TYPES = (Send, Recv, Collective, Transfer)

# Indices into a communication record (a list: cheaper to make than an object, one per comm op).
_C_RANK, _C_OP, _C_STREAM, _C_SEQ, _C_START, _C_END, _C_DONE = range(7)
# Indices into a stream record: [busy, queue of records (None until one queues), collectives posted on it].
_S_BUSY, _S_QUEUE, _S_POSTED = range(3)


class UnsupportedProgram(SimulationError):
    """The program holds an op this loop does not handle (the SimPy interpreter is the reference)."""


class _Rank:
    __slots__ = ("busy", "c_left", "c_op", "c_rate", "c_seg", "c_start", "c_ver", "durations",
                 "handles", "inflight", "live", "mem_peak", "mem_times", "mem_total", "n", "ops", "ptr", "rank",
                 "speed", "streams", "wait_op", "wait_start", "waiting", "weight")

    def __init__(self, rank: int, ops: tuple[Op, ...], speed: float, weight: int) -> None:
        self.rank = rank
        self.ops = ops
        self.n = len(ops)
        self.ptr = 0
        self.speed = speed
        self.weight = weight
        self.streams: dict[Any, list[Any]] = {}
        self.handles: dict[str, list[Any]] = {}
        """Handle -> record of the communication op posted under it, until the first WAIT on it."""
        self.inflight = 0
        self.waiting: list[Any] | None = None
        self.wait_start = 0.0
        self.wait_op: Any = None
        self.c_op: Compute | None = None
        self.c_start = self.c_seg = self.c_left = 0.0
        self.c_rate = 1.0
        self.c_ver = 0
        self.mem_times: list[float] = []  # time of each Alloc/Free (rows=True)
        self.live: dict[str, Alloc] = {}
        self.mem_total = 0
        self.mem_peak = 0
        self.busy: float | None = None  # pipeline compute seconds (None until the first F/B/I/W/R op)
        self.durations: dict[int, float] = {}  # compute seconds by op identity at this rank's speed (shared)


def has_rows(ops: tuple[Op, ...]) -> bool:
    """Whether a rank's ops make trace rows (any compute or communication op; stops at the first)."""
    return any(type(op) not in _ROWLESS for op in ops)


def _posted_before(ops: tuple[Op, ...], index: int, handle: str) -> bool:
    """Whether an op before ``ops[index]`` carries ``handle`` (every such op has been posted by then)."""
    return any(type(o) in _HANDLE_TYPES and o.handle == handle for o in ops[:index])  # type: ignore[union-attr]


class FastLoop:
    """Runs the simulated ranks of one program to completion (fast communication model only)."""

    def __init__(self, program: Program, durations: DurationCache, simulated: Sequence[int], *,
                 speed_factors: dict[int, float], multiplicity: dict[int, int] | None = None,
                 rows: bool = True) -> None:
        self.program = program
        self.durations = durations
        self.overlap = OverlapModel(durations.cost)
        self.sim_set = frozenset(simulated)
        weights = multiplicity or {}
        self.states: dict[int, _Rank] = {}
        by_speed: dict[float, dict[int, float]] = {}
        for r in simulated:
            st = self.states[r] = _Rank(r, program.ranks[r], speed_factors.get(r, 1.0), weights.get(r, 1))
            st.durations = by_speed.setdefault(st.speed, {})
        self.keep_rows = rows
        self.tape: list[Any] = []
        """rows=True: every trace row's values in row order, flat (see :mod:`simgrid.engine.fast.tape`)."""
        self.wait_rows = 0
        """How many of the tape's rows are WAIT rows (six values; the others have four)."""
        self.makespan_s = 0.0
        self.now = 0.0
        self._pending: dict[Any, list[Any]] = {}
        self._expected: dict[str, int] = {}
        # Reductions for the step metrics, made in row order exactly as simgrid.trace.aggregate_rows does.
        self.window_start = float("inf")
        self.window_end = float("-inf")
        self.executed_flops = 0.0
        self.exposed_s = dict.fromkeys(PURPOSE_TO_COMM_KIND.values(), 0.0)
        self.waits = array("d")
        """rank, end_s, exposed_s of every WAIT row with exposed seconds, in row order, flat."""
        self.busy_order: list[int] = []
        """Ranks in the order of their first pipeline compute row (the metrics' dict order)."""

    @property
    def row_count(self) -> int:
        """Trace rows on the tape."""
        return (len(self.tape) - 6 * self.wait_rows) // 4 + self.wait_rows

    def aggregates(self) -> TraceAggregates:
        """The :class:`~simgrid.trace.TraceAggregates` of the step's trace rows (after :meth:`run`)."""
        states = self.states
        with_rows = sorted(r for r, st in states.items() if has_rows(st.ops))
        return TraceAggregates(
            makespan_s=self.makespan_s,
            window_s=(self.window_start, self.window_end) if self.busy_order else (0.0, 0.0),
            busy_s={r: float(states[r].busy or 0.0) for r in self.busy_order},
            executed_flops=self.executed_flops,
            exposed_s=dict(self.exposed_s),
            waits=self.waits,
            weights={r: states[r].weight for r in with_rows},
        )

    # -- driver ------------------------------------------------------------------------------------
    def run(self) -> None:
        """Run every simulated rank to its last op (raises :class:`SimulationError` on a deadlock)."""
        # One function with closures over locals: the interpreter's small methods, attribute lookups and
        # calls cost more than the work they do at millions of ops. The statements are the interpreter's,
        # in its order (see the module docstring); only their packaging differs.
        states = self.states
        pending = self._pending
        expected_of = self._expected
        keep_rows = self.keep_rows
        record = self.tape.extend
        busy_order = self.busy_order
        exposed_s = self.exposed_s
        # Exposed waits go to a list first (a list takes a tuple 3-4x faster than an array does) and to
        # the array in blocks (fromlist: 2x faster per value than extend), so the list stays small.
        wait_buf: list[float] = []
        note_wait = wait_buf.extend
        flush_waits = self.waits.fromlist
        comm_kind = PURPOSE_TO_COMM_KIND.get
        overlap = self.overlap
        retime = overlap.active
        rates = overlap.rates
        rate_of = overlap.rate
        durations = self.durations
        compute_s, collective_s, p2p_s, transfer_s = (durations.compute, durations.collective, durations.p2p,
                                                       durations.transfer)
        pipeline_kinds = PIPELINE_KINDS
        # Time -> its events in insertion order (a compute end is (rank, version), a communication end its
        # instance list); ``times`` is a heap of the keys. See the module docstring.
        due: dict[float, list[Any]] = {}
        times: list[float] = []
        now = 0.0
        makespan = 0.0
        window_start, window_end = float("inf"), float("-inf")
        flops_total = 0.0
        wait_rows = 0

        def compute_row(st: _Rank, op: Any, start: float, end: float) -> None:
            # A compute op that took no time (the common case is inlined in the event loop below).
            nonlocal makespan, window_start, window_end, flops_total
            if keep_rows:
                record((st.rank, op, start, end))
            if end > makespan:
                makespan = end
            flops = float(op.flops)
            if flops:
                flops_total += flops * st.weight
            if op.kind in pipeline_kinds:
                if start < window_start:
                    window_start = start
                if end > window_end:
                    window_end = end
                if st.busy is None:
                    st.busy = 0.0
                    busy_order.append(st.rank)
                st.busy = st.busy + end - start

        def inflight_changed(st: _Rank) -> None:
            op = st.c_op
            if op is None or op.device != "gpu":
                return
            rate = rates.get(st.inflight) or rate_of(st.inflight)
            if rate == st.c_rate:
                return
            st.c_left = max(st.c_left - (now - st.c_seg) * st.c_rate, 0.0)
            st.c_seg, st.c_rate = now, rate
            st.c_ver = version = st.c_ver + 1
            at = now + st.c_left / st.c_rate
            events = due.get(at)
            if events is None:
                due[at] = [(st, version)]
                heappush(times, at)
            else:
                events.append((st, version))

        def start(inst: list[Any]) -> None:
            op: Any = inst[0]
            t = type(op)
            members = inst[2]
            # OverlapModel.weight, inlined (twice per communication op)
            weight = ((_CE_WEIGHT if op.kind == "ring_exchange" else
                       _UB_WEIGHT if op.kernel == "userbuffers" else _COLL_WEIGHT) if t is Collective
                      else 0 if t is Transfer else _P2P_WEIGHT)
            if not weight:  # host copies do not slow compute
                for comm in members:
                    comm[_C_START] = now
            else:
                for comm in members:
                    comm[_C_START] = now
                    st = comm[_C_RANK]
                    st.inflight += weight
                    if retime and st.c_op is not None:
                        inflight_changed(st)
            if t is Collective:
                duration = collective_s(op)
            elif t is Transfer:
                duration = transfer_s(op, members[0][_C_RANK].rank)
            elif t is Send:  # DurationCache.p2p memoises by (bytes, source, destination)
                duration = p2p_s(op.bytes, members[0][_C_RANK].rank, op.peer)
            else:
                duration = p2p_s(op.bytes, op.peer, members[0][_C_RANK].rank)
            at = now + duration
            events = due.get(at)
            if events is None:
                due[at] = [inst]
                heappush(times, at)
            else:
                events.append(inst)

        def ready(comm: list[Any]) -> None:
            # A communication op at the head of its stream: match it with its peers' (inlined in advance).
            op: Any = comm[_C_OP]
            t = type(op)
            if t is Collective:
                group = op.group
                expected = expected_of.get(group)
                if expected is None:
                    expected = expected_of[group] = self._simulated_members(op, comm[_C_RANK].rank)
                if expected == 1:
                    start([op, 1, [comm]])
                    return
                key: Any = (group, comm[_C_SEQ])
            elif t is Send:
                k = op.key
                key, expected = (comm[_C_RANK].rank, op.peer, k.src_stage, k.dst_stage, k.microbatch, k.direction), 2
            elif t is Recv:
                k = op.key
                key, expected = (op.peer, comm[_C_RANK].rank, k.src_stage, k.dst_stage, k.microbatch, k.direction), 2
            else:
                start([op, 1, [comm]])
                return
            inst = pending.get(key)
            if inst is None:
                inst = pending[key] = [op, expected, []]
            members = inst[2]
            members.append(comm)
            if len(members) == inst[1]:
                del pending[key]
                start(inst)

        def advance(st: _Rank) -> None:
            ops, n, handles, streams, ptr = st.ops, st.n, st.handles, st.streams, st.ptr
            while ptr < n:
                op: Any = ops[ptr]
                ptr += 1
                t = type(op)
                if t is Wait:
                    # Taken out of the table by the first WAIT on it, finished or not: this rank runs no
                    # other op until that WAIT is over, and every later WAIT on it finds it finished.
                    comm = handles.pop(op.handle, None)
                    if comm is None:
                        # Not in the table: either a WAIT already saw it (it is then finished for this one
                        # too), or no op issued it.
                        if _posted_before(ops, ptr - 1, op.handle):
                            continue
                        st.ptr = ptr
                        raise SimulationError(
                            f"rank {st.rank} op {ptr - 1}: WAIT handle={op.handle} names no earlier "
                            "send, receive, collective or transfer of this rank; validate the program first"
                        )
                    if not comm[_C_DONE]:
                        st.ptr = ptr
                        st.waiting, st.wait_start, st.wait_op = comm, now, op
                        return
                elif t is Alloc:
                    live = st.live
                    name = op.name
                    if name in live:
                        st.ptr = ptr
                        raise SimulationError(f"rank {st.rank}: ALLOC name={name} while a buffer of that name is live")
                    live[name] = op
                    if keep_rows:
                        st.mem_times.append(now)
                    total = st.mem_total = st.mem_total + op.bytes
                    if total > st.mem_peak:
                        st.mem_peak = total
                elif t is Free:
                    freed = st.live.pop(op.name, None)
                    if freed is None:
                        st.ptr = ptr
                        raise SimulationError(f"rank {st.rank}: FREE name={op.name} releases no live buffer")
                    if keep_rows:
                        st.mem_times.append(now)
                    st.mem_total -= freed.bytes
                elif t is Compute:
                    cache = st.durations
                    duration = cache.get(id(op))
                    if duration is None:
                        duration = cache[id(op)] = compute_s(op, st.speed)
                    if duration > 0:
                        st.ptr = ptr
                        st.c_op, st.c_start, st.c_seg, st.c_left = op, now, now, duration
                        rate = st.c_rate = (rates.get(st.inflight) or rate_of(st.inflight)
                                            if (st.inflight and retime and op.device == "gpu") else 1.0)
                        st.c_ver = version = st.c_ver + 1
                        at = now + duration / rate
                        events = due.get(at)
                        if events is None:
                            due[at] = [(st, version)]
                            heappush(times, at)
                        else:
                            events.append((st, version))
                        return
                    compute_row(st, op, now, now)
                else:  # post a communication op
                    if t is Collective:
                        key: Any = op.group
                    elif t is Send or t is Recv:  # a grouped op has its own direction's stream (Send.grouped)
                        key = op.peer if not op.grouped else p2p_stream_key(op)
                    elif t is Transfer:
                        key = ("pcie", op.direction)
                    else:
                        st.ptr = ptr - 1
                        raise UnsupportedProgram(
                            f"rank {st.rank} op {ptr - 1} is a {t.__name__}, which the fast engine does not "
                            "handle; simulate with engine='simpy'"
                        )
                    stream = streams.get(key)
                    if stream is None:
                        stream = streams[key] = [False, None, 0]
                    if t is Collective:  # its place in the group's call sequence: streams are per group
                        seq = stream[_S_POSTED]
                        stream[_S_POSTED] = seq + 1
                        comm = [st, op, stream, seq, -1.0, -1.0, False]
                    else:
                        comm = [st, op, stream, 0, -1.0, -1.0, False]
                    handles[op.handle] = comm
                    if stream[_S_BUSY]:
                        queue = stream[_S_QUEUE]
                        if queue is None:  # made on first use: most streams never queue, and a deque is 760 bytes
                            queue = stream[_S_QUEUE] = deque()
                        queue.append(comm)
                        continue
                    stream[_S_BUSY] = True
                    st.ptr = ptr
                    # ready(comm), inlined (the type, key and rank are at hand): one call per op is measurable
                    if t is Collective:
                        expected = expected_of.get(key)
                        if expected is None:
                            expected = expected_of[key] = self._simulated_members(op, st.rank)
                        if expected == 1:
                            start([op, 1, [comm]])
                            continue
                        match: Any = (key, seq)
                    elif t is Send:
                        k = op.key
                        match, expected = (st.rank, op.peer, k.src_stage, k.dst_stage, k.microbatch, k.direction), 2
                    elif t is Recv:
                        k = op.key
                        match, expected = (op.peer, st.rank, k.src_stage, k.dst_stage, k.microbatch, k.direction), 2
                    else:
                        start([op, 1, [comm]])
                        continue
                    inst = pending.get(match)
                    if inst is None:
                        inst = pending[match] = [op, expected, []]
                    members = inst[2]
                    members.append(comm)
                    if len(members) == expected:
                        del pending[match]
                        start(inst)
            st.ptr = ptr

        for st in states.values():
            advance(st)
        while times:
            now = heappop(times)
            self.now = now
            # Events due now, in insertion order; one scheduled now while these run is appended and runs
            # in its turn (its insertion counter is larger than every earlier one's).
            for entry in due[now]:
                if type(entry) is tuple:  # the end of a compute op, unless re-timed since it was scheduled
                    st, version = entry
                    if version != st.c_ver:
                        continue
                    op = st.c_op
                    st.c_op = None
                    began = st.c_start
                    # compute_row, inlined: one call per compute op is measurable
                    if keep_rows:
                        record((st.rank, op, began, now))
                    if now > makespan:
                        makespan = now
                    flops = float(op.flops)
                    if flops:
                        flops_total += flops * st.weight
                    if op.kind in pipeline_kinds:
                        if began < window_start:
                            window_start = began
                        if now > window_end:
                            window_end = now
                        if st.busy is None:
                            st.busy = 0.0
                            busy_order.append(st.rank)
                        st.busy = st.busy + now - began
                    advance(st)
                    continue
                # the end of a communication instance
                if now > makespan:
                    makespan = now
                members = entry[2]
                op = entry[0]
                t = type(op)
                weight = ((_CE_WEIGHT if op.kind == "ring_exchange" else
                           _UB_WEIGHT if op.kernel == "userbuffers" else _COLL_WEIGHT) if t is Collective
                          else 0 if t is Transfer else _P2P_WEIGHT)
                for comm in members:
                    comm[_C_END] = now
                    comm[_C_DONE] = True
                    st = comm[_C_RANK]
                    if keep_rows:
                        record((st.rank, comm[_C_OP], comm[_C_START], now))
                    if weight:
                        st.inflight -= weight
                        if retime and st.c_op is not None:
                            inflight_changed(st)
                resume: list[_Rank] = []
                for comm in members:
                    stream = comm[_C_STREAM]
                    queue = stream[_S_QUEUE]
                    if queue:
                        ready(queue.popleft())
                    else:
                        stream[_S_BUSY] = False
                    st = comm[_C_RANK]
                    if st.waiting is comm:
                        st.waiting = None
                        wait_op = st.wait_op
                        began = st.wait_start
                        if now > began:
                            op = comm[_C_OP]
                            exposed = now - (began if began > comm[_C_START] else comm[_C_START])
                            t = type(op)
                            purpose = op.purpose if t is Collective else "offload" if t is Transfer else "pp"
                            if keep_rows:
                                record((st.rank, wait_op, began, now, purpose, exposed))
                                wait_rows += 1
                            if exposed > 0:
                                note_wait((st.rank, now, exposed))
                                if len(wait_buf) > 98_304:
                                    flush_waits(wait_buf)
                                    wait_buf.clear()
                                kind = comm_kind(purpose)
                                if kind is not None:
                                    exposed_s[kind] += exposed * st.weight
                        resume.append(st)
                for st in resume:
                    advance(st)
            del due[now]
        flush_waits(wait_buf)
        self.makespan_s = makespan
        self.window_start, self.window_end = window_start, window_end
        self.executed_flops = flops_total
        self.wait_rows = wait_rows
        stuck = [st for st in states.values() if st.ptr < st.n or st.waiting is not None]
        if stuck or pending:
            raise SimulationError(self._deadlock_message(stuck))
        for st in states.values():
            # A rank and its communication records point at each other; dropping the handle table breaks
            # the cycles, so reference counting frees the step at once instead of the cyclic collector
            # scanning it later (measured: a third of a layout search's time).
            st.handles = {}
            st.streams = {}

    def _simulated_members(self, op: Collective, rank: int) -> int:
        members = self.program.groups.get(op.group)
        if members is None:
            raise SimulationError(f"rank {rank}: collective on group {op.group!r}, which the program does not define")
        if rank not in members:
            raise SimulationError(f"rank {rank} issues a collective on group {op.group!r} but is not a member of it")
        return sum(1 for m in members if m in self.sim_set)

    # -- diagnostics -------------------------------------------------------------------------------
    def _deadlock_message(self, stuck: list[_Rank]) -> str:
        shown = []
        for st in stuck[:SHOWN_RANKS]:
            comm = st.waiting
            waiting_on = None if comm is None else format_op(comm[_C_OP])
            started = comm is None or comm[_C_START] >= 0
            shown.append((st.rank, blocked_at(waiting_on, started=started, ptr=st.ptr, n=st.n)))
        return deadlock_message(self.now, shown, len(stuck), len(self._pending))
