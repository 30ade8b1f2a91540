"""Serving metrics from a simulated run: latency percentiles, throughput per GPU, KV and GPU use over time.

Definitions (those of vLLM's ``benchmark_serving.py`` and Vidur):

* TTFT (time to first token): arrival to the first output token, queueing included.
* TPOT (time per output token): ``(last token - first token) / (output tokens - 1)`` per request; requests
  with a single output token have none. Vidur reports the per-token gaps (TBT) instead; a request's TPOT
  is the mean of its gaps.
* End-to-end latency: arrival to the response (for static batching, the end of the request's batch).
* Throughput: output tokens (and requests) per second over the makespan, from the first arrival to the
  last response, divided by the deployment's GPUs.
* KV occupancy: blocks in use over the replica's blocks, time-weighted over the makespan, averaged over
  replicas; GPU busy: time a pipeline stage's GPUs are computing (or in their tensor-parallel
  collectives) over the makespan, averaged over all stages of all replicas.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from simgrid.serving.server import ServingRun

PERCENTILES = (50, 90, 99)
"""Latency percentiles reported."""


@dataclass(frozen=True, kw_only=True)
class Latency:
    """Percentiles and mean of one latency, in seconds."""

    p50: float
    """Median."""
    p90: float
    """90th percentile."""
    p99: float
    """99th percentile."""
    mean: float
    """Mean."""

    @classmethod
    def of(cls, values: Sequence[float]) -> Latency:
        """Percentiles (linear interpolation) of ``values``; NaN when there are none."""
        if not values:
            nan = float("nan")
            return cls(p50=nan, p90=nan, p99=nan, mean=nan)
        arr = np.asarray(values, dtype=float)
        p50, p90, p99 = (float(x) for x in np.percentile(arr, PERCENTILES))
        return cls(p50=p50, p90=p90, p99=p99, mean=float(arr.mean()))

    def to_dict(self) -> dict[str, float]:
        """JSON-ready mapping."""
        return {"p50": self.p50, "p90": self.p90, "p99": self.p99, "mean": self.mean}


@dataclass(frozen=True, kw_only=True)
class ServingMetrics:
    """Headline numbers of one serving run."""

    requests: int
    """Requests served."""
    gpus: int
    """GPUs of the deployment."""
    makespan_s: float
    """First arrival to last response."""
    ttft: Latency
    """Time to first token."""
    tpot: Latency
    """Time per output token."""
    e2e: Latency
    """End-to-end latency."""
    output_tokens_per_s: float
    """Output tokens per second, whole deployment."""
    requests_per_s: float
    """Requests completed per second, whole deployment."""
    kv_occupancy_mean: float
    """Time-weighted share of KV blocks in use (mean over replicas)."""
    kv_occupancy_peak: float
    """Largest share of KV blocks in use on any replica."""
    gpu_busy: float
    """Share of the makespan the GPUs are busy (mean over stages and replicas)."""
    preemptions: int
    """Recompute preemptions (a request losing its cache)."""
    iterations: int
    """Iterations run on all replicas."""
    mean_batch_tokens: float
    """Mean new tokens per iteration."""
    mean_batch_sequences: float
    """Mean sequences per iteration."""

    @property
    def output_tokens_per_s_per_gpu(self) -> float:
        """Output tokens per second per GPU."""
        return self.output_tokens_per_s / self.gpus

    @property
    def requests_per_s_per_gpu(self) -> float:
        """Requests per second per GPU."""
        return self.requests_per_s / self.gpus

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready mapping (latencies in seconds)."""
        return {
            "requests": self.requests, "gpus": self.gpus, "makespan_s": self.makespan_s,
            "ttft_s": self.ttft.to_dict(), "tpot_s": self.tpot.to_dict(), "e2e_s": self.e2e.to_dict(),
            "output_tokens_per_s": self.output_tokens_per_s,
            "output_tokens_per_s_per_gpu": self.output_tokens_per_s_per_gpu,
            "requests_per_s": self.requests_per_s, "requests_per_s_per_gpu": self.requests_per_s_per_gpu,
            "kv_occupancy_mean": self.kv_occupancy_mean, "kv_occupancy_peak": self.kv_occupancy_peak,
            "gpu_busy": self.gpu_busy, "preemptions": self.preemptions, "iterations": self.iterations,
            "mean_batch_tokens": self.mean_batch_tokens, "mean_batch_sequences": self.mean_batch_sequences,
        }


def _time_weighted(points: Sequence[tuple[float, int]], start: float, end: float) -> float:
    """Mean of a step function given by (time, value) change points over [start, end]."""
    if end <= start:
        return float(points[-1][1]) if points else 0.0
    total = 0.0
    for i, (t, value) in enumerate(points):
        t_next = points[i + 1][0] if i + 1 < len(points) else end
        lo, hi = max(t, start), min(t_next, end)
        if hi > lo:
            total += value * (hi - lo)
    return total / (end - start)


def compute_serving_metrics(run: ServingRun) -> ServingMetrics:
    """Metrics of ``run`` (definitions in the module docstring)."""
    recs = run.records
    start = min(r.arrival_s for r in recs)
    end = max(r.done_s for r in recs)
    span = max(end - start, 1e-12)
    capacity = run.kv_blocks_per_replica
    occupancy = [_time_weighted(tl, start, end) / capacity for tl in run.kv_timeline] if capacity else [0.0]
    peak = max((v for tl in run.kv_timeline for _, v in tl), default=0) / capacity if capacity else 0.0
    stage_busy = [sum(min(e, end) - max(s, start) for s, e in stage if e > start and s < end) / span
                  for replica in run.busy for stage in replica]
    its = run.iterations
    return ServingMetrics(
        requests=len(recs), gpus=run.layout.world_size, makespan_s=end - start,
        ttft=Latency.of([r.ttft_s for r in recs]),
        tpot=Latency.of([t for r in recs if (t := r.tpot_s) is not None]),
        e2e=Latency.of([r.e2e_s for r in recs]),
        output_tokens_per_s=sum(r.output_tokens for r in recs) / span,
        requests_per_s=len(recs) / span,
        kv_occupancy_mean=float(np.mean(occupancy)), kv_occupancy_peak=peak,
        gpu_busy=float(np.mean(stage_busy)) if stage_busy else 0.0,
        preemptions=sum(r.preemptions for r in recs), iterations=len(its),
        mean_batch_tokens=float(np.mean([it.tokens for it in its])) if its else 0.0,
        mean_batch_sequences=float(np.mean([it.sequences for it in its])) if its else 0.0,
    )


def kv_occupancy_series(run: ServingRun, replica: int = 0) -> tuple[list[float], list[float]]:
    """(times, share of KV blocks in use) of one replica, as a step function's change points."""
    capacity = run.kv_blocks_per_replica or 1
    points = run.kv_timeline[replica]
    return [t for t, _ in points], [v / capacity for _, v in points]


def busy_series(run: ServingRun, *, bins: int = 100) -> tuple[list[float], list[float]]:
    """(bin centres, share of all stages busy in each bin) over the makespan."""
    start = min(r.arrival_s for r in run.records)
    end = max(r.done_s for r in run.records)
    width = max(end - start, 1e-12) / bins
    busy = np.zeros(bins)
    stages = 0
    for replica in run.busy:
        for stage in replica:
            stages += 1
            for s, e in stage:
                first, last = int((s - start) // width), int((e - start) // width)
                for b in range(max(first, 0), min(last, bins - 1) + 1):
                    lo, hi = start + b * width, start + (b + 1) * width
                    busy[b] += max(0.0, min(e, hi) - max(s, lo))
    centres = [start + (b + 0.5) * width for b in range(bins)]
    return centres, [float(x) for x in busy / (width * max(stages, 1))]
