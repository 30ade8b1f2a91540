"""Trace rows and memory timelines of a fast-loop run, made when something reads them.

A full-mode step of thousands of ranks has millions of trace rows, and most callers (the step metrics,
a layout search, a scaling curve) never read one: they need the reductions the loop keeps as it runs
(:class:`~simgrid.trace.TraceAggregates`). So with ``rows=True`` :class:`~simgrid.engine.fast.loop.FastLoop`
keeps only a flat *tape* of the values each row is made of, in row order, and the time of each
Alloc/Free, and this module turns those into exactly the rows and memory events the loop would have
built eagerly (and the SimPy interpreter builds): ``tests/engine/test_lazy_trace.py`` compares them
with the SimPy interpreter's over a set of layouts.

Tape entries, by the type of their second value:

* ``Compute``: ``rank, op, start_s, end_s``;
* ``Wait``: ``rank, op, start_s, end_s, purpose, exposed_s`` (the wait blocked the compute stream);
* any communication op: ``rank, op, start_s, end_s`` (the stream label and the other columns follow
  from the op, as in :func:`simgrid.trace.row_for_op`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from simgrid.engine.memory import MemoryEvent
from simgrid.gcpause import collector_paused
from simgrid.ir import Alloc, Collective, Compute, Free, Op, Recv, Send, Transfer, Wait
from simgrid.ir.ops import p2p_stream_key
from simgrid.trace import TraceRow, p2p_match_id

_row: Any = tuple.__new__
"""``_row(TraceRow, (every field))``: a row without the named tuple's Python-level ``__new__``."""


def rows_from_tape(tape: Sequence[Any]) -> list[TraceRow]:
    """The trace rows recorded on ``tape`` (see the module docstring), in order."""
    with collector_paused():  # millions of new rows: the collector would rescan them again and again
        return _rows(tape)


def _rows(tape: Sequence[Any]) -> list[TraceRow]:
    out: list[TraceRow] = []
    put = out.append
    labels: dict[Any, str] = {}
    i, n = 0, len(tape)
    while i < n:
        rank, op, start, end = tape[i], tape[i + 1], tape[i + 2], tape[i + 3]
        t = type(op)
        if t is Compute:
            put(_row(TraceRow, (rank, "host" if op.device == "cpu" else "compute", op, op.kind, "compute", start, end,
                                0, float(op.flops), op.stage, op.microbatch, "", 0.0)))
            i += 4
            continue
        if t is Wait:
            put(_row(TraceRow, (rank, "compute", op, "WAIT", tape[i + 4], start, end, 0, 0.0, -1, -1, "", tape[i + 5])))
            i += 6
            continue
        i += 4
        # The stream label the loop gives the op's stream (one string per group, peer or direction).
        key = (op.group if t is Collective else ("pcie", op.direction) if t is Transfer
               else op.peer if not op.grouped else p2p_stream_key(op))
        label = labels.get((t is Collective, key))
        if label is None:
            label = labels[(t is Collective, key)] = (
                f"comm:{key}" if t is Collective else f"pcie:{key[1]}" if type(key) is tuple else f"p2p:{key}")
        if t is Collective:
            put(_row(TraceRow, (rank, label, op, op.kind, op.purpose, start, end, op.bytes, 0.0, -1, -1, "", 0.0)))
        elif t is Send:
            put(_row(TraceRow, (rank, label, op, "SEND", "pp", start, end, op.bytes, 0.0, op.key.src_stage,
                                op.key.microbatch, p2p_match_id(rank, op.peer, op), 0.0)))
        elif t is Recv:
            put(_row(TraceRow, (rank, label, op, "RECV", "pp", start, end, op.bytes, 0.0, op.key.dst_stage,
                                op.key.microbatch, p2p_match_id(op.peer, rank, op), 0.0)))
        else:
            put(_row(TraceRow, (rank, label, op, op.direction, "offload", start, end, op.bytes, 0.0, -1, -1, "", 0.0)))
    return out


def memory_events(ops: Sequence[Op], times: Sequence[float]) -> list[MemoryEvent]:
    """(time_s, signed bytes, category) of each Alloc/Free of ``ops``, in program order, at ``times``
    (one per Alloc/Free, as the loop recorded them); a Free releases the size and category of the live
    allocation of its name."""
    out: list[MemoryEvent] = []
    live: dict[str, Alloc] = {}
    at = iter(times)
    for op in ops:
        if isinstance(op, Alloc):
            live[op.name] = op
            out.append((next(at), op.bytes, op.category))
        elif isinstance(op, Free):
            freed = live.pop(op.name)
            out.append((next(at), -freed.bytes, freed.category))
    return out
