"""ALLOC and FREE: the IR's declared memory, and what a FREE really releases.

The executor keeps the live bytes the IR declares (their peak is reported next to the measured run). A
FREE of a ZeRO-3 gathered-parameter buffer releases the gathered parameters (:func:`.zero3.release_zero3`);
a FREE of a stage's activations (``act:s<stage>:m<mb>:b<first>-<last>``) drops the autograd graph of the
runs whose backward is complete, as the memory the IR frees would be on a device.
"""

from __future__ import annotations

import re

from executor.handlers.zero3 import release_zero3
from executor.state import RankState
from simgrid.ir.ops import Alloc, Free

ACTIVATION_BUFFER = re.compile(r"act:s(\d+):m(\d+):b(\d+)-(\d+)")
"""Name of the activation buffer of (stage, micro-batch, block range) in the IR."""


def alloc(state: RankState, op: Alloc) -> None:
    """Count the buffer's bytes as live and update the step's peak."""
    state.alloc_sizes[op.name] = op.bytes
    state.live_bytes += op.bytes
    state.result.peak_ir_bytes = max(state.result.peak_ir_bytes, state.live_bytes)


def free(state: RankState, op: Free) -> None:
    """Stop counting the buffer; release gathered ZeRO-3 parameters or finished activation graphs."""
    state.live_bytes -= state.alloc_sizes.pop(op.name, 0)
    for block in state.zero3_handles.pop(op.name, ()):
        release_zero3(state, block)
    match = ACTIVATION_BUFFER.fullmatch(op.name)
    if match:
        mb, start, end = (int(match.group(i)) for i in (2, 3, 4))
        for b in range(start, end):
            run = state.runs.get((b, mb))
            if run is not None and run.backward_complete and not run.pending_w:
                run.outputs = [o.detach() if o is not None else None for o in run.outputs]
