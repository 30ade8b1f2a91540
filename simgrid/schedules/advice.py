"""Warnings about a layout's pipeline: too few micro-batches, or a bubble past a quarter of the step.

The fix is the global batch: more micro-batches per step shrink the fill-and-drain bubble. To name the
batch that fixes it, :func:`schedule_bubble` runs the schedule's own order in unit time
(:mod:`simgrid.schedules.unit_time`; F = 1, B = 2, equal stages, free communication), which for 1F1B is
the textbook ``(pp - 1) / (m + pp - 1)`` (Narayanan et al. SC'21, section 2.2.1); the smallest valid
micro-batch count whose unit-time bubble is at most :data:`BUBBLE_WARNING` gives the suggested batch.
A simulated bubble above the threshold whose unit-time bubble is already below it comes from
elsewhere (uneven stages, exposed communication), and the warning says so instead.
"""

from __future__ import annotations

from simgrid.errors import ScheduleError
from simgrid.layout.spec import Layout

BUBBLE_WARNING = 0.25
"""Bubble fraction above which a report warns (a quarter of the step idle)."""
_MAX_MICROBATCHES_TRIED = 4096


def schedule_bubble(schedule: str, pp: int, num_microbatches: int, vpp: int) -> float:
    """Idle fraction of the schedule's order in unit time (F = 1, B = I + W = 2)."""
    from simgrid.schedules.pipeline import pipeline_order
    from simgrid.schedules.unit_time import simulate_unit_time

    return simulate_unit_time(pipeline_order(schedule, pp, num_microbatches, vpp)).idle_fraction


def microbatches_for_bubble(layout: Layout, target: float = BUBBLE_WARNING) -> int | None:
    """Smallest micro-batch count >= the layout's whose unit-time bubble is at most ``target``, or None."""
    m = max(layout.num_microbatches, 1)
    step = 1
    while m <= _MAX_MICROBATCHES_TRIED:
        try:
            if schedule_bubble(str(layout.schedule), layout.pp, m, layout.vpp) <= target:
                return m
        except ScheduleError:
            pass  # e.g. unequal interleaving rounds at this m: try the next count
        if m >= 64 * layout.pp:
            step = layout.pp  # large counts: keep the search short
        m += step
    return None


def pipeline_warnings(layout: Layout, bubble_fraction: float | None = None) -> list[str]:
    """What to tell the user about the layout's micro-batches and (if given) its simulated bubble."""
    if layout.pp == 1:
        return []
    m, pp = layout.num_microbatches, layout.pp
    per_mb = layout.micro_batch_size * layout.dp
    too_few = m < pp
    too_idle = bubble_fraction is not None and bubble_fraction > BUBBLE_WARNING
    if not (too_few or too_idle):
        return []
    inherent = schedule_bubble(str(layout.schedule), pp, m, layout.vpp)
    better = microbatches_for_bubble(layout)
    fix = (f"--gbs {better * per_mb} (m = {better}) brings the schedule's own bubble to "
           f"{schedule_bubble(str(layout.schedule), pp, better, layout.vpp):.0%}" if better is not None else "")
    where = f"m = {m} micro-batch{'es' if m != 1 else ''} (gbs {layout.gbs} / (mbs {layout.micro_batch_size} * dp {layout.dp}))"
    if too_few:
        return [f"only {where} for pp = {pp} pipeline ranks: ranks idle while the pipeline fills and drains "
                f"(the schedule alone leaves {inherent:.0%} of the step idle); {fix}"]
    if inherent > BUBBLE_WARNING:
        return [f"pipeline bubble {bubble_fraction:.0%} is above {BUBBLE_WARNING:.0%} with {where} on pp = {pp}; "
                f"{fix}"]
    return [f"pipeline bubble {bubble_fraction:.0%} is above {BUBBLE_WARNING:.0%} although the schedule's own "
            f"bubble at m = {m} is {inherent:.0%}: the rest is uneven stages or exposed communication (see the "
            "Gantt chart)"]
