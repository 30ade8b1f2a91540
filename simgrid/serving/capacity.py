"""Capacity search: the layout (tp, pp, replicas) with the most output tokens per second per GPU that meets
latency targets.

For one layout, capacity is the highest Poisson arrival rate at which the simulated run meets every target
(Vidur-Search's definition, Agrawal et al. MLSys 2024, section 6: "maximum QPS under SLO", found by binary
search over the simulator). The search brackets it between a light load (2% of the offline throughput,
where queueing is negligible; a layout that misses a target there cannot meet it at any rate) and 1.2x
the offline throughput (every request at time 0: the most the layout can complete per second), then
bisects until the bracket is within ``rel_tol``. The request lengths stay fixed and only the arrival
times are redrawn, with the same seed at every rate. Because every replica gets the same number of
requests whatever the replica count, the workload is ``requests_per_replica`` times ``replicas``.

The layouts searched are every ``tp * pp * replicas = gpus`` whose degrees the model allows
(:func:`simgrid.layout.check_layout`) and whose weights leave room for a KV cache; each is reported,
with why it was dropped or which target binds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from simgrid.errors import LayoutError
from simgrid.hardware import ClusterSpec, load_cluster_spec
from simgrid.model.spec import ModelSpec
from simgrid.serving.metrics import ServingMetrics
from simgrid.serving.requests import Request, with_poisson_arrivals
from simgrid.serving.simulate import resolve_model, simulate_serving
from simgrid.serving.spec import ServingConfig, ServingError, ServingLayout

LIGHT_LOAD_FRACTION = 0.02
"""Lowest rate probed, as a share of the offline throughput."""
OVERLOAD_FACTOR = 1.2
"""Highest rate probed, as a multiple of the offline throughput."""


@dataclass(frozen=True, kw_only=True)
class LatencyTargets:
    """Service-level objectives in seconds; ``None`` means no target on that percentile."""

    ttft_p50: float | None = None
    """Median time to first token."""
    ttft_p90: float | None = None
    """90th-percentile time to first token."""
    ttft_p99: float | None = None
    """99th-percentile time to first token."""
    tpot_p50: float | None = None
    """Median time per output token."""
    tpot_p90: float | None = None
    """90th-percentile time per output token."""
    tpot_p99: float | None = None
    """99th-percentile time per output token."""
    e2e_p50: float | None = None
    """Median end-to-end latency."""
    e2e_p90: float | None = None
    """90th-percentile end-to-end latency."""
    e2e_p99: float | None = None
    """99th-percentile end-to-end latency."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None and not (isinstance(value, (int, float)) and value > 0 and math.isfinite(value)):
                raise ServingError(f"latency target {f.name} = {value!r} must be a positive number of seconds")

    def items(self) -> list[tuple[str, float]]:
        """(name, seconds) of the targets that are set."""
        return [(f.name, float(v)) for f in fields(self) if (v := getattr(self, f.name)) is not None]

    def violations(self, metrics: ServingMetrics) -> list[str]:
        """``"ttft_p90 0.62 s > 0.5 s"`` for every missed target (a NaN percentile misses nothing)."""
        out = []
        for name, limit in self.items():
            kind, pct = name.split("_")
            value = getattr(getattr(metrics, kind), pct)
            if value > limit:
                out.append(f"{name} {value:.3g} s > {limit:.3g} s")
        return out


@dataclass(frozen=True, kw_only=True)
class LayoutCapacity:
    """Capacity of one layout."""

    layout: ServingLayout
    """The layout."""
    feasible: bool
    """Whether some rate meets every target."""
    rate_per_s: float
    """Highest arrival rate found to meet the targets (0 when infeasible)."""
    metrics: ServingMetrics | None
    """Metrics at that rate (at the light load when infeasible; ``None`` when the layout cannot run)."""
    note: str
    """Why the layout was dropped, or which target binds at the next rate up."""

    @property
    def tokens_per_s_per_gpu(self) -> float:
        """Output tokens per second per GPU at capacity (0 when infeasible)."""
        return self.metrics.output_tokens_per_s_per_gpu if self.feasible and self.metrics else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready mapping."""
        return {"layout": self.layout.to_dict(), "feasible": self.feasible, "rate_per_s": self.rate_per_s,
                "output_tokens_per_s_per_gpu": self.tokens_per_s_per_gpu, "note": self.note,
                "metrics": self.metrics.to_dict() if self.metrics else None}


def candidate_layouts(model: ModelSpec, gpus: int, *, max_pp: int | None = None) -> list[ServingLayout]:
    """Every (tp, pp, replicas) with ``tp * pp * replicas = gpus`` the model's shapes allow."""
    from simgrid.layout import Layout, check_layout

    out = []
    for tp in (d for d in range(1, gpus + 1) if gpus % d == 0):
        for pp in (d for d in range(1, gpus // tp + 1) if (gpus // tp) % d == 0):
            if max_pp is not None and pp > max_pp:
                continue
            try:
                check_layout(model, Layout(tp=tp, pp=pp))
            except LayoutError:
                continue
            out.append(ServingLayout(tp=tp, pp=pp, replicas=gpus // (tp * pp)))
    return out


def layout_capacity(model: str | ModelSpec, cluster: str | ClusterSpec, layout: ServingLayout,
                    workload: Sequence[Request], targets: LatencyTargets, config: ServingConfig | None = None, *,
                    rel_tol: float = 0.05, seed: int = 0) -> LayoutCapacity:
    """Highest Poisson rate at which ``layout`` meets ``targets`` on ``workload``'s request lengths."""
    if not targets.items():
        raise ServingError("capacity search needs at least one latency target, e.g. --ttft-p90 0.5 --tpot-p99 0.05")
    spec = resolve_model(model)
    cspec = load_cluster_spec(cluster) if isinstance(cluster, str) else cluster
    sized = cspec.sized(layout.world_size, synchronous_gpus=layout.gpus_per_replica)  # replicas never wait on each other
    cfg = config or ServingConfig()
    lengths = list(workload) * layout.replicas

    def run(rate: float) -> ServingMetrics:
        return simulate_serving(spec, sized, layout, with_poisson_arrivals(lengths, rate, seed=seed), cfg).metrics

    try:
        offline = run(math.inf)
    except ServingError as exc:
        return LayoutCapacity(layout=layout, feasible=False, rate_per_s=0.0, metrics=None, note=str(exc))
    lo = offline.requests_per_s * LIGHT_LOAD_FRACTION
    at_lo = run(lo)
    missed = targets.violations(at_lo)
    if missed:
        return LayoutCapacity(layout=layout, feasible=False, rate_per_s=0.0, metrics=at_lo,
                              note="misses " + ", ".join(missed) + " even at light load")
    hi = offline.requests_per_s * OVERLOAD_FACTOR
    at_hi = run(hi)
    if not targets.violations(at_hi):
        return LayoutCapacity(layout=layout, feasible=True, rate_per_s=hi, metrics=at_hi,
                              note="meets every target up to overload (rate not bounded by the targets)")
    best, binding = at_lo, ""
    while (hi - lo) / lo > rel_tol:
        mid = math.sqrt(lo * hi)  # rates span decades: bisect on a log scale
        at_mid = run(mid)
        missed = targets.violations(at_mid)
        if missed:
            hi, binding = mid, ", ".join(missed)
        else:
            lo, best = mid, at_mid
    return LayoutCapacity(layout=layout, feasible=True, rate_per_s=lo, metrics=best,
                          note=f"next rate up misses {binding}" if binding else "")


@dataclass(frozen=True, kw_only=True)
class CapacitySearch:
    """Every candidate layout's capacity, best first."""

    gpus: int
    """GPUs of the deployment."""
    targets: LatencyTargets
    """The latency targets."""
    results: tuple[LayoutCapacity, ...]
    """Feasible layouts by output tokens/s per GPU (best first), then the infeasible ones."""

    @property
    def best(self) -> LayoutCapacity | None:
        """The winning layout, or ``None`` when none meets the targets."""
        return self.results[0] if self.results and self.results[0].feasible else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready mapping."""
        return {"gpus": self.gpus, "targets": dict(self.targets.items()),
                "best": self.best.to_dict() if self.best else None, "layouts": [r.to_dict() for r in self.results]}


def capacity_search(model: str | ModelSpec, cluster: str | ClusterSpec, gpus: int, workload: Sequence[Request],
                    targets: LatencyTargets, config: ServingConfig | None = None, *,
                    layouts: Sequence[ServingLayout] | None = None, rel_tol: float = 0.05, seed: int = 0
                    ) -> CapacitySearch:
    """Capacity of every candidate layout on ``gpus`` GPUs; the best meets the targets at the most tokens/s/GPU."""
    spec = resolve_model(model)
    candidates = list(layouts) if layouts is not None else candidate_layouts(spec, gpus)
    if not candidates:
        raise ServingError(f"no layout of {gpus} GPUs suits {spec.name} (tp must divide its heads and MLP width)")
    results = [layout_capacity(spec, cluster, lay, workload, targets, config, rel_tol=rel_tol, seed=seed)
               for lay in candidates]
    results.sort(key=lambda r: (not r.feasible, -r.tokens_per_s_per_gpu, r.layout.world_size))
    return CapacitySearch(gpus=gpus, targets=targets, results=tuple(results))
