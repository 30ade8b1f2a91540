"""Symmetric mode: one representative per pipeline rank, agreeing with full mode where it applies."""

from __future__ import annotations

import dataclasses

import pytest
from engine_helpers import UniformCost, fwd

from simgrid.engine import DurationCache, simulate_program
from simgrid.engine.costmodel import ClusterCostModel
from simgrid.engine.symmetry import _asymmetry, plan_ranks
from simgrid.hardware import load_cluster
from simgrid.ir import Compute, Program
from simgrid.layout import Layout
from simgrid.metrics import bubble_fraction, executed_flops, exposed_comm_by_kind
from simgrid.model import get_model
from simgrid.schedules import build_program

LAYOUTS = [
    ("tiny-gpt", Layout(dp=2, tp=2, pp=2, global_batch_size=8)),
    ("tiny-gpt", Layout(dp=2, tp=2, pp=2, global_batch_size=8, schedule="gpipe", zero=1)),
    ("gpt2-small", Layout(dp=2, tp=2, pp=2, global_batch_size=8, recompute="full")),
    ("gpt2-small", Layout(dp=2, tp=2, pp=2, vpp=3, global_batch_size=8, schedule="interleaved-1f1b")),
    ("gpt2-small", Layout(dp=4, tp=2, global_batch_size=8, zero=2)),
]


@pytest.mark.parametrize(("model_name", "layout"), LAYOUTS)
def test_symmetric_and_full_modes_agree(model_name: str, layout: Layout) -> None:
    """On one DGX node the layouts are symmetric: both modes give the same step time (1e-9), the same
    bubble, exposed communication and executed FLOPs (the symmetric trace scaled by multiplicity)."""
    model = get_model(model_name)
    program = build_program(model, layout)
    cluster = load_cluster("dgx-a100-hdr", gpus=layout.world_size)
    sym = simulate_program(program, cluster, mode="symmetric")
    full = simulate_program(program, cluster, mode="full")
    assert sym.mode == "symmetric" and full.mode == "full"
    assert len(sym.simulated_ranks) == layout.pp < len(full.simulated_ranks) == layout.world_size
    assert sum(sym.multiplicity.values()) == layout.world_size
    assert sym.makespan_s == pytest.approx(full.makespan_s, rel=1e-9)
    assert bubble_fraction(sym.trace) == pytest.approx(bubble_fraction(full.trace), rel=1e-9, abs=1e-12)
    assert executed_flops(sym.trace) == pytest.approx(executed_flops(full.trace), rel=1e-9)
    sym_exposed, full_exposed = exposed_comm_by_kind(sym.trace), exposed_comm_by_kind(full.trace)
    for kind in ("tp", "pp", "dp"):
        assert sym_exposed[kind] == pytest.approx(full_exposed[kind], rel=1e-9, abs=1e-15)
    assert sym.memory.peak_bytes == full.memory.peak_bytes


def test_built_programs_pass_the_op_by_op_check_too() -> None:
    """The fast path trusts build_program's structural symmetry; the op-by-op comparison agrees."""
    model, layout = get_model("gpt2-small"), Layout(dp=2, tp=2, pp=2, global_batch_size=8, zero=1)
    program = build_program(model, layout)
    durations = DurationCache(ClusterCostModel(load_cluster("dgx-a100-hdr", gpus=8)), program.groups)
    rep_of = [(r // 4) * 4 for r in range(8)]  # rank(pp, dp=0, tp=0) = 4 * pp for dp = tp = 2
    assert _asymmetry(program, rep_of, durations, [0.0]) is None


def test_a_replica_with_different_work_falls_back_to_full_mode() -> None:
    """Change one compute op of one replica: the program is no longer symmetric, the engine says why
    and simulates every rank."""
    model, layout = get_model("tiny-gpt"), Layout(dp=2, tp=2, pp=2, global_batch_size=8)
    program = build_program(model, layout)
    ranks = [list(ops) for ops in program.ranks]
    index = next(i for i, op in enumerate(ranks[1]) if isinstance(op, Compute) and op.flops > 0)
    ranks[1][index] = dataclasses.replace(ranks[1][index], flops=ranks[1][index].flops * 3)  # type: ignore[type-var]
    changed = dataclasses.replace(program, ranks=tuple(tuple(r) for r in ranks), meta={})
    result = simulate_program(changed, load_cluster("dgx-a100-hdr", gpus=8))
    assert result.mode == "full"
    assert "not symmetric" in result.notes[0] and "rank 1" in result.notes[0]


@pytest.mark.parametrize(("kwargs", "reason"), [
    ({"comm_model": "flow"}, "fast comm model"),
    ({"speed_factors": {3: 0.8}}, "speed factors"),
])
def test_symmetric_mode_falls_back_with_a_note(kwargs: dict[str, object], reason: str) -> None:
    """Flow contention and stragglers need every rank: the engine runs full mode and says so."""
    layout = Layout(dp=2, tp=2, pp=2, global_batch_size=8)
    program = build_program(get_model("tiny-gpt"), layout)
    result = simulate_program(program, load_cluster("dgx-a100-hdr", gpus=8), **kwargs)  # type: ignore[arg-type]
    assert result.mode == "full"
    assert reason in result.notes[0]


def test_program_without_layout_runs_in_full_mode() -> None:
    """Hand-built programs have no mesh to find replicas in."""
    program = Program(ranks=[[fwd(1e12)], [fwd(1e12)]])
    plan = plan_ranks(program, mode="symmetric", comm_model="fast", has_speed_factors=False,
                      durations=DurationCache(UniformCost(), {}))
    assert plan.mode == "full" and plan.simulated == (0, 1)
    assert "no layout" in plan.notes[0]


def test_representatives_are_dp0_tp0_of_each_pipeline_rank() -> None:
    """dp 2, tp 2, pp 2: ranks 0 and 4 are simulated, each standing for four."""
    layout = Layout(dp=2, tp=2, pp=2, global_batch_size=8)
    result = simulate_program(build_program(get_model("tiny-gpt"), layout), load_cluster("dgx-a100-hdr", gpus=8))
    assert result.simulated_ranks == (0, 4)
    assert dict(result.multiplicity) == {0: 4, 4: 4}
    assert result.trace.ranks() == [0, 4]


def test_symmetric_mode_makes_only_the_representatives_op_lists() -> None:
    """A built program's replica op lists are derived on demand: a symmetric run reads the pp
    representatives only (the reason a 16,384-rank step builds in a fraction of a second)."""
    model, layout = get_model("tiny-gpt"), Layout(dp=4, tp=2, pp=2, global_batch_size=8)
    program = build_program(model, layout)
    result = simulate_program(program, load_cluster("dgx-a100-hdr", gpus=16), mode="symmetric")
    assert result.mode == "symmetric"
    assert program.ranks.made == layout.pp  # type: ignore[attr-defined]
