"""Serving metrics: percentiles, time-weighted occupancy, throughput per GPU and the busy timeline."""

from __future__ import annotations

import math

import pytest

from simgrid.serving import Latency, ServingLayout, poisson_requests, simulate_serving
from simgrid.serving.metrics import _time_weighted, busy_series, kv_occupancy_series


def test_percentiles_interpolate_linearly() -> None:
    """1..100: p50 50.5, p90 90.1, p99 99.01 (linear interpolation, numpy's default); none: NaN."""
    lat = Latency.of([float(i) for i in range(1, 101)])
    assert (lat.p50, lat.p90, lat.p99, lat.mean) == pytest.approx((50.5, 90.1, 99.01, 50.5))
    assert math.isnan(Latency.of([]).p90)


def test_time_weighted_mean_of_a_step_function() -> None:
    """0 until 1 s, 10 until 3 s, then 0: over [0, 4] the mean is 5."""
    assert _time_weighted([(0.0, 0), (1.0, 10), (3.0, 0)], 0.0, 4.0) == pytest.approx(5.0)
    assert _time_weighted([(0.0, 0), (1.0, 10), (3.0, 0)], 2.0, 4.0) == pytest.approx(5.0)


def test_throughput_and_busy_from_the_records() -> None:
    """Throughput is output tokens over first arrival to last response, divided by GPUs; the busy timeline
    integrates to the busy intervals; the KV series starts empty and ends empty."""
    reqs = poisson_requests(20.0, 60, prompt_tokens=(50, 400), output_tokens=(5, 60), seed=4)
    result = simulate_serving("llama2-7b", "dgx-a100-hdr", ServingLayout(replicas=2), reqs)
    m, run = result.metrics, result.run
    span = max(r.done_s for r in run.records) - min(r.arrival_s for r in run.records)
    assert m.output_tokens_per_s == pytest.approx(sum(r.output_tokens for r in reqs) / span)
    assert m.output_tokens_per_s_per_gpu == pytest.approx(m.output_tokens_per_s / 2)
    assert m.requests_per_s_per_gpu == pytest.approx(60 / span / 2)
    busy_total = sum(e - s for replica in run.busy for stage in replica for s, e in stage)
    assert m.gpu_busy == pytest.approx(busy_total / span / 2)
    centres, shares = busy_series(run, bins=50)
    assert len(centres) == 50
    assert sum(shares) * span / 50 * 2 == pytest.approx(busy_total, rel=1e-9)
    _times, occ = kv_occupancy_series(run, 0)
    assert occ[0] == 0.0 and occ[-1] == 0.0 and max(occ) > 0
    assert 0 < m.kv_occupancy_mean <= m.kv_occupancy_peak <= 1
