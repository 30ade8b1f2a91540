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
this module holds no cost formula. Flow mode (link sharing) is not handled here: it stays on SimPy.

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

_KNOWN_OPS = frozenset({Compute, Wait, Alloc, Free, Collective, Send, Recv, Transfer})
"""IR op classes this loop handles; any other class is refused before the run starts."""

_PIPELINE_KINDS = frozenset({"F", "B", "I", "W", "R"})

# Indices into a communication record (a list: cheaper to make than an object, one per comm op).
_C_RANK, _C_OP, _C_STREAM, _C_SEQ, _C_START, _C_END, _C_DONE = range(7)
# Indices into a stream record: [busy, queue of records, trace label].
_S_BUSY, _S_QUEUE, _S_LABEL = range(3)


class UnsupportedProgram(SimulationError):
    """The program holds an op this loop does not handle (the SimPy interpreter is the reference)."""


class _Rank:
    __slots__ = ("busy", "c_left", "c_op", "c_rate", "c_seg", "c_start", "c_ver", "coll_seq", "handles", "inflight",
                 "live", "mem", "mem_peak", "mem_total", "n", "ops", "ptr", "rank", "speed", "streams", "wait_op",
                 "wait_start", "waiting", "weight")

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
            ops = program.ranks[r]
            unknown = set(map(type, ops)) - _KNOWN_OPS
            if unknown:
                names = ", ".join(sorted(t.__name__ for t in unknown))
                raise UnsupportedProgram(
                    f"rank {r} issues {names} ops, which the fast engine does not handle; simulate with "
                    "engine='simpy'"
                )
            self.states[r] = _Rank(r, ops, speed_factors.get(r, 1.0), weights.get(r, 1))
        self.keep_rows = rows
        self.rows: list[TraceRow] = []
        self.makespan_s = 0.0
        self.now = 0.0
        self._heap: list[tuple[Any, ...]] = []
        self._eid = 0
        self._pending: dict[Any, list[Any]] = {}
        self._expected: dict[str, int] = {}
        # Aggregates for the step metrics (kept in trace order so sums round exactly as the metrics do).
        self.window_start = float("inf")
        self.window_end = float("-inf")
        self.executed_flops = 0.0
        self.waits: list[tuple[int, str, float, float]] = []
        """(rank, purpose, end_s, exposed_s) of every WAIT that blocked, in trace order."""
        self.busy_order: list[int] = []
        """Ranks in the order of their first pipeline compute row (the metrics' dict order)."""

    # -- driver ------------------------------------------------------------------------------------
    def run(self) -> None:
        for st in self.states.values():
            self._advance(st)
        heap = self._heap
        finish = self._finish
        compute_done = self._compute_done
        while heap:
            entry = heappop(heap)
            self.now = entry[0]
            st = entry[2]
            if st is None:
                finish(entry[3])
            elif entry[3] == st.c_ver:  # else re-timed since this end was scheduled
                compute_done(st)
        stuck = [st for st in self.states.values() if st.ptr < st.n or st.waiting is not None]
        if stuck or self._pending:
            raise SimulationError(self._deadlock_message(stuck))
        for st in self.states.values():
            # A rank and its communication records point at each other; dropping the handle table breaks
            # the cycles, so reference counting frees the step at once instead of the cyclic collector
            # scanning it later (measured: a third of a layout search's time).
            st.handles = {}
            st.streams = {}

    def _schedule(self, delay: float, st: _Rank | None, payload: Any) -> None:
        # SimPy orders events by (time, priority, insertion counter); every event here has the same
        # priority, so (time, counter) reproduces its order, ties included.
        self._eid += 1
        heappush(self._heap, (self.now + delay, self._eid, st, payload))

    # -- the rank walk -----------------------------------------------------------------------------
    def _advance(self, st: _Rank) -> None:
        ops, now, n = st.ops, self.now, st.n
        compute_s = self.durations.compute
        ptr = st.ptr
        while ptr < n:
            op: Any = ops[ptr]
            ptr += 1
            t = type(op)
            if t is Compute:
                duration = compute_s(op, st.speed)
                if duration > 0:
                    st.ptr = ptr
                    self._start_compute(st, op, duration)
                    return
                self._compute_row(st, op, now, now)
            elif t is Wait:
                comm = st.handles.get(op.handle)
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
                live[op.name] = (op.bytes, op.category)
                st.mem.append((now, op.bytes, op.category))
                total = st.mem_total = st.mem_total + op.bytes
                if total > st.mem_peak:
                    st.mem_peak = total
            elif t is Free:
                freed = st.live.pop(op.name, None)
                if freed is None:
                    st.ptr = ptr
                    raise SimulationError(f"rank {st.rank}: FREE name={op.name} releases no live buffer")
                st.mem.append((now, -freed[0], freed[1]))
                st.mem_total -= freed[0]
            else:
                st.ptr = ptr
                self._post(st, op, t)
        st.ptr = ptr

    def _start_compute(self, st: _Rank, op: Compute, duration: float) -> None:
        now = self.now
        st.c_op, st.c_start, st.c_seg, st.c_left = op, now, now, duration
        rate = st.c_rate = 1.0 - self.slowdown if (st.inflight and op.device == "gpu") else 1.0
        st.c_ver += 1
        self._schedule(duration / rate, st, st.c_ver)

    def _compute_done(self, st: _Rank) -> None:
        op = st.c_op
        assert op is not None
        st.c_op = None
        self._compute_row(st, op, st.c_start, self.now)
        self._advance(st)

    def _compute_row(self, st: _Rank, op: Compute, start: float, end: float) -> None:
        if self.keep_rows:
            stream = "host" if op.device == "cpu" else "compute"
            self.rows.append(_row(TraceRow, (st.rank, stream, op, op.kind, "compute", start, end, 0, float(op.flops),
                                             op.stage, op.microbatch, "", 0.0)))
        if end > self.makespan_s:
            self.makespan_s = end
        # What simgrid.metrics reads from this row: executed FLOPs, and for F/B/I/W/R the window and busy time.
        flops = float(op.flops)
        if flops:
            self.executed_flops += flops * st.weight
        if op.kind in _PIPELINE_KINDS:
            if start < self.window_start:
                self.window_start = start
            if end > self.window_end:
                self.window_end = end
            if st.busy is None:
                st.busy = 0.0
                self.busy_order.append(st.rank)
            st.busy = st.busy + end - start

    def _inflight_changed(self, st: _Rank) -> None:
        op = st.c_op
        if op is None or not self.slowdown or op.device != "gpu":
            return
        rate = 1.0 - self.slowdown if st.inflight else 1.0
        if rate == st.c_rate:
            return
        now = self.now
        st.c_left = max(st.c_left - (now - st.c_seg) * st.c_rate, 0.0)
        st.c_seg, st.c_rate = now, rate
        st.c_ver += 1
        self._schedule(st.c_left / st.c_rate, st, st.c_ver)

    # -- communication -----------------------------------------------------------------------------
    def _post(self, st: _Rank, op: Any, t: type) -> None:
        if t is Collective:
            key: Any = op.group
        elif t is Send or t is Recv:
            key = op.peer
        else:  # Transfer (the constructor refused every other class)
            key = ("pcie", op.direction)
        streams = st.streams
        stream = streams.get(key)
        if stream is None:
            label = f"comm:{key}" if t is Collective else f"p2p:{key}" if t is not Transfer else f"pcie:{key[1]}"
            stream = streams[key] = [False, deque(), label]
        comm = [st, op, stream, 0, -1.0, -1.0, False]
        st.handles[op.handle] = comm
        if t is Collective:
            coll_seq = st.coll_seq
            seq = coll_seq.get(key, 0)
            coll_seq[key] = seq + 1
            comm[_C_SEQ] = seq
        if stream[_S_BUSY]:
            stream[_S_QUEUE].append(comm)
        else:
            stream[_S_BUSY] = True
            self._ready(comm)

    def _ready(self, comm: list[Any]) -> None:
        op: Any = comm[_C_OP]
        t = type(op)
        if t is Collective:
            group = op.group
            expected = self._expected.get(group)
            if expected is None:
                expected = self._expected[group] = self._simulated_members(op, comm[_C_RANK].rank)
            if expected == 1:
                self._start([op, 1, [comm]])
                return
            key: Any = (group, comm[_C_SEQ])
        elif t is Send:
            k = op.key
            key, expected = (comm[_C_RANK].rank, op.peer, k.src_stage, k.dst_stage, k.microbatch, k.direction), 2
        elif t is Recv:
            k = op.key
            key, expected = (op.peer, comm[_C_RANK].rank, k.src_stage, k.dst_stage, k.microbatch, k.direction), 2
        else:
            self._start([op, 1, [comm]])
            return
        pending = self._pending
        inst = pending.get(key)
        if inst is None:
            inst = pending[key] = [op, expected, []]
        members = inst[2]
        members.append(comm)
        if len(members) == inst[1]:
            del pending[key]
            self._start(inst)

    def _simulated_members(self, op: Collective, rank: int) -> int:
        members = self.program.groups.get(op.group)
        if members is None:
            raise SimulationError(f"rank {rank}: collective on group {op.group!r}, which the program does not define")
        if rank not in members:
            raise SimulationError(f"rank {rank} issues a collective on group {op.group!r} but is not a member of it")
        return sum(1 for m in members if m in self.sim_set)

    def _start(self, inst: list[Any]) -> None:
        now = self.now
        op: Any = inst[0]
        counts_as_comm = type(op) is not Transfer
        retime = bool(self.slowdown)
        members = inst[2]
        for comm in members:
            comm[_C_START] = now
            if counts_as_comm:
                st = comm[_C_RANK]
                st.inflight += 1
                if st.inflight == 1 and retime and st.c_op is not None:
                    self._inflight_changed(st)
        t = type(op)
        if t is Collective:
            duration = self.durations.collective(op)
        elif t is Transfer:
            duration = self.durations.transfer(op, members[0][_C_RANK].rank)
        else:
            rank = members[0][_C_RANK].rank
            src, dst = (rank, op.peer) if t is Send else (op.peer, rank)
            duration = self.durations.p2p(op.bytes, src, dst)
        self._schedule(duration, None, inst)

    def _finish(self, inst: list[Any]) -> None:
        now = self.now
        if now > self.makespan_s:
            self.makespan_s = now
        op = inst[0]
        counts_as_comm = type(op) is not Transfer
        retime = bool(self.slowdown)
        members = inst[2]
        keep_rows = self.keep_rows
        rows = self.rows
        for comm in members:
            comm[_C_END] = now
            comm[_C_DONE] = True
            st = comm[_C_RANK]
            if keep_rows:
                rows.append(_comm_row(st.rank, comm))
            if counts_as_comm:
                st.inflight -= 1
                if st.inflight == 0 and retime and st.c_op is not None:
                    self._inflight_changed(st)
        resume: list[_Rank] = []
        for comm in members:
            stream = comm[_C_STREAM]
            queue = stream[_S_QUEUE]
            if queue:
                self._ready(queue.popleft())
            else:
                stream[_S_BUSY] = False
            st = comm[_C_RANK]
            if st.waiting is comm:
                st.waiting = None
                if now > st.wait_start:
                    exposed = now - max(st.wait_start, comm[_C_START])
                    purpose = _purpose(comm[_C_OP])
                    if keep_rows:
                        rows.append(TraceRow(st.rank, "compute", st.wait_op, "WAIT", purpose, st.wait_start, now,
                                             exposed_s=exposed))
                    if exposed > 0:
                        self.waits.append((st.rank, purpose, now, exposed))
                resume.append(st)
        for st in resume:
            self._advance(st)

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
