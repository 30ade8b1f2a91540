"""A SimPy-free event loop for the fast (closed-form) communication model, equal to the SimPy interpreter.

:class:`simgrid.engine.interpreter.Interpreter` spends most of its time in SimPy's event machinery and in
the objects it makes per op (a ``_Comm`` per communication op, a SimPy event per timer). This loop runs
the same state machine with a plain ``heapq`` of ``(time, sequence, ...)`` entries and lists instead of
objects. It is a transcription, not a new model: every rule (the walk, stream FIFOs, collective and
send/receive matching, the compute slow-down re-timing, WAIT exposure, memory events) is the
interpreter's, in the same order, so events are scheduled in the same sequence SimPy would schedule
them and ties break the same way. The result is the same trace row for row, bit for bit; the test
``tests/engine/test_fast_equivalence.py`` checks that over hundreds of generated layouts.

Durations come from the same :class:`~simgrid.engine.costmodel.DurationCache` the interpreter uses, so
this module holds no cost formula. Flow mode (link sharing) is not handled here: it stays on SimPy. An op
class the loop does not know stops it with :class:`UnsupportedProgram` (``simulate_program(engine="auto")``
then runs the program on SimPy), never with a guessed answer.

Two recording levels: ``rows=True`` keeps every trace row (what :class:`~simgrid.trace.Trace` needs);
``rows=False`` keeps only the aggregates the step metrics need (:class:`~.summary.StepSummary`): busy
time per rank, the pipeline window, executed FLOPs, WAIT exposures and memory peaks, which is what a
layout search reads.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from heapq import heappop, heappush
from typing import Any

from simgrid.engine.costmodel import DurationCache
from simgrid.errors import SimulationError
from simgrid.ir import Alloc, Collective, Compute, Free, Op, Program, Recv, Send, Transfer, Wait, format_op
from simgrid.trace import TraceRow, p2p_match_id

_row: Any = tuple.__new__
"""``_row(TraceRow, (every field))``: a row without the named tuple's Python-level ``__new__``."""

_ROWLESS = frozenset({Alloc, Free, Wait})
"""Op classes that make no trace row by themselves (a WAIT's row needs a communication op as well)."""

_PIPELINE_KINDS = frozenset({"F", "B", "I", "W", "R"})

# Indices into a communication record (a list: cheaper to make than an object, one per comm op).
_C_RANK, _C_OP, _C_STREAM, _C_SEQ, _C_START, _C_END, _C_DONE = range(7)
# Indices into a stream record: [busy, queue of records, trace label].
_S_BUSY, _S_QUEUE, _S_LABEL = range(3)


class UnsupportedProgram(SimulationError):
    """The program holds an op this loop does not handle (the SimPy interpreter is the reference)."""


class _Rank:
    __slots__ = ("busy", "c_left", "c_op", "c_rate", "c_seg", "c_start", "c_ver", "coll_seq", "durations", "flops",
                 "handles", "inflight", "live", "mem", "mem_peak", "mem_total", "n", "ops", "ptr", "rank", "speed",
                 "streams", "wait_op", "wait_start", "waiting", "weight")

    def __init__(self, rank: int, ops: tuple[Op, ...], speed: float, weight: int) -> None:
        self.rank = rank
        self.ops = ops
        self.n = len(ops)
        self.ptr = 0
        self.speed = speed
        self.weight = weight
        self.streams: dict[Any, list[Any]] = {}
        self.handles: dict[str, list[Any]] = {}
        self.coll_seq: dict[str, int] = {}
        self.inflight = 0
        self.waiting: list[Any] | None = None
        self.wait_start = 0.0
        self.wait_op: Any = None
        self.c_op: Compute | None = None
        self.c_start = self.c_seg = self.c_left = 0.0
        self.c_rate = 1.0
        self.c_ver = 0
        self.mem: list[tuple[float, int, str]] = []
        self.live: dict[str, tuple[int, str]] = {}
        self.mem_total = 0
        self.mem_peak = 0
        self.busy: float | None = None  # pipeline compute seconds (None until the first F/B/I/W/R op)
        self.durations: dict[int, float] | None = None  # compute seconds by op identity at this rank's speed
        self.flops = 0.0  # FLOPs of the compute ops run so far


def has_rows(ops: tuple[Op, ...]) -> bool:
    """Whether a rank's ops make trace rows (any compute or communication op; stops at the first)."""
    return any(type(op) not in _ROWLESS for op in ops)


class FastLoop:
    """Runs the simulated ranks of one program to completion (fast communication model only)."""

    def __init__(self, program: Program, durations: DurationCache, simulated: Sequence[int], *,
                 speed_factors: dict[int, float], multiplicity: dict[int, int] | None = None,
                 rows: bool = True) -> None:
        self.program = program
        self.durations = durations
        self.slowdown = float(durations.cost.comm_compute_slowdown)
        self.sim_set = frozenset(simulated)
        weights = multiplicity or {}
        self.states: dict[int, _Rank] = {}
        for r in simulated:
            self.states[r] = _Rank(r, program.ranks[r], speed_factors.get(r, 1.0), weights.get(r, 1))
        self.keep_rows = rows
        self.rows: list[TraceRow] = []
        self.makespan_s = 0.0
        self.now = 0.0
        # SimPy orders events by (time, priority, insertion counter); every event here has the same
        # priority, so (time, counter) reproduces its order, ties included.
        self._heap: list[tuple[Any, ...]] = []
        self._pending: dict[Any, list[Any]] = {}
        self._expected: dict[str, int] = {}
        # Aggregates for the step metrics (kept in trace order so sums round exactly as the metrics do).
        self.window_start = float("inf")
        self.window_end = float("-inf")
        self.waits: list[tuple[int, str, float, float]] = []
        """(rank, purpose, end_s, exposed_s) of every WAIT that blocked, in trace order."""
        self.busy_order: list[int] = []
        """Ranks in the order of their first pipeline compute row (the metrics' dict order)."""

    # -- driver ------------------------------------------------------------------------------------
    def run(self) -> None:
        """Run every simulated rank to its last op (raises :class:`SimulationError` on a deadlock)."""
        # One function with closures over locals: the interpreter's small methods, attribute lookups and
        # calls cost more than the work they do at millions of ops. The statements are the interpreter's,
        # in its order (see the module docstring); only their packaging differs.
        heap: list[tuple[Any, ...]] = self._heap
        states = self.states
        pending = self._pending
        expected_of = self._expected
        keep_rows = self.keep_rows
        rows = self.rows
        waits = self.waits
        busy_order = self.busy_order
        slowdown = self.slowdown
        retime = bool(slowdown)
        slow_rate = 1.0 - slowdown
        durations = self.durations
        compute_s, collective_s, p2p_s, transfer_s = (durations.compute, durations.collective, durations.p2p,
                                                       durations.transfer)
        by_speed: dict[float, dict[int, float]] = {}
        pipeline_kinds = _PIPELINE_KINDS
        now = 0.0
        eid = 0
        makespan = 0.0
        window_start, window_end = float("inf"), float("-inf")

        def compute_row(st: _Rank, op: Any, start: float, end: float) -> None:
            nonlocal makespan, window_start, window_end
            if keep_rows:
                rows.append(_row(TraceRow, (st.rank, "host" if op.device == "cpu" else "compute", op, op.kind,
                                            "compute", start, end, 0, float(op.flops), op.stage, op.microbatch,
                                            "", 0.0)))
            if end > makespan:
                makespan = end
            # What simgrid.metrics reads from this row: FLOPs, and for F/B/I/W/R the window and busy time.
            flops = float(op.flops)
            if flops:
                st.flops += flops
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
            nonlocal eid
            op = st.c_op
            if op is None or not slowdown or op.device != "gpu":
                return
            rate = slow_rate if st.inflight else 1.0
            if rate == st.c_rate:
                return
            st.c_left = max(st.c_left - (now - st.c_seg) * st.c_rate, 0.0)
            st.c_seg, st.c_rate = now, rate
            st.c_ver += 1
            eid += 1
            heappush(heap, (now + st.c_left / st.c_rate, eid, st, st.c_ver))

        def start(inst: list[Any]) -> None:
            nonlocal eid
            op: Any = inst[0]
            t = type(op)
            members = inst[2]
            if t is Transfer:  # host copies do not slow compute
                for comm in members:
                    comm[_C_START] = now
            else:
                for comm in members:
                    comm[_C_START] = now
                    st = comm[_C_RANK]
                    st.inflight += 1
                    if st.inflight == 1 and retime and st.c_op is not None:
                        inflight_changed(st)
            if t is Collective:
                duration = collective_s(op)
            elif t is Transfer:
                duration = transfer_s(op, members[0][_C_RANK].rank)
            else:
                rank = members[0][_C_RANK].rank
                duration = p2p_s(op.bytes, rank, op.peer) if t is Send else p2p_s(op.bytes, op.peer, rank)
            eid += 1
            heappush(heap, (now + duration, eid, None, inst))

        def ready(comm: list[Any]) -> None:
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
            nonlocal eid
            ops, n, handles, streams, ptr = st.ops, st.n, st.handles, st.streams, st.ptr
            speed = st.speed
            cache = st.durations
            if cache is None:
                cache = st.durations = by_speed.setdefault(speed, {})
            while ptr < n:
                op: Any = ops[ptr]
                ptr += 1
                t = type(op)
                if t is Wait:
                    comm = handles.get(op.handle)
                    if comm is None:
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
                    if op.name in live:
                        st.ptr = ptr
                        raise SimulationError(f"rank {st.rank}: ALLOC name={op.name} while a buffer of that name is live")
                    size = op.bytes
                    live[op.name] = (size, op.category)
                    if keep_rows:
                        st.mem.append((now, size, op.category))
                    total = st.mem_total = st.mem_total + size
                    if total > st.mem_peak:
                        st.mem_peak = total
                elif t is Free:
                    freed = st.live.pop(op.name, None)
                    if freed is None:
                        st.ptr = ptr
                        raise SimulationError(f"rank {st.rank}: FREE name={op.name} releases no live buffer")
                    if keep_rows:
                        st.mem.append((now, -freed[0], freed[1]))
                    st.mem_total -= freed[0]
                elif t is Compute:
                    duration = cache.get(id(op))
                    if duration is None:
                        duration = cache[id(op)] = compute_s(op, speed)
                    if duration > 0:
                        st.ptr = ptr
                        st.c_op, st.c_start, st.c_seg, st.c_left = op, now, now, duration
                        rate = st.c_rate = slow_rate if (st.inflight and op.device == "gpu") else 1.0
                        st.c_ver += 1
                        eid += 1
                        heappush(heap, (now + duration / rate, eid, st, st.c_ver))
                        return
                    compute_row(st, op, now, now)
                else:  # post a communication op
                    if t is Collective:
                        key: Any = op.group
                    elif t is Send or t is Recv:
                        key = op.peer
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
                        label = (f"comm:{key}" if t is Collective else f"p2p:{key}" if t is not Transfer
                                 else f"pcie:{key[1]}")
                        stream = streams[key] = [False, deque(), label]
                    if t is Collective:
                        coll_seq = st.coll_seq
                        seq = coll_seq.get(key, 0)
                        coll_seq[key] = seq + 1
                        comm = [st, op, stream, seq, -1.0, -1.0, False]
                    else:
                        comm = [st, op, stream, 0, -1.0, -1.0, False]
                    handles[op.handle] = comm
                    if stream[_S_BUSY]:
                        stream[_S_QUEUE].append(comm)
                    else:
                        stream[_S_BUSY] = True
                        st.ptr = ptr
                        ready(comm)
            st.ptr = ptr

        for st in states.values():
            advance(st)
        while heap:
            entry = heappop(heap)
            now = self.now = entry[0]
            st = entry[2]
            if st is not None:  # the end of a compute op, unless re-timed since it was scheduled
                if entry[3] != st.c_ver:
                    continue
                op = st.c_op
                st.c_op = None
                began = st.c_start
                if keep_rows:
                    compute_row(st, op, began, now)
                else:  # compute_row without the row, inlined: one call per compute op is measurable
                    if now > makespan:
                        makespan = now
                    flops = float(op.flops)
                    if flops:
                        st.flops += flops
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
            inst = entry[3]
            if now > makespan:
                makespan = now
            members = inst[2]
            counts_as_comm = type(inst[0]) is not Transfer
            for comm in members:
                comm[_C_END] = now
                comm[_C_DONE] = True
                if keep_rows:
                    rows.append(_comm_row(comm[_C_RANK].rank, comm))
                if counts_as_comm:
                    st = comm[_C_RANK]
                    st.inflight -= 1
                    if st.inflight == 0 and retime and st.c_op is not None:
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
                    began = st.wait_start
                    if now > began:
                        op = comm[_C_OP]
                        exposed = now - (began if began > comm[_C_START] else comm[_C_START])
                        t = type(op)
                        purpose = op.purpose if t is Collective else "offload" if t is Transfer else "pp"
                        if keep_rows:
                            rows.append(TraceRow(st.rank, "compute", st.wait_op, "WAIT", purpose, began, now,
                                                 exposed_s=exposed))
                        if exposed > 0:
                            waits.append((st.rank, purpose, now, exposed))
                    resume.append(st)
            for st in resume:
                advance(st)
        self.makespan_s = makespan
        self.window_start, self.window_end = window_start, window_end
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
        parts = []
        for st in stuck[:3]:
            if st.waiting is not None:
                comm = st.waiting
                what = f"WAIT on {format_op(comm[_C_OP])}"
                if comm[_C_START] < 0:
                    what += " (never started: a peer did not issue the matching op)"
            else:
                what = f"op {st.ptr} of {st.n}"
            parts.append(f"rank {st.rank} blocked at {what}")
        if len(stuck) > 3:
            parts.append(f"and {len(stuck) - 3} more rank(s)")
        if not stuck:
            parts.append(f"{len(self._pending)} communication op(s) were issued but never matched by their peers")
        return (f"simulation deadlocked at t = {self.now:.6g} s: " + "; ".join(parts)
                + "; run simgrid.ir.dry_run on the program for a step-by-rank grid of the cycle")


def _purpose(op: Op) -> str:
    if isinstance(op, Collective):
        return op.purpose
    if isinstance(op, Transfer):
        return "offload"
    return "pp"


def _comm_row(rank: int, comm: list[Any]) -> TraceRow:
    op: Any = comm[_C_OP]
    t = type(op)
    label = comm[_C_STREAM][_S_LABEL]
    start, end = comm[_C_START], comm[_C_END]
    if t is Collective:
        return _row(TraceRow, (rank, label, op, op.kind, op.purpose, start, end, op.bytes, 0.0, -1, -1, "", 0.0))
    if t is Send:
        return _row(TraceRow, (rank, label, op, "SEND", "pp", start, end, op.bytes, 0.0, op.key.src_stage,
                               op.key.microbatch, p2p_match_id(rank, op.peer, op), 0.0))
    if t is Recv:
        return _row(TraceRow, (rank, label, op, "RECV", "pp", start, end, op.bytes, 0.0, op.key.dst_stage,
                               op.key.microbatch, p2p_match_id(op.peer, rank, op), 0.0))
    return _row(TraceRow, (rank, label, op, op.direction, "offload", start, end, op.bytes, 0.0, -1, -1, "", 0.0))
