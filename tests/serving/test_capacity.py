"""Capacity search: targets, candidate layouts, the highest rate meeting targets, and the best layout."""

from __future__ import annotations

import pytest

from simgrid.model import get_model
from simgrid.serving import (
    LatencyTargets,
    ServingError,
    ServingLayout,
    candidate_layouts,
    capacity_search,
    layout_capacity,
    poisson_requests,
    simulate_serving,
    with_poisson_arrivals,
)

WORKLOAD = poisson_requests(1.0, 40, prompt_tokens=(100, 600), output_tokens=(10, 80), seed=5)


def test_targets_report_what_they_miss() -> None:
    """Only set targets are checked; a miss reads 'name value > limit'."""
    targets = LatencyTargets(ttft_p90=0.5, tpot_p99=0.05)
    assert targets.items() == [("ttft_p90", 0.5), ("tpot_p99", 0.05)]
    result = simulate_serving("llama2-7b", "dgx-a100-hdr", ServingLayout(), WORKLOAD)
    assert targets.violations(result.metrics) == []
    tight = LatencyTargets(ttft_p50=1e-4)
    assert tight.violations(result.metrics)[0].startswith("ttft_p50 ")
    with pytest.raises(ServingError, match="ttft_p90 = -1 must be a positive number of seconds"):
        LatencyTargets(ttft_p90=-1)


def test_candidate_layouts_of_llama2_70b_on_8_gpus() -> None:
    """Every tp x pp x replicas = 8 with tp dividing the heads: ten layouts."""
    got = {(lay.tp, lay.pp, lay.replicas) for lay in candidate_layouts(get_model("llama2-70b"), 8)}
    assert got == {(1, 1, 8), (1, 2, 4), (1, 4, 2), (1, 8, 1), (2, 1, 4), (2, 2, 2), (2, 4, 1), (4, 1, 2),
                   (4, 2, 1), (8, 1, 1)}


def test_capacity_is_the_highest_rate_meeting_the_targets() -> None:
    """The rate found meets the targets when simulated again, and a rate 25% higher misses one: the search
    stopped near the boundary. (A p99 over 40 requests is not monotone in the rate within ~10%: on the A100
    profile +5% misses while +12% meets, so the check leaves that margin.)"""
    targets = LatencyTargets(tpot_p99=0.02)
    cap = layout_capacity("llama2-7b", "dgx-a100-hdr", ServingLayout(), WORKLOAD, targets)
    assert cap.feasible and cap.rate_per_s > 0
    again = simulate_serving("llama2-7b", "dgx-a100-hdr", ServingLayout(), with_poisson_arrivals(WORKLOAD,
                                                                                               cap.rate_per_s))
    assert targets.violations(again.metrics) == []
    above = simulate_serving("llama2-7b", "dgx-a100-hdr", ServingLayout(),
                             with_poisson_arrivals(WORKLOAD, cap.rate_per_s * 1.25))
    assert targets.violations(above.metrics)
    assert cap.tokens_per_s_per_gpu == pytest.approx(again.metrics.output_tokens_per_s_per_gpu)


def test_search_ranks_layouts_and_explains_the_dropped_ones() -> None:
    """On 2 GPUs llama2-7b has tp2, pp2 and two replicas; targets a single A100 cannot meet at any rate leave
    only layouts that split the model; an impossible target leaves none, each with its reason."""
    search = capacity_search("llama2-7b", "dgx-a100-hdr", 2, WORKLOAD, LatencyTargets(tpot_p99=0.008))
    labels = [r.layout.label() for r in search.results]
    assert sorted(labels) == ["tp1 pp1 x2", "tp1 pp2 x1", "tp2 pp1 x1"]
    assert search.best is not None and search.best.layout.tp == 2
    one_gpu = next(r for r in search.results if r.layout.replicas == 2)
    assert not one_gpu.feasible and "even at light load" in one_gpu.note
    none = capacity_search("llama2-7b", "dgx-a100-hdr", 2, WORKLOAD, LatencyTargets(ttft_p50=1e-4))
    assert none.best is None and all(not r.feasible for r in none.results)


def test_a_search_needs_a_target() -> None:
    """No targets, no capacity."""
    with pytest.raises(ServingError, match="needs at least one latency target"):
        layout_capacity("llama2-7b", "dgx-a100-hdr", ServingLayout(), WORKLOAD, LatencyTargets())
