"""The fast engine's deferred trace and memory timelines against the SimPy interpreter's eager ones.

The fast loop keeps a tape of each row's values and the reductions the metrics read
(:class:`simgrid.trace.TraceAggregates`); rows and memory timelines are made only when read
(:mod:`simgrid.engine.fast.tape`). Over a set of generated layouts (every schedule, ZeRO stages, offload,
context and expert parallelism, stragglers, symmetric and full mode) these tests check that, before
anything is materialised, the row count, ranks, step time, aggregates, metrics and memory peaks equal
those of the SimPy interpreter's eager trace exactly, and that the rows and memory events made on demand
equal its rows and events, row for row and bit for bit.
"""

from __future__ import annotations

import copy as copy_module
import pickle
import random
from typing import Any

import pytest
from test_fast_equivalence import _cluster, _random_case

from simgrid import simulate
from simgrid.engine import simulate_program
from simgrid.engine.memory import LazyTimelines
from simgrid.errors import SimulationError
from simgrid.hardware import load_cluster
from simgrid.ir import P2PKey, Program, Recv, Send, Wait
from simgrid.layout import Layout
from simgrid.metrics import compute_metrics
from simgrid.model import get_model
from simgrid.schedules import build_program
from simgrid.trace import Trace, TraceRow, aggregate_rows

CASES = 80


def _cases() -> list[tuple[Any, ...]]:
    rng = random.Random(20261125)
    return [_random_case(rng) for _ in range(CASES)]


def _metrics(trace: Trace, model: Any, layout: Layout, cluster: Any, memory: Any) -> Any:
    return compute_metrics(trace, model=model, layout=layout, peak_flops_per_gpu=cluster.gpu.peak_flops(layout.precision),
                           peak_memory_bytes=memory.peak_bytes, memory_capacity_bytes=memory.capacity_bytes)


@pytest.mark.slow
def test_deferred_trace_equals_the_eager_trace_on_generated_layouts() -> None:
    """Unread: same length, ranks, step time, aggregates, metrics and memory peaks; read: the same rows and
    memory events as the SimPy interpreter's eager trace."""
    seen: set[str] = set()
    for model, cluster_name, layout, granularity, mode, speeds in _cases():
        program = build_program(model, layout, granularity=granularity)  # type: ignore[arg-type]
        cluster = _cluster(cluster_name, layout.world_size)
        eager = simulate_program(program, cluster, mode=mode, speed_factors=speeds, engine="simpy")
        lazy = simulate_program(program, cluster, mode=mode, speed_factors=speeds, engine="fast")
        what = f"{model.name} on {cluster_name}: {layout} ({granularity}, {mode}, speeds {speeds})"
        trace = lazy.trace
        assert not trace.materialised, what
        assert (len(trace), trace.ranks(), trace.makespan_s) == \
            (len(eager.trace), eager.trace.ranks(), eager.trace.makespan_s), what
        assert trace.aggregates() == eager.trace.aggregates(), what
        assert _metrics(trace, model, layout, cluster, lazy.memory) == \
            _metrics(eager.trace, model, layout, cluster, eager.memory), what
        assert isinstance(lazy.memory.timelines, LazyTimelines), what
        assert (lazy.memory.peak_by_rank(), lazy.memory.peak_rank, lazy.memory.fits) == \
            (eager.memory.peak_by_rank(), eager.memory.peak_rank, eager.memory.fits), what
        assert not trace.materialised, what  # nothing above read a row
        # Now read everything: rows (with and without op text) and every rank's memory timeline.
        assert trace.timing_rows == eager.trace.timing_rows, what
        assert trace.rows == eager.trace.rows, what
        assert dict(lazy.memory.timelines) == dict(eager.memory.timelines), what
        # A materialised trace's metrics come from its rows: still the same numbers.
        assert aggregate_rows(trace.rows, trace.multiplicity) == eager.trace.aggregates(), what
        seen |= {mode, layout.schedule or "none", f"zero{layout.zero}"}
        seen |= {name for name, on in (("offload", layout.offload_optimizer), ("cp", layout.cp > 1),
                                       ("ep", layout.ep > 1), ("straggler", bool(speeds))) if on}
    assert {"full", "symmetric", "zero0", "zero3", "offload", "cp", "ep", "straggler"} <= seen, seen


def test_simulate_keeps_the_trace_deferred_and_its_metrics_exact() -> None:
    """``simulate`` answers metrics and the saved memory timeline without making a row; they equal what the
    SimPy interpreter's eager trace gives."""
    model, layout = get_model("tiny-gpt"), Layout(dp=2, tp=2, pp=2, global_batch_size=8, schedule="1f1b")
    cluster = load_cluster("dgx-a100-hdr", gpus=layout.world_size)
    result = simulate(model, cluster, layout, mode="full")
    assert not result.trace.materialised
    eager = simulate_program(result.program, cluster, mode="full", engine="simpy")
    assert result.metrics == _metrics(eager.trace, model, layout, cluster, eager.memory)
    saved = result.trace.meta["memory_timeline"]
    assert saved == {str(r): {"times_s": list(eager.memory.timelines[r].times_s),
                              "total_bytes": list(eager.memory.timelines[r].total_bytes)} for r in (0, 4)}
    assert repr(result.trace) == f"Trace({len(eager.trace)} rows, ranks={eager.trace.ranks()})"
    assert not result.trace.materialised
    assert result.trace.rows == eager.trace.rows


def test_deferred_trace_pickles_its_rows_and_follows_changed_multiplicities() -> None:
    """Pickling a deferred trace writes its rows; changing ``meta['multiplicity']`` before reading makes the
    metrics reductions come from the rows under the new weights, as for an eager trace."""
    model, layout = get_model("tiny-gpt"), Layout(dp=2, pp=2, global_batch_size=8, schedule="gpipe")
    cluster = load_cluster("dgx-a100-hdr", gpus=layout.world_size)
    program = build_program(model, layout)
    eager = simulate_program(program, cluster, mode="full", engine="simpy").trace
    lazy = simulate_program(program, cluster, mode="full", engine="fast")
    copy = pickle.loads(pickle.dumps(lazy.trace))
    assert copy.materialised and copy.rows == eager.rows and copy.meta == eager.meta
    timelines = pickle.loads(pickle.dumps(lazy.memory.timelines))
    eager_timelines = dict(simulate_program(program, cluster, mode="full", engine="simpy").memory.timelines)
    assert dict(timelines) == eager_timelines
    assert isinstance(timelines, LazyTimelines) and timelines.peak_bytes_by_rank == {
        r: t.peak_bytes for r, t in eager_timelines.items()}
    assert dict(copy_module.deepcopy(lazy.memory.timelines)) == eager_timelines  # copy goes through __getstate__ too

    again = simulate_program(program, cluster, mode="full", engine="fast").trace
    weights = {"0": 3, "1": 1, "2": 1, "3": 2}
    again.meta["multiplicity"] = weights
    eager.meta["multiplicity"] = weights
    assert again.aggregates() == eager.aggregates() == aggregate_rows(eager.timing_rows, eager.multiplicity)
    assert again.aggregates().weights == {0: 3, 1: 1, 2: 1, 3: 2}


def test_a_deferred_trace_that_makes_the_wrong_number_of_rows_is_an_error() -> None:
    """The count announced for a deferred trace is checked when its rows are made."""
    row = TraceRow(0, "compute", "F", "F", "compute", 0.0, 1.0)
    trace = Trace.deferred(lambda: [row], length=2, aggregates=aggregate_rows([row, row], lambda r: 1))
    assert len(trace) == 2
    with pytest.raises(Exception, match="deferred rows number 1, not the 2 announced"):
        trace.rows  # noqa: B018


def _p2p_program(second_wait: str) -> Program:
    key = P2PKey(src_stage=0, dst_stage=1, microbatch=0, direction="F")
    return Program(groups={"world": (0, 1)}, ranks=(
        (Send(peer=1, bytes=1 << 20, key=key, handle="s"), Wait(handle="s"), Wait(handle="s")),
        (Recv(peer=0, bytes=1 << 20, key=key, handle="r"), Wait(handle="r"), Wait(handle=second_wait)),
    ))


def test_waiting_twice_on_a_handle_and_on_an_unknown_one_behave_as_on_simpy() -> None:
    """The fast loop forgets a handle at the first WAIT on it (here one that blocks); a second WAIT still passes,
    and a WAIT on a handle no op issued is still the same one-line error."""
    cluster = _cluster("dgx-a100-hdr", 2)
    twice = _p2p_program("r")
    eager = simulate_program(twice, cluster, mode="full", engine="simpy")
    lazy = simulate_program(twice, cluster, mode="full", engine="fast")
    assert lazy.trace.rows == eager.trace.rows and lazy.makespan_s == eager.makespan_s
    messages = []
    for engine in ("simpy", "fast"):
        with pytest.raises(SimulationError, match="names no earlier") as info:
            simulate_program(_p2p_program("nothing"), cluster, mode="full", engine=engine)
        messages.append(str(info.value))
    assert messages[0] == messages[1]
