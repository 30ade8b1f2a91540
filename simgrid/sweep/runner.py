"""The layout search: enumerate, drop what cannot fit, simulate the rest in parallel, rank.

Simulations run in worker processes started with the ``spawn`` method: the engine holds SimPy state and
large tables, and a forked copy of a parent that already imported them (or runs threads, as Jupyter
does) is not safe. Each worker loads the model and cluster once (pool initializer) and then receives
only :class:`~simgrid.layout.Layout` values, which are small frozen dataclasses.

A failing simulation (a schedule the generator rejects, an engine bug) is recorded with its message and
the search goes on: one bad corner of the space must not cost the user the whole sweep.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import gc
import importlib
import multiprocessing
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from simgrid.errors import LayoutError
from simgrid.gcpause import collector_paused
from simgrid.layout import Layout
from simgrid.model.spec import ModelSpec
from simgrid.sweep.constraints import SweepConstraints
from simgrid.sweep.progress import ProgressBar
from simgrid.sweep.search_space import enumerate_layout_space

if TYPE_CHECKING:
    import pandas as pd

#: Layout columns of the result table, in the order the issue lists them.
LAYOUT_COLUMNS: tuple[str, ...] = ("dp", "tp", "pp", "vpp", "zero", "mbs", "schedule", "recompute", "cp", "ep", "etp")
#: Metric columns copied from the simulation's metrics.
METRIC_COLUMNS: tuple[str, ...] = (
    "step_time_s", "tokens_per_s", "mfu", "hfu", "tflops_per_gpu", "bubble_fraction",
    "peak_memory_bytes", "memory_capacity_bytes", "fits",
)
#: Every column of :attr:`SweepResult.table`.
RESULT_COLUMNS: tuple[str, ...] = (
    *LAYOUT_COLUMNS, "sequence_parallel", "flash_attention", *METRIC_COLUMNS, "exposed_tp_s", "exposed_cp_s",
    "exposed_ep_s", "exposed_pp_s", "exposed_dp_s",
)
#: Memory categories of a :class:`simgrid.memory.MemoryEstimate` breakdown.
MEMORY_CATEGORIES: tuple[str, ...] = ("weights", "grads", "optimizer", "activations", "buffers")

SimulateFn = Callable[..., Any]
EstimateMemoryFn = Callable[[ModelSpec, Layout, Any], Any]


@dataclass(frozen=True, kw_only=True)
class SweepFailure:
    """A layout whose memory estimate or simulation raised, and the message."""

    layout: Layout
    """The layout that failed."""
    error: str
    """``ExceptionType: message``."""


@dataclass(frozen=True, kw_only=True)
class SweepResult:
    """Ranked simulations (best first) and the account of every layout that was not simulated."""

    table: pd.DataFrame
    """One row per simulated layout, best first; columns :data:`RESULT_COLUMNS`."""
    tried: int = 0
    """Candidates built by the enumeration (valid + invalid)."""
    enumerated: int = 0
    """Valid layouts the enumeration produced."""
    invalid_reasons: Counter[str] = field(default_factory=Counter)
    """Invalid candidates per reason."""
    invalid_examples: dict[str, str] = field(default_factory=dict)
    """Per reason, one candidate's own message with its numbers."""
    memory_dropped: int = 0
    """Valid layouts the memory estimate said do not fit."""
    memory_reasons: Counter[str] = field(default_factory=Counter)
    """Memory-dropped layouts per dominant category (the largest term of the per-GPU breakdown)."""
    dominated: int = 0
    """Fitting layouts not simulated because the same layout with less recompute also fits (recompute
    only adds work, so it cannot be faster)."""
    failures: tuple[SweepFailure, ...] = ()
    """Layouts whose estimate or simulation raised."""
    wall_s: float = 0.0
    """Wall time of the whole search in seconds."""

    @property
    def invalid(self) -> int:
        """Candidates dropped as invalid."""
        return sum(self.invalid_reasons.values())

    @property
    def simulated(self) -> int:
        """Layouts handed to the simulator (successes and failures)."""
        return len(self.table) + len(self.failures)

    def best(self) -> dict[str, Any]:
        """The winning row as a plain dict; :class:`LayoutError` if nothing was simulated successfully."""
        if self.table.empty:
            raise LayoutError(
                f"sweep: no layout could be simulated ({self.enumerated} valid, {self.memory_dropped} do not "
                f"fit in memory, {len(self.failures)} failed); relax the constraints or add GPUs"
            )
        return {k: _plain(v) for k, v in self.table.iloc[0].to_dict().items()}

    def summary_lines(self) -> list[str]:
        """Human-readable account: how many enumerated, dropped (and why), simulated, failed."""
        lines = [
            f"candidates tried: {self.tried}; valid layouts: {self.enumerated}; "
            f"dropped as invalid: {self.invalid}",
        ]
        for reason, count in self.invalid_reasons.most_common(5):
            example = self.invalid_examples.get(reason)
            if example is None:
                lines.append(f"  {count:>6} invalid: {reason}")
            else:  # the first candidate's own numbers read better than the blanked reason
                lines.append(f"  {count:>6} invalid{', e.g.' if count > 1 else ':'} {example}")
        why = ", ".join(f"{cat} dominant in {n}" for cat, n in self.memory_reasons.most_common())
        lines.append(f"dropped for memory: {self.memory_dropped}" + (f" ({why})" if why else ""))
        if self.dominated:
            lines.append(f"skipped {self.dominated} that fit with less recompute as well (recompute only adds work)")
        lines.append(
            f"simulated: {self.simulated} ({len(self.table)} ok, {len(self.failures)} failed) "
            f"in {self.wall_s:.1f} s"
        )
        for failure in self.failures[:3]:
            lines.append(f"  failed {describe_layout(failure.layout)}: {failure.error}")
        return lines


def sweep(
    model: ModelSpec | str,
    cluster_name: Any,
    gpus: int,
    global_batch: int,
    *,
    constraints: SweepConstraints | None = None,
    top: int | None = None,
    workers: int | None = None,
    progress: bool = True,
    prune_recompute: bool = True,
    simulate_options: Mapping[str, Any] | None = None,
    simulate_fn: SimulateFn | None = None,
    estimate_memory_fn: EstimateMemoryFn | None = None,
) -> SweepResult:
    """Search every valid layout of ``model`` on ``gpus`` GPUs of ``cluster_name`` and rank them.

    ``cluster_name`` is a profile name (loaded in every worker) or an already sized cluster object.
    ``simulate_options`` go to :func:`simgrid.simulation.simulate` (``mode``, ``comm_model``,
    ``granularity``). ``simulate_fn``/``estimate_memory_fn`` replace the simulator and the memory
    estimate (a custom cost model; they must be importable module-level functions to reach workers).
    ``top`` keeps only the best rows in the table; the counts still cover the whole search.
    ``prune_recompute`` skips a layout when the same layout with a cheaper recompute policy (none <
    selective < full) also fits: recompute only adds FLOPs, so the skipped one cannot rank higher.
    """
    start = time.perf_counter()
    spec = _resolve_model(model)
    cluster = _resolve_cluster(cluster_name, gpus)
    space = enumerate_layout_space(spec, cluster, gpus=gpus, global_batch=global_batch, constraints=constraints)
    result = sweep_layouts(
        spec, cluster_name, gpus, space.layouts, top=top, workers=workers, progress=progress,
        prune_recompute=prune_recompute, simulate_options=simulate_options, simulate_fn=simulate_fn, estimate_memory_fn=estimate_memory_fn,
        cluster=cluster,
    )
    return SweepResult(
        table=result.table, tried=space.tried, enumerated=len(space.layouts),
        invalid_reasons=space.invalid_reasons, invalid_examples=space.invalid_examples,
        memory_dropped=result.memory_dropped,
        memory_reasons=result.memory_reasons, dominated=result.dominated, failures=result.failures,
        wall_s=time.perf_counter() - start,
    )


SWEEP_SIMULATE_DEFAULTS: dict[str, Any] = {"granularity": "stage"}
"""A sweep ranks layouts, so it simulates at stage granularity: about 10x faster than per-block programs
at 8-64 GPUs and within a few percent of them in step time (``simulate_options`` can ask for ``block``)."""


def sweep_layouts(
    model: ModelSpec | str,
    cluster_name: Any,
    gpus: int,
    layouts: Iterable[Layout],
    *,
    top: int | None = None,
    workers: int | None = None,
    progress: bool = True,
    prune_recompute: bool = True,
    simulate_options: Mapping[str, Any] | None = None,
    simulate_fn: SimulateFn | None = None,
    estimate_memory_fn: EstimateMemoryFn | None = None,
    cluster: Any = None,
) -> SweepResult:
    """Memory-filter, simulate and rank the given layouts (the second half of :func:`sweep`)."""
    start = time.perf_counter()
    spec = _resolve_model(model)
    if cluster is None:
        cluster = _resolve_cluster(cluster_name, gpus)
    candidates = list(layouts)
    estimate = estimate_memory_fn or _default_estimate_memory()
    to_simulate: list[Layout] = []
    memory_reasons: Counter[str] = Counter()
    failures: list[SweepFailure] = []
    for layout in candidates:
        try:
            est = estimate(spec, layout, cluster.gpu)
        except Exception as exc:  # one broken estimate must not end the sweep
            failures.append(SweepFailure(layout=layout, error=f"memory estimate: {type(exc).__name__}: {exc}"))
            continue
        if _field(est, "fits"):
            to_simulate.append(layout)
        else:
            memory_reasons[_dominant_category(_field(est, "breakdown"))] += 1
    fitting = len(to_simulate)
    if prune_recompute:
        to_simulate = cheapest_recompute(to_simulate)
    rows, sim_failures = _simulate_all(
        spec, cluster_name if isinstance(cluster_name, str) else cluster, gpus, to_simulate,
        workers=workers, progress=progress, options={**SWEEP_SIMULATE_DEFAULTS, **(simulate_options or {})},
        simulate_fn=simulate_fn,
    )
    failures += sim_failures
    return SweepResult(
        table=rank_table(rows, top=top), tried=len(candidates), enumerated=len(candidates),
        memory_dropped=sum(memory_reasons.values()), memory_reasons=memory_reasons,
        dominated=fitting - len(to_simulate), failures=tuple(failures),
        wall_s=time.perf_counter() - start,
    )


def cheapest_recompute(layouts: Sequence[Layout]) -> list[Layout]:
    """Keep, of layouts equal but for the recompute policy, only the one with the least recompute.

    Recompute re-runs forward work in the backward pass and changes no communication (Korthikanti 2022,
    section 5: it trades compute for activation memory), so among fitting variants the one with less
    recompute is at least as fast. Order of the input is kept.
    """
    cost = {"none": 0, "selective": 1, "full": 2}
    best: dict[Layout, Layout] = {}
    for layout in layouts:
        key = dataclasses.replace(layout, recompute="none")
        kept = best.get(key)
        if kept is None or cost[layout.recompute] < cost[kept.recompute]:
            best[key] = layout
    chosen = set(best.values())
    return [layout for layout in layouts if layout in chosen]


def rank_table(rows: Sequence[Mapping[str, Any]], *, top: int | None = None) -> pd.DataFrame:
    """Rows as a DataFrame, best first: layouts that fit before those that do not, then by step time."""
    import pandas as pd

    df = pd.DataFrame(list(rows), columns=list(RESULT_COLUMNS))
    if not df.empty:
        # Equal step time: less memory is the safer pick, then the simpler (fewer GPUs per replica) layout.
        df = df.sort_values(
            ["fits", "step_time_s", "peak_memory_bytes", "tp", "pp"],
            ascending=[False, True, True, True, True], kind="mergesort",
        )
    df = df.reset_index(drop=True)
    return df.head(top) if top is not None else df


def describe_layout(layout: Layout) -> str:
    """``dp=16 tp=8 pp=8 vpp=1 zero=1 mbs=1 1f1b recompute=full`` (short, for messages)."""
    text = (
        f"dp={layout.dp} tp={layout.tp} pp={layout.pp} "
        f"{f'cp={layout.cp} ' if layout.cp > 1 else ''}"
        f"{f'ep={layout.ep} etp={layout.expert_tp} ' if layout.ep > 1 or layout.etp is not None else ''}"
        f"vpp={layout.vpp} zero={layout.zero} mbs={layout.micro_batch_size} {layout.schedule} "
        f"recompute={layout.recompute}"
    )
    return text + (" sp" if layout.sequence_parallel else "") + (" flash" if layout.flash_attention else "")


# -- simulation in workers -------------------------------------------------------------------------


class LayoutEvaluator:
    """Simulates one layout of a fixed model and cluster and returns its result row (or an error)."""

    def __init__(self, model: ModelSpec, cluster_ref: Any, gpus: int, options: dict[str, Any],
                 simulate_fn: SimulateFn | None) -> None:
        self.model = model
        self.cluster = _resolve_cluster(cluster_ref, gpus)
        self.options = options
        self.simulate = simulate_fn or _default_simulate()

    def __call__(self, layout: Layout) -> tuple[dict[str, Any] | None, str | None]:
        try:
            result = self.simulate(self.model, self.cluster, layout, **self.options)
            return result_row(layout, result), None
        except Exception as exc:  # recorded per layout; the sweep goes on
            return None, f"{type(exc).__name__}: {exc}"


_WORKER_EVALUATOR: list[LayoutEvaluator] = []


def _init_worker(model: ModelSpec, cluster_ref: Any, gpus: int, options: dict[str, Any],
                 simulate_fn: SimulateFn | None) -> None:
    _WORKER_EVALUATOR[:] = [LayoutEvaluator(model, cluster_ref, gpus, options, simulate_fn)]
    # Everything loaded so far lives as long as the worker: keep the cyclic collector from rescanning it
    # after every layout.
    gc.freeze()


def _evaluate_in_worker(layout: Layout) -> tuple[dict[str, Any] | None, str | None]:
    # One layout's objects die together when it returns; collecting cycles mid-run only costs time.
    with collector_paused():
        return _WORKER_EVALUATOR[0](layout)


def _simulate_all(
    model: ModelSpec, cluster_ref: Any, gpus: int, layouts: list[Layout], *, workers: int | None,
    progress: bool, options: dict[str, Any], simulate_fn: SimulateFn | None,
) -> tuple[list[dict[str, Any]], list[SweepFailure]]:
    rows: list[dict[str, Any]] = []
    failures: list[SweepFailure] = []
    bar = ProgressBar(len(layouts), label="layouts simulated", enabled=None if progress else False)

    def record(layout: Layout, row: dict[str, Any] | None, error: str | None) -> None:
        if row is not None:
            rows.append(row)
        else:
            failures.append(SweepFailure(layout=layout, error=error or "unknown error"))
        bar.advance(failed=row is None)

    n_workers = min(workers or os.cpu_count() or 1, len(layouts))
    leftover: list[Layout] = []
    try:
        if n_workers <= 1:
            evaluator = LayoutEvaluator(model, cluster_ref, gpus, options, simulate_fn)
            for layout in layouts:
                record(layout, *evaluator(layout))
        else:
            context = multiprocessing.get_context("spawn")
            with cf.ProcessPoolExecutor(
                max_workers=n_workers, mp_context=context, initializer=_init_worker,
                initargs=(model, cluster_ref, gpus, options, simulate_fn),
            ) as pool:
                futures = {pool.submit(_evaluate_in_worker, layout): layout for layout in layouts}
                try:
                    for future in cf.as_completed(futures):
                        try:
                            row, error = future.result()
                        except BrokenProcessPool:
                            leftover.append(futures[future])
                            continue
                        except Exception as exc:  # an unpicklable result fails its layout only
                            row, error = None, f"worker: {type(exc).__name__}: {exc}"
                        record(futures[future], row, error)
                except BaseException:
                    pool.shutdown(wait=False, cancel_futures=True)
                    raise
            if leftover:
                # Workers die together when they cannot start (a script without the
                # ``if __name__ == "__main__":`` guard that spawn needs) or one is killed (out of host
                # memory). Finishing in this process is slower but still gives the user an answer.
                print(
                    f"simgrid sweep: worker processes stopped ({len(leftover)} layouts left); finishing them "
                    "in this process. If this is a script, put the sweep under `if __name__ == \"__main__\":`.",
                    file=sys.stderr,
                )
                evaluator = LayoutEvaluator(model, cluster_ref, gpus, options, simulate_fn)
                for layout in leftover:
                    record(layout, *evaluator(layout))
    finally:
        bar.close()
    return rows, failures


def result_row(layout: Layout, result: Any) -> dict[str, Any]:
    """One table row from a layout and its :class:`simgrid.simulation.SimulationResult` (or metrics)."""
    metrics = getattr(result, "metrics", result)
    row: dict[str, Any] = {
        "dp": layout.dp, "tp": layout.tp, "pp": layout.pp, "cp": layout.cp, "ep": layout.ep, "etp": layout.expert_tp,
        "vpp": layout.vpp, "zero": layout.zero,
        "mbs": layout.micro_batch_size, "schedule": layout.schedule, "recompute": layout.recompute,
        "sequence_parallel": layout.sequence_parallel, "flash_attention": layout.flash_attention,
    }
    for name in METRIC_COLUMNS:
        row[name] = _plain(_field(metrics, name))
    exposed = _field(metrics, "exposed_comm_s", default={}) or {}
    for kind in ("tp", "cp", "ep", "pp", "dp"):
        row[f"exposed_{kind}_s"] = float(_field(exposed, kind, default=0.0) or 0.0)
    return row


# -- helpers ----------------------------------------------------------------------------------------


def _resolve_model(model: ModelSpec | str) -> ModelSpec:
    if isinstance(model, ModelSpec):
        return model
    spec: ModelSpec = importlib.import_module("simgrid.model").get_model(model)
    return spec


def _resolve_cluster(cluster_ref: Any, gpus: int) -> Any:
    if isinstance(cluster_ref, str):
        from simgrid.hardware.loader import load_cluster

        return load_cluster(cluster_ref, gpus=gpus)
    return cluster_ref


def _default_simulate() -> SimulateFn:
    fn: SimulateFn = importlib.import_module("simgrid.simulation").simulate
    return fn


def _default_estimate_memory() -> EstimateMemoryFn:
    fn: EstimateMemoryFn = importlib.import_module("simgrid.memory").estimate_memory
    return fn


def _field(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _dominant_category(breakdown: Any) -> str:
    if not isinstance(breakdown, Mapping) or not breakdown:
        return "unknown"
    return str(max(breakdown, key=lambda k: breakdown[k]))


def _plain(value: Any) -> Any:
    """numpy scalars to Python ones (JSON and comparisons stay simple)."""
    item = getattr(value, "item", None)
    return item() if callable(item) else value
