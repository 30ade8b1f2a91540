"""LLM serving on many GPUs: requests, KV cache, iteration costs, batching policies, a SimPy server,
metrics and a capacity search (see docs/inference.md).

Quick use::

    from simgrid.serving import ServingLayout, ServingConfig, poisson_requests, simulate_serving
    requests = poisson_requests(4.0, 500, prompt_tokens=(128, 1024), output_tokens=(32, 256))
    result = simulate_serving("llama2-70b", "dgx-a100-hdr", ServingLayout(tp=4, replicas=2), requests)
    result.metrics.ttft.p90, result.metrics.output_tokens_per_s_per_gpu
"""

from simgrid.serving.capacity import (
    CapacitySearch,
    LatencyTargets,
    LayoutCapacity,
    candidate_layouts,
    capacity_search,
    layout_capacity,
)
from simgrid.serving.iteration import BatchShape, IterationCostModel, IterationTime, chunk_shape, combine
from simgrid.serving.kv_cache import KVBudget, kv_budget, kv_bytes_per_token
from simgrid.serving.metrics import Latency, ServingMetrics, compute_serving_metrics
from simgrid.serving.requests import Request, poisson_requests, read_trace, with_poisson_arrivals, write_trace
from simgrid.serving.server import RequestRecord, ServingRun, ServingSimulation
from simgrid.serving.simulate import ServingResult, simulate_serving
from simgrid.serving.spec import POLICIES, ServingConfig, ServingError, ServingLayout

__all__ = [
    "POLICIES",
    "BatchShape",
    "CapacitySearch",
    "IterationCostModel",
    "IterationTime",
    "KVBudget",
    "Latency",
    "LatencyTargets",
    "LayoutCapacity",
    "Request",
    "RequestRecord",
    "ServingConfig",
    "ServingError",
    "ServingLayout",
    "ServingMetrics",
    "ServingResult",
    "ServingRun",
    "ServingSimulation",
    "candidate_layouts",
    "capacity_search",
    "chunk_shape",
    "combine",
    "compute_serving_metrics",
    "kv_budget",
    "kv_bytes_per_token",
    "layout_capacity",
    "poisson_requests",
    "read_trace",
    "simulate_serving",
    "with_poisson_arrivals",
    "write_trace",
]
