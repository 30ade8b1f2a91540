"""The SimPy server: one request's timeline equals its iterations, batching modes, pipelines, routing,
KV pressure with preemption, and refusals of workloads that cannot run."""

from __future__ import annotations

import pytest

from simgrid.hardware import load_cluster
from simgrid.model import get_model
from simgrid.serving import (
    IterationCostModel,
    Request,
    ServingConfig,
    ServingError,
    ServingLayout,
    chunk_shape,
    poisson_requests,
    simulate_serving,
)
from simgrid.topology import Topology

MODEL = "llama2-7b"
CLUSTER = "dgx-a100-hdr"


def _req(i: int, arrival: float, prompt: int, output: int) -> Request:
    return Request(id=i, arrival_s=arrival, prompt_tokens=prompt, output_tokens=output)


def test_one_request_takes_a_prefill_then_its_decodes() -> None:
    """Alone on a replica: TTFT = the prefill iteration, then one decode per further token with the cache
    growing by one each time; TPOT is their mean; the response returns with the last token."""
    prompt, output = 300, 5
    result = simulate_serving(MODEL, CLUSTER, ServingLayout(), [_req(0, 1.0, prompt, output)])
    cost = IterationCostModel(get_model(MODEL), ServingLayout(), ServingConfig(),
                              Topology(load_cluster(CLUSTER, gpus=1)))
    prefill = cost.time(chunk_shape(prompt, 0, sampled=True)).latency_s
    decodes = [cost.time(chunk_shape(1, prompt + i, sampled=True)).latency_s for i in range(output - 1)]
    (rec,) = result.run.records
    assert rec.ttft_s == pytest.approx(prefill, rel=1e-12)
    assert rec.tpot_s == pytest.approx(sum(decodes) / (output - 1), rel=1e-12)
    assert rec.e2e_s == pytest.approx(prefill + sum(decodes), rel=1e-12)
    assert result.metrics.iterations == output
    assert result.metrics.gpu_busy == pytest.approx(1.0)


def test_continuous_batching_returns_short_requests_early_static_does_not() -> None:
    """A 2-token and a 40-token request arrive together: continuous batching answers the short one after
    two iterations; static batching holds it until the batch's longest request ends."""
    reqs = [_req(0, 0.0, 100, 2), _req(1, 0.0, 100, 40)]
    cont = simulate_serving(MODEL, CLUSTER, ServingLayout(), reqs).run.records
    static = simulate_serving(MODEL, CLUSTER, ServingLayout(), reqs, ServingConfig(batching="static")).run.records
    assert cont[0].done_s < 0.25 * cont[1].done_s
    assert static[0].done_s == static[1].done_s
    assert static[0].last_token_s < static[0].done_s  # its last token came early, the response did not


def test_pipeline_keeps_two_iterations_in_flight() -> None:
    """With pp 2 and enough requests, stage 0 and stage 1 are busy at the same time (two virtual engines)."""
    reqs = poisson_requests(50.0, 40, prompt_tokens=200, output_tokens=20, seed=1)
    run = simulate_serving(MODEL, CLUSTER, ServingLayout(pp=2), reqs).run
    stage0, stage1 = run.busy[0]
    assert any(s0 < e1 and s1 < e0 for s0, e0 in stage0 for s1, e1 in stage1)


def test_round_robin_and_least_loaded_routing() -> None:
    """Round-robin sends request i to replica i mod 3; least-loaded sends a burst to every replica too."""
    reqs = poisson_requests(1.0, 9, prompt_tokens=50, output_tokens=5, seed=2)
    rr = simulate_serving(MODEL, CLUSTER, ServingLayout(replicas=3), reqs).run.records
    assert [r.replica for r in rr] == [i % 3 for i in range(9)]
    burst = [_req(i, 0.0, 50, 5) for i in range(3)]
    ll = simulate_serving(MODEL, CLUSTER, ServingLayout(replicas=3), burst,
                          ServingConfig(router="least-loaded")).run.records
    assert sorted(r.replica for r in ll) == [0, 1, 2]


@pytest.mark.parametrize("policy", ["prefill-first", "mixed", "chunked"])
def test_kv_pressure_preempts_but_everyone_is_served(policy: str) -> None:
    """A KV cache of 0.15 GiB (307 tokens of 512 KiB: 19 blocks) for 8 requests of 128: sequences are preempted and recomputed, the pool never
    overflows, and every request still gets all its tokens in order."""
    reqs = [_req(i, 0.0, 64, 64) for i in range(8)]
    result = simulate_serving(MODEL, CLUSTER, ServingLayout(), reqs,
                              ServingConfig(kv_budget_GiB=0.15, policy=policy))  # type: ignore[arg-type]
    run = result.run
    assert run.kv_blocks_per_replica == 19
    assert max(v for _, v in run.kv_timeline[0]) <= 19
    assert result.metrics.preemptions > 0
    assert all(r.arrival_s <= r.first_token_s <= r.last_token_s <= r.done_s for r in run.records)
    assert len(run.records) == 8


def test_refusals_of_workloads_that_cannot_run() -> None:
    """A request larger than the KV cache, and an unchunked prompt larger than the token budget, are errors
    that say what to change."""
    with pytest.raises(ServingError, match="KV budget too small for one request: request 0 needs 4000 tokens"):
        simulate_serving(MODEL, CLUSTER, ServingLayout(), [_req(0, 0.0, 3000, 1000)],
                         ServingConfig(kv_budget_GiB=0.5))
    with pytest.raises(ServingError, match=r"prompt of 3000 tokens exceeds the token budget of 1024.*--policy chunked"):
        simulate_serving(MODEL, CLUSTER, ServingLayout(), [_req(0, 0.0, 3000, 10)],
                         ServingConfig(max_batched_tokens=1024))
    chunked = simulate_serving(MODEL, CLUSTER, ServingLayout(), [_req(0, 0.0, 3000, 10)],
                               ServingConfig(max_batched_tokens=1024, policy="chunked"))
    assert chunked.metrics.iterations == 3 + 9  # ceil(3000 / 1024) prompt chunks, then 9 decodes
