"""Schedule generators: pipeline orders and the lowering passes that turn (model, layout) into a Program."""

from simgrid.schedules.buckets import Bucket, grad_buckets
from simgrid.schedules.build import build_program
from simgrid.schedules.pipeline import (
    Action,
    PipelineOrder,
    check_schedule,
    pipeline_order,
    rank_stages,
    stage_to_rank,
)
from simgrid.schedules.unit_time import UnitTimeResult, format_grid, simulate_unit_time

__all__ = [
    "Action",
    "Bucket",
    "PipelineOrder",
    "UnitTimeResult",
    "build_program",
    "check_schedule",
    "format_grid",
    "grad_buckets",
    "pipeline_order",
    "rank_stages",
    "simulate_unit_time",
    "stage_to_rank",
]
