"""IR tools on programs from the schedule generators: validate, dry-run, JSON, and torch's CSV loader.

The generators (simgrid.schedules) are tested by their owner; here they are a source of realistic
programs, and the expected pipeline orders come from the generator's compute-only ``pipeline_order``
(which the program's ops must follow) and from torch's own CSV loader and validator.
"""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from simgrid.ir import (
    Program,
    action_cost,
    comm_actions,
    compute_actions,
    cost_by_kind,
    dry_run,
    program_from_json,
    program_to_json,
    to_torch_csv,
    validate_program,
)
from simgrid.layout.spec import Layout
from simgrid.model.spec import ModelSpec

schedules = pytest.importorskip("simgrid.schedules", reason="simgrid.schedules (teammate's module) is missing")

MODEL = ModelSpec(name="tiny8", num_layers=8, hidden_size=64, num_heads=4, vocab_size=128, seq_length=16)
CASES = [
    # schedule, pp, vpp, micro-batches, dp, tp
    ("gpipe", 4, 1, 6, 1, 1),
    ("1f1b", 4, 1, 8, 2, 2),
    ("interleaved-1f1b", 2, 2, 4, 1, 1),
    ("zb-h1", 4, 1, 8, 1, 2),
    ("zbv", 2, 2, 4, 1, 1),
]
IDS = [case[0] for case in CASES]


def _layout(schedule: str, pp: int, vpp: int, m: int, dp: int, tp: int) -> Layout:
    return Layout(pp=pp, vpp=vpp, dp=dp, tp=tp, schedule=schedule, global_batch_size=m * dp)  # type: ignore[arg-type]


@pytest.fixture(scope="module", params=CASES, ids=IDS)
def generated(request: pytest.FixtureRequest) -> tuple[tuple[str, int, int, int, int, int], Program]:
    """A full program (TP collectives, pipeline transfers, DP sync, memory) from build_program."""
    case = request.param
    return case, schedules.build_program(MODEL, _layout(*case))


def test_generated_program_validates_and_dry_runs(generated: tuple[tuple[object, ...], Program]) -> None:
    """Generated programs pass validation and finish a dry run on every rank."""
    _, program = generated
    validate_program(program)
    result = dry_run(program, cost_by_kind({"F": 1, "B": 2, "I": 1, "W": 1, "R": 1}))
    assert result.makespan > 0
    assert all(len(ends) == len(ops) for ends, ops in zip(result.ends, program.ranks, strict=True))
    assert all(e >= 0 for ends in result.ends for e in ends)


def test_generated_program_json_round_trip(generated: tuple[tuple[object, ...], Program]) -> None:
    """A full generated program survives JSON exactly."""
    _, program = generated
    assert program_from_json(program_to_json(program)) == program


def test_compute_actions_follow_the_generators_pipeline_order(generated: tuple[tuple[object, ...], Program]) -> None:
    """Collapsing the program's layer ops gives back the compute-only order it was lowered from."""
    (schedule, pp, vpp, m, _, _), program = generated
    order = schedules.pipeline_order(schedule, pp, m, vpp)
    assert [[str(a) for a in row] for row in compute_actions(program)] == [[str(a) for a in row] for row in order]


@pytest.mark.torch
def test_torch_loads_generated_compute_only_csv(
    generated: tuple[tuple[str, int, int, int, int, int], Program], tmp_path: Path
) -> None:
    """torch's _load_csv (with its schedule validator) accepts the exported order and reads the same actions."""
    torch_schedules = pytest.importorskip("torch.distributed.pipelining.schedules", reason="torch is not installed")
    (_, pp, vpp, m, _, _), program = generated
    path = tmp_path / "order.csv"
    path.write_text(to_torch_csv(program), newline="")
    stage = types.SimpleNamespace(num_stages=pp * vpp, group_size=pp, group_rank=0)
    loaded = torch_schedules._PipelineScheduleRuntime(stages=[stage], n_microbatches=m)
    loaded._load_csv(str(path), format="compute_only")
    got = [[str(a) for a in loaded.pipeline_order[r] if a is not None] for r in range(pp)]
    assert got == [[str(a) for a in row] for row in compute_actions(program)]


@pytest.mark.torch
def test_torch_loads_generated_compute_comms_csv(
    generated: tuple[tuple[str, int, int, int, int, int], Program], tmp_path: Path
) -> None:
    """The order with our SEND/RECV placement loads in torch's runtime format (compute_comms) unchanged."""
    torch_schedules = pytest.importorskip("torch.distributed.pipelining.schedules", reason="torch is not installed")
    (_, pp, vpp, m, _, _), program = generated
    path = tmp_path / "order-comms.csv"
    path.write_text(to_torch_csv(program, "compute_comms"), newline="")
    stage = types.SimpleNamespace(num_stages=pp * vpp, group_size=pp, group_rank=0)
    loaded = torch_schedules._PipelineScheduleRuntime(stages=[stage], n_microbatches=m)
    loaded._load_csv(str(path), format="compute_comms")
    got = [[str(a) for a in loaded.pipeline_order_with_comms[r]] for r in range(pp)]
    assert got == [[str(a) for a in row] for row in comm_actions(program)]
    assert any("SEND_F" in a for a in got[0])


@pytest.mark.parametrize(
    ("schedule", "pp", "vpp", "m", "dp", "tp"),
    [("gpipe", 4, 1, 8, 1, 1), ("1f1b", 4, 1, 8, 2, 2), ("1f1b", 2, 1, 3, 1, 1), ("interleaved-1f1b", 4, 2, 8, 1, 1)],
)
@pytest.mark.parametrize("backward_units", [1, 2])
def test_unit_time_bubble_of_generated_programs_is_textbook(
    schedule: str, pp: int, vpp: int, m: int, dp: int, tp: int, backward_units: int
) -> None:
    """With F = 1 and B = 1 or 2 per action (communication free), the idle share is (p-1)/(v*m+p-1):
    GPipe and 1F1B (Narayanan et al. SC'21, section 2.2.1) and interleaved 1F1B with v chunks (2.2.2)."""
    program = schedules.build_program(MODEL, _layout(schedule, pp, vpp, m, dp, tp))
    result = dry_run(program, action_cost(program, {"F": 1, "B": backward_units}))
    assert result.bubble_fraction == pytest.approx((pp - 1) / (vpp * m + pp - 1), rel=1e-9)
    assert result.makespan == pytest.approx((1 + backward_units) * (vpp * m + pp - 1), rel=1e-9)


def test_unit_time_bubble_of_generated_zb_h1_is_textbook() -> None:
    """ZB-H1 (Qi et al. 2023, section 3): each rank idles (p-1)(T_F + T_B - T_W) with their B = our I;
    with F = I = W = 1 that is p-1 per rank against m*3 busy."""
    pp, m = 4, 8
    program = schedules.build_program(MODEL, _layout("zb-h1", pp, 1, m, 1, 1))
    result = dry_run(program, action_cost(program, {"F": 1, "I": 1, "W": 1}))
    assert result.makespan == pytest.approx(3 * m + (pp - 1), rel=1e-9)
    assert result.bubble_fraction == pytest.approx((pp - 1) / (3 * m + pp - 1), rel=1e-9)
