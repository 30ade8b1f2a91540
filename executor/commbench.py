"""Communication micro-benchmarks of calibration: collectives by kind and size, send/recv, memory bandwidth.

Each collective the executor issues (all-reduce, all-gather, reduce-scatter, broadcast, reduce) is timed
by size over a group of ``world_size`` ranks, exactly as the executor performs it (gloo's reduce-scatter
is an all-reduce plus taking a shard: measured that way, never assumed to be a ring); send/recv is half a
ping-pong round trip; memory bandwidth is a large ``clone``. The sizes are a fixed grid plus the messages
the calibration programs really send (:func:`program_message_sizes`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from executor.comm import all_gather_dim0, reduce_scatter_dim0
from executor.costmodel import mean_rows
from executor.launch import LaunchConfig, RankContext, spawn_world
from simgrid.ir.ops import Collective, Send
from simgrid.ir.program import Program

COLLECTIVE_SIZES_BYTES = (256, 2048, 8192, 32768, 131072, 524288, 2097152)
"""Message sizes measured per collective (the tiny model's TP/DP messages fall between 128 B and 1 MB)."""
REPEATS = 20
"""Timed repetitions per size after 3 warm-up runs; the 10%-trimmed mean is kept (see
:func:`executor.costmodel.mean_rows`: gloo's latency on a shared host is bimodal, 0.3 ms or a 4 ms
scheduler tick, and a step pays the mean, not the median)."""
MEASURED_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")


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
    return {"collectives": monotone_in_size(collectives),
            "p2p": [(b, t) for _, b, t in monotone_in_size([("p2p", b, t) for b, t in p2p])],
            "memory_Bps": bandwidth}


def monotone_in_size(rows: Sequence[tuple[str, int, float]]) -> list[tuple[str, int, float]]:
    """Rows (kind, bytes, seconds) with each kind's times made non-decreasing in size.

    A larger message is never faster, so a time that falls as the size grows is noise: on this VM gloo
    completes a small collective in ~0.3 ms or after a 4 ms scheduler tick, and a trimmed mean still
    carries the ticks it drew. The least-squares non-decreasing fit (pool adjacent violators; Barlow et
    al., "Statistical Inference under Order Restrictions", 1972) replaces each violating run by its mean,
    so the written table passes the profile loader's monotonicity rule instead of failing the calibration.
    """
    out: list[tuple[str, int, float]] = []
    for kind in dict.fromkeys(k for k, _, _ in rows):
        series = sorted((b, t) for k, b, t in rows if k == kind)
        blocks: list[list[float]] = []  # [mean, count] per pooled run
        for _, t in series:
            blocks.append([t, 1.0])
            while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
                (m1, n1), (m2, n2) = blocks.pop(-2), blocks.pop()
                blocks.append([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2])
        fitted = [m for m, n in blocks for _ in range(int(n))]
        out.extend((kind, b, t) for (b, _), t in zip(series, fitted, strict=True))
    return out


def trimmed_mean_s(times: Sequence[float]) -> float:
    """Mean of ``times`` with :data:`executor.costmodel.TRIM_FRACTION` dropped at each end."""
    return mean_rows([("t", t) for t in times])["t"] * 1e-6


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
