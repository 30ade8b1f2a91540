"""What one rank measures in a step: timed :class:`simgrid.trace.TraceRow` rows, losses and the IR's memory peak.

Compute ops are timed from issue to end; communication from issue to observed completion; a WAIT gets a
row when the compute stream really blocked. Rows are built from timer marks only when the step ends
(:meth:`StepRecorder.resolve_rows`): on CUDA a mark is an event the GPU has not reached yet when it is taken,
and reading it at once would make the host wait for the GPU after every op, so the host could never queue
work ahead of the GPU as it does in a real training step. A segment that runs outside any compute op (at a send, a
gradient synchronisation, a tensor-parallel collective's issue or a ZeRO-3 FREE) gets a row of its own on
the compute stream, at the time it really ran, carrying the kind, stage and micro-batch of the compute op
it belongs to (:meth:`StepRecorder.deferred_segments`); segments run inside a compute op are in that op's
row already.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from executor.blockrun import BlockRun
from executor.timing import make_timer
from simgrid.ir.ops import Op
from simgrid.ir.text import format_op
from simgrid.trace import TraceRow, row_for_op

DEFERRED_NOTE = "deferred segment"
"""Marks the op text of a row timing lazy segments of a compute op that ran after it (see
:meth:`StepRecorder.deferred_segments`)."""

WAIT_ROW_MIN_S = 20e-6
"""A WAIT that blocked less than this gets no trace row (host-clock noise)."""

RowBuilder = Callable[[float, float], TraceRow | None]
"""Builds a trace row from its start and end in seconds from the step start (None: no row)."""


@dataclass
class StepResult:
    """What one rank measured in one step."""

    losses: dict[int, float] = field(default_factory=dict)
    """Micro-batch -> loss (ranks that run the head)."""
    rows: list[TraceRow] = field(default_factory=list)
    """Timed ops, seconds from the step start."""
    step_s: float = 0.0
    """This rank's time from step start to its last op's end."""
    peak_ir_bytes: int = 0
    """Peak of the live ALLOC bytes the IR declared."""


class StepRecorder:
    """The rows of one rank's current step, and which op is running (the base of :class:`executor.state.RankState`)."""

    def __init__(self, *, rank: int, ops: Sequence[Op], stage_of: dict[int, int], device: torch.device) -> None:
        self.rank = rank
        self.ops: tuple[Op, ...] = tuple(ops)
        self.texts = [format_op(op) for op in self.ops]
        #: Block -> global pipeline stage of the blocks this rank holds.
        self.stage_of = stage_of
        self.timer = make_timer(device)
        self.result = StepResult()
        #: Index of the op being dispatched, and the timer mark taken when its dispatch began.
        self.current_index = 0
        self.op_start: Any = None
        #: A compute op is running: lazy segments run now are inside its row.
        self.in_compute = False
        #: (block, micro-batch, "fwd" | "bwd") -> index of the compute op whose segments the run holds.
        self.segment_owner: dict[tuple[int, int, str], int] = {}
        #: Rows of this step not built yet: (start mark, end mark, builder from their seconds).
        self.unresolved: list[tuple[Any, Any, RowBuilder]] = []

    def add_row(self, start: Any, end: Any, build: RowBuilder) -> None:
        """A row built from the seconds of two timer marks when the step ends (``build`` may return None:
        no row)."""
        self.unresolved.append((start, end, build))

    def resolve_rows(self) -> None:
        """Build the step's rows, in the order they were added, from their marks (one device sync on CUDA)."""
        self.timer.resolve()
        for start, end, build in self.unresolved:
            row = build(self.timer.seconds(start), self.timer.seconds(end))
            if row is not None:
                self.result.rows.append(row)
        self.unresolved = []

    def row(self, op: Op, start: Any, end: Any, text: str, *, note: str = "") -> None:
        """A row for ``op`` between two timer marks."""
        full = text + (f"  # {note}" if note else "")
        self.add_row(start, end, lambda s, e: row_for_op(self.rank, op, s, e, text=full))

    @contextmanager
    def deferred_segments(self, run: BlockRun, phase: str) -> Iterator[None]:
        """Time the segments of ``run`` the body advances (``phase`` ``fwd`` or ``bwd``) outside any compute op.

        The IR counts such a segment (a residual add after the forward all-reduce, a norm backward after
        the gradient all-reduce) in the compute op that reached its cut, but the executor can only run it
        once the collective has delivered: at the next compute op (inside that op's row), a send, a
        gradient synchronisation or a ZeRO-3 FREE. Under sequence parallelism the issue of a gather the IR
        places *before* its compute op runs that op's first segments too. All but the first get a row of
        their own at the time they ran, with the kind, stage and micro-batch of the owning compute op
        (:attr:`segment_owner`), so per-kind compute time is whole and no time is counted twice (the rows
        of one rank's compute stream never overlap).
        """
        if self.in_compute:
            yield
            return
        before = _progress(run, phase)
        start = self.timer.mark()
        yield
        if _progress(run, phase) != before:
            self._deferred_row(run, phase, start, self.timer.mark())

    def _deferred_row(self, run: BlockRun, phase: str, start: Any, end: Any) -> None:
        block, mb = run.module.index, run.microbatch
        where = f"run at #{self.current_index} {self.texts[self.current_index]}"
        owner = self.segment_owner.get((block, mb, phase))
        if owner is None:  # no compute op reached the cut yet: named by the block, kind from the phase
            kind = "F" if phase == "fwd" else run.bwd_mode or "B"
            stage = self.stage_of.get(block, -1)
            self.add_row(start, end, lambda s, e: TraceRow(
                self.rank, "compute", f"{kind} b{block} m{mb}  # {DEFERRED_NOTE}, {where}", kind, "compute",
                s, e, 0, 0.0, stage, mb))
            return
        # No FLOPs: the op's own row carries all of them (metrics sum row FLOPs; counting them twice
        # would inflate the hardware FLOP rate).
        op, text = self.ops[owner], f"{self.texts[owner]}  # {DEFERRED_NOTE}, {where}"
        self.add_row(start, end, lambda s, e: row_for_op(self.rank, op, s, e, text=text)._replace(flops=0.0))


def _progress(run: BlockRun, phase: str) -> int:
    """How far ``run`` has got in ``phase`` (changes exactly when a segment runs)."""
    return run.fwd_done if phase == "fwd" else run.bwd_next
