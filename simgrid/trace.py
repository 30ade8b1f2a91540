"""Traces: one row per executed op, shared by the simulator and the executor.

The engine (predicted) and the executor (measured) both produce a :class:`Trace`, so the same code
plots, diffs and exports either. A row is a plain :class:`TraceRow` named tuple; build a trace from
measured timings with :meth:`Trace.from_rows` (or :meth:`Trace.from_dataframe`) and :func:`row_for_op`,
which fills the descriptive columns from the IR op exactly as the engine does.

Row conventions:

* ``stream`` is :func:`simgrid.ir.stream_of` of the op (``compute``, ``comm:<group>``, ``p2p:<peer>``,
  ``pcie:<dir>``, ``host``).
* ``kind``: the compute kind (``F B I W R OPT``), ``SEND``, ``RECV``, the collective kind
  (``all_reduce`` ...), the transfer direction (``d2h``/``h2d``), or ``WAIT`` for the time the compute
  stream sat blocked in a :class:`~simgrid.ir.Wait` (only waits that actually blocked get a row).
* ``purpose``: ``compute`` for compute ops, ``pp`` for SEND/RECV, the collective's purpose
  (``tp``, ``dp-grad``, ...), ``offload`` for host transfers; a WAIT row carries the purpose of the
  op it waited for.
* ``match`` pairs a SEND row with its RECV row (equal non-empty strings), for flow arrows.
* ``exposed_s`` (WAIT rows only): the part of the blocked time during which the waited-for
  communication was actually running, as opposed to waiting for a peer to issue it.

``meta`` holds JSON scalars and small mappings; the engine sets ``world_size`` and ``multiplicity``
(how many ranks each simulated rank stands for, in symmetric mode). :func:`simgrid.simulate` adds what
the step's metrics are computed from (``model``, ``layout``, ``cluster`` and ``metrics_inputs``; see
:func:`simgrid.metrics.metrics_from_trace`), so a saved trace, simgrid or Chrome format, reproduces the
run's report. Chrome trace events carry every row field in ``args`` (``exposed_s`` of a WAIT included),
so reading one back loses nothing the metrics use.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from simgrid.errors import SimgridError
from simgrid.gcpause import collector_paused
from simgrid.ir import Collective, Compute, Op, Recv, Send, Transfer, Wait, format_op, stream_of

if TYPE_CHECKING:
    import pandas as pd

TRACE_FORMAT = "simgrid-trace"
TRACE_VERSION = 1

COMPUTE_KINDS = ("F", "B", "I", "W", "R", "OPT")

PIPELINE_KINDS = frozenset({"F", "B", "I", "W", "R"})
"""Compute kinds that make up the pipeline (everything but the optimizer step)."""

#: Collective purpose -> the communication kind metrics report (tp, pp or dp).
PURPOSE_TO_COMM_KIND: dict[str, str] = {
    "tp": "tp",
    "cp": "cp",
    "ep": "ep",
    "pp": "pp",
    # The tied-embedding gradient sync exists only because the pipeline splits embedding and head.
    "embed-grad": "pp",
    "pp-gather": "pp",
    "dp-grad": "dp",
    "zero-grad": "dp",
    "zero-param": "dp",
    "ps-reduce": "dp",
    "ps-broadcast": "dp",
    "sync": "dp",
}


class TraceRow(NamedTuple):
    """One executed op (or one blocking wait) on one rank."""

    rank: int
    """Global rank."""
    stream: str
    """Stream the op ran on (see the module docstring)."""
    op: str
    """Op text (:func:`simgrid.ir.format_op`) or a short name."""
    kind: str
    """F/B/I/W/R/OPT, SEND, RECV, a collective kind, d2h/h2d, or WAIT."""
    purpose: str
    """compute, pp, tp, dp-grad, ..., offload."""
    start_s: float
    """Start time in seconds from the beginning of the step."""
    end_s: float
    """End time in seconds."""
    bytes: int = 0
    """Bytes moved (communication) or 0."""
    flops: float = 0.0
    """Floating-point operations executed (compute) or 0."""
    stage: int = -1
    """Pipeline stage (compute: the op's stage; SEND: source stage; RECV: destination stage) or -1."""
    microbatch: int = -1
    """Micro-batch index or -1."""
    match: str = ""
    """Pairing id shared by a SEND row and its RECV row; empty otherwise."""
    exposed_s: float = 0.0
    """WAIT rows: blocked seconds during which the awaited communication was running."""

    @property
    def duration_s(self) -> float:
        """``end_s - start_s``."""
        return self.end_s - self.start_s


COLUMNS: tuple[str, ...] = TraceRow._fields


class TraceError(SimgridError):
    """A trace file or table is malformed."""


def comm_kind(purpose: str) -> str:
    """The communication kind (tp, pp, dp) a purpose is reported under; ``other`` for offload etc."""
    return PURPOSE_TO_COMM_KIND.get(purpose, "other")


def p2p_match_id(src: int, dst: int, op: Send | Recv) -> str:
    """Id shared by a SEND on ``src`` and the matching RECV on ``dst``."""
    k = op.key
    return f"{src}>{dst}:{k.src_stage}>{k.dst_stage}:{k.direction}:{k.microbatch}"


def row_for_op(rank: int, op: Op, start_s: float, end_s: float, *, text: str | None = None) -> TraceRow:
    """The trace row of ``op`` run on ``rank`` over ``[start_s, end_s]`` (descriptive columns from the op)."""
    op_text = format_op(op) if text is None else text
    stream = stream_of(op)
    if isinstance(op, Compute):
        return TraceRow(rank, stream, op_text, op.kind, "compute", start_s, end_s, 0, float(op.flops),
                        op.stage, op.microbatch)
    if isinstance(op, Send):
        return TraceRow(rank, stream, op_text, "SEND", "pp", start_s, end_s, op.bytes, 0.0, op.key.src_stage,
                        op.key.microbatch, p2p_match_id(rank, op.peer, op))
    if isinstance(op, Recv):
        return TraceRow(rank, stream, op_text, "RECV", "pp", start_s, end_s, op.bytes, 0.0, op.key.dst_stage,
                        op.key.microbatch, p2p_match_id(op.peer, rank, op))
    if isinstance(op, Collective):
        return TraceRow(rank, stream, op_text, op.kind, op.purpose, start_s, end_s, op.bytes)
    if isinstance(op, Transfer):
        return TraceRow(rank, stream, op_text, op.direction, "offload", start_s, end_s, op.bytes)
    if isinstance(op, Wait):
        return TraceRow(rank, stream, op_text, "WAIT", "", start_s, end_s)
    raise TraceError(f"trace: op {op!r} runs on no stream and gets no row (allocations and frees are not traced)")


@dataclass(frozen=True, kw_only=True)
class TraceAggregates:
    """What the step metrics (:mod:`simgrid.metrics`) read from a trace's rows, reduced in row order.

    :meth:`Trace.aggregates` makes them with one pass over the rows; the fast engine keeps the same
    reductions as it runs (the same additions in the same order), so a trace whose rows are never
    materialised still gives its metrics bit for bit.
    """

    makespan_s: float
    """Latest end of any row (0 without rows)."""
    window_s: tuple[float, float]
    """First start and last end of any F/B/I/W/R row; ``(0, 0)`` without one."""
    busy_s: Mapping[int, float]
    """Seconds of F/B/I/W/R rows per rank (each ``(busy + end) - start``), in order of each rank's first one."""
    executed_flops: float
    """FLOPs of every row times its rank's multiplicity, summed in row order."""
    exposed_s: Mapping[str, float]
    """Exposed seconds of WAIT rows times the rank's multiplicity, summed in row order, by communication
    kind (:data:`PURPOSE_TO_COMM_KIND` values; other purposes are left out)."""
    waits: Sequence[float]
    """The WAIT rows with exposed seconds > 0, in row order, flat: rank, end_s, exposed_s, rank, ... (an
    ``array('d')``: the rank as a float)."""
    weights: Mapping[int, int]
    """Every rank with rows (ascending) -> its multiplicity."""


def aggregate_rows(rows: Iterable[TraceRow], multiplicity: Callable[[int], int]) -> TraceAggregates:
    """The :class:`TraceAggregates` of ``rows`` (``multiplicity(rank)``: ranks each traced rank stands for)."""
    makespan: float | None = None
    t0, t1 = float("inf"), float("-inf")
    busy: dict[int, float] = {}
    flops = 0.0
    kinds = dict.fromkeys(PURPOSE_TO_COMM_KIND.values(), 0.0)
    waits = array("d")
    weights: dict[int, int] = {}
    pipeline = PIPELINE_KINDS
    for row in rows:
        rank, start, end = row.rank, row.start_s, row.end_s
        weight = weights.get(rank)
        if weight is None:
            weight = weights[rank] = multiplicity(rank)
        if makespan is None or end > makespan:
            makespan = end
        if row.flops:
            flops += row.flops * weight
        kind = row.kind
        if kind in pipeline:
            if start < t0:
                t0 = start
            if end > t1:
                t1 = end
            busy[rank] = busy.get(rank, 0.0) + end - start
        elif kind == "WAIT" and row.exposed_s > 0:
            comm = PURPOSE_TO_COMM_KIND.get(row.purpose)
            if comm is not None:
                kinds[comm] += row.exposed_s * weight
            waits.extend((rank, end, row.exposed_s))
    return TraceAggregates(
        makespan_s=0.0 if makespan is None else makespan,
        window_s=(t0, t1) if busy else (0.0, 0.0),
        busy_s=busy,
        executed_flops=flops,
        exposed_s=kinds,
        waits=waits,
        weights={r: weights[r] for r in sorted(weights)},
    )


class Trace:
    """Rows of executed ops plus metadata; convertible to pandas, Chrome trace JSON and back.

    A trace may be *deferred* (:meth:`deferred`): the engine hands over a recipe for its rows, made the
    first time something reads them, together with the row count, the ranks and the
    :class:`TraceAggregates` it kept while running, so the step's metrics never need the rows.
    """

    def __init__(self, rows: Iterable[TraceRow] = (), meta: Mapping[str, Any] | None = None, *,
                 render_ops: bool = False) -> None:
        self._list: list[TraceRow] | None = list(rows)
        self._source: Callable[[], list[TraceRow]] | None = None
        self._length = 0
        self._known_ranks: tuple[int, ...] = ()
        self._aggregates: TraceAggregates | None = None
        self._unrendered = render_ops
        self.meta: dict[str, Any] = dict(meta or {})

    @classmethod
    def deferred(cls, source: Callable[[], list[TraceRow]], *, length: int, aggregates: TraceAggregates,
                 meta: Mapping[str, Any] | None = None, render_ops: bool = True) -> Trace:
        """A trace whose rows are ``source()``, called once, the first time the rows are read.

        ``length`` is the number of rows ``source`` makes and ``aggregates`` their
        :class:`TraceAggregates` (its ``weights`` name the ranks with rows): ``len``, :meth:`ranks`,
        :attr:`makespan_s` and the metrics answer from them without making the rows.
        """
        trace = cls((), meta, render_ops=render_ops)
        trace._list, trace._source = None, source
        trace._length, trace._known_ranks, trace._aggregates = length, tuple(aggregates.weights), aggregates
        return trace

    @property
    def materialised(self) -> bool:
        """Whether the rows exist as :class:`TraceRow` values (always, unless the trace is deferred and unread)."""
        return self._list is not None

    @property
    def _rows(self) -> list[TraceRow]:
        found = self._list
        if found is None:
            assert self._source is not None  # a deferred trace keeps its source until it is read
            found = self._list = self._source()
            self._source = None
            if len(found) != self._length:
                raise TraceError(f"trace: the deferred rows number {len(found)}, not the {self._length} announced")
        return found

    @property
    def rows(self) -> list[TraceRow]:
        """Every row, with op text rendered."""
        if self._unrendered:
            # The engine stores the IR op itself in ``op`` and renders text only when someone reads it:
            # formatting a million ops costs seconds, and metrics and plots never need the text.
            with collector_paused():
                self._list = _rendered(self._rows)
            self._unrendered = False
        return self._rows

    @property
    def timing_rows(self) -> list[TraceRow]:
        """Every row without forcing op text (``op`` may still be the IR op); for metrics and plots."""
        return self._rows

    def aggregates(self) -> TraceAggregates:
        """The rows' :class:`TraceAggregates` under the current ``meta`` multiplicities: those the engine
        kept for a deferred trace (while nobody has read, and so could have changed, its rows), else one
        pass over the rows."""
        kept = self._aggregates
        if kept is not None and self._list is None and all(
                self.multiplicity(r) == w for r, w in kept.weights.items()):
            return kept
        return aggregate_rows(self._rows, self.multiplicity)

    def __getstate__(self) -> dict[str, Any]:
        # A deferred trace's source is a closure over the engine's records: pickle the rows instead.
        self._rows  # noqa: B018 - materialise
        return dict(self.__dict__)

    # -- construction ----------------------------------------------------------------------------
    @classmethod
    def from_rows(cls, rows: Iterable[TraceRow | tuple[Any, ...] | Mapping[str, Any]],
                  meta: Mapping[str, Any] | None = None) -> Trace:
        """Build from TraceRow values, plain tuples in column order, or mappings keyed by column."""
        out: list[TraceRow] = []
        for i, row in enumerate(rows):
            out.append(_coerce_row(row, i))
        return cls(out, meta)

    @classmethod
    def from_dataframe(cls, df: pd.DataFrame, meta: Mapping[str, Any] | None = None) -> Trace:
        """Build from a DataFrame with (at least) the required columns rank..end_s."""
        missing = [c for c in COLUMNS[:7] if c not in df.columns]
        if missing:
            raise TraceError(f"trace: the table lacks column(s) {missing}; required: {list(COLUMNS[:7])}")
        present = [c for c in COLUMNS if c in df.columns]
        records = df[present].to_dict("records")
        return cls.from_rows(records, meta)

    # -- views -------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._list) if self._list is not None else self._length

    def __repr__(self) -> str:
        ranks = self.ranks()
        return f"Trace({len(self)} rows, ranks={ranks[:8]}{'...' if len(ranks) > 8 else ''})"

    def ranks(self) -> list[int]:
        """Ranks that have rows, ascending."""
        if self._list is None:
            return list(self._known_ranks)
        return sorted({r.rank for r in self._list})

    def rows_of(self, rank: int) -> list[TraceRow]:
        """Rows of one rank, in start order."""
        return sorted((r for r in self._rows if r.rank == rank), key=lambda r: (r.start_s, r.end_s))

    @property
    def makespan_s(self) -> float:
        """Latest end time of any row (0 for an empty trace)."""
        if self._list is None and self._aggregates is not None:
            return self._aggregates.makespan_s
        return max((r.end_s for r in self._rows), default=0.0)

    def multiplicity(self, rank: int) -> int:
        """How many ranks the traced ``rank`` stands for (1 unless the engine ran in symmetric mode)."""
        mult = self.meta.get("multiplicity") or {}
        return int(mult.get(str(rank), mult.get(rank, 1))) if isinstance(mult, Mapping) else 1

    def to_dataframe(self) -> pd.DataFrame:
        """One DataFrame row per trace row, columns as :data:`COLUMNS` plus ``duration_s``."""
        import pandas as pd

        df = pd.DataFrame.from_records(self.rows, columns=list(COLUMNS))
        df["duration_s"] = df["end_s"] - df["start_s"]
        return df

    # -- files -------------------------------------------------------------------------------------
    def to_json_dict(self) -> dict[str, Any]:
        """JSON-ready form (see :meth:`save`)."""
        return {
            "format": TRACE_FORMAT,
            "version": TRACE_VERSION,
            "meta": self.meta,
            "columns": list(COLUMNS),
            "rows": [list(r) for r in self.rows],
        }

    def save(self, path: str | Path) -> Path:
        """Write the trace as JSON (rows as arrays in :data:`COLUMNS` order); returns the path."""
        path = Path(path)
        path.write_text(json.dumps(self.to_json_dict(), separators=(",", ":")))
        return path

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        """Read a trace written by :meth:`save`."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise TraceError(f"trace file {str(path)!r} cannot be read as JSON: {exc}") from None
        if not isinstance(data, dict) or data.get("format") != TRACE_FORMAT:
            raise TraceError(f"trace file {str(path)!r} is not a simgrid trace (format must be {TRACE_FORMAT!r})")
        columns = data.get("columns")
        if not isinstance(columns, list):
            raise TraceError(f"trace file {str(path)!r}: 'columns' must be a list of column names")
        rows = [dict(zip(columns, values, strict=False)) for values in data.get("rows", [])]
        return cls.from_rows(rows, data.get("meta") or {})

    def to_chrome_trace(self, path: str | Path | None = None) -> dict[str, Any]:
        """Chrome trace JSON (opens in Perfetto / chrome://tracing): pid = rank, tid = stream.

        Complete ("X") events in microseconds, process/thread name metadata, and flow arrows
        ("s" at a SEND, "f" at its RECV). Written to ``path`` when given; the dict is returned.
        """
        events: list[dict[str, Any]] = []
        tids: dict[tuple[int, str], int] = {}
        for rank in self.ranks():
            events.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
                           "args": {"name": f"rank {rank}"}})
            events.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0,
                           "args": {"sort_index": rank}})
        sends: dict[str, TraceRow] = {}
        recvs: dict[str, TraceRow] = {}
        for row in self.rows:
            key = (row.rank, row.stream)
            tid = tids.get(key)
            if tid is None:
                tid = tids[key] = _stream_sort_key(row.stream, len(tids))
                events.append({"ph": "M", "name": "thread_name", "pid": row.rank, "tid": tid,
                               "args": {"name": row.stream}})
            args: dict[str, Any] = {"op": row.op, "bytes": row.bytes, "flops": row.flops, "kind": row.kind,
                                    "purpose": row.purpose, "stage": row.stage, "microbatch": row.microbatch}
            if row.match:
                args["match"] = row.match
            if row.exposed_s:
                args["exposed_s"] = row.exposed_s  # the part of a WAIT that is exposed communication
            events.append({
                "ph": "X", "name": _event_name(row), "cat": row.purpose or row.kind, "pid": row.rank, "tid": tid,
                "ts": row.start_s * 1e6, "dur": max(row.end_s - row.start_s, 0.0) * 1e6, "args": args,
            })
            if row.match:
                (sends if row.kind == "SEND" else recvs)[row.match] = row
        for flow_id, (match, send) in enumerate(sorted(sends.items())):
            recv = recvs.get(match)
            if recv is None:
                continue
            events.append({"ph": "s", "id": flow_id, "name": "p2p", "cat": "p2p", "pid": send.rank,
                           "tid": tids[(send.rank, send.stream)], "ts": send.start_s * 1e6})
            events.append({"ph": "f", "bp": "e", "id": flow_id, "name": "p2p", "cat": "p2p", "pid": recv.rank,
                           "tid": tids[(recv.rank, recv.stream)], "ts": recv.end_s * 1e6})
        out = {"traceEvents": events, "displayTimeUnit": "ms", "otherData": _jsonable(self.meta)}
        if path is not None:
            Path(path).write_text(json.dumps(out, separators=(",", ":")))
        return out


def _rendered(rows: list[TraceRow]) -> list[TraceRow]:
    cache: dict[int, str] = {}
    out = []
    for row in rows:
        op: Any = row.op
        if type(op) is not str:
            text = cache.get(id(op))
            if text is None:
                text = cache[id(op)] = format_op(op)
            row = row._replace(op=text)
        out.append(row)
    return out


def _stream_sort_key(stream: str, fallback: int) -> int:
    # Compute first, then communication streams in order of appearance: Perfetto sorts threads by tid.
    if stream == "compute":
        return 0
    if stream == "host":
        return 1
    return 2 + fallback


def _event_name(row: TraceRow) -> str:
    if row.kind in COMPUTE_KINDS and row.kind != "OPT":
        return f"{row.stage}{row.kind}{row.microbatch}"
    if row.kind == "WAIT":
        return f"WAIT {row.purpose}"
    if row.kind in ("SEND", "RECV"):
        return f"{row.kind} mb{row.microbatch}"
    return row.kind if not row.purpose or row.purpose == "compute" else f"{row.kind} {row.purpose}"


def _jsonable(meta: Mapping[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(meta, default=str))


_TYPES = (int, str, str, str, str, float, float, int, float, int, int, str, float)


def _coerce_row(row: TraceRow | tuple[Any, ...] | Mapping[str, Any], index: int) -> TraceRow:
    if isinstance(row, TraceRow):
        return row
    if isinstance(row, Mapping):
        missing = [c for c in COLUMNS[:7] if c not in row]
        if missing:
            raise TraceError(f"trace row {index}: missing field(s) {missing}; required: {list(COLUMNS[:7])}")
        values = [row.get(c, TraceRow._field_defaults.get(c)) for c in COLUMNS]
    else:
        if not 7 <= len(row) <= len(COLUMNS):
            raise TraceError(
                f"trace row {index}: has {len(row)} values; give 7 to {len(COLUMNS)} in the order {list(COLUMNS)}"
            )
        values = list(row) + [TraceRow._field_defaults[c] for c in COLUMNS[len(row):]]
    try:
        return TraceRow(*(t(v) if v is not None else t() for t, v in zip(_TYPES, values, strict=True)))
    except (TypeError, ValueError) as exc:
        raise TraceError(f"trace row {index}: {exc}; values {values!r}") from None
