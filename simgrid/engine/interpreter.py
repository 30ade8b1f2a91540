"""The SimPy interpreter of a schedule IR program.

Each simulated rank is a resumable state machine driven by SimPy events (cheaper than one generator
process per rank, and far cheaper than one process per op). It walks its op list in order:

* ``Compute`` occupies the rank's compute stream; the rank resumes when it ends. Ops issued later
  cannot start earlier (IR semantics: comm ops wait for every compute op issued before them, and the
  compute stream is serial), so walking the list and the compute stream together is exact.
* A communication op is posted to its stream's FIFO and the walk continues at once. When the stream
  is free the op becomes *ready* on this rank; a collective starts when every simulated member of its
  group is ready (matched by the group's call sequence), a send/receive when both sides are ready.
* ``Wait`` suspends the walk (and so the compute stream) until the named op has finished.
* ``Alloc``/``Free`` are recorded at the current simulated time of the compute stream.

Compute slows while communication of the same rank is in flight, for exactly the overlapping portion, by
what that communication takes from it (:mod:`simgrid.engine.overlap`): an NCCL collective the profile's
``comm_compute_slowdown`` ``s`` (rate ``1 - s``), a send/receive ``p2p_compute_slowdown``, a copy-engine
ring exchange ``copy_engine_compute_slowdown``; collectives in flight together multiply their rates (sends,
receives and copy-engine steps count once). The remaining
work is re-timed whenever the rank's in-flight mix changes the rate; the rate depends only on the mix, which
makes the result independent of the order SimPy happens to process simultaneous events (symmetric and full
mode then agree bit for bit). Host transfers (``Transfer``) use copy engines over PCIe and do not slow
compute; host compute (``device='cpu'``) is never slowed.

Communication time comes from the cost model: closed form per op (``fast``), or, in ``flow`` mode, a
collective runs its algorithm's phases (each phase: its latency, then its transfers as concurrent flows
on topology links, finishing when the slowest does) and a send/receive pays its route latency and then
flows, all sharing links max-min fairly (:mod:`simgrid.engine.flows`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import simpy
from simpy.events import NORMAL

from simgrid.engine.costmodel import DurationCache, PhaseLike
from simgrid.engine.deadlock import SHOWN_RANKS, blocked_at, deadlock_message
from simgrid.engine.flows import FlowNetwork
from simgrid.engine.memory import MemoryEvent
from simgrid.engine.overlap import OverlapModel
from simgrid.errors import SimulationError
from simgrid.ir import Alloc, Collective, Compute, Free, Op, Program, Recv, Send, Transfer, Wait, format_op
from simgrid.ir.ops import p2p_stream_key
from simgrid.trace import TraceRow, p2p_match_id

_row: Any = tuple.__new__
"""``_row(TraceRow, (every field))`` builds a row without the named tuple's Python-level ``__new__`` (which
fills defaults); a run makes hundreds of thousands of rows. Every field must be given, in order."""


class _Stream:
    __slots__ = ("busy", "label", "queue")

    def __init__(self, label: str) -> None:
        self.busy = False
        self.queue: deque[_Comm] = deque()
        self.label = label
        """The trace's stream name (``comm:<group>``, ``p2p:<peer>``, ``pcie:<direction>``)."""


class _Comm:
    """One asynchronous op on one rank."""

    __slots__ = ("done", "end", "op", "rank", "seq", "start", "stream")

    def __init__(self, rank: _Rank, op: Op, stream: _Stream) -> None:
        self.rank = rank
        self.op = op
        self.stream = stream
        self.seq = 0
        self.start = -1.0
        self.end = -1.0
        self.done = False


class _Instance:
    """One collective call, one send/receive pair, or one host transfer: the unit that starts together.

    In the fast model it is also the SimPy event of its own end (``callbacks``/``_ok`` are all that
    ``simpy.Environment.step`` reads), which saves a Timeout and a closure per communication op."""

    __slots__ = ("_ok", "callbacks", "expected", "members", "op")

    def __init__(self, op: Op, expected: int) -> None:
        self.op = op
        self.expected = expected
        self.members: list[_Comm] = []
        self.callbacks: list[Callable[[Any], None]] | None = None
        self._ok = True


class _ComputeEnd:
    """The SimPy event of a compute op's (possibly re-timed) end; stale when ``version`` is outdated."""

    __slots__ = ("_ok", "callbacks", "rank", "version")

    def __init__(self, rank: _Rank, version: int, callback: Callable[[Any], None]) -> None:
        self.rank = rank
        self.version = version
        self.callbacks: list[Callable[[Any], None]] | None = [callback]
        self._ok = True


class _Rank:
    __slots__ = ("c_left", "c_op", "c_rate", "c_seg", "c_start", "c_ver", "coll_seq", "handles", "inflight",
                 "live", "mem", "n", "ops", "ptr", "rank", "speed", "streams", "wait_op", "wait_start", "waiting")

    def __init__(self, rank: int, ops: tuple[Op, ...], speed: float) -> None:
        self.rank = rank
        self.ops = ops
        self.n = len(ops)
        self.ptr = 0
        self.speed = speed
        self.streams: dict[Any, _Stream] = {}
        self.handles: dict[str, _Comm] = {}
        self.coll_seq: dict[str, int] = {}
        self.inflight = 0
        """In-flight communication counted by kind (:meth:`OverlapModel.weight`); 0: none."""
        self.waiting: _Comm | None = None
        self.wait_start = 0.0
        self.wait_op: Any = None
        self.c_op: Compute | None = None
        self.c_start = self.c_seg = self.c_left = 0.0
        self.c_rate = 1.0
        self.c_ver = 0
        self.mem: list[MemoryEvent] = []
        self.live: dict[str, tuple[int, str]] = {}


class Interpreter:
    """Runs the simulated ranks of one program to completion."""

    def __init__(self, program: Program, durations: DurationCache, simulated: Sequence[int], *,
                 comm_model: str, speed_factors: dict[int, float]) -> None:
        self.program = program
        self.durations = durations
        self.cost = durations.cost
        self.flow = comm_model == "flow"
        self.env = simpy.Environment(initial_time=0.0)
        self.network = FlowNetwork(self.env)
        self.overlap = OverlapModel(self.cost)
        self.slowdown = self.overlap.active
        self.sim_set = frozenset(simulated)
        self.states = {r: _Rank(r, program.ranks[r], speed_factors.get(r, 1.0)) for r in simulated}
        self.rows: list[TraceRow] = []
        self.makespan_s = 0.0
        self._pending: dict[Any, _Instance] = {}
        self._expected: dict[str, int] = {}
        self._text: dict[int, str] = {}

    # -- driver ------------------------------------------------------------------------------------
    def run(self) -> None:
        for st in self.states.values():
            self._advance(st)
        self.env.run()
        stuck = [st for st in self.states.values() if st.ptr < st.n or st.waiting is not None]
        if stuck or self._pending:
            raise SimulationError(self._deadlock_message(stuck))

    def _text_of(self, op: Op) -> str:
        text = self._text.get(id(op))
        if text is None:
            text = self._text[id(op)] = format_op(op)
        return text

    # -- the rank walk -----------------------------------------------------------------------------
    def _advance(self, st: _Rank) -> None:
        # The walk runs every op that takes no simulated time (memory ops, waits on finished handles,
        # issues of communication) inline and returns only when the rank must wait for time to pass.
        ops, now, n = st.ops, self.env.now, st.n
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
                if not comm.done:
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
            elif t is Free:
                freed = st.live.pop(op.name, None)
                if freed is None:
                    st.ptr = ptr
                    raise SimulationError(f"rank {st.rank}: FREE name={op.name} releases no live buffer")
                st.mem.append((now, -freed[0], freed[1]))
            else:
                st.ptr = ptr
                self._post(st, op)
        st.ptr = ptr

    def _start_compute(self, st: _Rank, op: Compute, duration: float) -> None:
        now = self.env.now
        st.c_op, st.c_start, st.c_seg, st.c_left = op, now, now, duration
        rate = st.c_rate = self.overlap.rate(st.inflight) if (st.inflight and op.device == "gpu") else 1.0
        st.c_ver += 1
        self.env.schedule(_ComputeEnd(st, st.c_ver, self._compute_timer),  # type: ignore[arg-type]
                          NORMAL, duration / rate)

    def _arm_compute(self, st: _Rank) -> None:
        st.c_ver += 1
        self.env.schedule(_ComputeEnd(st, st.c_ver, self._compute_timer),  # type: ignore[arg-type]
                          NORMAL, st.c_left / st.c_rate)

    def _compute_timer(self, event: _ComputeEnd) -> None:
        st = event.rank
        if event.version != st.c_ver:
            return  # re-timed since this timeout was armed
        self._compute_done(st)

    def _compute_done(self, st: _Rank) -> None:
        op = st.c_op
        assert op is not None
        st.c_op = None
        self._compute_row(st, op, st.c_start, self.env.now)
        self._advance(st)

    def _compute_row(self, st: _Rank, op: Compute, start: float, end: float) -> None:
        stream = "host" if op.device == "cpu" else "compute"
        self.rows.append(_row(TraceRow, (st.rank, stream, op, op.kind, "compute", start, end, 0, float(op.flops),
                                         op.stage, op.microbatch, "", 0.0)))
        if end > self.makespan_s:
            self.makespan_s = end

    def _inflight_changed(self, st: _Rank) -> None:
        op = st.c_op
        if op is None or not self.slowdown or op.device != "gpu":
            return
        rate = self.overlap.rate(st.inflight)
        if rate == st.c_rate:
            return
        now = self.env.now
        st.c_left = max(st.c_left - (now - st.c_seg) * st.c_rate, 0.0)
        st.c_seg, st.c_rate = now, rate
        self._arm_compute(st)

    # -- communication -----------------------------------------------------------------------------
    def _post(self, st: _Rank, op: Any) -> None:
        t = type(op)
        if t is Collective:
            key: Any = op.group
        elif t is Send or t is Recv:  # a grouped op has its own direction's stream (Send.grouped)
            key = op.peer if not op.grouped else p2p_stream_key(op)
        elif t is Transfer:
            key = ("pcie", op.direction)
        else:
            raise SimulationError(f"rank {st.rank}: {op!r} is not an IR op the engine knows")
        streams = st.streams
        stream = streams.get(key)
        if stream is None:
            label = f"comm:{key}" if t is Collective else f"p2p:{key}" if t is not Transfer else f"pcie:{key[1]}"
            stream = streams[key] = _Stream(label)
        comm = _Comm(st, op, stream)
        st.handles[op.handle] = comm
        if t is Collective:
            coll_seq = st.coll_seq
            seq = coll_seq.get(key, 0)
            coll_seq[key] = seq + 1
            comm.seq = seq
        if stream.busy:
            stream.queue.append(comm)
        else:
            stream.busy = True
            self._ready(comm)

    def _ready(self, comm: _Comm) -> None:
        op: Any = comm.op
        t = type(op)
        if t is Collective:
            group = op.group
            expected = self._expected.get(group)
            if expected is None:
                expected = self._expected[group] = self._simulated_members(op, comm.rank.rank)
            if expected == 1:
                self._start_single(op, comm)
                return
            key: Any = (group, comm.seq)
        elif t is Send:
            k = op.key  # a plain tuple hashes and compares far faster than the P2PKey dataclass
            key, expected = (comm.rank.rank, op.peer, k.src_stage, k.dst_stage, k.microbatch, k.direction), 2
        elif t is Recv:
            k = op.key
            key, expected = (op.peer, comm.rank.rank, k.src_stage, k.dst_stage, k.microbatch, k.direction), 2
        else:
            self._start_single(op, comm)
            return
        pending = self._pending
        inst = pending.get(key)
        if inst is None:
            inst = pending[key] = _Instance(op, expected)
        members = inst.members
        members.append(comm)
        if len(members) == inst.expected:
            del pending[key]
            self._start(inst)

    def _start_single(self, op: Op, comm: _Comm) -> None:
        single = _Instance(op, 1)
        single.members.append(comm)
        self._start(single)

    def _simulated_members(self, op: Collective, rank: int) -> int:
        members = self.program.groups.get(op.group)
        if members is None:
            raise SimulationError(f"rank {rank}: collective on group {op.group!r}, which the program does not define")
        if rank not in members:
            raise SimulationError(f"rank {rank} issues a collective on group {op.group!r} but is not a member of it")
        return sum(1 for m in members if m in self.sim_set)

    def _start(self, inst: _Instance) -> None:
        now = self.env.now
        weight = self.overlap.weight(inst.op)
        retime = self.slowdown
        for comm in inst.members:
            comm.start = now
            if weight:
                st = comm.rank
                st.inflight += weight
                if retime and st.c_op is not None:
                    self._inflight_changed(st)
        if self.flow and type(inst.op) is not Transfer:
            self._start_flows(inst)
            return
        inst.callbacks = [self._finish_event]
        self.env.schedule(inst, NORMAL, self._fast_duration(inst))  # type: ignore[arg-type]

    def _finish_event(self, event: _Instance) -> None:
        self._finish(event)

    def _fast_duration(self, inst: _Instance) -> float:
        op: Any = inst.op
        if type(op) is Collective:
            return self.durations.collective(op)
        if type(op) is Transfer:
            return self.durations.transfer(op, inst.members[0].rank.rank)
        src, dst = self._p2p_ends(inst)
        return self.durations.p2p(op.bytes, src, dst)

    @staticmethod
    def _p2p_ends(inst: _Instance) -> tuple[int, int]:
        op: Any = inst.op
        rank = inst.members[0].rank.rank
        return (rank, op.peer) if type(op) is Send else (op.peer, rank)

    def _start_flows(self, inst: _Instance) -> None:
        op: Any = inst.op
        finish: Callable[[], None] = lambda: self._finish(inst)  # noqa: E731 - a named callback reads better
        if type(op) is Collective:
            ranks = tuple(self.program.groups[op.group])
            self._run_phases(list(self.cost.phases(op, ranks)), 0, finish)
            return
        src, dst = self._p2p_ends(inst)
        route = self.cost.route(src, dst)
        latency = sum(link.latency_s for link in route)
        nbytes = float(op.bytes)
        self.env.timeout(latency).callbacks.append(lambda _e: self.network.start(route, nbytes, finish))

    def _run_phases(self, steps: list[PhaseLike], index: int, finish: Callable[[], None]) -> None:
        """Run algorithm steps one after the other: each pays its latency, then moves its transfers.

        A step repeated k times runs as one step with k times the bytes and the latency: identical
        under constant contention, and the fluid equivalent when contention changes part-way (it
        saves k - 1 rate recomputations per step, which is what makes flow mode usable on rings)."""
        if index == len(steps):
            finish()
            return
        phase = steps[index]
        repeat = int(getattr(phase, "repeat", 1) or 1)
        transfers = [(self.cost.route(src, dst), nbytes * repeat) for src, dst, nbytes in phase.transfers
                     if src != dst]

        def launch(_e: object) -> None:
            self.network.start_all(transfers, lambda: self._run_phases(steps, index + 1, finish))

        self.env.timeout(phase.latency_s * repeat).callbacks.append(launch)

    def _finish(self, inst: _Instance) -> None:
        now = self.env.now
        if now > self.makespan_s:
            self.makespan_s = now
        op = inst.op
        weight = self.overlap.weight(op)
        retime = self.slowdown
        members = inst.members
        rows = self.rows
        comm_row = self._comm_row
        for comm in members:
            comm.end, comm.done = now, True
            st = comm.rank
            rows.append(comm_row(st.rank, comm))
            if weight:
                st.inflight -= weight
                if retime and st.c_op is not None:
                    self._inflight_changed(st)
        resume: list[_Rank] = []
        for comm in members:
            stream = comm.stream
            if stream.queue:
                self._ready(stream.queue.popleft())
            else:
                stream.busy = False
            st = comm.rank
            if st.waiting is comm:
                st.waiting = None
                if now > st.wait_start:
                    exposed = now - max(st.wait_start, comm.start)
                    rows.append(TraceRow(st.rank, "compute", st.wait_op, "WAIT", self._purpose(comm.op),
                                         st.wait_start, now, exposed_s=exposed))
                resume.append(st)
        for st in resume:
            self._advance(st)

    @staticmethod
    def _purpose(op: Op) -> str:
        if isinstance(op, Collective):
            return op.purpose
        if isinstance(op, Transfer):
            return "offload"
        return "pp"

    @staticmethod
    def _comm_row(rank: int, comm: _Comm) -> TraceRow:
        # ``op`` holds the IR op itself; the Trace renders its text only when read (see Trace.rows).
        op: Any = comm.op
        raw: Any = op
        t = type(op)
        label = comm.stream.label
        if t is Collective:
            return _row(TraceRow, (rank, label, raw, op.kind, op.purpose, comm.start, comm.end, op.bytes, 0.0, -1, -1,
                                   "", 0.0))
        if t is Send:
            return _row(TraceRow, (rank, label, raw, "SEND", "pp", comm.start, comm.end, op.bytes, 0.0,
                                   op.key.src_stage, op.key.microbatch, p2p_match_id(rank, op.peer, op), 0.0))
        if t is Recv:
            return _row(TraceRow, (rank, label, raw, "RECV", "pp", comm.start, comm.end, op.bytes, 0.0,
                                   op.key.dst_stage, op.key.microbatch, p2p_match_id(op.peer, rank, op), 0.0))
        return _row(TraceRow, (rank, label, op, op.direction, "offload", comm.start, comm.end, op.bytes, 0.0, -1, -1,
                               "", 0.0))

    # -- diagnostics -------------------------------------------------------------------------------
    def _deadlock_message(self, stuck: list[_Rank]) -> str:
        shown = []
        for st in stuck[:SHOWN_RANKS]:
            comm = st.waiting
            waiting_on = None if comm is None else self._text_of(comm.op)
            started = comm is None or comm.start >= 0
            shown.append((st.rank, blocked_at(waiting_on, started=started, ptr=st.ptr, n=st.n)))
        return deadlock_message(self.env.now, shown, len(stuck), len(self._pending))
