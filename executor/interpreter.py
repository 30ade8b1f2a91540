"""Run one rank's IR ops in order, for real: compute, pipeline send/recv, collectives, transfers, memory.

The interpreter never reorders the IR. Compute ops run the named blocks (:class:`executor.blockrun.BlockRun`)
forward (F), backward (B), input-grad only (I), weight-grad only (W), recompute (R, which rebuilds the graph
a no-grad forward skipped) and the optimizer step (OPT). Communication ops are issued asynchronously and
finished at their WAIT (:mod:`executor.comm`); :mod:`executor.collectives` maps each collective onto real
tensors. Under context parallelism the rank feeds its two chunks of every sequence (:mod:`executor.cp`). A segment that sits between a collective and the next compute op (a residual add after a
tensor-parallel all-reduce, a norm backward after the gradient all-reduce) runs when its result is first
needed: by the next compute op, by a send, or by the gradient synchronisation; under ZeRO-3 at the latest
at the FREE of the gathered parameters it reads (the IR places that FREE after the block's compute).

Every op is timed into :class:`simgrid.trace.TraceRow` rows (compute: issue to end; communication: issue
to observed completion; WAIT rows when the compute stream really blocked). A segment that runs outside any
compute op (at a send, a gradient synchronisation, a tensor-parallel collective's issue or a ZeRO-3 FREE)
gets a row of its own on the compute stream, at the time it really ran, carrying the kind, stage and
micro-batch of the compute op it belongs to (:meth:`RankInterpreter.deferred_segments`); segments run
inside a compute op are in that op's row already.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from executor import collectives
from executor.blockrun import BlockRun
from executor.comm import Pending
from executor.cp import CPContext
from executor.data import global_batch, microbatch
from executor.grads import GradBook
from executor.launch import RankContext
from executor.model import BlockModule, build_blocks, head_index, init_weights
from executor.optim import OptimizerConfig, optimizer_for
from executor.timing import make_timer
from executor.tp import TPContext
from simgrid.errors import ProgramError
from simgrid.ir.ops import Alloc, Collective, Compute, Free, Op, Recv, Send, Transfer, Wait
from simgrid.ir.program import Program
from simgrid.ir.text import format_op
from simgrid.layout.mesh import Mesh
from simgrid.model.blocks import stage_blocks
from simgrid.trace import TraceRow, row_for_op

DEFERRED_NOTE = "deferred segment"
"""Marks the op text of a row timing lazy segments of a compute op that ran after it (see
:meth:`RankInterpreter.deferred_segments`)."""

WAIT_ROW_MIN_S = 20e-6
"""A WAIT that blocked less than this gets no trace row (host-clock noise)."""

SP_PARTIAL_PARAMS = ("norm_weight", "norm_bias", "o_bias", "fc2_bias", "wpe")
"""Replicated parameters whose gradients are partial over the tensor-parallel group under sequence
parallelism (computed from a sequence shard); the program's ``s<stage>:sp-grads`` all-reduce sums them."""


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


class RankInterpreter:
    """Executes ``program.ranks[ctx.rank]`` step after step on a real process group."""

    def __init__(self, ctx: RankContext, program: Program, *, seed: int = 0,
                 optimizer: OptimizerConfig | None = None, backend: str = "gloo") -> None:
        if program.model is None or program.layout is None:
            raise ProgramError("executor: the program carries no model or layout; build it with build_program")
        self.ctx = ctx
        self.program = program
        self.spec = program.model
        self.layout = program.layout
        self.seed = seed
        self.backend = backend
        self.rank = ctx.rank
        self.ops: tuple[Op, ...] = program.ranks[ctx.rank]
        self.texts = [format_op(op) for op in self.ops]
        self.mesh = Mesh(self.layout)
        self.coord = self.mesh.coords(ctx.rank)
        self.tp = TPContext(size=self.layout.tp, rank=self.coord.tp, sequence_parallel=self.layout.sequence_parallel)
        self.cp = CPContext(size=self.layout.cp, rank=self.coord.cp or 0)
        #: Global positions of this rank's tokens under context parallelism (None: the whole sequence).
        self.positions = self.cp.positions(self.spec.seq_length).to(ctx.device) if self.cp.size > 1 else None
        self.head = head_index(self.spec)
        self.stages = sorted({op.stage for op in self.ops if isinstance(op, Compute) and op.stage >= 0})
        self.stage_of: dict[int, int] = {}
        for s in self.stages:
            for b in stage_blocks(self.spec, self.layout, s):
                self.stage_of[b] = s
        self.modules: dict[int, BlockModule] = build_blocks(
            self.spec, sorted(self.stage_of), init_weights(self.spec, seed), self.tp,
            flash_attention=self.layout.flash_attention, cp=self.cp)
        for module in self.modules.values():
            module.to(ctx.device)
        # The data-parallel group spans dp * cp ranks (context-parallel ranks hold the same parameters).
        self.book = GradBook(self.modules, dp_size=self.layout.grad_sync_size,
                             dp_index=self.mesh.dp_group(ctx.rank).index(ctx.rank),
                             optimizer=optimizer or optimizer_for(self.layout.optimizer))
        if self.layout.zero == 3:
            self.book.shard_zero3()
        self.recomputed = {(b, op.microbatch) for op in self.ops if isinstance(op, Compute) and op.kind == "R"
                           for b in range(op.block_start, op.block_end)}
        self.sp_params = {id(p): p for m in self.modules.values() for name, p in m.named_parameters(recurse=False)
                          if self.tp.sequence_parallel and name in SP_PARTIAL_PARAMS}
        self.tp_plan = collectives.plan_tp_collectives(self)
        self.timer = make_timer(ctx.device)
        self.step_index = 0
        self.runs: dict[tuple[int, int], BlockRun] = {}
        self.inbox: dict[tuple[int, int, str], torch.Tensor] = {}
        self.pending: dict[str, tuple[Op, Pending]] = {}
        self.zero3_live: dict[int, int] = {}
        self.zero3_handles: dict[str, tuple[int, ...]] = {}
        self.tokens = torch.zeros(0)
        self.result = StepResult()
        self.live_bytes = 0
        self.alloc_sizes: dict[str, int] = {}
        self.current_index = 0
        #: A compute op is running: lazy segments run now are inside its row.
        self.in_compute = False
        #: (block, micro-batch, "fwd" | "bwd") -> index of the compute op whose segments the run holds.
        self.segment_owner: dict[tuple[int, int, str], int] = {}
        #: Test-only fault injection: (op index, "exit" | "hang").
        self.fault: tuple[int, str] | None = None

    # -- driver -----------------------------------------------------------------------------------
    def run_step(self, step: int) -> StepResult:
        """Execute the rank's ops once (one optimizer step) and return what was measured."""
        self.step_index = step
        self.tokens = global_batch(self.spec, self.layout, self.seed, step).to(self.ctx.device)
        self.result = StepResult()
        self.live_bytes = 0
        self.tp_plan.cursor.clear()
        self.segment_owner.clear()
        self.timer.start_step()
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
        if self.pending:
            raise ProgramError(f"rank {self.rank}: communication never waited: {sorted(self.pending)}")
        self.book.end_step()
        self.runs.clear()
        if self.inbox:
            raise ProgramError(f"rank {self.rank}: received tensors never used: {sorted(self.inbox)}")
        rows = self.result.rows
        self.result.step_s = max((r.end_s for r in rows), default=0.0)
        return self.result

    def _dispatch(self, op: Op, text: str) -> None:
        start = self.timer.mark()
        if isinstance(op, Compute):
            self.in_compute = True
            try:
                self._compute(op)
            finally:
                self.in_compute = False
            self._row(op, start, self.timer.mark(), text)
        elif isinstance(op, (Send, Recv)):
            self._p2p(op)
        elif isinstance(op, Collective):
            self.pending[op.handle] = (op, collectives.issue(self, op))
        elif isinstance(op, Transfer):
            self.pending[op.handle] = (op, collectives.transfer(self, op))
        elif isinstance(op, Wait):
            self._wait(op, start, text)
        elif isinstance(op, Alloc):
            self.alloc_sizes[op.name] = op.bytes
            self.live_bytes += op.bytes
            self.result.peak_ir_bytes = max(self.result.peak_ir_bytes, self.live_bytes)
        elif isinstance(op, Free):
            self._free(op)

    def _row(self, op: Op, start: Any, end: Any, text: str, *, note: str = "") -> None:
        row = row_for_op(self.rank, op, self.timer.seconds(start), self.timer.seconds(end),
                         text=text + (f"  # {note}" if note else ""))
        self.result.rows.append(row)

    def extra_row(self, name: str, kind: str, purpose: str, stream: str, start: Any, nbytes: int) -> None:
        """A row for work the executor does that the IR has no op for (named as such)."""
        self.result.rows.append(TraceRow(self.rank, stream, name, kind, purpose, self.timer.seconds(start),
                                         self.timer.seconds(self.timer.mark()), nbytes))

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
            self.result.rows.append(TraceRow(
                self.rank, "compute", f"{kind} b{block} m{mb}  # {DEFERRED_NOTE}, {where}", kind, "compute",
                self.timer.seconds(start), self.timer.seconds(end), 0, 0.0, self.stage_of.get(block, -1), mb))
            return
        # No FLOPs: the op's own row carries all of them (metrics sum row FLOPs; counting them twice
        # would inflate the hardware FLOP rate).
        row = row_for_op(self.rank, self.ops[owner], self.timer.seconds(start), self.timer.seconds(end),
                         text=f"{self.texts[owner]}  # {DEFERRED_NOTE}, {where}")
        self.result.rows.append(row._replace(flops=0.0))

    # -- compute ------------------------------------------------------------------------------------
    def _compute(self, op: Compute) -> None:
        blocks = list(range(op.block_start, op.block_end))
        mb = op.microbatch
        phase = {"F": "fwd", "R": "fwd", "B": "bwd", "I": "bwd"}.get(op.kind)
        if phase is not None:
            for b in blocks:
                self.segment_owner[(b, mb, phase)] = self.current_index
        if op.kind == "F":
            for i, b in enumerate(blocks):
                blocked = self.forward_run(b, mb).forward()
                if blocked is not None and i < len(blocks) - 1:
                    raise ProgramError(f"block {b} needs a collective at cut {blocked} inside one compute op")
        elif op.kind == "R":
            for b in blocks:
                run = self._run(b, mb)
                if not run.recomputing:
                    run.start_recompute(fresh_collectives=(b, mb, "recompute") in self.tp_plan.phases)
                run.forward()
        elif op.kind in ("B", "I"):
            for b in reversed(blocks):
                self.backward_run(b, mb, op.kind)
        elif op.kind == "W":
            for b in reversed(blocks):
                run = self._run(b, mb)
                self.finish_backward(run)
                run.weight_backward()
        elif op.kind == "OPT":
            collectives.optimizer_step(self, op)

    def _run(self, block: int, mb: int) -> BlockRun:
        run = self.runs.get((block, mb))
        if run is None:
            raise ProgramError(f"block {block} micro-batch {mb} has no forward on this rank yet")
        return run

    def forward_run(self, block: int, mb: int) -> BlockRun:
        """The run of (block, micro-batch), created with its input on first use."""
        run = self.runs.get((block, mb))
        if run is not None:
            return run
        if block not in self.modules:
            raise ProgramError(f"block {block} is not held by rank {self.rank}")
        if block == 0:
            x = microbatch(self.tokens, mb, self.coord.dp, self.positions)[0]
        elif (block - 1, mb) in self.runs:
            x = self.finish_forward(self.runs[(block - 1, mb)]).output.detach()
        else:
            x = self._take(self.stage_of[block], mb, "F")
        targets = microbatch(self.tokens, mb, self.coord.dp, self.positions)[1] if block == self.head else None
        run = BlockRun(self.modules[block], mb, x, targets, no_grad_forward=(block, mb) in self.recomputed)
        self.runs[(block, mb)] = run
        return run

    def finish_forward(self, run: BlockRun) -> BlockRun:
        """Run any forward segments still pending (after a delivered collective); error if blocked."""
        with self.deferred_segments(run, "fwd"):
            cut = run.forward()
        if cut is not None:
            raise ProgramError(f"block {run.module.index} micro-batch {run.microbatch}: its output is needed but "
                               f"the forward collective of cut {cut} has not been waited")
        if run.module.index == self.head and run.microbatch not in self.result.losses:
            self.result.losses[run.microbatch] = float(run.output.detach())
        return run

    def backward_run(self, block: int, mb: int, mode: str) -> int | None:
        """Start or continue the backward of (block, micro-batch); returns the blocking cut, if any."""
        run = self._run(block, mb)
        self.finish_forward(run)
        if run.output_grads[-1] is None:
            run.set_output_grad(self._output_grad(block, mb, mode))
        with self.deferred_segments(run, "bwd"):
            return run.backward(mode)

    def finish_backward(self, run: BlockRun) -> BlockRun:
        """Run any backward segments still pending; error if a gradient collective is outstanding."""
        with self.deferred_segments(run, "bwd"):
            cut = run.backward(run.bwd_mode or "B")
        if cut is not None:
            raise ProgramError(f"block {run.module.index} micro-batch {run.microbatch}: its input gradient is "
                               f"needed but the backward collective of cut {cut} has not been waited")
        return run

    def _output_grad(self, block: int, mb: int, mode: str) -> torch.Tensor:
        if block == self.head:
            # Each rank's loss is the mean over its tokens; the gradient sync sums over dp * cp ranks that
            # hold equally many tokens, so this scale makes the sum the gradient of the global mean loss.
            scale = 1.0 / (self.layout.num_microbatches * self.layout.grad_sync_size)
            return torch.tensor(scale, device=self.ctx.device)
        nxt = self.runs.get((block + 1, mb))
        if nxt is not None:
            grad = self.finish_backward(nxt).input_grad
            if grad is None:
                raise ProgramError(f"block {block + 1} produced no input gradient")
            return grad
        return self._take(self.stage_of[block], mb, "B")

    def _take(self, stage: int, mb: int, direction: str) -> torch.Tensor:
        found = self.inbox.pop((stage, mb, direction), None)
        if found is None:
            what = "activation" if direction == "F" else "gradient"
            raise ProgramError(f"stage {stage} micro-batch {mb}: no received {what} (missing RECV or its WAIT)")
        return found

    def finish_blocks(self, blocks: set[int]) -> None:
        """Complete every pending segment of the runs of ``blocks`` before their gradients are read."""
        for (b, _), run in self.runs.items():
            if b in blocks and run.output_grads[-1] is not None:
                self.finish_backward(run)
                if run.pending_w:
                    raise ProgramError(f"block {b} micro-batch {run.microbatch}: gradients read before its W op")

    def finish_ready_segments(self, blocks: set[int]) -> None:
        """Run every lazy segment of the runs of ``blocks`` whose collective has delivered.

        ZeRO-3 calls this at the FREE of a gathered-parameter buffer: the IR places that FREE after the
        unit's last compute op and its tensor-parallel WAITs, so the segments left after a cut (residual
        add and bias after the row-parallel all-reduce; the norm backward after the gradient all-reduce)
        belong to compute that is over in the IR and must read the gathered parameters before they go.
        Their time is traced as the compute op they finish (:meth:`deferred_segments`).
        """
        for (b, _), run in self.runs.items():
            if b not in blocks:
                continue
            if 0 < run.fwd_done < run.module.num_segments:
                with self.deferred_segments(run, "fwd"):
                    blocked = run.forward()
                if blocked is None:
                    self.finish_forward(run)  # records the loss of a head block
            if run.output_grads[-1] is not None and not run.backward_complete:
                with self.deferred_segments(run, "bwd"):
                    run.backward(run.bwd_mode or "B")

    # -- point to point -----------------------------------------------------------------------------
    def _p2p(self, op: Send | Recv) -> None:
        key = op.key
        if isinstance(op, Send):
            if key.direction == "F":
                last = stage_blocks(self.spec, self.layout, key.src_stage)[-1]
                tensor = self.finish_forward(self._run(last, key.microbatch)).output.detach().contiguous()
            else:
                first = stage_blocks(self.spec, self.layout, key.src_stage)[0]
                grad = self.finish_backward(self._run(first, key.microbatch)).input_grad
                if grad is None:
                    raise ProgramError(f"stage {key.src_stage} produced no input gradient to send")
                tensor = grad.contiguous()
            work = dist.isend(tensor, dst=op.peer)
            self.pending[op.handle] = (op, Pending(handle=op.handle, works=[work]))
            return
        seq = self.spec.seq_length // self.cp.size // (self.tp.size if self.tp.sequence_parallel else 1)
        buf = torch.empty(seq, self.layout.micro_batch_size, self.spec.hidden_size, device=self.ctx.device)
        work = dist.irecv(buf, src=op.peer)
        slot = (key.dst_stage, key.microbatch, key.direction)

        def deliver() -> None:
            self.inbox[slot] = buf

        self.pending[op.handle] = (op, Pending(handle=op.handle, works=[work], on_complete=deliver))

    # -- waits and memory -----------------------------------------------------------------------------
    def _wait(self, op: Wait, start: Any, text: str) -> None:
        found = self.pending.pop(op.handle, None)
        if found is None:
            raise ProgramError(f"WAIT for unknown or already waited handle {op.handle!r}")
        comm_op, pend = found
        done_host = pend.finish()
        end = self.timer.mark()
        issued = self.timer.from_host(pend.issued_s)
        self._row(comm_op, issued, self.timer.from_host(done_host), format_op(comm_op), note=pend.note)
        if self.timer.seconds(end) - self.timer.seconds(start) >= WAIT_ROW_MIN_S:
            row = row_for_op(self.rank, op, self.timer.seconds(start), self.timer.seconds(end), text=text)
            purpose = row_for_op(self.rank, comm_op, 0.0, 0.0).purpose
            self.result.rows.append(row._replace(purpose=purpose))

    def _free(self, op: Free) -> None:
        self.live_bytes -= self.alloc_sizes.pop(op.name, 0)
        blocks = self.zero3_handles.pop(op.name, None)
        for block in blocks or ():
            collectives.release_zero3(self, block)
        match = re.fullmatch(r"act:s(\d+):m(\d+):b(\d+)-(\d+)", op.name)
        if match:
            mb, start, end = (int(match.group(i)) for i in (2, 3, 4))
            for b in range(start, end):
                run = self.runs.get((b, mb))
                if run is not None and run.backward_complete and not run.pending_w:
                    run.outputs = [o.detach() if o is not None else None for o in run.outputs]


def _progress(run: BlockRun, phase: str) -> int:
    """How far ``run`` has got in ``phase`` (changes exactly when a segment runs)."""
    return run.fwd_done if phase == "fwd" else run.bwd_next


def _inject(action: str) -> None:
    """Die abruptly or stall (fault-injection tests of the launcher's bounded failure handling)."""
    if action == "exit":
        os._exit(17)
    time.sleep(3600)
