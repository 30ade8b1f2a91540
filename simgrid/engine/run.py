"""Entry point of the engine: simulate one program on one cluster and collect the results."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from simgrid.engine.costmodel import ClusterCostModel, CostModel, DurationCache
from simgrid.engine.fast.loop import FastLoop, UnsupportedProgram
from simgrid.engine.fast.tape import memory_events, rows_from_tape
from simgrid.engine.interpreter import Interpreter
from simgrid.engine.memory import LazyTimelines, MemoryReport, build_report
from simgrid.engine.symmetry import plan_ranks
from simgrid.errors import SimulationError
from simgrid.gcpause import collector_paused
from simgrid.ir import Program
from simgrid.trace import Trace

if TYPE_CHECKING:
    from simgrid.hardware import Cluster

MODES = ("symmetric", "full")
COMM_MODELS = ("fast", "flow")
ENGINES = ("auto", "simpy", "fast")


@dataclass(frozen=True, kw_only=True)
class EngineResult:
    """What one simulated step produced."""

    trace: Trace
    """One row per executed op of every simulated rank."""
    memory: MemoryReport
    """Memory timeline and peak per simulated rank, and the capacity verdict."""
    makespan_s: float
    """Time from the first issue to the last op's end: the step time."""
    mode: str
    """Mode actually used (``symmetric`` or ``full``; symmetric falls back to full when not exact)."""
    comm_model: str
    """``fast`` (closed-form collectives) or ``flow`` (link-sharing flows)."""
    simulated_ranks: tuple[int, ...]
    """Ranks the engine ran."""
    multiplicity: Mapping[int, int]
    """Simulated rank -> how many ranks it stands for (sums to the world size)."""
    world_size: int
    """Ranks in the program."""
    notes: tuple[str, ...] = ()
    """Things the user should know (e.g. why symmetric mode fell back to full)."""
    link_bytes: Mapping[str, float] = field(default_factory=dict)
    """Flow mode: bytes carried by each link over the step."""
    link_bandwidth_Bps: Mapping[str, float] = field(default_factory=dict)
    """Flow mode: achievable bandwidth of each link that carried traffic."""

    @property
    def peak_memory_bytes(self) -> int:
        """Largest per-rank peak of device memory."""
        return self.memory.peak_bytes

    @property
    def fits(self) -> bool:
        """Every rank stays within device memory."""
        return self.memory.fits

    def link_utilisation(self) -> dict[str, float]:
        """Flow mode: each link's carried bytes over (bandwidth x step time), in [0, 1]."""
        if self.makespan_s <= 0:
            return {}
        out = {}
        for name, nbytes in self.link_bytes.items():
            bw = self.link_bandwidth_Bps.get(name, math.inf)
            out[name] = 0.0 if math.isinf(bw) else nbytes / (bw * self.makespan_s)
        return out


def simulate_program(program: Program, cluster: Cluster | None = None, *, mode: str = "symmetric",
                     comm_model: str = "fast", speed_factors: Mapping[int, float] | None = None,
                     dtype: str | None = None, cost_model: CostModel | None = None,
                     memory_capacity_bytes: int | None = None, engine: str = "auto") -> EngineResult:
    """Simulate one training step of ``program`` on ``cluster``.

    ``mode``: ``symmetric`` simulates one representative per pipeline rank when that is provably exact
    (see :mod:`simgrid.engine.symmetry`), else falls back to ``full`` with a note. ``comm_model``:
    ``fast`` closed-form communication or ``flow`` max-min fair flows on topology links.
    ``speed_factors``: rank -> relative compute speed (0.5 = a straggler at half speed).
    ``dtype``: compute dtype for peak rates (default: the layout's precision, else bf16).
    ``cost_model`` replaces the cluster's costs (tests, what-if studies); ``memory_capacity_bytes``
    overrides the GPU's capacity for the fit verdict. ``engine``: ``simpy`` runs the SimPy interpreter;
    ``fast`` runs the same rules in a plain event loop (:mod:`simgrid.engine.fast`; fast comm model only,
    same trace row for row); ``auto`` (default) picks ``fast`` whenever it applies.
    """
    if engine not in ENGINES:
        raise SimulationError(f"simulate: engine = {engine!r} is not one of {', '.join(ENGINES)}")
    if engine == "fast" and comm_model != "fast":
        raise SimulationError("simulate: engine 'fast' needs comm_model 'fast' (flow mode runs on SimPy); "
                              "use engine 'simpy' or 'auto'")
    speeds, cost_model, memory_capacity_bytes = prepare_run(
        program, cluster, mode=mode, comm_model=comm_model, speed_factors=speed_factors, dtype=dtype,
        cost_model=cost_model, memory_capacity_bytes=memory_capacity_bytes)
    with collector_paused():
        return _run(program, cluster, mode=mode, comm_model=comm_model, speeds=speeds, cost_model=cost_model,
                    memory_capacity_bytes=memory_capacity_bytes, engine=engine)


def prepare_run(program: Program, cluster: Cluster | None, *, mode: str, comm_model: str,
                speed_factors: Mapping[int, float] | None, dtype: str | None, cost_model: CostModel | None,
                memory_capacity_bytes: int | None) -> tuple[dict[int, float], CostModel, int]:
    """Check the arguments of a run; return (speed factors, cost model, memory capacity in bytes)."""
    if mode not in MODES:
        raise SimulationError(f"simulate: mode = {mode!r} is not one of {', '.join(MODES)}")
    if comm_model not in COMM_MODELS:
        raise SimulationError(f"simulate: comm_model = {comm_model!r} is not one of {', '.join(COMM_MODELS)}")
    if not isinstance(program, Program):
        raise SimulationError(f"simulate: program must be a simgrid.ir.Program, got {type(program).__name__}")
    world = program.world_size
    speeds = _check_speed_factors(speed_factors, world)
    if dtype is None:
        dtype = program.layout.precision if program.layout is not None else "bf16"
    if cost_model is None:
        if cluster is None:
            raise SimulationError("simulate: give a cluster (or a cost_model)")
        _check_cluster_size(cluster, world)
        kernel = program.layout.attention_kernel if program.layout is not None else "auto"
        cost_model = ClusterCostModel(cluster, dtype=dtype, attention_kernel=kernel)
    if memory_capacity_bytes is None:
        memory_capacity_bytes = cluster.gpu.memory_bytes if cluster is not None else 0
    return speeds, cost_model, memory_capacity_bytes


def _run(program: Program, cluster: Cluster | None, *, mode: str, comm_model: str, speeds: dict[int, float],
         cost_model: CostModel, memory_capacity_bytes: int, engine: str) -> EngineResult:
    world = program.world_size
    durations = DurationCache(cost_model, program.groups)
    plan = plan_ranks(program, mode=mode, comm_model=comm_model,
                      has_speed_factors=any(v != 1.0 for v in speeds.values()), durations=durations)
    multiplicity = dict(plan.multiplicity)
    interp: Interpreter | FastLoop | None = None
    if engine != "simpy" and comm_model == "fast":
        interp = FastLoop(program, durations, plan.simulated, speed_factors=speeds, multiplicity=multiplicity)
        try:
            interp.run()
        except UnsupportedProgram:
            if engine == "fast":
                raise
            interp = None  # an op the fast loop does not know: the SimPy interpreter is the reference
    if interp is None:
        interp = Interpreter(program, durations, plan.simulated, comm_model=comm_model, speed_factors=speeds)
        interp.run()
    meta = {
        "source": "simgrid.engine",
        "world_size": world,
        "mode": plan.mode,
        "comm_model": comm_model,
        "multiplicity": {str(r): n for r, n in multiplicity.items()},
    }
    network = None
    if isinstance(interp, FastLoop):
        trace, memory = _deferred_results(interp, meta, memory_capacity_bytes)
    else:
        trace = Trace(interp.rows, meta=meta, render_ops=True)
        memory = build_report({r: interp.states[r].mem for r in plan.simulated}, memory_capacity_bytes)
        network = interp.network
    return EngineResult(
        trace=trace,
        memory=memory,
        makespan_s=interp.makespan_s,
        mode=plan.mode,
        comm_model=comm_model,
        simulated_ranks=plan.simulated,
        multiplicity=multiplicity,
        world_size=world,
        notes=plan.notes,
        link_bytes=dict(network.bytes_by_link) if network is not None else {},
        link_bandwidth_Bps=dict(network.capacity_Bps) if network is not None else {},
    )


def _deferred_results(loop: FastLoop, meta: dict[str, object], capacity_bytes: int) -> tuple[Trace, MemoryReport]:
    """The fast loop's trace and memory report, their rows and timelines made only when read
    (:mod:`simgrid.engine.fast.tape`); the metrics come from the loop's aggregates."""
    tape, states = loop.tape, loop.states
    trace = Trace.deferred(lambda: rows_from_tape(tape), length=loop.row_count, aggregates=loop.aggregates(),
                           meta=meta)
    timelines = LazyTimelines(lambda rank: memory_events(states[rank].ops, states[rank].mem_times),
                              {r: st.mem_peak for r, st in states.items()})
    return trace, MemoryReport(timelines=timelines, capacity_bytes=int(capacity_bytes))


def _check_speed_factors(speed_factors: Mapping[int, float] | None, world: int) -> dict[int, float]:
    out: dict[int, float] = {}
    for rank, value in (speed_factors or {}).items():
        if not isinstance(rank, int) or not 0 <= rank < world:
            raise SimulationError(f"simulate: speed_factors key {rank!r} is not a rank in 0..{world - 1}")
        if not isinstance(value, (int, float)) or not 0 < value < math.inf:
            raise SimulationError(
                f"simulate: speed_factors[{rank}] = {value!r} must be a positive finite number "
                "(1.0 = nominal speed, 0.5 = half speed)"
            )
        out[rank] = float(value)
    return out


def _check_cluster_size(cluster: Cluster, world: int) -> None:
    if getattr(cluster, "num_gpus", world) < world:
        raise SimulationError(
            f"simulate: the program has {world} ranks but the cluster has only {cluster.num_gpus} GPUs; "
            f"size the cluster with gpus >= {world}"
        )
