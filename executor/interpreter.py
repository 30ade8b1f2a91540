"""Run one rank's IR ops in order, for real: every op goes to its handler through one table.

The interpreter never reorders the IR. :data:`HANDLERS` maps each op's key (:func:`op_key`: a compute
op's kind, a collective's purpose, a transfer's direction, or the op's type) to a function of
:mod:`executor.handlers`, which gets the rank's :class:`executor.state.RankState` (the interpreter is
one) and the op. Compute handlers run the named blocks (:class:`executor.blockrun.BlockRun`) forward,
backward, input-grad only, weight-grad only, recompute, and the optimizer step; communication handlers
issue asynchronously and return a :class:`executor.comm.Pending` that the op's WAIT finishes. A new kind
of op (an expert-parallel all-to-all, say) is a new handler and one new row of the table.

Every op is timed into :class:`simgrid.trace.TraceRow` rows (:mod:`executor.recorder`): a compute op from
issue to end, here; communication from issue to observed completion, and blocking WAITs, by the WAIT
handler; segments that run outside any compute op by :meth:`RankState.deferred_segments`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from executor.comm import Pending
from executor.handlers import blockcomm, compute, experts, gradsync, memory, optimizer, p2p, sync
from executor.launch import RankContext
from executor.optim import OptimizerConfig
from executor.recorder import DEFERRED_NOTE, WAIT_ROW_MIN_S, StepResult
from executor.state import RankState
from simgrid.errors import ProgramError
from simgrid.ir.ops import Alloc, Collective, Compute, Free, Op, Recv, Send, Transfer, Wait
from simgrid.ir.program import Program

__all__ = ["DEFERRED_NOTE", "HANDLERS", "WAIT_ROW_MIN_S", "RankInterpreter", "StepResult", "op_key"]

Handler = Callable[[RankState, Any], Pending | None]
"""Performs one op for a rank; returns the issued communication (finished at its WAIT) or None. The op
argument is the type :func:`op_key` keyed it by (``Compute`` for ``compute:*``, ...)."""

HANDLERS: Mapping[str, Handler] = {
    # Compute, by kind (the interpreter times the op's row around the handler).
    "compute:F": compute.forward,
    "compute:R": compute.recompute,
    "compute:B": compute.backward,
    "compute:I": compute.backward,
    "compute:W": compute.weight_backward,
    "compute:OPT": optimizer.optimizer_step,
    # Pipeline point-to-point.
    "send": p2p.send,
    "recv": p2p.recv,
    # Collectives, by purpose.
    "collective:tp": blockcomm.tensor_parallel,
    "collective:cp": blockcomm.context_parallel,
    "collective:ep": experts.expert_parallel,
    "collective:dp-grad": gradsync.data_parallel,
    "collective:zero-grad": gradsync.data_parallel,
    "collective:zero-param": gradsync.data_parallel,
    "collective:ps-reduce": gradsync.data_parallel,
    "collective:ps-broadcast": gradsync.data_parallel,
    "collective:embed-grad": gradsync.embed_grad,
    "collective:sync": sync.barrier,
    # Optimizer offload, waits and memory.
    "transfer:d2h": optimizer.transfer,
    "transfer:h2d": optimizer.transfer,
    "wait": sync.wait,
    "alloc": memory.alloc,
    "free": memory.free,
}
"""The executor's op table: every op the interpreter runs goes through exactly one of these handlers."""


def op_key(op: Op) -> str:
    """The :data:`HANDLERS` key of ``op``."""
    if isinstance(op, Compute):
        return f"compute:{op.kind}"
    if isinstance(op, Collective):
        return f"collective:{op.purpose}"
    if isinstance(op, Transfer):
        return f"transfer:{op.direction}"
    if isinstance(op, Send):
        return "send"
    if isinstance(op, Recv):
        return "recv"
    if isinstance(op, Wait):
        return "wait"
    if isinstance(op, Alloc):
        return "alloc"
    if isinstance(op, Free):
        return "free"
    raise ProgramError(f"the executor does not know op {op!r}")


class RankInterpreter(RankState):
    """Executes ``program.ranks[ctx.rank]`` step after step on a real process group."""

    def __init__(self, ctx: RankContext, program: Program, *, seed: int = 0,
                 optimizer: OptimizerConfig | None = None, backend: str = "gloo",
                 mixed_precision: bool | None = None) -> None:
        super().__init__(ctx, program, seed=seed, optimizer=optimizer, backend=backend,
                         mixed_precision=mixed_precision)
        #: This interpreter's copy of :data:`HANDLERS` (calibration wraps one entry to time it).
        self.handlers: dict[str, Handler] = dict(HANDLERS)
        #: Test-only fault injection: (op index, "exit" | "hang").
        self.fault: tuple[int, str] | None = None

    def run_step(self, step: int) -> StepResult:
        """Execute the rank's ops once (one optimizer step) and return what was measured."""
        self.begin_step(step)
        for index, op in enumerate(self.ops):
            self.current_index = index
            text = self.texts[index]
            self.ctx.report_op(f"#{index} {text}")
            for _, pend in self.pending.values():
                pend.poll()
            if self.fault is not None and self.fault[0] == index:
                _inject(self.fault[1])
            try:
                self._dispatch(op, text)
            except Exception as exc:
                raise ProgramError(f"rank {self.rank} op #{index} '{text}': {type(exc).__name__}: {exc}") from exc
        return self.end_step()

    def _dispatch(self, op: Op, text: str) -> None:
        start = self.op_start = self.timer.mark()
        key = op_key(op)
        handler = self.handlers.get(key)
        if handler is None:
            raise ProgramError(f"the executor has no handler for {key!r} ops (supported: {', '.join(self.handlers)})")
        if isinstance(op, Compute):
            self.in_compute = True
            try:
                handler(self, op)
            finally:
                self.in_compute = False
            self.row(op, start, self.timer.mark(), text)
            return
        pending = handler(self, op)
        if pending is not None:
            self.pending[pending.handle] = (op, pending)


def _inject(action: str) -> None:
    """Die abruptly or stall (fault-injection tests of the launcher's bounded failure handling)."""
    if action == "exit":
        os._exit(17)
    time.sleep(3600)
