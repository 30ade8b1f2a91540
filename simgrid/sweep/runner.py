"""The layout search: enumerate, bound, simulate the layouts that can still make the best K, rank.

Layouts are decided by :func:`simgrid.sweep.search.branch_and_bound` in order of an admissible lower
bound on their step time (:mod:`simgrid.sweep.bounds`): the best ``exact_top`` layouts are exactly those
of simulating everything, and every layout whose bound shows it cannot join them is skipped unsimulated
(``exact_top=None`` simulates every layout that fits). Simulations run on the fast engine
(:mod:`simgrid.engine.fast`), in worker processes or on a Ray cluster (:mod:`simgrid.sweep.backends`).

A failing simulation (a schedule the generator rejects, an engine bug) is recorded with its message and
the search goes on: one bad corner of the space must not cost the user the whole sweep.
"""

from __future__ import annotations

import dataclasses
import importlib
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from simgrid.errors import LayoutError
from simgrid.gcpause import collector_paused
from simgrid.layout import Layout, check_fp8_gpu
from simgrid.model.spec import ModelSpec
from simgrid.sweep.constraints import SweepConstraints
from simgrid.sweep.evaluate import (
    METRIC_COLUMNS,
    EstimateMemoryFn,
    LayoutEvaluator,
    SimulateFn,
    fast_path_applies,
    plain,
    resolve_cluster,
)
from simgrid.sweep.progress import ProgressBar
from simgrid.sweep.search_space import enumerate_layout_space

if TYPE_CHECKING:
    import pandas as pd

#: Layout columns of the result table, in the order the issue lists them.
LAYOUT_COLUMNS: tuple[str, ...] = ("dp", "tp", "pp", "vpp", "zero", "mbs", "schedule", "recompute", "cp", "ep", "etp")
#: Megatron-Core overlap switches a search may try (``--tp-comm-overlap``, ``--overlap-param-gather``).
SWITCH_COLUMNS: tuple[str, ...] = ("tp_comm_overlap", "overlap_param_gather")
#: Every column of :attr:`SweepResult.table`.
RESULT_COLUMNS: tuple[str, ...] = (
    *LAYOUT_COLUMNS, "sequence_parallel", "flash_attention", *SWITCH_COLUMNS, *METRIC_COLUMNS, "exposed_tp_s", "exposed_cp_s",
    "exposed_ep_s", "exposed_pp_s", "exposed_dp_s",
)
#: Memory categories of a :class:`simgrid.memory.MemoryEstimate` breakdown.
MEMORY_CATEGORIES: tuple[str, ...] = ("weights", "grads", "optimizer", "activations", "buffers")

DEFAULT_EXACT_TOP = 20
"""Best layouts a search guarantees exact (the bound prunes only layouts that cannot join them)."""


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
    bounded: int = 0
    """Layouts skipped because their lower bound on the step time exceeds the ``exact_top``-th best simulated
    step time: they cannot join the best ``exact_top`` (their memory was not checked either)."""
    exact_top: int | None = None
    """How many best layouts the search guarantees exact; ``None``: every layout that fits was simulated."""
    failures: tuple[SweepFailure, ...] = ()
    """Layouts whose estimate or simulation raised."""
    wall_s: float = 0.0
    """Wall time of the whole search in seconds."""
    backend: str = "local"
    """Where the layouts were evaluated (``local`` or ``ray``)."""
    workers: int = 1
    """Worker processes (or Ray actors) that evaluated them."""

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
        return {k: plain(v) for k, v in self.table.iloc[0].to_dict().items()}

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
        if self.bounded:
            lines.append(f"skipped {self.bounded} whose lower bound exceeds the {self.exact_top}th best step time "
                         "(they cannot enter the best; --exhaustive simulates them)")
        lines.append(
            f"simulated: {self.simulated} ({len(self.table)} ok, {len(self.failures)} failed) "
            f"in {self.wall_s:.1f} s on {self.workers} {self.backend} worker{'s' if self.workers != 1 else ''}"
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
    exact_top: int | None = DEFAULT_EXACT_TOP,
    backend: str = "local",
    address: str | None = None,
) -> SweepResult:
    """Search every valid layout of ``model`` on ``gpus`` GPUs of ``cluster_name`` and rank them.

    ``cluster_name`` is a profile name (loaded in every worker) or an already sized cluster object.
    ``simulate_options`` go to :func:`simgrid.simulation.simulate` (``mode``, ``comm_model``,
    ``granularity``). ``simulate_fn``/``estimate_memory_fn`` replace the simulator and the memory
    estimate (a custom cost model; they must be importable module-level functions to reach workers).
    ``top`` keeps only the best rows in the table; the counts still cover the whole search.
    ``exact_top``: the best that many layouts are guaranteed exact, and layouts whose lower bound shows
    they cannot join them are not simulated (``None``: simulate every layout that fits; a custom
    ``simulate_fn`` or flow-mode options always do, as the bound is the engine's).
    ``prune_recompute`` skips a layout when the same layout with a cheaper recompute policy (none <
    selective < full) also fits: recompute only adds FLOPs, so the skipped one cannot rank higher.
    ``backend``: ``local`` (``workers`` processes, default the CPU count) or ``ray`` (actors on the Ray
    cluster at ``address``; see :mod:`simgrid.sweep.backends`).
    """
    start = time.perf_counter()
    spec = _resolve_model(model)
    cluster = resolve_cluster(cluster_name, gpus)
    space = enumerate_layout_space(spec, cluster, gpus=gpus, global_batch=global_batch, constraints=constraints)
    result = sweep_layouts(
        spec, cluster_name, gpus, space.layouts, top=top, workers=workers, progress=progress,
        prune_recompute=prune_recompute, simulate_options=simulate_options, simulate_fn=simulate_fn,
        estimate_memory_fn=estimate_memory_fn, cluster=cluster, exact_top=exact_top, backend=backend,
        address=address,
    )
    return dataclasses.replace(
        result, tried=space.tried, enumerated=len(space.layouts), invalid_reasons=space.invalid_reasons,
        invalid_examples=space.invalid_examples, wall_s=time.perf_counter() - start,
    )


SWEEP_SIMULATE_DEFAULTS: dict[str, Any] = {"granularity": "stage"}
"""A sweep ranks layouts, so it simulates at stage granularity: about 10x faster than per-block programs
at 8-64 GPUs and within a few percent of them in step time (``simulate_options`` can ask for ``block``)."""

BATCH_PER_WORKER = 8
"""Layouts sent per worker per batch: enough to keep workers busy between two decisions of the search,
few enough that the bound prunes soon after the best layouts are found."""


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
    exact_top: int | None = DEFAULT_EXACT_TOP,
    backend: str = "local",
    address: str | None = None,
) -> SweepResult:
    """Bound, memory-filter, simulate and rank the given layouts (the second half of :func:`sweep`)."""
    from simgrid.sweep.backends import make_backend
    from simgrid.sweep.search import branch_and_bound

    start = time.perf_counter()
    spec = _resolve_model(model)
    if cluster is None:
        cluster = resolve_cluster(cluster_name, gpus)
    candidates = list(layouts)
    for fp8_recipe in sorted({layout.fp8_recipe for layout in candidates}):
        check_fp8_gpu(fp8_recipe, getattr(cluster, "gpu", None))
    options = {**SWEEP_SIMULATE_DEFAULTS, **(simulate_options or {})}
    bounded = bool(exact_top) and simulate_fn is None and fast_path_applies(options)
    evaluator_args = (spec, cluster_name if isinstance(cluster_name, str) else cluster, gpus, options,
                      {"simulate_fn": simulate_fn, "estimate_memory_fn": estimate_memory_fn})
    bar = ProgressBar(len(candidates), label="layouts decided", enabled=None if progress else False)
    engine = None
    try:
        engine = make_backend(backend, evaluator_args, workers=workers, address=address,
                              most=len(candidates)) if candidates else None
        bounds = None
        if bounded and candidates:
            with collector_paused():
                local = LayoutEvaluator(spec, cluster, gpus, options)
                bounds = [_quick_bound(local, layout) for layout in candidates]
        outcome = branch_and_bound(
            candidates, bounds, engine.evaluate if engine is not None else (lambda tasks: []),
            keep=exact_top if bounded else None, prune_recompute=prune_recompute,
            batch_size=BATCH_PER_WORKER * (engine.workers if engine is not None else 1),
            on_progress=bar.update_to,
        )
    finally:
        bar.close()
        if engine is not None:
            engine.close()
    # Rows arrive batch by batch, and batches depend on the worker count: order them by layout first so
    # that layouts tied in every ranking key keep one order whatever the backend.
    rows = sorted(outcome.rows, key=lambda r: tuple(str(r[c]) for c in (*LAYOUT_COLUMNS, "sequence_parallel",
                                                                          "flash_attention", *SWITCH_COLUMNS)))
    return SweepResult(
        table=rank_table(rows, top=top), tried=len(candidates), enumerated=len(candidates),
        memory_dropped=sum(outcome.memory_reasons.values()), memory_reasons=outcome.memory_reasons,
        dominated=outcome.dominated, bounded=outcome.bounded, exact_top=exact_top if bounded else None,
        failures=tuple(SweepFailure(layout=layout, error=error) for layout, error in outcome.failures),
        wall_s=time.perf_counter() - start, backend=backend, workers=engine.workers if engine is not None else 1,
    )


def cheapest_recompute(layouts: Sequence[Layout]) -> list[Layout]:
    """Keep, of layouts equal but for the recompute policy, only the one with the least recompute.

    Recompute re-runs forward work in the backward pass and changes no communication (Korthikanti 2022,
    section 5: it trades compute for activation memory), so among fitting variants the one with less
    recompute is at least as fast. Order of the input is kept.
    """
    cost = {"none": 0, "selective": 1, "selective-op": 1, "full": 2}
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
    return (text + (" sp" if layout.sequence_parallel else "") + (" tpo" if layout.tp_comm_overlap else "")
            + (" flash" if layout.flash_attention else "") + (" opg" if layout.overlap_param_gather else ""))


# -- helpers ----------------------------------------------------------------------------------------


def _quick_bound(evaluator: LayoutEvaluator, layout: Layout) -> float:
    """The layout's quick bound, or 0 (always admissible: the layout is simulated) if it cannot be had."""
    try:
        return float(evaluator.bounds.quick(layout))
    except Exception:  # a schedule or op the bound does not know: no pruning for this layout, no error
        return 0.0


def _resolve_model(model: ModelSpec | str) -> ModelSpec:
    if isinstance(model, ModelSpec):
        return model
    spec: ModelSpec = importlib.import_module("simgrid.model").get_model(model)
    return spec
