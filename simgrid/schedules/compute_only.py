"""A pipeline order as an IR Program with compute ops only (for export, plotting and dry runs).

No model is involved, so the ops carry no cost: FLOPs and bytes are 0 and each op covers the
placeholder block range ``[stage, stage + 1)``. A dry run with :func:`simgrid.ir.dryrun.cost_by_kind`
(e.g. F = 1, B = 2) reproduces :func:`simgrid.schedules.unit_time.simulate_unit_time` timings, since a
compute-only program has no transfers to order the ranks: those dependencies are implied by the stage
numbers and are the job of the full lowering (:func:`simgrid.schedules.build_program`).
"""

from __future__ import annotations

from simgrid.errors import LayoutError
from simgrid.ir.ops import Compute
from simgrid.ir.program import Program
from simgrid.layout.spec import Layout
from simgrid.schedules.pipeline import flatten_order, pipeline_order


def compute_only_program(schedule: str, pp: int, num_microbatches: int, vpp: int = 1) -> Program:
    """One op list per pipeline rank holding the compute ops of the schedule, in order."""
    order = flatten_order(pipeline_order(schedule, pp, num_microbatches, vpp))
    ranks = tuple(
        tuple(
            Compute(kind=a.kind, stage=a.stage, microbatch=a.microbatch, chunk=a.stage // pp,  # type: ignore[arg-type]
                    block_start=a.stage, block_end=a.stage + 1, flops=0.0, hbm_bytes=0.0)
            for a in row
        )
        for row in order
    )
    try:
        layout: Layout | None = Layout(pp=pp, vpp=vpp, schedule=schedule,  # type: ignore[arg-type]
                                       global_batch_size=num_microbatches)
    except LayoutError:
        layout = None  # e.g. '1f1b' on one rank: a valid order that the Layout rules refuse
    meta = {"generator": "simgrid.schedules.compute_only_program", "schedule": schedule,
            "num_microbatches": num_microbatches, "compute_only": True}
    return Program(layout=layout, ranks=ranks, meta=meta)
