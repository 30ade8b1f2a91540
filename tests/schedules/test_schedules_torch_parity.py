"""Our pipeline orders against torch 2.13's schedule classes, built by their real constructors.

torch's classes compute every rank's order in ``__init__`` (the runtime then lowers it to transfers);
stand-in stages carry the only things the constructors read (stage count, group size and rank), so
these tests need torch but no process group.
"""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from simgrid.errors import ScheduleError
from simgrid.ir import Action, actions_to_csv, cells_from_csv
from simgrid.schedules.pipeline import pipeline_order
from simgrid.schedules.unit_time import simulate_unit_time

pytestmark = pytest.mark.torch
schedules = pytest.importorskip("torch.distributed.pipelining.schedules", reason="torch is not installed")

#: Our schedule name -> (torch class, chunks per rank to try).
TORCH_CLASSES = {
    "interleaved-1f1b": ("ScheduleInterleaved1F1B", (2, 3)),
    "zb-h1": ("ScheduleInterleavedZeroBubble", (1,)),
    "interleaved-zb": ("ScheduleInterleavedZeroBubble", (2, 3)),
    "looped-bfs": ("ScheduleLoopedBFS", (1, 2, 3)),
    "zbv": ("ScheduleZBVZeroBubble", (2,)),
    "dualpipev": ("ScheduleDualPipeV", (2,)),
}


def _torch_schedule(cls_name: str, pp: int, m: int, local: int) -> object:
    stages = [types.SimpleNamespace(num_stages=pp * local, group_size=pp, group_rank=0, submod=None, stage_index=i)
              for i in range(local)]
    return getattr(schedules, cls_name)(stages=stages, n_microbatches=m)


def _bare_order(cls_name: str, pp: int, m: int, local: int) -> list[list[str]]:
    """torch's order generator on a bare instance, skipping the constructor's checks: ZB-H1 is torch's
    interleaved zero-bubble class with one chunk, whose constructor still asks for equal interleaving
    rounds although one chunk has nothing to interleave."""
    obj = object.__new__(getattr(schedules, cls_name))
    obj.pp_group_size, obj.n_local_stages, obj._n_microbatches = pp, local, m
    obj.number_of_rounds = max(1, m // pp)
    obj.microbatches_per_round = m // obj.number_of_rounds
    return [[str(a) for a in obj._calculate_single_rank_operations(rank) if a is not None] for rank in range(pp)]


def _strs(order: dict[int, list[object]]) -> list[list[str]]:
    return [[str(a) for a in order[rank] if a is not None] for rank in sorted(order)]


@pytest.mark.parametrize("schedule", sorted(TORCH_CLASSES))
def test_orders_equal_torch_classes_action_for_action(schedule: str) -> None:
    """For pp 1-4, m 1-12 and every chunk count, our order is torch's (idle slots dropped), including the
    OVERLAP_F_B units of DualPipeV; where torch's constructor refuses (unequal interleaving rounds,
    DualPipeV with m < 2 pp) we refuse too, and every order we build runs in unit time without deadlock."""
    cls_name, chunk_counts = TORCH_CLASSES[schedule]
    compared = 0
    for pp in range(1, 5):
        for m in range(1, 13):
            for vpp in chunk_counts:
                try:
                    theirs: list[list[str]] | None = _strs(_torch_schedule(cls_name, pp, m, vpp).pipeline_order)  # type: ignore[attr-defined]
                except ValueError:
                    theirs = _bare_order(cls_name, pp, m, vpp) if schedule == "zb-h1" else None
                try:
                    order = pipeline_order(schedule, pp, m, vpp)
                except ScheduleError:
                    assert theirs is None, (schedule, pp, m, vpp)
                    continue
                assert theirs is not None, (schedule, pp, m, vpp)
                assert [[str(a) for a in row] for row in order] == theirs, (schedule, pp, m, vpp)
                simulate_unit_time(order)
                compared += 1
    assert compared >= 30


def test_interleaved_1f1b_with_m_not_a_multiple_of_pp_is_torchs_flexible_order() -> None:
    """pp 4 with m = 10 (two rounds of 5) and m = 3 (one round of 3): torch's orders, not refused."""
    for m in (10, 3, 6):
        theirs = _strs(_torch_schedule("ScheduleInterleaved1F1B", 4, m, 2).pipeline_order)  # type: ignore[attr-defined]
        assert [[str(a) for a in row] for row in pipeline_order("interleaved-1f1b", 4, m, 2)] == theirs


def test_dualpipev_steady_state_is_overlapped_forward_backward_units() -> None:
    """DualPipeV pairs a forward of one chunk with a full backward of the other in OVERLAP_F_B cells."""
    order = pipeline_order("dualpipev", 2, 6, 2)
    units = [a for a in order[0] if a.kind == "OVERLAP_F_B"]
    assert units and all(len(a.sub_actions) == 2 for a in units)
    assert all(a.sub_actions[0].kind == "F" and a.sub_actions[1].kind == "B" for a in units)
    assert {a.sub_actions[0].stage for a in units} == {0, 3}


@pytest.mark.parametrize(("pp", "m"), [(2, 3), (4, 6)])
def test_torch_single_stage_order_with_reduce_grad_runs_in_unit_time(pp: int, m: int) -> None:
    """ScheduleGPipe's own order ends each rank with REDUCE_GRAD: imported, it runs in unit time (no
    false deadlock) with our GPipe's makespan. (Schedule1F1B's ``_get_pipeline_order`` is not used: in
    torch 2.13 its last rank starts at micro-batch 1 and runs one that does not exist, a real deadlock.)"""
    obj = object.__new__(schedules.ScheduleGPipe)
    obj._num_stages, obj._n_microbatches = pp, m
    imported = [[Action.parse(str(a)) for a in row if a is not None] for row in obj._get_pipeline_order().values()]
    assert all(row[-1] == Action(r, "REDUCE_GRAD") for r, row in enumerate(imported))
    assert simulate_unit_time(imported).makespan == simulate_unit_time(pipeline_order("gpipe", pp, m)).makespan


@pytest.mark.parametrize(("cls_name", "pp", "m", "local"), [
    ("ScheduleInterleaved1F1B", 2, 4, 2), ("ScheduleDualPipeV", 2, 5, 2), ("ScheduleLoopedBFS", 3, 2, 2),
])
def test_torch_dumps_re_export_byte_for_byte(cls_name: str, pp: int, m: int, local: int, tmp_path: Path) -> None:
    """A CSV torch dumps (idle cells, OVERLAP_F_B cells, transfers, REDUCE_GRAD) reads with
    cells_from_csv and writes back identically with actions_to_csv, in both of torch's formats."""
    schedule = _torch_schedule(cls_name, pp, m, local)
    for fmt in ("compute_only", "compute_comms"):
        path = tmp_path / f"{fmt}.csv"
        schedule._dump_csv(str(path), format=fmt)  # type: ignore[attr-defined]
        text = path.read_bytes().decode()
        assert actions_to_csv(cells_from_csv(text)) == text
