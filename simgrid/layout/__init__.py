"""Parallel layouts and the rank mesh."""

from simgrid.layout.fp8_checks import check_fp8_gpu
from simgrid.layout.mesh import Mesh, RankCoord
from simgrid.layout.spec import (
    OPTIMIZERS,
    PRECISIONS,
    RECOMPUTE_POLICIES,
    SCHEDULES,
    Layout,
    check_layout,
)

__all__ = ["OPTIMIZERS", "PRECISIONS", "RECOMPUTE_POLICIES", "SCHEDULES", "Layout", "Mesh", "RankCoord", "check_fp8_gpu",
           "check_layout"]
