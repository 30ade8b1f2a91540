"""How fast the host is, and how much a running collective slows compute, measured on every rank at once.

The executor's steps on a tiny model are mostly Python dispatch of small torch ops, so other load on the
machine slows them down in proportion: the host-speed probe (:func:`measure_probe`) taken before and after
calibration says whether the host stayed steady (:func:`host_drift`), and around a validated run how fast
it is relative to calibration time. :func:`measure_slowdown` measures the compute throughput lost while
gloo's threads run a background all-reduce.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

from executor.launch import LaunchConfig, RankContext, spawn_world

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


def host_drift(probe_before_s: float, probe_after_s: float) -> float:
    """Relative change between two timings of the host-speed probe (slower over faster, minus one)."""
    low, high = sorted((probe_before_s, probe_after_s))
    return high / low - 1.0 if low > 0 else 0.0
