"""Compute slowed by the communication in flight beside it, by what runs that communication (issue 12).

Hand-built programs on :class:`UniformCost` (1 TFLOP/s, 1 GB/s rings): a 1 s compute op starts together with a
0.5 s communication op, so with slowdown ``s`` it does ``0.5 (1 - s)`` s of work while the op flies and ends at
``1.5 - 0.5 (1 - s)`` = ``1 + 0.5 s``. Both engines (SimPy interpreter and fast loop) must give those times.
"""

from __future__ import annotations

import pytest
from engine_helpers import UniformCost, allreduce, fwd, recv, send

from simgrid.engine import simulate_program
from simgrid.engine.overlap import (
    COLLECTIVE_WEIGHT,
    COPY_ENGINE_WEIGHT,
    P2P_WEIGHT,
    USERBUFFERS_WEIGHT,
    OverlapModel,
    slowdowns,
)
from simgrid.ir import Collective, Program, Transfer, Wait

TFLOP = 1e12
ENGINES = ("simpy", "fast")


def _ring_exchange(group: str, nbytes: int, handle: str) -> Collective:
    return Collective(kind="ring_exchange", group=group, bytes=nbytes, purpose="tp", handle=handle)


def _all_gather(group: str, nbytes: int, handle: str) -> Collective:
    return Collective(kind="all_gather", group=group, bytes=nbytes, purpose="tp", handle=handle)


def _compute_end(program: Program, cost: UniformCost, engine: str, rank: int = 0) -> float:
    res = simulate_program(program, cost_model=cost, mode="full", engine=engine)
    (row,) = [r for r in res.trace.timing_rows if r.rank == rank and r.kind == "F"]
    return row.end_s


@pytest.mark.parametrize("engine", ENGINES)
def test_copy_engine_steps_slow_compute_less_than_sm_collectives(engine: str) -> None:
    """The same 0.5 s exchange (1 GB over 2 ranks at 1 GB/s) beside a 1 s compute: as an SM-based all-gather
    (s = 0.5) the compute ends at 1.25 s; as a copy-engine ring exchange (s = 0.2) at 1.1 s; at s = 0 at 1.0 s."""
    cost = UniformCost(slowdown=0.5, copy_engine_slowdown=0.2)
    ends = {}
    for name, make in (("sm", _all_gather), ("ce", _ring_exchange)):
        ops = [make("g", 10**9, "x"), fwd(TFLOP), Wait(handle="x")]
        ends[name] = _compute_end(Program(groups={"g": (0, 1)}, ranks=[ops, ops]), cost, engine)
    assert ends["sm"] == pytest.approx(1.25, rel=1e-12)
    assert ends["ce"] == pytest.approx(1.1, rel=1e-12)
    ops = [_ring_exchange("g", 10**9, "x"), fwd(TFLOP), Wait(handle="x")]
    free = UniformCost(slowdown=0.5, copy_engine_slowdown=0.0)
    assert _compute_end(Program(groups={"g": (0, 1)}, ranks=[ops, ops]), free, engine) == 1.0


@pytest.mark.parametrize("engine", ENGINES)
def test_userbuffers_collective_uses_its_own_slowdown(engine: str) -> None:
    """The same 0.5 s all-gather run by a userbuffers kernel (s = 0.1) instead of NCCL (s = 0.5) slows the 1 s
    compute beside it to 1.05 s, not 1.25 s; with an NCCL collective or a copy-engine step in flight too, the
    rates multiply (and the userbuffers count does not read as a copy-engine step)."""
    cost = UniformCost(slowdown=0.5, userbuffers_slowdown=0.1)
    ub = Collective(kind="all_gather", group="g", bytes=10**9, purpose="tp", handle="x", kernel="userbuffers")
    ops = [ub, fwd(TFLOP), Wait(handle="x")]
    assert _compute_end(Program(groups={"g": (0, 1)}, ranks=[ops, ops]), cost, engine) == pytest.approx(1.05, rel=1e-12)
    model = OverlapModel(cost)
    assert model.weight(ub) == USERBUFFERS_WEIGHT
    assert model.rate(USERBUFFERS_WEIGHT + COLLECTIVE_WEIGHT) == pytest.approx(0.9 * 0.5, rel=1e-12)
    assert model.rate(USERBUFFERS_WEIGHT + COPY_ENGINE_WEIGHT) == pytest.approx(0.9 * 0.5, rel=1e-12)  # ce: s falls back


@pytest.mark.parametrize("engine", ENGINES)
def test_point_to_point_uses_its_own_slowdown(engine: str) -> None:
    """A 0.5 s send (0.5 GB at 1 GB/s) beside rank 0's 1 s compute slows it by p2p's s = 0.1 (ends at 1.05 s),
    not by the collectives' 0.5."""
    cost = UniformCost(slowdown=0.5, p2p_slowdown=0.1)
    program = Program(ranks=[[send(1, 10**9 // 2, "s"), fwd(TFLOP), Wait(handle="s")],
                             [recv(0, 10**9 // 2, "r"), Wait(handle="r")]])
    assert _compute_end(program, cost, engine) == pytest.approx(1.05, rel=1e-12)


@pytest.mark.parametrize("engine", ENGINES)
def test_concurrent_collectives_multiply_their_rates(engine: str) -> None:
    """Two 0.5 s all-reduces on different groups (each its own stream, its own SMs) beside a 1 s compute at
    s = 0.5 each: rate 0.25 for 0.5 s (0.125 s of work), then full rate: ends at 1.375 s."""
    ops = [allreduce("a", 10**9 // 2, "x"), allreduce("b", 10**9 // 2, "y"), fwd(TFLOP), Wait(handle="x"),
           Wait(handle="y")]
    program = Program(groups={"a": (0, 1), "b": (0, 1)}, ranks=[ops, ops])
    assert _compute_end(program, UniformCost(slowdown=0.5), engine) == pytest.approx(1.375, rel=1e-12)


@pytest.mark.parametrize("engine", ENGINES)
def test_no_slowdown_when_nothing_overlaps(engine: str) -> None:
    """A collective waited before the compute starts leaves it at its nominal 1 s (0.5 s to 1.5 s)."""
    ops = [allreduce("g", 10**9 // 2, "x"), Wait(handle="x"), fwd(TFLOP)]
    res = simulate_program(Program(groups={"g": (0, 1)}, ranks=[ops, ops]), cost_model=UniformCost(slowdown=0.5),
                           mode="full", engine=engine)
    (row,) = [r for r in res.trace.timing_rows if r.rank == 0 and r.kind == "F"]
    assert (row.start_s, row.end_s) == (0.5, 1.5)


def test_weights_sort_ops_by_what_runs_them() -> None:
    """Ring exchange -> copy engine, other collectives -> SM collective, send/receive -> p2p, host copy -> none."""
    weight = OverlapModel.weight
    assert weight(_ring_exchange("g", 1, "x")) == COPY_ENGINE_WEIGHT
    assert weight(_all_gather("g", 1, "x")) == weight(allreduce("g", 1, "x")) == COLLECTIVE_WEIGHT
    assert weight(send(1, 1, "s")) == weight(recv(0, 1, "r")) == P2P_WEIGHT
    assert weight(Transfer(direction="d2h", bytes=1, handle="t")) == 0


def test_rate_of_a_mix_multiplies_collectives_and_counts_p2p_and_copies_once() -> None:
    """Nothing in flight: rate 1; two collectives, one send and one ring step: 0.8^2 * 0.9 * 0.95; a send and
    a receive together (one NCCL group kernel) and two ring steps slow compute as one of each does."""
    model = OverlapModel(UniformCost(slowdown=0.2, p2p_slowdown=0.1, copy_engine_slowdown=0.05))
    assert model.rate(0) == 1.0
    mix = 2 * COLLECTIVE_WEIGHT + P2P_WEIGHT + COPY_ENGINE_WEIGHT
    assert model.rate(mix) == pytest.approx(0.8**2 * 0.9 * 0.95, rel=1e-12)
    assert model.rate(mix + P2P_WEIGHT + COPY_ENGINE_WEIGHT) == model.rate(mix)
    assert model.active and not OverlapModel(UniformCost()).active


def test_a_cost_model_before_issue_12_applies_its_one_slowdown_to_every_kind() -> None:
    """A model with only ``comm_compute_slowdown`` (e.g. the executor's) keeps its old meaning everywhere."""

    class Old:
        comm_compute_slowdown = 0.1

    assert slowdowns(Old()) == (0.1, 0.1, 0.1, 0.1)
    assert slowdowns(UniformCost(slowdown=0.3, copy_engine_slowdown=0.0)) == (0.3, 0.3, 0.0, 0.3)
