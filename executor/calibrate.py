"""Calibration: micro-benchmarks on this machine, written as a self-contained cluster profile with measured tables.

What is measured (``simgrid-exec calibrate``):

* communication (:mod:`executor.commbench`): each collective the executor issues by size over a group of
  ``world_size`` ranks, exactly as the executor performs it, send/recv and streaming memory bandwidth;
* the host (:mod:`executor.hostprobe`): its speed before and after the in-situ runs (a busy host skews
  every prediction) and the compute slowdown while a collective runs;
* in situ (here): the model's real ops at its shapes and the interpreter's own host work per op, timed
  inside short real runs of a few layouts, and the collectives a step waits for right after issuing;
  compute is then fitted to the engine's compute model (:mod:`executor.profilefit`).

The profile starts from the shipped ``ideal`` cluster and replaces its node and "GPU" (here: one CPU rank
with ``cores / ranks`` threads) with the fitted figures, so it is self-contained and loads anywhere. The
names of the split modules are re-exported here, where the CLI, the validation and the notebooks import them.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch.distributed as dist

from executor.commbench import (
    COLLECTIVE_SIZES_BYTES,
    MEASURED_KINDS,
    REPEATS,
    measure_communication,
    program_message_sizes,
    trimmed_mean_s,
)
from executor.costmodel import LOOP_KEY, compute_key, host_keys, mean_rows
from executor.gencal import calibrate_generation
from executor.handlers import sync
from executor.hostprobe import (
    HOST_DRIFT_WARNING,
    PROBE_ITERATIONS,
    PROBE_KEY,
    PROBE_REPEATS,
    SLOWDOWN_ISSUE_EVERY,
    SLOWDOWN_MATMULS,
    SLOWDOWN_MESSAGE_BYTES,
    SLOWDOWN_REPEATS,
    host_drift,
    measure_probe,
    measure_slowdown,
)
from executor.interpreter import RankInterpreter, StepResult
from executor.launch import LaunchConfig, RankContext, spawn_world
from executor.profilefit import ComputeFit, build_profile, fit_compute
from executor.runner import _make_groups
from executor.state import RankState
from simgrid.hardware import ClusterSpec, write_profile
from simgrid.ir.jsonio import program_from_json, program_to_json
from simgrid.ir.ops import Collective, Compute, Op, Recv, Send, Transfer, Wait
from simgrid.ir.program import Program
from simgrid.layout.spec import Layout
from simgrid.model.spec import ModelSpec
from simgrid.schedules import build_program

__all__ = [
    "COLLECTIVE_SIZES_BYTES",
    "HOST_DRIFT_WARNING",
    "INSITU_COMM_PREFIX",
    "MEASURED_KINDS",
    "PROBE_ITERATIONS",
    "PROBE_KEY",
    "PROBE_REPEATS",
    "REPEATS",
    "SLOWDOWN_ISSUE_EVERY",
    "SLOWDOWN_MATMULS",
    "SLOWDOWN_MESSAGE_BYTES",
    "SLOWDOWN_REPEATS",
    "ComputeFit",
    "build_profile",
    "calibrate",
    "calibration_layouts",
    "calibration_programs",
    "compute_ops_by_key",
    "compute_samples",
    "fit_compute",
    "host_drift",
    "insitu_collective_key",
    "insitu_samples",
    "measure_communication",
    "measure_probe",
    "measure_slowdown",
    "merge_insitu_collectives",
    "program_message_sizes",
    "table_rows",
    "trimmed_mean_s",
]

INSITU_COMM_PREFIX = "COMM:"
"""Sample-key prefix of synchronous collectives timed in situ (see :func:`merge_insitu_collectives`)."""


def insitu_collective_key(kind: str, nbytes: int) -> str:
    """Sample key of an in-situ synchronous collective of ``kind`` moving ``nbytes`` per call."""
    return f"{INSITU_COMM_PREFIX}{kind}:{nbytes}"


def merge_insitu_collectives(collectives: Sequence[tuple[str, int, float]],
                             samples: Sequence[tuple[str, float, bool]]) -> list[tuple[str, int, float]]:
    """Collective rows (kind, bytes, seconds) with the in-situ synchronous measurements in place of the
    micro-benchmark's at the same kind and size (added when the grid lacks that size).

    A collective waited right after it is issued (tensor parallelism's all-reduces) also pays, inside a
    step, for the peer arriving late and for gloo's thread wake-ups after compute; measured alone after
    a barrier it looked half as long on this machine (1.2 ms against 2.5 ms for a 256 KiB all-reduce).
    """
    insitu = mean_rows([(k, sec) for k, sec, _ in samples if k.startswith(INSITU_COMM_PREFIX)])
    rows = {(kind, nbytes): seconds for kind, nbytes, seconds in collectives}
    for key, us in insitu.items():
        kind, nbytes = key[len(INSITU_COMM_PREFIX):].rsplit(":", 1)
        rows[(kind, int(nbytes))] = us * 1e-6
    return [(kind, nbytes, seconds) for (kind, nbytes), seconds in sorted(rows.items())]


def calibration_programs(model: ModelSpec, layouts: Sequence[Layout]) -> list[Program]:
    """The Program of each layout, built once: message sizes, in-situ runs and the op table all read
    these same programs (building one is the slow part of preparing a calibration)."""
    return [build_program(model, layout) for layout in layouts]


class _TimedInterpreter(RankInterpreter):
    """The executor's interpreter, timing each op's host work (its own ops are untouched).

    Samples: compute ops by :func:`executor.costmodel.compute_key` (with whether communication was in flight
    when the op started: compute slows down while gloo's threads run), the host work of every other op by
    :func:`executor.costmodel.host_keys` (a WAIT's blocking time excluded, its completion callback kept),
    and the dispatch loop's per-op overhead (step wall time minus the dispatched time, per op).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.samples: list[tuple[str, float, bool]] = []
        self._issued: dict[str, Op] = {}
        self._dispatched_s = 0.0
        self._last_issue: tuple[str, float] | None = None
        self.handlers["wait"] = self._timed_wait

    def _dispatch(self, op: Op, text: str) -> None:
        busy = bool(self.pending)
        start = time.perf_counter()
        self._blocked_s = 0.0
        comm = self._issued.pop(op.handle, None) if isinstance(op, Wait) else None
        last_issue, self._last_issue = self._last_issue, None
        super()._dispatch(op, text)
        end = time.perf_counter()
        seconds = end - start
        self._dispatched_s += seconds
        if isinstance(op, Compute):
            if op.device == "gpu":
                self.samples.append((compute_key(op), seconds, busy))
            return
        if isinstance(op, (Collective, Send, Recv, Transfer)):
            self._issued[op.handle] = op
            self._last_issue = (op.handle, end)
        synchronous = isinstance(op, Wait) and last_issue is not None and last_issue[0] == op.handle
        if synchronous and isinstance(comm, Collective) and last_issue is not None:
            # A synchronous collective (waited right after it was issued, as TP's are): its time from the
            # end of the issue to the end of the blocking wait is what the step pays for it on this host,
            # peer skew and gloo's wake-up delays included, which a barrier-aligned micro-benchmark misses.
            comm_s = (start - last_issue[1]) + self._blocked_s
            self.samples.append((insitu_collective_key(comm.kind, comm.bytes // max(1, comm.count)), comm_s, False))
        for key in host_keys(op, comm):
            self.samples.append((key, max(0.0, seconds - self._blocked_s), False))

    def _timed_wait(self, state: RankState, op: Wait) -> None:
        """The WAIT handler, after blocking on the communication here to time how long the host waited."""
        found = self.pending.get(op.handle)
        begin = time.perf_counter()
        if found is not None:
            pend = found[1]
            for work in pend.works:
                work.wait()
            pend.poll()
            pend.works = []  # gloo's recv work cannot be waited twice; finish() then only runs the callback
        self._blocked_s = time.perf_counter() - begin
        sync.wait(state, op)

    def run_step(self, step: int) -> StepResult:
        self._dispatched_s = 0.0
        begin = time.perf_counter()
        result = super().run_step(step)
        loop_s = (time.perf_counter() - begin - self._dispatched_s) / max(1, len(self.ops))
        self.samples.append((LOOP_KEY, loop_s, False))
        return result


def _insitu_worker(ctx: RankContext, payload: list[tuple[str, int]]) -> list[tuple[str, float, bool]]:
    """Run each calibration program a few steps with the timed interpreter; samples after the warm-up step."""
    samples: list[tuple[str, float, bool]] = []
    for text, steps in payload:
        program = program_from_json(text, source="calibration program")
        _make_groups(ctx, program)
        interp = _TimedInterpreter(ctx, program, backend=str(dist.get_backend()))
        for step in range(steps):
            dist.barrier()
            interp.samples.clear()
            interp.run_step(step)
            if step > 0:
                samples += interp.samples
    return samples


def insitu_samples(programs: Sequence[Program], *, steps: int = 6,
                   config: LaunchConfig | None = None) -> list[tuple[str, float, bool]]:
    """(key, seconds, comm in flight) of every op of short real runs of the calibration ``programs``
    (one spawned world per world size)."""
    samples: list[tuple[str, float, bool]] = []
    by_world: dict[int, list[Program]] = {}
    for program in programs:
        by_world.setdefault(len(program.ranks), []).append(program)
    for world, group in by_world.items():
        payload = [(program_to_json(program, indent=None), steps) for program in group]
        cfg = config or LaunchConfig(world_size=world, run_timeout_s=900)
        for rank_samples in spawn_world(_insitu_worker, payload, dataclasses.replace(cfg, world_size=world)):
            samples += rank_samples
    return samples


def compute_ops_by_key(programs: Sequence[Program]) -> dict[str, Compute]:
    """One device compute op per measured-table key over ``programs``."""
    ops: dict[str, Compute] = {}
    for program in programs:
        for rank_ops in program.ranks:
            for op in rank_ops:
                if isinstance(op, Compute) and op.device == "gpu":
                    ops.setdefault(compute_key(op), op)
    return ops


def compute_samples(model: ModelSpec, layouts: Sequence[Layout], *, steps: int = 4,
                    config: LaunchConfig | None = None) -> list[tuple[Compute, float]]:
    """(op, seconds) of the compute ops of short real runs of ``layouts`` (for :func:`fit_compute`)."""
    programs = calibration_programs(model, layouts)
    ops = compute_ops_by_key(programs)
    return [(ops[key], seconds) for key, seconds, _ in insitu_samples(programs, steps=steps, config=config)
            if key in ops]


def table_rows(samples: Sequence[tuple[str, float, bool]]) -> list[tuple[str, float]]:
    """(key, mean seconds) per key (see :func:`executor.costmodel.mean_rows` for why the mean); compute ops
    use their samples without communication in flight when there are any (the engine adds the measured
    slowdown where communication overlaps)."""
    quiet = [(k, s) for k, s, busy in samples if not busy]
    quiet_keys = {k for k, _ in quiet}
    chosen = quiet + [(k, s) for k, s, busy in samples if busy and k not in quiet_keys]
    return sorted((k, us * 1e-6) for k, us in mean_rows(chosen).items())


def calibration_layouts(world_size: int) -> list[Layout]:
    """Small in-situ benchmark programs: every op signature of the validated 2-rank layouts (DP, TP,
    PP, ZeRO-3: same model, micro-batch size 1) in programs with one micro-batch (two for PP), so no
    validated program (two or four micro-batches) is itself run during calibration."""
    layouts = [Layout(dp=world_size, global_batch_size=world_size, precision="fp32")]
    if world_size >= 2:
        layouts += [Layout(tp=2, dp=world_size // 2, global_batch_size=world_size // 2, precision="fp32"),
                    Layout(pp=2, dp=world_size // 2, schedule="gpipe", global_batch_size=world_size,
                           precision="fp32"),
                    Layout(dp=world_size, zero=3, global_batch_size=world_size, precision="fp32")]
    return layouts


def calibrate(model: ModelSpec, *, world_size: int = 2, out: str | Path | None = None,
              name: str = "localhost-gloo", generation: bool = True) -> tuple[ClusterSpec, ComputeFit]:
    """Measure this machine and return (and optionally write) its cluster profile.

    With ``generation`` (the default) real greedy generation is timed too (:mod:`executor.gencal`), so the
    profile prices serving iterations (:mod:`simgrid.serving.insitu`); its summary is the fit's
    ``generation_summary``."""
    programs = calibration_programs(model, calibration_layouts(world_size))
    own = program_message_sizes(programs)
    by_kind = {kind: tuple(sorted(set(COLLECTIVE_SIZES_BYTES) | set(own.get(kind, ()))))
               for kind in (*MEASURED_KINDS, "send")}
    comm = measure_communication(world_size, sizes_by_kind=by_kind)
    slowdown = measure_slowdown(world_size) if world_size >= 2 else 0.0
    probe_before = measure_probe(world_size)
    samples = insitu_samples(programs)
    probe_after = measure_probe(world_size)
    # The in-situ samples ran between the two probes: their mean is the host speed they were taken at.
    samples.append((PROBE_KEY, (probe_before + probe_after) / 2, False))
    ops = compute_ops_by_key(programs)
    fit = fit_compute([(ops[k], sec) for k, sec, _ in samples if k in ops])
    fit = dataclasses.replace(fit, host_drift=host_drift(probe_before, probe_after))
    comm = {**comm, "collectives": merge_insitu_collectives(comm["collectives"], samples)}
    rows = table_rows([sample for sample in samples if not sample[0].startswith(INSITU_COMM_PREFIX)])
    spec = build_profile(name=name, world_size=world_size, comm=comm, fit=fit, compute_rows=rows, slowdown=slowdown)
    if generation:
        # Priced on the profile calibrated so far: the in-situ rows are what its rates leave unexplained.
        gen = calibrate_generation(model, spec, world_size=world_size)
        fit = dataclasses.replace(fit, generation_summary=gen.summary())
        spec = build_profile(name=name, world_size=world_size, comm=comm, fit=fit, compute_rows=[*rows, *gen.rows],
                             slowdown=slowdown)
    if out is not None:
        write_profile(spec, out)
    return spec, fit
