"""Compute ops on the named blocks: forward (F), recompute (R), full or input-grad backward (B, I), weight grad (W).

Each op records itself as the owner of the segments it starts (:attr:`executor.recorder.StepRecorder.segment_owner`),
so segments that run later, once a collective has delivered, are traced as this op.
"""

from __future__ import annotations

from executor.state import RankState
from simgrid.errors import ProgramError
from simgrid.ir.ops import Compute


def _own_segments(state: RankState, op: Compute, phase: str) -> list[int]:
    """The op's blocks, each recorded as run by this op in ``phase`` (``fwd`` or ``bwd``)."""
    blocks = list(range(op.block_start, op.block_end))
    for b in blocks:
        state.segment_owner[(b, op.microbatch, phase)] = state.current_index
    return blocks


def forward(state: RankState, op: Compute) -> None:
    """F: run the blocks forward; only the last may stop at a cut whose collective comes after the op."""
    blocks = _own_segments(state, op, "fwd")
    for i, b in enumerate(blocks):
        blocked = state.forward_run(b, op.microbatch).forward()
        if blocked is not None and i < len(blocks) - 1:
            raise ProgramError(f"block {b} needs a collective at cut {blocked} inside one compute op")


def recompute(state: RankState, op: Compute) -> None:
    """R: rebuild the autograd graph a no-grad forward skipped (activation recomputation)."""
    mb = op.microbatch
    for b in _own_segments(state, op, "fwd"):
        run = state.started_run(b, mb)
        if not run.recomputing:
            run.start_recompute(fresh_collectives=(b, mb, "recompute") in state.tp_plan.phases)
        run.forward()


def backward(state: RankState, op: Compute) -> None:
    """B (full backward) or I (input gradients only), last block first."""
    for b in reversed(_own_segments(state, op, "bwd")):
        state.backward_run(b, op.microbatch, op.kind)


def weight_backward(state: RankState, op: Compute) -> None:
    """W: the weight gradients the I op left for later."""
    for b in reversed(range(op.block_start, op.block_end)):
        run = state.started_run(b, op.microbatch)
        state.finish_backward(run)
        run.weight_backward()
