"""Layout search: enumerate every valid parallel layout, drop what cannot fit, simulate and rank the rest.

Quick use::

    from simgrid.sweep import SweepConstraints, sweep
    result = sweep("gpt3-175b", "dgx-a100-hdr", gpus=1024, global_batch=1536,
                   constraints=SweepConstraints(recompute=("full",)))
    result.table.head()          # best first: dp, tp, pp, vpp, zero, mbs, schedule, recompute, ...
    print("\\n".join(result.summary_lines()))
"""

from simgrid.sweep.constraints import PIPELINE_SCHEDULES, SweepConstraints
from simgrid.sweep.progress import ProgressBar
from simgrid.sweep.runner import (
    LAYOUT_COLUMNS,
    RESULT_COLUMNS,
    SweepFailure,
    SweepResult,
    cheapest_recompute,
    describe_layout,
    rank_table,
    result_row,
    sweep,
    sweep_layouts,
)
from simgrid.sweep.search_space import LayoutSpace, enumerate_layout_space, enumerate_layouts

__all__ = [
    "LAYOUT_COLUMNS",
    "PIPELINE_SCHEDULES",
    "RESULT_COLUMNS",
    "LayoutSpace",
    "ProgressBar",
    "SweepConstraints",
    "SweepFailure",
    "SweepResult",
    "cheapest_recompute",
    "describe_layout",
    "enumerate_layout_space",
    "enumerate_layouts",
    "rank_table",
    "result_row",
    "sweep",
    "sweep_layouts",
]
