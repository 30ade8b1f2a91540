"""What a search worker does with one layout: memory check, tighter bound, build and simulate.

A :class:`LayoutEvaluator` is made once per worker (a process of the local pool, a Ray actor, or the
search's own process) and then receives small :class:`Task` values. Its per-worker tables (the cost
memo, the bound model's shared costs) make the second layout of a shape much cheaper than the first.

The default path builds the program and runs it on the fast engine (:func:`simgrid.engine.fast.simulate_step`)
with the metrics taken from the loop's aggregates: the same step as :func:`simgrid.simulation.simulate`
with the sweep's options, checked by ``tests/sweep/test_sweep_exact.py``. A custom ``simulate_fn`` or
flow-mode options go through :func:`~simgrid.simulation.simulate` (and the search turns its bound off).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from simgrid.layout import Layout
from simgrid.model.spec import ModelSpec

#: Metric columns copied from the simulation's metrics.
METRIC_COLUMNS: tuple[str, ...] = (
    "step_time_s", "tokens_per_s", "mfu", "hfu", "tflops_per_gpu", "bubble_fraction",
    "peak_memory_bytes", "memory_capacity_bytes", "fits",
)

SimulateFn = Callable[..., Any]
EstimateMemoryFn = Callable[[ModelSpec, Layout, Any], Any]


@dataclass(frozen=True)
class Task:
    """One layout to evaluate; ``threshold_s``: skip it if its tighter bound exceeds this step time."""

    layout: Layout
    threshold_s: float | None = None


@dataclass(frozen=True)
class Outcome:
    """What became of a task: ``row`` (simulated), ``memory`` (does not fit), ``bound`` (cannot make the
    best K) or ``failed``."""

    kind: str
    row: dict[str, Any] | None = None
    detail: str = ""
    """``memory``: the dominant category; ``failed``: the error."""
    bound_s: float = 0.0
    """The tighter lower bound, when computed."""


class LayoutEvaluator:
    """Evaluates layouts of one model on one cluster (see the module docstring)."""

    def __init__(self, model: ModelSpec, cluster_ref: Any, gpus: int, options: Mapping[str, Any], *,
                 simulate_fn: SimulateFn | None = None, estimate_memory_fn: EstimateMemoryFn | None = None,
                 check_memory: bool = True) -> None:
        self.model = model
        self.cluster = resolve_cluster(cluster_ref, gpus)
        self.options = dict(options)
        self.simulate_fn = simulate_fn
        self.check_memory = check_memory
        self.estimate = estimate_memory_fn or importlib.import_module("simgrid.memory").estimate_memory
        self.fast = simulate_fn is None and fast_path_applies(self.options)
        self._cost_models: dict[tuple[str, str], Any] = {}
        self._bounds: Any = None

    def cost_model(self, dtype: str, attention_kernel: str = "auto") -> Any:
        """The worker's memoised cost model for one compute dtype and fused-attention kernel (the layout's
        ``attention_kernel``, as :func:`simgrid.engine.simulate_program` picks it)."""
        key = (dtype, attention_kernel)
        found = self._cost_models.get(key)
        if found is None:
            from simgrid.engine import ClusterCostModel
            from simgrid.sweep.costcache import MemoCostModel

            found = self._cost_models[key] = MemoCostModel(
                ClusterCostModel(self.cluster, dtype=dtype, attention_kernel=attention_kernel))
        return found

    @property
    def bounds(self) -> Any:
        """This worker's :class:`~simgrid.sweep.bounds.BoundModel` (made on first use)."""
        if self._bounds is None:
            from simgrid.sweep.bounds import BoundModel

            self._bounds = BoundModel(self.model, self.cluster, granularity=self.granularity,
                                      cost_model=self.cost_model)
        return self._bounds

    @property
    def granularity(self) -> str:
        """Program granularity of the simulations (``auto`` resolved as :func:`simgrid.simulate` does)."""
        gran = str(self.options.get("granularity", "auto"))
        if gran == "auto":
            from simgrid.simulation import STAGE_GRANULARITY_ABOVE_RANKS

            return "stage" if self.cluster.num_gpus > STAGE_GRANULARITY_ABOVE_RANKS else "block"
        return gran

    def __call__(self, task: Task) -> Outcome:
        layout = task.layout
        if self.check_memory:
            try:
                est = self.estimate(self.model, layout, self.cluster.gpu)
            except Exception as exc:  # one broken estimate must not end the search
                return Outcome("failed", detail=f"memory estimate: {type(exc).__name__}: {exc}")
            if not _field(est, "fits"):
                return Outcome("memory", detail=_dominant_category(_field(est, "breakdown")))
        bound = 0.0
        try:
            if task.threshold_s is not None:
                bound = self._dag_bound(layout)
                if bound > task.threshold_s:
                    return Outcome("bound", bound_s=bound)
            row = self.simulate(layout)
        except Exception as exc:  # recorded per layout; the search goes on
            return Outcome("failed", detail=f"{type(exc).__name__}: {exc}", bound_s=bound)
        if bound > row["step_time_s"]:
            return Outcome("failed", bound_s=bound, detail=(
                f"internal: lower bound {bound!r} s exceeds the simulated step {row['step_time_s']!r} s; "
                "the bound is not admissible for this layout (report it)"))
        return Outcome("row", row=row, bound_s=bound)

    def _dag_bound(self, layout: Layout) -> float:
        try:
            return float(self.bounds.dag(layout))
        except Exception:  # a schedule or op the bound does not know: simulate it, never fail for the bound
            return 0.0

    def simulate(self, layout: Layout) -> dict[str, Any]:
        """The result row of one layout (no memory check, no bound)."""
        if not self.fast:
            simulate = self.simulate_fn or importlib.import_module("simgrid.simulation").simulate
            return result_row(layout, simulate(self.model, self.cluster, layout, **self.options))
        from simgrid.engine.fast import simulate_step, summary_metrics
        from simgrid.layout import check_layout
        from simgrid.schedules import build_program

        check_layout(self.model, layout)
        program = build_program(self.model, layout, granularity=self.granularity)  # type: ignore[arg-type]
        summary = simulate_step(program, self.cluster, mode=str(self.options.get("mode", "symmetric")),
                                dtype=layout.precision,
                                cost_model=self.cost_model(layout.precision, layout.attention_kernel))
        gpu = self.cluster.gpu
        metrics = summary_metrics(summary, model=self.model, layout=layout,
                                  peak_flops_per_gpu=gpu.peak_flops(layout.precision),
                                  memory_capacity_bytes=gpu.memory_bytes)
        return result_row(layout, metrics)


def fast_path_applies(options: Mapping[str, Any]) -> bool:
    """True when ``simulate(**options)`` is the fast engine's step (fast comm model, no stragglers)."""
    allowed = {"mode", "comm_model", "granularity"}
    return (set(options) <= allowed and options.get("comm_model", "fast") == "fast"
            and options.get("mode", "symmetric") in ("symmetric", "full"))


def result_row(layout: Layout, result: Any) -> dict[str, Any]:
    """One table row from a layout and its :class:`simgrid.simulation.SimulationResult` (or metrics)."""
    metrics = getattr(result, "metrics", result)
    row: dict[str, Any] = {
        "dp": layout.dp, "tp": layout.tp, "pp": layout.pp, "cp": layout.cp, "ep": layout.ep, "etp": layout.expert_tp,
        "vpp": layout.vpp, "zero": layout.zero,
        "mbs": layout.micro_batch_size, "schedule": layout.schedule, "recompute": layout.recompute,
        "sequence_parallel": layout.sequence_parallel, "flash_attention": layout.flash_attention,
        "tp_comm_overlap": layout.tp_comm_overlap, "overlap_param_gather": layout.overlap_param_gather,
    }
    for name in METRIC_COLUMNS:
        row[name] = plain(_field(metrics, name))
    exposed = _field(metrics, "exposed_comm_s", default={}) or {}
    for kind in ("tp", "cp", "ep", "pp", "dp"):
        row[f"exposed_{kind}_s"] = float(_field(exposed, kind, default=0.0) or 0.0)
    return row


def resolve_cluster(cluster_ref: Any, gpus: int) -> Any:
    """A profile name loaded and sized to ``gpus``, or the cluster object itself."""
    if isinstance(cluster_ref, str):
        from simgrid.hardware.loader import load_cluster

        return load_cluster(cluster_ref, gpus=gpus)
    return cluster_ref


def plain(value: Any) -> Any:
    """numpy scalars to Python ones (JSON and comparisons stay simple)."""
    item = getattr(value, "item", None)
    return item() if callable(item) else value


def _field(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _dominant_category(breakdown: Any) -> str:
    if not isinstance(breakdown, Mapping) or not breakdown:
        return "unknown"
    return str(max(breakdown, key=lambda k: breakdown[k]))
