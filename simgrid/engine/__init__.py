"""The SimPy discrete-event engine: interprets a schedule IR program on a cluster.

``simulate_program(program, cluster, mode=..., comm_model=...)`` returns an :class:`EngineResult`
(trace, memory timelines and peak, step time). See :mod:`simgrid.engine.interpreter` for the op
semantics as simulated, :mod:`simgrid.engine.symmetry` for when one rank may stand for many, and
:mod:`simgrid.engine.flows` for link sharing in flow mode.
"""

from simgrid.engine.costmodel import ClusterCostModel, CostModel, DurationCache, PhaseLike
from simgrid.engine.flows import FlowNetwork
from simgrid.engine.memory import MemoryReport, MemoryTimeline, build_report, build_timeline
from simgrid.engine.run import COMM_MODELS, MODES, EngineResult, simulate_program
from simgrid.engine.symmetry import RankPlan, plan_ranks

__all__ = [
    "COMM_MODELS",
    "MODES",
    "ClusterCostModel",
    "CostModel",
    "DurationCache",
    "EngineResult",
    "FlowNetwork",
    "MemoryReport",
    "MemoryTimeline",
    "PhaseLike",
    "RankPlan",
    "build_report",
    "build_timeline",
    "plan_ranks",
    "simulate_program",
]
