"""Pipeline orders from outside: a torch schedule CSV as the compute order of a program.

``torch.distributed.pipelining`` writes a schedule as one CSV row per pipeline rank
(:mod:`simgrid.ir.torch_csv`). :func:`read_pipeline_csv` keeps its computation (F, I, W, B and
``OVERLAP_F_B`` units) and drops what the lowering passes place themselves (transfers, ``REDUCE_GRAD``,
``UNSHARD``/``RESHARD``), so ``build_program(model, layout, order=...)`` costs and simulates, or the
executor runs, exactly the order torch would. :func:`layout_for_order` reads the pipeline shape off the
order (ranks, chunks per rank, where each stage lives, micro-batches) and fills in or checks the layout.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from simgrid.errors import ScheduleError
from simgrid.ir.torch_csv import COMPUTE_ACTION_KINDS, actions_from_csv
from simgrid.layout.spec import V_SCHEDULES, Layout, schedule_problem
from simgrid.schedules.pipeline import PipelineOrder, flatten_order, stage_to_rank


def read_pipeline_csv(path: str | Path) -> PipelineOrder:
    """The compute order of a torch schedule CSV (either of torch's formats)."""
    from simgrid.io.inputs import read_input_text

    text = read_input_text(path, what="--pipeline-csv", error=ScheduleError)  # a regular UTF-8 file (not a FIFO)
    rows = actions_from_csv(text, str(path))
    order = [[a for a in row if a.sub_actions or a.kind in COMPUTE_ACTION_KINDS] for row in rows]
    if not order or not any(order):
        raise ScheduleError(f"--pipeline-csv {path}: no compute actions (F, I, W, B); expected torch's "
                            "schedule CSV, one row per pipeline rank, e.g. 0F0,0F1,0B0,0B1")
    return order


def order_shape(order: PipelineOrder, source: str = "order") -> tuple[int, int, str, int]:
    """``(pp, vpp, placement, m)`` of an order: placement is ``"v"`` (chunk 1 of rank r holds stage
    2 pp - 1 - r) or ``"interleaved"`` (stage s on rank s % pp)."""
    pp = len(order)
    leaves = flatten_order(order)
    ranks_of: dict[int, set[int]] = {}
    for rank, row in enumerate(leaves):
        for action in row:
            ranks_of.setdefault(action.stage, set()).add(rank)
    stages = 1 + max(ranks_of)
    split = [s for s, ranks in sorted(ranks_of.items()) if len(ranks) > 1]
    if split:
        raise ScheduleError(f"{source}: stage {split[0]} appears on ranks {sorted(ranks_of[split[0]])}; each "
                            "stage must live on one pipeline rank")
    if stages % pp or len(ranks_of) != stages:
        raise ScheduleError(f"{source}: {pp} rank(s) hold stages {sorted(ranks_of)}; expected stages 0..{pp * (stages // pp or 1) - 1}, "
                            "the same number on every rank")
    vpp = stages // pp
    where = {s: next(iter(r)) for s, r in ranks_of.items()}
    if all(where[s] == s % pp for s in where):
        placement = "interleaved"
    elif vpp == 2 and all(where[s] == stage_to_rank(s, pp, 2, "zbv") for s in where):
        placement = "v"
    else:
        raise ScheduleError(f"{source}: stages sit on ranks {[where[s] for s in range(stages)]}; supported "
                            "placements are interleaved (stage s on rank s % pp) and the V of zbv/dualpipev")
    m = 1 + max(a.microbatch for row in leaves for a in row)
    return pp, vpp, placement, m


def check_order(order: PipelineOrder, layout: Layout, source: str = "order") -> None:
    """Raise :class:`ScheduleError` unless ``order`` runs every micro-batch of ``layout`` once through
    every stage (F, then B or I and W), each stage on the rank the layout puts it."""
    pp, vpp, placement, m = order_shape(order, source)
    want_v = layout.schedule in V_SCHEDULES
    if (pp, vpp) != (layout.pp, layout.vpp) or (placement == "v") != want_v:
        raise ScheduleError(f"{source}: the order has pp {pp}, vpp {vpp}, {placement} placement; the layout has "
                            f"pp {layout.pp}, vpp {layout.vpp}, schedule {layout.schedule}; let the order set them "
                            "(drop --pp/--vpp/--schedule) or make them agree")
    if m != layout.num_microbatches:
        raise ScheduleError(f"{source}: the order runs {m} micro-batches but the layout runs m = "
                            f"{layout.num_microbatches} (gbs {layout.gbs} / (mbs {layout.micro_batch_size} * dp "
                            f"{layout.dp})); use --gbs {m * layout.micro_batch_size * layout.dp}")
    seen: dict[tuple[int, int], list[str]] = {}
    for row in flatten_order(order):
        for a in row:
            seen.setdefault((a.stage, a.microbatch), []).append(a.kind)
    for stage in range(pp * vpp):
        for mb in range(m):
            kinds = sorted(seen.get((stage, mb), []))
            if kinds not in (["B", "F"], ["F", "I", "W"]):
                raise ScheduleError(f"{source}: stage {stage}, micro-batch {mb} runs {kinds or 'nothing'}; each "
                                    "needs one F and one B (or one I and one W)")


def layout_for_order(order: PipelineOrder, layout: Layout, source: str = "order") -> Layout:
    """``layout`` with pp, vpp and a schedule of the order's placement taken from ``order`` (and the global
    batch, when the layout leaves it unset); then :func:`check_order`."""
    pp, vpp, placement, m = order_shape(order, source)
    schedule = str(layout.schedule)
    if (schedule in V_SCHEDULES) != (placement == "v") or schedule_problem(schedule, pp, m, vpp) or (pp > 1) != (
            schedule != "none"):
        # A schedule name that places stages as the order does and accepts any m: with an imported order
        # the name only decides placement; the order itself comes from the file.
        schedule = "zbv" if placement == "v" else ("looped-bfs" if vpp > 1 else ("1f1b" if pp > 1 else "none"))
    gbs = layout.global_batch_size
    fitted = dataclasses.replace(layout, pp=pp, vpp=vpp, schedule=schedule,  # type: ignore[arg-type]
                                 global_batch_size=m * layout.micro_batch_size * layout.dp if gbs is None else gbs)
    check_order(order, fitted, source)
    return fitted


def describe_order(order: PipelineOrder) -> str:
    """``"4 ranks, 8 stages, 6 micro-batches, 12 OVERLAP_F_B units"``-style summary."""
    pp, vpp, _, m = order_shape(order)
    units = sum(1 for row in order for a in row if a.sub_actions)
    return f"{pp} ranks, {pp * vpp} stages, {m} micro-batches" + (f", {units} OVERLAP_F_B units" if units else "")

