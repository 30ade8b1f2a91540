"""``simulate_step``: one program through the fast loop, keeping only the step's aggregates."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from simgrid.engine.costmodel import CostModel, DurationCache
from simgrid.engine.fast.loop import FastLoop
from simgrid.engine.fast.summary import StepSummary
from simgrid.engine.symmetry import plan_ranks
from simgrid.gcpause import collector_paused
from simgrid.ir import Program

if TYPE_CHECKING:
    from simgrid.hardware import Cluster


def simulate_step(program: Program, cluster: Cluster | None = None, *, mode: str = "symmetric",
                  speed_factors: Mapping[int, float] | None = None, dtype: str | None = None,
                  cost_model: CostModel | None = None) -> StepSummary:
    """Simulate one step of ``program`` with the fast communication model and return its aggregates.

    Arguments as :func:`simgrid.engine.simulate_program` (``comm_model`` is always ``fast``). A layout
    search passes one ``cost_model`` for all its programs, so costs computed for one layout serve the next.
    """
    from simgrid.engine.run import prepare_run

    speeds, cost_model, _ = prepare_run(program, cluster, mode=mode, comm_model="fast", speed_factors=speed_factors,
                                        dtype=dtype, cost_model=cost_model, memory_capacity_bytes=0)
    with collector_paused():
        durations = DurationCache(cost_model, program.groups)
        plan = plan_ranks(program, mode=mode, comm_model="fast",
                          has_speed_factors=any(v != 1.0 for v in speeds.values()), durations=durations)
        multiplicity = dict(plan.multiplicity)
        loop = FastLoop(program, durations, plan.simulated, speed_factors=speeds, multiplicity=multiplicity,
                        rows=False)
        loop.run()
        return StepSummary(
            makespan_s=loop.makespan_s,
            mode=plan.mode,
            notes=plan.notes,
            aggregates=loop.aggregates(),
            peak_memory_bytes={r: st.mem_peak for r, st in loop.states.items()},
        )
