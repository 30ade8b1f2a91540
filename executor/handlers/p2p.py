"""Pipeline SEND and RECV of activations (forward) and their gradients (backward).

A send first finishes the block whose output (or input gradient) it carries: segments left after a
delivered collective run now, traced as the compute op they belong to. A receive lands in the rank's
inbox at its WAIT, where the next block of that stage and micro-batch takes it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from executor.comm import Pending
from executor.state import RankState
from simgrid.errors import ProgramError
from simgrid.ir.ops import Recv, Send
from simgrid.model.blocks import stage_blocks


def send(state: RankState, op: Send) -> Pending:
    """Send the stage's output activation (F) or input gradient (B) of the op's micro-batch."""
    key = op.key
    if key.direction == "F":
        last = stage_blocks(state.spec, state.layout, key.src_stage)[-1]
        tensor = state.finish_forward(state.started_run(last, key.microbatch)).output.detach().contiguous()
    else:
        first = stage_blocks(state.spec, state.layout, key.src_stage)[0]
        grad = state.finish_backward(state.started_run(first, key.microbatch)).input_grad
        if grad is None:
            raise ProgramError(f"stage {key.src_stage} produced no input gradient to send")
        tensor = grad.contiguous()
    work = dist.isend(tensor, dst=op.peer)
    return Pending(handle=op.handle, works=[work])


def recv(state: RankState, op: Recv) -> Pending:
    """Receive a ``[s, b, h]`` activation or gradient (this rank's sequence share under CP and SP)."""
    key = op.key
    seq = state.spec.seq_length // state.cp.size // (state.tp.size if state.tp.sequence_parallel else 1)
    buf = torch.empty(seq, state.layout.micro_batch_size, state.spec.hidden_size, device=state.ctx.device)
    work = dist.irecv(buf, src=op.peer)
    slot = (key.dst_stage, key.microbatch, key.direction)

    def deliver() -> None:
        state.inbox[slot] = buf

    return Pending(handle=op.handle, works=[work], on_complete=deliver)
