"""``simulate(model, cluster, layout)``: the one-call Python API from a layout to step time, MFU and memory.

It builds the schedule IR program (:func:`simgrid.schedules.build_program`), runs it on the engine
(:func:`simgrid.engine.simulate_program`) and derives :class:`~simgrid.metrics.Metrics` from the trace.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from simgrid.engine import EngineResult, MemoryReport, simulate_program
from simgrid.errors import SimulationError
from simgrid.layout import Layout, check_fp8_gpu, check_layout
from simgrid.memory.headroom import DEFAULT_HEADROOM, MemoryHeadroom
from simgrid.metrics import Metrics, compute_metrics, metric_notes, metrics_meta
from simgrid.model.spec import ModelSpec
from simgrid.schedules.advice import pipeline_warnings
from simgrid.trace import Trace

if TYPE_CHECKING:
    from simgrid.hardware import Cluster
    from simgrid.ir import Program

STAGE_GRANULARITY_ABOVE_RANKS = 64
"""``granularity="auto"`` folds per-layer ops into per-stage ops above this many ranks: the per-layer
tensor-parallel collectives then become one op with a ``count``, which keeps 1000+ GPU runs to seconds
at the cost of per-layer overlap detail."""

GRANULARITIES = ("auto", "block", "stage")


@dataclass(frozen=True, kw_only=True)
class SimulationResult:
    """Everything one simulated step produced."""

    metrics: Metrics
    """Headline numbers (step time, throughput, MFU/HFU, bubble, exposed comm, memory)."""
    trace: Trace
    """One row per executed op of every simulated rank."""
    program: Program
    """The schedule IR program that was simulated."""
    memory: MemoryReport
    """Per-rank memory timelines and the fit verdict."""
    engine: EngineResult
    """The raw engine result (mode used, notes, link traffic)."""
    model: ModelSpec
    """The model trained."""
    layout: Layout
    """The parallel layout."""
    cluster_name: str
    """Cluster profile name."""
    granularity: str
    """Program granularity used (``block`` or ``stage``)."""
    wall_s: float
    """Wall-clock seconds spent building and simulating."""
    notes: tuple[str, ...] = field(default_factory=tuple)
    """Things the user should know (e.g. why symmetric mode fell back to full, why HFU < MFU)."""
    warnings: tuple[str, ...] = field(default_factory=tuple)
    """Things to fix (e.g. too few micro-batches for the pipeline, with the batch that fixes it)."""

    def to_json_dict(self) -> dict[str, Any]:
        """The issue's JSON keys, plus model/cluster/layout/mode fields."""
        out = self.metrics.to_json_dict()
        out["wall_s"] = self.wall_s
        out["model"] = self.model.name
        out["cluster"] = self.cluster_name
        out["layout"] = self.layout.to_dict()
        out["mode"] = self.engine.mode
        out["comm_model"] = self.engine.comm_model
        out["granularity"] = self.granularity
        out["notes"] = list(self.notes)
        out["warnings"] = list(self.warnings)
        return out


def simulate(model: str | ModelSpec, cluster: str | Cluster, layout: Layout, *, mode: str = "symmetric",
             comm_model: str = "fast", granularity: str = "auto",
             speed_factors: Mapping[int, float] | None = None,
             memory_headroom: MemoryHeadroom = DEFAULT_HEADROOM, program: Program | None = None) -> SimulationResult:
    """Simulate one training step of ``model`` on ``cluster`` under ``layout``.

    ``model``: a preset name (``simgrid models``) or a :class:`ModelSpec`. ``cluster``: a profile name
    (sized to ``layout.world_size`` GPUs) or a sized :class:`~simgrid.hardware.Cluster`.
    ``mode``: ``symmetric`` (one rank per pipeline stage when exact) or ``full``; ``comm_model``: ``fast``
    or ``flow``; ``granularity``: ``block``, ``stage`` or ``auto`` (stage above 64 ranks);
    ``speed_factors``: rank -> relative compute speed for stragglers; ``memory_headroom``: what the
    fit verdict keeps free for the CUDA context and allocator fragmentation; ``program``: simulate this
    program (e.g. loaded from a file, or built from an imported pipeline order) instead of building one
    from ``model`` and ``layout``, which must then be the program's own.
    """
    t_start = time.perf_counter()
    if not isinstance(layout, Layout):
        raise SimulationError(f"simulate: layout must be a simgrid.layout.Layout, got {type(layout).__name__}")
    spec = _resolve_model(model)
    check_layout(spec, layout)
    sized = _resolve_cluster(cluster, layout.world_size)
    check_fp8_gpu(layout.fp8_recipe, sized.gpu)
    gran = resolve_granularity(granularity, layout.world_size)
    if program is not None and program.world_size != layout.world_size:
        raise SimulationError(
            f"simulate: the program has {program.world_size} ranks but the layout needs {layout.world_size}; "
            "pass the program's own layout"
        )
    if program is None:
        from simgrid.limits import check_program_size
        from simgrid.schedules import build_program

        every_rank = mode == "full" or comm_model == "flow" or bool(speed_factors)  # else one rank per stage
        check_program_size(spec, layout, gran, ranks=layout.world_size if every_rank else layout.pp,
                           what=f"simulating {'every rank' if every_rank else 'one rank per pipeline stage'}")
        program = build_program(spec, layout, granularity=gran)  # type: ignore[arg-type]
    else:
        gran = str(program.meta.get("granularity", gran))
    engine = simulate_program(program, sized, mode=mode, comm_model=comm_model, speed_factors=speed_factors,
                              dtype=layout.precision)
    metrics = compute_metrics(
        engine.trace,
        model=spec,
        layout=layout,
        peak_flops_per_gpu=sized.gpu.peak_flops(layout.precision),
        peak_memory_bytes=engine.memory.peak_bytes,
        memory_capacity_bytes=engine.memory.capacity_bytes,
        link_utilisation=engine.link_utilisation() if comm_model == "flow" else None,
        memory_headroom=memory_headroom,
    )
    _attach_memory_timeline(engine, layout)
    engine.trace.meta.update(metrics_meta(
        model=spec, layout=layout, cluster=sized.spec.name, peak_flops_per_gpu=sized.gpu.peak_flops(layout.precision),
        peak_memory_bytes=engine.memory.peak_bytes, memory_capacity_bytes=engine.memory.capacity_bytes,
        memory_headroom=memory_headroom,
    ))
    return SimulationResult(
        metrics=metrics,
        trace=engine.trace,
        program=program,
        memory=engine.memory,
        engine=engine,
        model=spec,
        layout=layout,
        cluster_name=sized.spec.name,
        granularity=gran,
        wall_s=time.perf_counter() - t_start,
        notes=(*engine.notes, *metric_notes(metrics, layout)),
        warnings=tuple(pipeline_warnings(layout, metrics.bubble_fraction)),
    )


def _attach_memory_timeline(engine: EngineResult, layout: Layout) -> None:
    """Keep the pipeline ranks' memory over time in the trace's metadata, so a saved trace can be drawn
    by ``simgrid plot --kind memory``; only one pipeline's ranks, so a full-mode file stays small."""
    from simgrid.layout import Mesh

    mesh = Mesh(layout)
    ranks = sorted({mesh.rank(pp=p, dp=0, tp=0) for p in range(layout.pp)} & set(engine.memory.timelines))
    engine.trace.meta["memory_timeline"] = {
        str(rank): {
            "times_s": list(engine.memory.timelines[rank].times_s),
            "total_bytes": list(engine.memory.timelines[rank].total_bytes),
        }
        for rank in ranks
    }


def _resolve_model(model: str | ModelSpec) -> ModelSpec:
    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, str):
        from simgrid.model import get_model

        return get_model(model)
    raise SimulationError(f"simulate: model must be a preset name or a ModelSpec, got {type(model).__name__}")


def _resolve_cluster(cluster: str | Cluster, world_size: int) -> Cluster:
    from simgrid.hardware import Cluster, load_cluster

    if isinstance(cluster, str):
        return load_cluster(cluster, gpus=world_size)
    if isinstance(cluster, Cluster):
        if cluster.num_gpus < world_size:
            raise SimulationError(
                f"simulate: the layout needs {world_size} GPUs (dp x tp x pp) but cluster {cluster.spec.name!r} "
                f"was sized for {cluster.num_gpus}; load it with gpus={world_size}"
            )
        return cluster
    raise SimulationError(f"simulate: cluster must be a profile name or a Cluster, got {type(cluster).__name__}")


def resolve_granularity(granularity: str, world_size: int) -> str:
    """``block`` or ``stage`` for ``granularity`` (``auto``: stage above 64 ranks); checks the name."""
    if granularity not in GRANULARITIES:
        raise SimulationError(
            f"simulate: granularity = {granularity!r} is not one of {', '.join(GRANULARITIES)}"
        )
    if granularity == "auto":
        return "stage" if world_size > STAGE_GRANULARITY_ABOVE_RANKS else "block"
    return granularity
