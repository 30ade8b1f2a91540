"""Micro-benchmarks on this machine, written as a self-contained cluster profile with measured tables.

What is measured (``simgrid-exec calibrate``):

* each collective the executor issues (all-reduce, all-gather, reduce-scatter, broadcast, reduce) by
  size over a group of ``world_size`` ranks, exactly as the executor performs it (gloo's reduce-scatter
  is an all-reduce plus taking a shard: measured that way, never assumed to be a ring);
* point-to-point send/recv by size (half a ping-pong round trip);
* streaming memory bandwidth (a large ``clone``);
* compute: the model's real ops at its shapes, timed inside short real runs of a few layouts, then fitted
  to the engine's compute model ``time = flops / peak + hbm_bytes / bandwidth + kernels * overhead``
  (:mod:`simgrid.costs.compute`) by least squares with non-negative coefficients.

The profile starts from the shipped ``ideal`` cluster and replaces its node and "GPU" (here: one CPU rank
with ``cores / ranks`` threads) with the fitted figures, so it is self-contained and loads anywhere.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from executor.comm import all_gather_dim0, reduce_scatter_dim0
from executor.costmodel import LOOP_KEY, compute_key, host_keys, mean_rows
from executor.interpreter import RankInterpreter, StepResult
from executor.launch import LaunchConfig, RankContext, spawn_world
from executor.runner import _make_groups
from simgrid.hardware import (
    DTYPES,
    ClusterSpec,
    CollectiveRow,
    ComputeRow,
    LinkSpec,
    MatmulEfficiency,
    MeasuredTables,
    P2PRow,
    load_cluster_spec,
    write_profile,
)
from simgrid.ir.jsonio import program_from_json, program_to_json
from simgrid.ir.ops import Collective, Compute, Op, Recv, Send, Transfer, Wait
from simgrid.ir.program import Program
from simgrid.layout.spec import Layout
from simgrid.model.spec import ModelSpec
from simgrid.schedules import build_program

COLLECTIVE_SIZES_BYTES = (256, 2048, 8192, 32768, 131072, 524288, 2097152)
"""Message sizes measured per collective (the tiny model's TP/DP messages fall between 128 B and 1 MB)."""
REPEATS = 20
"""Timed repetitions per size after 3 warm-up runs; the 10%-trimmed mean is kept (see
:func:`executor.costmodel.mean_rows`: gloo's latency on a shared host is bimodal, 0.3 ms or a 4 ms
scheduler tick, and a step pays the mean, not the median)."""
MEASURED_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")
SLOWDOWN_MESSAGE_BYTES = 1 << 20
"""Background all-reduce size of the slowdown benchmark (the tiny model's largest DP bucket is ~1 MB)."""
SLOWDOWN_MATMULS = 96
"""192x192 matmuls per timed loop (tens of ms on one core: several all-reduces complete meanwhile)."""
SLOWDOWN_ISSUE_EVERY = 8
"""Matmuls between two background all-reduces in the slowdown benchmark."""
PROBE_KEY = "PROBE:host"
"""Measured-table key of the host-speed probe (:func:`measure_probe`) at calibration time."""
PROBE_ITERATIONS = 150
"""Forward+backward of a 64x64 matmul per probe repetition (~20-40 ms: small ops, like the interpreter's)."""
PROBE_REPEATS = 5
"""Timed probe repetitions (median kept) after one warm-up."""
SLOWDOWN_REPEATS = 5
"""Timed (alone, with communication) pairs; the median ratio is kept, after one warm-up pair."""
HOST_DRIFT_WARNING = 0.15
"""Above this relative change of the host-speed probe between the start and the end of the in-situ
measurements, other load changed while calibrating and every prediction from the profile may be off
(seen on 2026-11-22: predictions moved by 10% between calibrations while the measured steps did not)."""


@dataclass(frozen=True, kw_only=True)
class ComputeFit:
    """Fitted compute model of one rank."""

    peak_flops: float
    """FLOP/s of matrix work (fp32)."""
    bandwidth_Bps: float
    """Bytes/s of memory-bound work."""
    overhead_s: float
    """Seconds per kernel launch (here: per operator call, Python dispatch included)."""
    samples: int
    """Compute ops the fit used."""
    mean_abs_error: float
    """Mean absolute relative error of the fit over the samples."""
    host_drift: float = 0.0
    """Relative change of the host-speed probe from before to after the in-situ measurements (0: steady
    host); above :data:`HOST_DRIFT_WARNING` the calibration is suspect."""

    @property
    def host_was_steady(self) -> bool:
        """Whether the host-speed probe stayed within :data:`HOST_DRIFT_WARNING` while calibrating."""
        return self.host_drift <= HOST_DRIFT_WARNING

    def drift_warning(self) -> str:
        """A one-line warning when the host was not steady, else ''."""
        if self.host_was_steady:
            return ""
        return (f"warning: the host-speed probe changed by {self.host_drift:.0%} while calibrating (other load on "
                "this machine); predictions from this profile may be off: calibrate again on a quiet machine")


def _time_collective(kind: str, nbytes: int, group: Any, size: int, index: int, backend: str) -> float:
    elements = max(size, nbytes // 4 // size * size)
    if kind == "all_reduce":
        t = torch.ones(elements)
        dist.all_reduce(t, group=group, async_op=True).wait()
    elif kind == "all_gather":
        _, work = all_gather_dim0(torch.ones(elements // size), group, size)
        work.wait()
    elif kind == "reduce_scatter":
        getter, work, _ = reduce_scatter_dim0(torch.ones(elements), group, size, index, backend)
        work.wait()
        getter()
    elif kind == "broadcast":
        dist.broadcast(torch.ones(elements), src=0, group=group, async_op=True).wait()
    else:
        dist.reduce(torch.ones(elements), dst=0, group=group, async_op=True).wait()
    return 0.0


def _bench_worker(ctx: RankContext, payload: dict[str, Any]) -> dict[str, Any]:
    """Collectives, send/recv and memory bandwidth, timed identically on every rank (rank 0 reports)."""
    backend = str(dist.get_backend())
    group = dist.group.WORLD
    size, index = ctx.world_size, ctx.rank
    collectives: list[tuple[str, int, float]] = []
    for kind, nbytes in ((k, n) for k in payload["kinds"] for n in payload["sizes_by_kind"].get(k, payload["sizes"])):
        ctx.report_op(f"calibrate {kind} {nbytes} B")
        times = []
        for rep in range(REPEATS + 3):
            dist.barrier()
            start = time.perf_counter()
            _time_collective(kind, nbytes, group, size, index, backend)
            if rep >= 3:
                times.append(time.perf_counter() - start)
        collectives.append((kind, nbytes, trimmed_mean_s(times)))
    p2p: list[tuple[int, float]] = []
    for nbytes in payload["sizes_by_kind"].get("send", payload["sizes"]):
        ctx.report_op(f"calibrate send/recv {nbytes} B")
        buf = torch.ones(max(1, nbytes // 4))
        times = []
        for rep in range(REPEATS + 3):
            dist.barrier()
            start = time.perf_counter()
            if index == 0:
                dist.send(buf, dst=1)
                dist.recv(buf, src=1)
            elif index == 1:
                dist.recv(buf, src=0)
                dist.send(buf, dst=0)
            if rep >= 3:
                times.append((time.perf_counter() - start) / 2)
        p2p.append((nbytes, trimmed_mean_s(times)))
    big = torch.ones(16 * 2**20)
    times = []
    for _ in range(5):
        start = time.perf_counter()
        big.clone()
        times.append(time.perf_counter() - start)
    bandwidth = 2 * big.numel() * 4 / min(times)  # read + write
    return {"collectives": collectives, "p2p": p2p, "memory_Bps": bandwidth}


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


def trimmed_mean_s(times: Sequence[float]) -> float:
    """Mean of ``times`` with :data:`executor.costmodel.TRIM_FRACTION` dropped at each end."""
    return mean_rows([("t", t) for t in times])["t"] * 1e-6


def calibration_programs(model: ModelSpec, layouts: Sequence[Layout]) -> list[Program]:
    """The Program of each layout, built once: message sizes, in-situ runs and the op table all read
    these same programs (building one is the slow part of preparing a calibration)."""
    return [build_program(model, layout) for layout in layouts]


def program_message_sizes(programs: Sequence[Program]) -> dict[str, tuple[int, ...]]:
    """Collective kind (and ``"send"``) -> bytes per call ``programs`` issue, sorted.

    Measured in addition to :data:`COLLECTIVE_SIZES_BYTES` so the tables hold the model's own message
    sizes (gradient buckets, gathered blocks, activations) instead of interpolating between grid points.
    """
    sizes: dict[str, set[int]] = {}
    for program in programs:
        for rank_ops in program.ranks:
            for op in rank_ops:
                if isinstance(op, Collective):
                    sizes.setdefault(op.kind, set()).add(max(1, op.bytes // max(1, op.count)))
                elif isinstance(op, Send):
                    sizes.setdefault("send", set()).add(max(1, op.bytes))
    return {kind: tuple(sorted(values)) for kind, values in sizes.items()}


def measure_communication(world_size: int = 2, *, sizes: Sequence[int] = COLLECTIVE_SIZES_BYTES,
                          sizes_by_kind: dict[str, tuple[int, ...]] | None = None,
                          config: LaunchConfig | None = None) -> dict[str, Any]:
    """Collective, send/recv and memory-bandwidth measurements from a real ``world_size``-rank world.

    ``sizes_by_kind`` (collective kind or ``"send"`` -> sizes) overrides ``sizes`` per kind.
    """
    payload = {"kinds": MEASURED_KINDS, "sizes": tuple(sizes), "sizes_by_kind": dict(sizes_by_kind or {})}
    results = spawn_world(_bench_worker, payload, config or LaunchConfig(world_size=world_size, run_timeout_s=600))
    return dict(results[0])


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

    def _wait(self, op: Wait, start: Any, text: str) -> None:
        found = self.pending.get(op.handle)
        begin = time.perf_counter()
        if found is not None:
            pend = found[1]
            for work in pend.works:
                work.wait()
            pend.poll()
            pend.works = []  # gloo's recv work cannot be waited twice; finish() then only runs the callback
        self._blocked_s = time.perf_counter() - begin
        super()._wait(op, start, text)

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


def measure_probe(world_size: int = 2, *, config: LaunchConfig | None = None) -> float:
    """Seconds of a fixed small-op workload run on every rank at once: how fast the host is *now*.

    The executor's steps on a tiny model are mostly Python dispatch of small torch ops, so other load on
    the machine slows them down in proportion; comparing this probe at calibration time and around a
    validated run gives the relative speed of the machine between the two (never a validated run's times).
    """
    results = spawn_world(_probe_worker, {}, config or LaunchConfig(world_size=world_size, run_timeout_s=120))
    return float(statistics.median(results))


def _probe_worker(ctx: RankContext, payload: dict[str, Any]) -> float:
    x = torch.randn(64, 64, requires_grad=True)
    w = torch.randn(64, 64, requires_grad=True)
    times = []
    for rep in range(PROBE_REPEATS + 1):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(PROBE_ITERATIONS):
            torch.relu(x @ w).sum().backward()
        if rep > 0:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_slowdown(world_size: int = 2, *, config: LaunchConfig | None = None) -> float:
    """Fraction of compute throughput lost while a collective runs in the background, on every rank."""
    results = spawn_world(_slowdown_worker, {}, config or LaunchConfig(world_size=world_size, run_timeout_s=300))
    return float(statistics.median(results))


def _slowdown_worker(ctx: RankContext, payload: dict[str, Any]) -> float:
    """Both ranks run the same matmul loop alone, then with an all-reduce always in flight (gloo's threads
    compete for the cores); the median ratio of the two times gives the lost throughput."""
    a = torch.randn(192, 192)
    buf = torch.ones(SLOWDOWN_MESSAGE_BYTES // 4)

    def loop(with_comm: bool) -> float:
        # Same issue schedule on every rank (collectives must match): one all-reduce every few matmuls,
        # so one is nearly always queued or running in gloo's background thread.
        works = []
        start = time.perf_counter()
        for i in range(SLOWDOWN_MATMULS):
            if with_comm and i % SLOWDOWN_ISSUE_EVERY == 0:
                works.append(dist.all_reduce(buf, async_op=True))
            a @ a
        elapsed = time.perf_counter() - start
        for work in works:
            work.wait()
        return elapsed

    ratios = []
    for rep in range(SLOWDOWN_REPEATS + 1):
        dist.barrier()
        alone = loop(False)
        dist.barrier()
        busy = loop(True)
        if rep > 0:
            ratios.append(alone / busy)
    return max(0.0, min(0.9, 1.0 - statistics.median(ratios)))


def fit_compute(samples: Sequence[tuple[Compute, float]]) -> ComputeFit:
    """Least squares ``t = a*flops + b*hbm_bytes + c*kernels`` with a, b, c >= 0 (best non-negative subset)."""
    if not samples:
        raise ValueError("no compute samples to fit")
    # One point per distinct op, the median over repeats and ranks (the measured step is a median too);
    # the weight keeps frequent ops important.
    groups: dict[tuple[object, ...], list[float]] = {}
    ops: dict[tuple[object, ...], Compute] = {}
    for op, seconds in samples:
        key = (op.kind, op.flops, op.hbm_bytes, op.kernels)
        groups.setdefault(key, []).append(seconds)
        ops[key] = op
    # Absolute least squares: the step time is a sum of op times, so absolute errors are what add up
    # (a relative fit under-predicted steps by ~50% here); sqrt(count) keeps frequent ops important.
    times = np.array([statistics.median(v) for v in groups.values()], dtype=float)
    weight = np.sqrt(np.array([len(v) for v in groups.values()], dtype=float))
    x = np.array([[ops[k].flops, ops[k].hbm_bytes, ops[k].kernels] for k in groups], dtype=float) * weight[:, None]
    y = times * weight
    best: tuple[float, np.ndarray] | None = None
    for mask in itertools.product((True, False), repeat=3):
        cols = [i for i, keep in enumerate(mask) if keep]
        if not cols:
            continue
        coef, *_ = np.linalg.lstsq(x[:, cols], y, rcond=None)
        if (coef < 0).any():
            continue
        full = np.zeros(3)
        full[cols] = coef
        residual = float(((x @ full - y) ** 2).sum())
        if best is None or residual < best[0]:
            best = (residual, full)
    assert best is not None
    a, b, c = best[1]
    rel = float(np.mean(np.abs(x @ best[1] - y) / np.maximum(y, 1e-12)))  # weights cancel in the ratio
    return ComputeFit(peak_flops=1.0 / a if a > 0 else float("inf"), bandwidth_Bps=1.0 / b if b > 0 else float("inf"),
                      overhead_s=float(c), samples=len(samples), mean_abs_error=rel)


def build_profile(*, name: str, world_size: int, comm: dict[str, Any], fit: ComputeFit,
                  compute_rows: Sequence[tuple[str, float]] = (), slowdown: float | None = None) -> ClusterSpec:
    """A self-contained cluster profile of this machine (one node of ``world_size`` CPU ranks)."""
    base = load_cluster_spec("ideal")
    cores = os.cpu_count() or 1
    threads = max(1, cores // world_size)
    p2p = sorted(comm["p2p"])
    small_s = p2p[0][1]
    (s0, t0), (s1, t1) = p2p[-2], p2p[-1]
    p2p_bw = (s1 - s0) / max(t1 - t0, 1e-12)
    memory_GBps = comm["memory_Bps"] / 1e9
    tflops = fit.peak_flops / 1e12
    gpu = dataclasses.replace(
        base.node.gpu, name=f"{name}-rank", description=f"one CPU rank with {threads} thread(s), fp32, measured",
        memory_GiB=float(max(1, _host_memory_GiB() // world_size)), hbm_bandwidth_GBps=fit.bandwidth_Bps / 1e9,
        hbm_efficiency=1.0, peak_tflops={d: tflops for d in DTYPES}, matmul=MatmulEfficiency(max_efficiency=1.0),
        kernel_overhead_us=fit.overhead_s * 1e6, comm_compute_slowdown=slowdown or 0.0,
        sources={"peak_tflops": f"fitted to {fit.samples} real compute ops (mean abs error {fit.mean_abs_error:.1%})",
                 "hbm_bandwidth_GBps": "fitted with peak_tflops", "kernel_overhead_us": "fitted with peak_tflops",
                 "comm_compute_slowdown": "assumed 0: not measured" if slowdown is None else
                 "measured: matmul loop on every rank alone vs with a background gloo all-reduce"},
    )
    node = dataclasses.replace(
        base.node, name=f"{name}-node", description=f"this machine: {cores} cores, {world_size} ranks, gloo",
        gpu=gpu, gpus_per_node=world_size, intra_fabric="pcie", gpus_per_pcie_switch=world_size,
        intra_link=LinkSpec(bandwidth_GBps=p2p_bw / 1e9, latency_us=small_s * 1e6, efficiency=1.0),
        pcie_link=LinkSpec(bandwidth_GBps=memory_GBps, latency_us=0.0, efficiency=1.0),
        host_memory_GiB=float(_host_memory_GiB()),
        sources={"intra_link": "measured: gloo send/recv over loopback (bandwidth from the two largest sizes)",
                 "pcie_link": "measured: memory bandwidth (host copies stand in for PCIe)"},
    )
    measured = MeasuredTables(
        collectives=tuple(CollectiveRow(kind=k, group_size=world_size, bytes=b, time_us=t * 1e6)
                          for k, b, t in comm["collectives"]),
        p2p=tuple(P2PRow(bytes=b, time_us=t * 1e6) for b, t in comm["p2p"]),
        compute=tuple(ComputeRow(key=k, time_us=t * 1e6) for k, t in compute_rows),
        memory_bandwidth_GBps=memory_GBps,
    )
    return dataclasses.replace(base, name=name, description=f"calibrated on this machine ({world_size} ranks, gloo)",
                               node=node, max_nodes=1, measured=measured,
                               sources={"measured": "simgrid-exec calibrate"})


def _host_memory_GiB() -> int:
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        return max(1, int(pages // 2**30))
    except (ValueError, OSError, AttributeError):
        return 16


def host_drift(probe_before_s: float, probe_after_s: float) -> float:
    """Relative change between two timings of the host-speed probe (slower over faster, minus one)."""
    low, high = sorted((probe_before_s, probe_after_s))
    return high / low - 1.0 if low > 0 else 0.0


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
              name: str = "localhost-gloo") -> tuple[ClusterSpec, ComputeFit]:
    """Measure this machine and return (and optionally write) its cluster profile."""
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
    if out is not None:
        write_profile(spec, out)
    return spec, fit
