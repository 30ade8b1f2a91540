"""The executor's measured cost model: table lookups, host-work folding, and a whole simulated step."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from executor.calibrate import ComputeFit, build_profile, table_rows
from executor.costmodel import (
    HOST_UNIT_S,
    LOOP_KEY,
    MeasuredCostModel,
    compute_key,
    fold_host_work,
    host_keys,
)
from simgrid.errors import SimulationError
from simgrid.hardware import ClusterSpec
from simgrid.ir.ops import Alloc, Collective, Compute, Free, Op, Wait
from simgrid.layout.spec import Layout
from simgrid.model.presets import get_model
from simgrid.schedules import build_program

COMM = {"collectives": [("all_reduce", 256, 100e-6), ("all_reduce", 65792, 300e-6)],
        "p2p": [(256, 50e-6), (1280, 70e-6)], "memory_Bps": 4e9}
FIT = ComputeFit(peak_flops=1e9, bandwidth_Bps=2e9, overhead_s=10e-6, samples=1, mean_abs_error=0.0)


def _op(flops: float = 1000.0, kernels: int = 3) -> Compute:
    return Compute(kind="F", stage=0, microbatch=0, chunk=0, block_start=1, block_end=2, flops=flops,
                   hbm_bytes=4000.0, kernels=kernels)


def _kernels(op: Op) -> int:
    return op.kernels if isinstance(op, Compute) else 0


def _spec(rows: list[tuple[str, float]], slowdown: float = 0.25) -> ClusterSpec:
    return build_profile(name="hand", world_size=2, comm=COMM, fit=FIT, compute_rows=rows, slowdown=slowdown)


def test_compute_uses_the_measured_row_of_its_signature() -> None:
    """A measured op costs its row (1.5 ms) whatever its stage or micro-batch; speed divides it."""
    op = _op()
    model = MeasuredCostModel(_spec([(compute_key(op), 1.5e-3)]), {compute_key(op): 3})
    assert model.compute_s(op, 1.0) == pytest.approx(1.5e-3)
    assert model.compute_s(op, 0.5) == pytest.approx(3.0e-3)
    assert model.comm_compute_slowdown == pytest.approx(0.25)


def test_unmeasured_compute_falls_back_to_the_fitted_formula() -> None:
    """1000 FLOP at 1 GFLOP/s + 4000 B at 2 GB/s + 3 kernels x 10 us = 1 + 2 + 30 us."""
    model = MeasuredCostModel(_spec([]), {})
    assert model.compute_s(_op(), 1.0) == pytest.approx(33e-6)


def test_extra_kernels_beyond_the_base_are_host_work_in_microseconds() -> None:
    """Folded host work rides on ``kernels``: 250 extra units are 250 us on top of the measured row."""
    op = _op(kernels=3 + 250)
    model = MeasuredCostModel(_spec([(compute_key(op), 1e-3)]), {compute_key(op): 3})
    assert model.compute_s(op, 1.0) == pytest.approx(1e-3 + 250 * HOST_UNIT_S)
    # A host at half its calibrated speed (other load) takes twice as long for both parts.
    assert model.compute_s(op, 0.5) == pytest.approx(2 * (1e-3 + 250 * HOST_UNIT_S))


def test_collective_interpolates_in_bytes_and_counts_folded_calls() -> None:
    """Midway between 256 B (100 us) and 65792 B (300 us) is 200 us; count=2 of 512 B total is 2 x 100 us."""
    model = MeasuredCostModel(_spec([]), {})
    mid = Collective(kind="all_reduce", group="g", bytes=33024, purpose="dp-grad", handle="h")
    assert model.collective_s(mid, (0, 1)) == pytest.approx(200e-6)
    folded = Collective(kind="all_reduce", group="g", bytes=512, purpose="tp", handle="h", count=2)
    assert model.collective_s(folded, (0, 1)) == pytest.approx(2 * 100e-6)  # 256 B per call: the first row
    assert model.collective_s(mid, (0,)) == 0.0
    assert model.p2p_s(768, 0, 1) == pytest.approx(60e-6)


def test_unmeasured_collective_kind_names_the_fix() -> None:
    """A kind with no rows is a SimulationError telling the user to recalibrate."""
    model = MeasuredCostModel(_spec([]), {})
    gather = Collective(kind="all_gather", group="g", bytes=1024, purpose="zero-param", handle="h")
    with pytest.raises(SimulationError, match=r"measured no all_gather over 2 ranks.*calibrate"):
        model.collective_s(gather, (0, 1))


def test_flow_mode_is_refused() -> None:
    """Measured tables hold whole-call times, so link-level flow mode is refused with a clear message."""
    model = MeasuredCostModel(_spec([]), {})
    with pytest.raises(SimulationError, match="comm_model='fast' only"):
        model.route(0, 1)


def test_host_keys_go_from_specific_to_general() -> None:
    """A WAIT is keyed by the collective it completes; FREE by its buffer family."""
    coll = Collective(kind="all_gather", group="g", bytes=64, purpose="zero-param", handle="h")
    assert host_keys(Wait(handle="h"), coll) == ["HOST:wait:all_gather:zero-param:64",
                                                 "HOST:wait:all_gather:zero-param", "HOST:wait:all_gather"]
    assert host_keys(Free(name="act:s0:m0:b1-2")) == ["HOST:free:act", "HOST:free"]


def test_fold_places_issue_work_before_and_completion_work_after() -> None:
    """Issue (100 us) goes to the compute op before the collective, the WAIT (30 us) and FREE (7 us) to the
    one after; every op pays the 2 us loop, counted by hand below."""
    program = build_program(get_model("tiny-gpt"), Layout(dp=2, global_batch_size=2, precision="fp32"))
    table = {"HOST:issue:all_reduce": 100.0, "HOST:wait:all_reduce": 30.0, "HOST:free": 7.0, LOOP_KEY: 2.0}
    folded = fold_host_work(program, table)
    for before, after in zip(program.ranks, folded.ranks, strict=True):
        n_coll = sum(isinstance(op, Collective) for op in before)
        n_wait = sum(isinstance(op, Wait) for op in before)
        n_free = sum(isinstance(op, Free) for op in before)
        expected_us = 2 * len(before) + 100 * n_coll + 30 * n_wait + 7 * n_free
        extra = sum(_kernels(b) - _kernels(a) for a, b in zip(before, after, strict=True))
        assert extra == expected_us
        # Non-compute ops are untouched and the order is the same.
        assert [type(op) for op in before] == [type(op) for op in after]
        assert all(a == b for a, b in zip(before, after, strict=True) if not isinstance(b, Compute))
        # The compute op right before the first collective carries its issue work.
        first = next(i for i, op in enumerate(before) if isinstance(op, Collective))
        prev = max(i for i in range(first) if isinstance(before[i], Compute))
        assert _kernels(after[prev]) - _kernels(before[prev]) >= 100
    assert any(isinstance(op, Alloc) for op in program.ranks[0])


def test_simulated_step_is_the_sum_of_measured_ops_without_communication_overlap() -> None:
    """With every compute op at 200 us, no host work and no slowdown, a 2-rank DP step takes
    (compute ops per rank) x 200 us plus the exposed final all-reduce (at most its table time)."""
    from simgrid.engine.run import simulate_program

    program = build_program(get_model("tiny-gpt"), Layout(dp=2, global_batch_size=2, precision="fp32"))
    keys = {compute_key(op) for ops in program.ranks for op in ops if isinstance(op, Compute)}
    spec = _spec([(k, 200e-6) for k in keys], slowdown=0.0)
    cost, simulated = MeasuredCostModel.for_program(spec, program)
    result = simulate_program(simulated, None, mode="full", cost_model=cost)
    n_compute = sum(isinstance(op, Compute) for op in program.ranks[0])
    buckets = [op for op in program.ranks[0] if isinstance(op, Collective)]
    comm_s = sum(cost.collective_s(op, (0, 1)) for op in buckets)
    assert n_compute * 200e-6 <= result.makespan_s <= n_compute * 200e-6 + comm_s + 1e-9


def test_rows_average_after_trimming_the_extremes() -> None:
    """Ten samples 1..10 ms: the 10% trim drops 1 and 10, the mean of 2..9 is 5.5 ms."""
    from executor.costmodel import mean_rows

    assert mean_rows([("k", i * 1e-3) for i in range(1, 11)]) == pytest.approx({"k": 5500.0})


def test_table_rows_prefer_samples_without_communication_in_flight() -> None:
    """Quiet samples win over busy ones and are averaged ((1 + 2 + 6) / 3 = 3 ms, where the median would be
    2 ms); a key with busy samples only keeps them."""
    samples = [("F:x", 1e-3, False), ("F:x", 2e-3, False), ("F:x", 6e-3, False), ("F:x", 9e-3, True),
               ("B:y", 5e-3, True)]
    assert dict(table_rows(samples)) == pytest.approx({"F:x": 3e-3, "B:y": 5e-3})
