"""Run whole Programs for real and bring back losses, updated weights, step times and the measured Trace.

:func:`run_program` validates a Program (a Program that fails validation never launches), spawns one
process per rank, interprets every rank's ops for ``steps`` optimizer steps and returns a
:class:`RunResult`. :func:`run_programs` runs several Programs of the same world size one after another
inside *one* set of processes (each with its own process groups), which is how the test suite keeps
process start-up (seconds per world on a small machine) out of every case.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from executor.comm import all_gather_single
from executor.devices import peak_memory_bytes, reset_peak_memory
from executor.interpreter import RankInterpreter
from executor.launch import LaunchConfig, RankContext, spawn_world
from executor.model import owned_parameters, shard_dim
from executor.optim import OptimizerConfig, optimizer_for
from executor.tp import unshard
from simgrid.errors import LayoutError, ProgramError
from simgrid.ir.jsonio import program_from_json, program_to_json
from simgrid.ir.program import Program
from simgrid.layout.spec import Layout
from simgrid.model.spec import ModelSpec
from simgrid.trace import Trace, TraceRow

EXPERT_WEIGHT = ".moe.experts."
"""Infix of a routed expert's weight names (:mod:`executor.weights`): under expert parallelism each rank holds
whole experts of its own, so they are collected from whichever rank holds them, not by tensor-parallel shard."""


@dataclass(frozen=True, kw_only=True)
class Job:
    """One Program to run for some steps."""

    program: Program
    """The program (with model and layout)."""
    steps: int = 1
    """Optimizer steps to run."""
    seed: int = 0
    """Seed of weights and data (the reference uses the same)."""
    optimizer: OptimizerConfig | None = None
    """Optimizer hyper-parameters; None uses the layout's optimizer with default settings."""
    collect_weights: bool = True
    """Return the updated weights (tiny models; skip for timing runs)."""
    fault: tuple[int, int, str] | None = None
    """Fault injection for tests: (rank, op index, ``exit`` or ``hang``) makes that rank die or stall there."""
    mixed_precision: bool | None = None
    """bf16 autocast over fp32 master weights when the layout's precision is bf16: None on CUDA only, True
    on any device, False never (:func:`executor.precision.compute_dtype`)."""


@dataclass(kw_only=True)
class RunResult:
    """What a real run measured."""

    losses: list[float]
    """Mean loss of each step (over micro-batches, replicas and context-parallel ranks: all tokens)."""
    step_times_s: list[float]
    """Wall time of each step: the latest rank's last op end, from a common start barrier."""
    weights: dict[str, torch.Tensor] = field(default_factory=dict)
    """Full weights after the last step, by full name (tensor-parallel shards joined)."""
    trace: Trace = field(default_factory=Trace)
    """Rows of the last step, every rank."""
    peak_ir_bytes: list[int] = field(default_factory=list)
    """Per rank: the peak of the IR's declared live bytes."""
    peak_device_bytes: list[int] = field(default_factory=list)
    """Per rank on CUDA: the allocator's peak of allocated bytes over the run (``torch.cuda.max_memory_allocated``);
    0 on CPU."""

    @property
    def measured_step_s(self) -> float:
        """Step time: the median of the steps after the first (warm-up).

        Calibration summarises each op by its median too; mixing a minimum of whole steps with minima of
        single ops under-predicted by 50-80% on a loaded machine (the minimum of a sum is not the sum of
        minima).
        """
        times = self.step_times_s[1:] if len(self.step_times_s) > 1 else self.step_times_s
        return float(statistics.median(times))


def validate_or_raise(program: Program) -> None:
    """Static validation and a deadlock dry run; a failing program never launches."""
    from simgrid.ir.dryrun import dry_run
    from simgrid.ir.validate import validate_program

    validate_program(program)
    dry_run(program)
    if program.model is None or program.layout is None:
        raise ProgramError("executor: the program must carry its model and layout (use build_program)")
    optimizer_for(program.layout.optimizer)  # an optimizer the executor cannot run is refused before launch
    check_experts_supported(program.model, program.layout)
    check_recompute_supported(program.layout)
    refuse_fp8(program.layout)
    if program.layout.tp_comm_overlap:
        raise LayoutError(
            "executor: tp_comm_overlap = true (Transformer Engine's chunked tensor-parallel overlap) is not "
            "implemented; the executor runs each tensor-parallel collective whole: build the program without "
            "--tp-comm-overlap"
        )
    if program.layout.p2p_scatter_gather:
        raise LayoutError(
            "executor: p2p_scatter_gather = true (Megatron-LM's pipeline tensors sent as 1/tp slices and all-gathered "
            "over tp) is not implemented; the executor sends each pipeline tensor whole: build the program without "
            "--p2p-scatter-gather (the simulator alone prices it)"
        )
    if program.layout.overlap_param_gather:
        raise LayoutError(
            "executor: overlap_param_gather = true (ZeRO-1 parameter all-gather deferred to the next step's "
            "forward) is not implemented; the executor runs one step and gathers the updated parameters after "
            "its optimizer step: build the program without --overlap-param-gather"
        )


def refuse_fp8(layout: Layout) -> None:
    """Refuse, before launch, a Transformer Engine fp8 layout: the executor has no fp8 GEMMs (nor TE)."""
    if layout.fp8_recipe != "none":
        raise LayoutError(
            f"executor: fp8_recipe = {layout.fp8_recipe!r} (Transformer Engine fp8 autocast) is not implemented; "
            "the executor runs 16-bit or fp32 GEMMs only: run it with --fp8 none (the simulator alone models fp8)"
        )


def check_recompute_supported(layout: Layout) -> None:
    """Refuse, before launch, torchtitan's per-op selective checkpointing: the executor recomputes whole
    blocks from their saved input and has no per-op saved-tensor policy (the simulator models it)."""
    if layout.recompute == "selective-op":
        raise LayoutError(
            "executor: recompute 'selective-op' (torchtitan's per-op checkpointing) is not implemented; run "
            "recompute 'full' or 'none' (the simulator alone models selective-op)"
        )


def check_experts_supported(model: ModelSpec, layout: Layout) -> None:
    """Refuse, before launch, the MoE settings the executor does not run (the simulator models them)."""
    moe = model.moe
    if moe is None:
        return
    if layout.expert_tp > 1:
        raise LayoutError(
            f"executor: expert tensor parallelism (etp = {layout.expert_tp}) is not implemented; run etp = 1 "
            "(etp defaults to tp: pass --etp 1 with tp > 1)"
        )
    if moe.capacity_factor is not None:
        raise LayoutError(
            f"executor: capacity_factor = {moe.capacity_factor} (token dropping) is not implemented; the executor "
            "runs dropless routing (capacity_factor None)"
        )
    if moe.shared_expert_ffn_hidden_size and layout.tp > 1:
        raise LayoutError(
            "executor: a shared expert with tp > 1 is not implemented (it would need tensor-parallel cuts inside "
            "the MoE block); use tp = 1 or a model without shared experts"
        )


def run_program(program: Program, *, steps: int = 1, seed: int = 0, optimizer: OptimizerConfig | None = None,
                config: LaunchConfig | None = None, collect_weights: bool = True,
                mixed_precision: bool | None = None) -> RunResult:
    """Validate, launch ``len(program.ranks)`` processes and run ``steps`` steps of ``program``."""
    job = Job(program=program, steps=steps, seed=seed, optimizer=optimizer, collect_weights=collect_weights,
              mixed_precision=mixed_precision)
    return run_programs([job], config=config)[0]


def run_programs(jobs: list[Job], *, config: LaunchConfig | None = None) -> list[RunResult]:
    """Run several programs of one world size in one set of processes, one after another."""
    if not jobs:
        return []
    world = len(jobs[0].program.ranks)
    for job in jobs:
        validate_or_raise(job.program)
        if len(job.program.ranks) != world:
            raise ProgramError(f"run_programs: all programs need {world} ranks; one has {len(job.program.ranks)}")
    payload = [(program_to_json(j.program, indent=None), j.steps, j.seed, j.optimizer, j.collect_weights, j.fault,
                j.mixed_precision) for j in jobs]
    config = config or LaunchConfig(world_size=world)
    per_rank = spawn_world(_worker, payload, config)
    return [_assemble(i, jobs[i], [rank_out[i] for rank_out in per_rank]) for i in range(len(jobs))]


def _worker(ctx: RankContext, payload: list[tuple[Any, ...]]) -> list[Any]:
    outputs = []
    for index, (text, steps, seed, optimizer, collect, fault, mixed) in enumerate(payload):
        program = program_from_json(text, source=f"job {index}")
        _make_groups(ctx, program)
        backend = dist.get_backend()
        reset_peak_memory(ctx.device)
        interp = RankInterpreter(ctx, program, seed=seed, optimizer=optimizer, backend=str(backend),
                                 mixed_precision=mixed)
        if fault is not None and fault[0] == ctx.rank:
            interp.fault = (fault[1], fault[2])
        losses, times, rows, peak = [], [], [], 0
        for step in range(steps):
            dist.barrier()
            result = interp.run_step(step)
            losses.append(result.losses)
            times.append(result.step_s)
            rows = [tuple(r) for r in result.rows]
            peak = max(peak, result.peak_ir_bytes)
        weights = _local_weights(ctx, interp) if collect else {}
        coord = interp.coord
        outputs.append({"losses": losses, "times": times, "rows": rows, "weights": weights, "peak": peak,
                        "coord": (coord.pp, coord.dp, coord.tp, coord.cp or 0),
                        "device_peak": peak_memory_bytes(ctx.device)})
    return outputs


def _make_groups(ctx: RankContext, program: Program) -> None:
    """Create the program's groups on every rank in the same (sorted) order."""
    ctx.groups.clear()
    ctx.members.clear()
    for name in sorted(program.groups):
        members = tuple(program.groups[name])
        ctx.members[name] = members
        if members == tuple(range(ctx.world_size)):
            ctx.groups[name] = dist.group.WORLD
            continue
        group = dist.new_group(ranks=list(members), timeout=timedelta(seconds=60))
        if ctx.rank in members:
            ctx.groups[name] = group


def _local_weights(ctx: RankContext, interp: RankInterpreter) -> dict[str, tuple[np.ndarray, int | None]]:
    """This rank's owned weights (tensor-parallel shards), ZeRO-3 shards gathered for reporting only."""
    book = interp.book
    if book.zero3:
        group = ctx.groups[interp.mesh.dp_group_name(interp.coord)]
        for shard in book.zero3.values():
            full = shard.shard.new_empty(shard.shard.numel() * interp.layout.grad_sync_size)
            all_gather_single(full, shard.shard, group)
            shard.param.data = full[: shard.numel].view(shard.shape).clone()
    out: dict[str, tuple[np.ndarray, int | None]] = {}
    for module in interp.modules.values():
        for name, p in owned_parameters(module):
            out[name] = (p.detach().cpu().numpy().copy(), shard_dim(module, name))
    return out


def _assemble(index: int, job: Job, ranks: list[dict[str, Any]]) -> RunResult:
    layout = job.program.layout
    assert layout is not None
    # One loss per (replica, context-parallel rank, micro-batch): each is the mean over equally many
    # tokens, so their plain mean is the mean over all tokens (the reference's loss).
    expected = layout.num_microbatches * layout.dp * layout.cp
    losses = []
    for step in range(job.steps):
        per_replica: dict[tuple[int, int, int], float] = {}
        for out in ranks:
            _, d, t, c = out["coord"]
            if t == 0:
                for mb, loss in out["losses"][step].items():
                    per_replica[(d, c, mb)] = loss
        if len(per_replica) != expected:
            raise ProgramError(f"job {index}: {len(per_replica)} micro-batch losses reported, expected {expected}")
        losses.append(sum(per_replica.values()) / expected)
    times = [max(out["times"][s] for out in ranks) for s in range(job.steps)]
    weights: dict[str, torch.Tensor] = {}
    if job.collect_weights:
        pieces: dict[str, dict[int, tuple[int, np.ndarray, int | None]]] = {}
        for out in ranks:
            pp, d, t, c = out["coord"]
            for name, (arr, _) in out["weights"].items():
                if EXPERT_WEIGHT in name:  # a routed expert is whole on each rank holding it (etp = 1)
                    weights.setdefault(name, torch.from_numpy(arr))
            if d != 0 or c != 0:  # replicas and context-parallel ranks hold the same weights
                continue
            for name, (arr, dim) in out["weights"].items():
                if EXPERT_WEIGHT in name:
                    continue
                slot = pieces.setdefault(name, {})
                if t not in slot or pp < slot[t][0]:
                    slot[t] = (pp, arr, dim)
        for name, by_tp in pieces.items():
            ordered = [by_tp[t] for t in sorted(by_tp)]
            weights[name] = unshard([torch.from_numpy(a) for _, a, _ in ordered], ordered[0][2])
    rows = [TraceRow(*r) for out in ranks for r in out["rows"]]
    trace = Trace.from_rows(rows, meta={"source": "executor", "world_size": len(ranks), "steps": job.steps})
    return RunResult(losses=losses, step_times_s=times, weights=weights, trace=trace,
                     peak_ir_bytes=[out["peak"] for out in ranks],
                     peak_device_bytes=[out.get("device_peak", 0) for out in ranks])


def max_relative_error(weights: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> tuple[float, str]:
    """Largest per-tensor ``||a - b|| / ||b||`` over the reference's weights, and the tensor's name."""
    worst, where = 0.0, ""
    missing = sorted(set(reference) - set(weights))
    if missing:
        raise ProgramError(f"run returned no value for weight(s) {missing[:5]}")
    for name, ref in reference.items():
        got = weights[name]
        err = float((got - ref).norm() / max(float(ref.norm()), 1e-30))
        if err > worst:
            worst, where = err, name
    return worst, where
