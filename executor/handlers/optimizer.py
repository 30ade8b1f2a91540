"""The optimizer step (OPT) and the offloaded optimizer's host <-> device transfers.

OPT updates what this rank owns for the blocks of its range: ZeRO-3 parameter shards, ZeRO-1/2 bucket
master shards, or whole parameters (on the host copies when the optimizer is offloaded, ``device=cpu``).
A ``d2h`` transfer copies the synchronised gradients to the host (and the parameters once, as the host's
master copy); ``h2d`` copies the updated parameters back.
"""

from __future__ import annotations

import re

import torch

from executor.comm import Pending
from executor.grads import block_parameters
from executor.state import RankState
from simgrid.ir.ops import Compute, Transfer


def transfer(state: RankState, op: Transfer) -> Pending:
    """Host <-> device copies of the optimizer offload: gradients down, parameters up."""
    match = re.fullmatch(r"s(\d+):(grads|params)", op.label)
    stage = int(match.group(1)) if match else None
    blocks = [b for b, s in state.stage_of.items() if stage is None or s == stage]
    book = state.book
    named = block_parameters(state.modules, blocks)
    if op.direction == "d2h":
        state.finish_blocks(set(blocks))
        for _, p in named:
            book.host_grads[id(p)] = book.full_grad(p).detach().to("cpu", copy=True)
            if id(p) not in book.host_params:
                book.host_params[id(p)] = p.detach().to("cpu", copy=True)
    else:
        with torch.no_grad():
            for _, p in named:
                p.copy_(book.host_params[id(p)].to(p.device))
    return Pending(handle=op.handle, works=[], note="synchronous copy")


def optimizer_step(state: RankState, op: Compute) -> None:
    """The OPT op: update what this rank owns for the blocks of the op's range."""
    blocks = [b for b in range(op.block_start, op.block_end) if b in state.modules]
    state.finish_blocks(set(blocks))
    book = state.book
    step = state.step_index + 1
    stages = {state.stage_of[b] for b in blocks}
    if state.layout.zero == 3:
        book.step_zero3(blocks, step)
    elif state.layout.zero in (1, 2) and any(k[0] in stages for k in book.buckets):
        keys = [k for k in book.buckets if k[0] in stages]
        book.step_buckets(keys, step)
        # Parameters no bucket shards (a MoE model's experts without expert data parallelism, or its dense
        # part without data parallelism) are updated whole.
        book.step_unsharded(blocks, step, skip={id(p) for k in keys for p in book.buckets[k].params})
    elif op.device == "cpu":
        book.step_unsharded(blocks, step, host=True)
    else:
        book.step_unsharded(blocks, step)
