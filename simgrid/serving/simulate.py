"""``simulate_serving``: the one-call API from a model, a cluster, a serving layout and requests to metrics."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from simgrid.hardware import Cluster, load_cluster_spec
from simgrid.model import get_model
from simgrid.model.spec import ModelSpec
from simgrid.serving.metrics import ServingMetrics, compute_serving_metrics
from simgrid.serving.requests import Request
from simgrid.serving.server import ServingRun, ServingSimulation
from simgrid.serving.spec import ServingConfig, ServingError, ServingLayout


@dataclass(frozen=True, kw_only=True)
class ServingResult:
    """A simulated serving run and its metrics."""

    metrics: ServingMetrics
    """Latency percentiles, throughput per GPU, KV and GPU use."""
    run: ServingRun
    """Per-request records, iterations and timelines."""
    model: ModelSpec
    """The model served."""
    cluster_name: str
    """Cluster profile name."""
    wall_s: float
    """Wall-clock seconds the simulation took."""

    def to_json_dict(self) -> dict[str, Any]:
        """Metrics plus what was simulated, JSON-ready."""
        out = self.metrics.to_dict()
        out.update(model=self.model.name, cluster=self.cluster_name, layout=self.run.layout.to_dict(),
                   config=self.run.config.to_dict(), wall_s=self.wall_s,
                   kv_capacity_tokens=self.run.budget.capacity_tokens,
                   kv_bytes_per_token_per_gpu=max(s.kv_bytes_per_token for s in self.run.budget.stages),
                   weight_bytes_per_gpu=max(s.weight_bytes for s in self.run.budget.stages))
        return out


def resolve_model(model: str | ModelSpec) -> ModelSpec:
    """A preset name or a :class:`ModelSpec`."""
    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, str):
        return get_model(model)
    raise ServingError(f"model must be a preset name or a ModelSpec, got {type(model).__name__}")


def resolve_cluster(cluster: str | Cluster, gpus: int, *, synchronous_gpus: int | None = None) -> Cluster:
    """A profile name (sized to ``gpus``, of which ``synchronous_gpus`` step together) or a sized :class:`Cluster`."""
    if isinstance(cluster, str):
        return load_cluster_spec(cluster).sized(gpus, synchronous_gpus=synchronous_gpus)
    if isinstance(cluster, Cluster):
        return cluster
    raise ServingError(f"cluster must be a profile name or a Cluster, got {type(cluster).__name__}")


def simulate_serving(model: str | ModelSpec, cluster: str | Cluster, layout: ServingLayout,
                     requests: Sequence[Request], config: ServingConfig | None = None) -> ServingResult:
    """Serve ``requests`` with ``model`` on ``cluster`` under ``layout`` and ``config``; return the metrics."""
    start = time.perf_counter()
    spec = resolve_model(model)
    # a replica waits on the slowest of its own GPUs only: replicas do not synchronise with each other
    sized = resolve_cluster(cluster, layout.world_size, synchronous_gpus=layout.gpus_per_replica)
    run = ServingSimulation(spec, sized, layout, config or ServingConfig(), requests).run()
    return ServingResult(metrics=compute_serving_metrics(run), run=run, model=spec, cluster_name=sized.spec.name,
                         wall_s=time.perf_counter() - start)
