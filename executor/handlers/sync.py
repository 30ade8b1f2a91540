"""WAIT (finish an issued communication where the IR says the compute stream depends on it) and barriers.

A WAIT runs the communication's completion (the reduced gradients land in their accumulators, a gathered
tensor continues its block's run, a received tensor reaches the inbox) and records the communication's
row from its issue to its observed completion; when the compute stream really blocked it records a WAIT
row too, tagged with the communication's purpose.
"""

from __future__ import annotations

import torch.distributed as dist

from executor.comm import Pending
from executor.recorder import WAIT_ROW_MIN_S
from executor.state import RankState
from simgrid.errors import ProgramError
from simgrid.ir.ops import Collective, Wait
from simgrid.ir.text import format_op
from simgrid.trace import TraceRow, row_for_op


def wait(state: RankState, op: Wait) -> None:
    """Block until the op under ``op.handle`` is done and run its completion."""
    start = state.op_start
    found = state.pending.pop(op.handle, None)
    if found is None:
        raise ProgramError(f"WAIT for unknown or already waited handle {op.handle!r}")
    comm_op, pend = found
    done_host = pend.finish()
    timer = state.timer
    end = timer.mark()
    issued = timer.from_host(pend.issued_s)
    state.row(comm_op, issued, timer.from_host(done_host), format_op(comm_op), note=pend.note)
    text = state.texts[state.current_index]
    purpose = row_for_op(state.rank, comm_op, 0.0, 0.0).purpose

    def blocked_row(start_s: float, end_s: float) -> TraceRow | None:
        if end_s - start_s < WAIT_ROW_MIN_S:
            return None
        return row_for_op(state.rank, op, start_s, end_s, text=text)._replace(purpose=purpose)

    state.add_row(start, end, blocked_row)


def barrier(state: RankState, op: Collective) -> Pending:
    """A ``sync`` collective: a barrier over the op's group (the only kind with that purpose)."""
    group, _ = state.group(op)
    if op.kind != "barrier":
        raise ProgramError(f"collective kind {op.kind!r} with purpose {op.purpose!r} is not supported by the executor")
    return Pending(handle=op.handle, works=[dist.barrier(group=group, async_op=True)])
