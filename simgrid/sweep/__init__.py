"""Layout search: enumerate every valid parallel layout, bound, simulate what can win, rank.

Quick use::

    from simgrid.sweep import SweepConstraints, sweep
    result = sweep("gpt3-175b", "dgx-a100-hdr", gpus=1024, global_batch=1536,
                   constraints=SweepConstraints(recompute=("full",)))
    result.table.head()          # best first: dp, tp, pp, vpp, zero, mbs, schedule, recompute, ...
    print("\\n".join(result.summary_lines()))
"""

from simgrid.sweep.constraints import PIPELINE_SCHEDULES, SweepConstraints
from simgrid.sweep.evaluate import result_row
from simgrid.sweep.progress import ProgressBar
from simgrid.sweep.runner import (
    DEFAULT_EXACT_TOP,
    LAYOUT_COLUMNS,
    RESULT_COLUMNS,
    SweepFailure,
    SweepResult,
    cheapest_recompute,
    describe_layout,
    rank_table,
    sweep,
    sweep_layouts,
)
from simgrid.sweep.search_space import LayoutSpace, enumerate_layout_space, enumerate_layouts

__all__ = [
    "DEFAULT_EXACT_TOP",
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
