"""One rank's state while it runs a Program: its blocks, gradients, in-flight work, and the block runs it drives.

:class:`RankState` is what every op handler (:mod:`executor.handlers`) is given and all it may use: the
rank's place in the mesh and its process groups, its model blocks (:mod:`executor.model`) and
:class:`executor.grads.GradBook`, the autograd runs of (block, micro-batch) pairs
(:class:`executor.blockrun.BlockRun`), received pipeline tensors, issued communication waiting for its
WAIT, ZeRO-3 gather counts, and the step's trace rows (:class:`executor.recorder.StepRecorder`). The
interpreter (:mod:`executor.interpreter`) is a RankState that also owns the op table and the step loop;
the handlers never import it.

A segment that sits between a collective and the next compute op (a residual add after a tensor-parallel
all-reduce, a norm backward after the gradient all-reduce) runs when its result is first needed: by the
next compute op, by a send, or by the gradient synchronisation (:meth:`RankState.finish_blocks`); under
ZeRO-3 at the latest at the FREE of the gathered parameters it reads (:meth:`RankState.finish_ready_segments`).
"""

from __future__ import annotations

from typing import Any

import torch

from executor.blockrun import BlockRun
from executor.comm import Pending
from executor.cp import CPContext
from executor.cutplan import TPPlan, plan_tp_collectives
from executor.data import global_batch, microbatch
from executor.grads import GradBook
from executor.launch import RankContext
from executor.model import BlockModule, EPContext, build_blocks, head_index, init_weights
from executor.optim import OptimizerConfig, optimizer_for
from executor.precision import compute_dtype
from executor.recorder import StepRecorder, StepResult
from executor.tp import TPContext
from simgrid.errors import ProgramError
from simgrid.ir.ops import Collective, Compute, Op
from simgrid.ir.program import Program
from simgrid.layout.experts import expert_coords
from simgrid.layout.mesh import Mesh
from simgrid.model.blocks import stage_blocks

SP_PARTIAL_PARAMS = ("norm_weight", "norm_bias", "o_bias", "fc2_bias", "wpe", "router_weight", "shared_gate_weight")
"""Replicated parameters whose gradients are partial over the tensor-parallel group under sequence
parallelism (computed from a sequence shard); the program's ``s<stage>:sp-grads`` all-reduce sums them. A MoE
block's router (and shared-expert gate) routes the rank's sequence shard, so it is one of them."""


class RankState(StepRecorder):
    """``program.ranks[ctx.rank]``'s blocks, gradients and in-flight work on a real process group."""

    def __init__(self, ctx: RankContext, program: Program, *, seed: int = 0,
                 optimizer: OptimizerConfig | None = None, backend: str = "gloo",
                 mixed_precision: bool | None = None) -> None:
        if program.model is None or program.layout is None:
            raise ProgramError("executor: the program carries no model or layout; build it with build_program")
        ops = program.ranks[ctx.rank]
        spec, layout = program.model, program.layout
        stage_of: dict[int, int] = {}
        for s in sorted({op.stage for op in ops if isinstance(op, Compute) and op.stage >= 0}):
            for b in stage_blocks(spec, layout, s):
                stage_of[b] = s
        super().__init__(rank=ctx.rank, ops=ops, stage_of=stage_of, device=ctx.device)
        self.ctx = ctx
        self.program = program
        self.spec = spec
        self.layout = layout
        self.seed = seed
        self.backend = backend
        self.mesh = Mesh(layout)
        self.coord = self.mesh.coords(ctx.rank)
        self.tp = TPContext(size=layout.tp, rank=self.coord.tp, sequence_parallel=layout.sequence_parallel)
        self.cp = CPContext(size=layout.cp, rank=self.coord.cp or 0)
        #: Global positions of this rank's tokens under context parallelism (None: the whole sequence).
        self.positions = self.cp.positions(spec.seq_length).to(ctx.device) if self.cp.size > 1 else None
        self.head = head_index(spec)
        expert = expert_coords(layout, ctx.rank)
        #: This rank's expert-parallel place (MoE parallel folding, simgrid.layout.experts).
        self.ep = EPContext(size=layout.ep, rank=expert.ep) if spec.moe is not None else EPContext()
        self.modules: dict[int, BlockModule] = build_blocks(
            spec, sorted(stage_of), init_weights(spec, seed), self.tp,
            flash_attention=layout.flash_attention, cp=self.cp, ep=self.ep)
        #: Autocast dtype of the forward (None: fp32), see :func:`executor.precision.compute_dtype`.
        self.compute_dtype = compute_dtype(layout.precision, ctx.device, mixed_precision=mixed_precision)
        for module in self.modules.values():
            module.to(ctx.device)
            module.compute_dtype = self.compute_dtype
        # The data-parallel group spans dp * cp ranks (context-parallel ranks hold the same parameters).
        self.book = GradBook(self.modules, dp_size=layout.grad_sync_size,
                             dp_index=self.mesh.dp_group(ctx.rank).index(ctx.rank),
                             optimizer=optimizer or optimizer_for(layout.optimizer),
                             expert_dp_size=layout.edp, expert_dp_index=expert.edp)
        if layout.zero == 3:
            self.book.shard_zero3()
        #: (block, micro-batch) whose forward runs without a graph (an R op rebuilds it).
        self.recomputed = {(b, op.microbatch) for op in ops if isinstance(op, Compute) and op.kind == "R"
                           for b in range(op.block_start, op.block_end)}
        #: id -> parameter whose gradient is partial over the TP group (sequence parallelism).
        self.sp_params = {id(p): p for m in self.modules.values() for name, p in m.named_parameters(recurse=False)
                          if self.tp.sequence_parallel and name in SP_PARTIAL_PARAMS}
        self.tp_plan: TPPlan = plan_tp_collectives(self.ops)
        self.step_index = 0
        self.tokens = torch.zeros(0, device=ctx.device)
        #: Micro-batch -> loss tensor of this step (read into ``result.losses`` at the end of the step).
        self.loss_values: dict[int, torch.Tensor] = {}
        #: (block, micro-batch) -> its autograd run in this step.
        self.runs: dict[tuple[int, int], BlockRun] = {}
        #: (stage, micro-batch, "F" | "B") -> a received pipeline tensor not yet used.
        self.inbox: dict[tuple[int, int, str], torch.Tensor] = {}
        #: Handle -> (op, issued communication) until its WAIT.
        self.pending: dict[str, tuple[Op, Pending]] = {}
        #: Block -> ZeRO-3 gathers of its parameters not yet freed; FREE name -> block gathered under it.
        self.zero3_live: dict[int, int] = {}
        self.zero3_handles: dict[str, tuple[int, ...]] = {}
        #: Live bytes of the IR's ALLOCs; ALLOC name -> bytes.
        self.live_bytes = 0
        self.alloc_sizes: dict[str, int] = {}

    # -- the step ---------------------------------------------------------------------------------
    def begin_step(self, step: int) -> None:
        """Fresh data and per-step bookkeeping for optimizer step ``step``."""
        self.step_index = step
        self.tokens = global_batch(self.spec, self.layout, self.seed, step).to(self.ctx.device)
        self.result = StepResult()
        self.loss_values = {}
        self.live_bytes = 0
        self.tp_plan.cursor.clear()
        self.segment_owner.clear()
        self.timer.start_step()

    def end_step(self) -> StepResult:
        """Check nothing was left behind, clear gradients and runs, return what the step measured."""
        if self.pending:
            raise ProgramError(f"rank {self.rank}: communication never waited: {sorted(self.pending)}")
        self.book.end_step()
        self.runs.clear()
        if self.inbox:
            raise ProgramError(f"rank {self.rank}: received tensors never used: {sorted(self.inbox)}")
        self.result.losses = {mb: float(loss) for mb, loss in sorted(self.loss_values.items())}
        self.resolve_rows()
        rows = self.result.rows
        self.result.step_s = max((r.end_s for r in rows), default=0.0)
        return self.result

    def group(self, op: Collective) -> tuple[Any, tuple[int, ...]]:
        """(process group, member ranks) of a collective's group; error if this rank is not in it."""
        group = self.ctx.groups.get(op.group)
        members = self.ctx.members.get(op.group)
        if group is None or members is None:
            raise ProgramError(f"group {op.group!r} is unknown or does not contain rank {self.rank}")
        return group, members

    # -- block runs -------------------------------------------------------------------------------
    def started_run(self, block: int, mb: int) -> BlockRun:
        """The run of (block, micro-batch); error if its forward has not started on this rank."""
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
        if run.module.index == self.head and run.microbatch not in self.loss_values:
            # Kept as a tensor until the step ends: reading it now would make the host wait for the GPU.
            self.loss_values[run.microbatch] = run.output.detach()
        return run

    def backward_run(self, block: int, mb: int, mode: str) -> int | None:
        """Start or continue the backward of (block, micro-batch); returns the blocking cut, if any."""
        run = self.started_run(block, mb)
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
