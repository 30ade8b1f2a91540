"""build_program on random hybrid layouts: validation, dry run, coverage, rank instantiation, speed."""

from __future__ import annotations

import time
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schedule_helpers import TINY, tiny_with_layers

from simgrid.ir.dryrun import cost_by_kind, dry_run
from simgrid.ir.ops import Collective, Compute, Recv, Send
from simgrid.ir.validate import validate_program
from simgrid.layout.mesh import Mesh
from simgrid.layout.spec import SCHEDULES, Layout
from simgrid.model import get_model
from simgrid.model.spec import ModelSpec
from simgrid.schedules import build_program


@st.composite
def hybrid_layouts(draw: st.DrawFn) -> tuple[ModelSpec, Layout, str]:
    """A small valid (model, layout, granularity) over every schedule and technique."""
    pp = draw(st.integers(1, 4))
    schedule = "none" if pp == 1 else draw(st.sampled_from([s for s in SCHEDULES if s != "none"]))
    vpp = {"interleaved-1f1b": draw(st.integers(2, 3)), "interleaved-zb": draw(st.integers(2, 3)),
           "looped-bfs": draw(st.integers(1, 2)), "zbv": 2, "dualpipev": 2}.get(schedule, 1)
    dp = draw(st.integers(1, 3))
    tp = draw(st.sampled_from([1, 2]))
    m = draw(st.integers(2 * pp if schedule == "dualpipev" else 1, 8))
    if schedule in ("interleaved-1f1b", "interleaved-zb"):
        m -= m % max(1, m // pp)  # equal interleaving rounds (m need not be a multiple of pp)
    zero = draw(st.integers(0, 3)) if pp == 1 else draw(st.integers(0, 1))
    dp_mode = "parameter-server" if zero == 0 and draw(st.booleans()) else "allreduce"
    layout = Layout(
        dp=dp, tp=tp, pp=pp, vpp=vpp, schedule=schedule, zero=zero, dp_mode=dp_mode,  # type: ignore[arg-type]
        global_batch_size=m * dp,
        recompute=draw(st.sampled_from(["none", "selective", "full"])),
        sequence_parallel=tp > 1 and draw(st.booleans()),
        offload_optimizer=draw(st.booleans()),
        bucket_size_MB=draw(st.sampled_from([0.01, 25.0])),
        zero3_prefetch_depth=draw(st.integers(1, 2)),
    )
    model = TINY if 4 % (pp * vpp) == 0 else tiny_with_layers(pp * vpp)
    return model, layout, draw(st.sampled_from(["block", "stage"]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hybrid_layouts())
def test_random_layouts_validate_dry_run_and_cover_every_microbatch(case: tuple[ModelSpec, Layout, str]) -> None:
    """Every program passes validation (send/recv pairing and order, collective sequences, handles,
    memory), the rendezvous dry run finishes under two cost assignments, and every rank runs F and B
    (or I and W) exactly once per micro-batch on every block of every stage it holds."""
    model, layout, granularity = case
    program = build_program(model, layout, granularity=granularity)  # type: ignore[arg-type]
    validate_program(program)
    dry_run(program)
    dry_run(program, cost_by_kind({"F": 1, "B": 2, "I": 1, "W": 1, "R": 1, "OPT": 3}))
    mesh = Mesh(layout)
    for rank, ops in enumerate(program.ranks):
        covered = Counter()
        for op in ops:
            if isinstance(op, Compute) and op.kind in ("F", "B", "I", "W"):
                for block in range(op.block_start, op.block_end):
                    covered[(op.kind, op.microbatch, block)] += 1
        pp_rank = mesh.coords(rank).pp
        blocks = {b for (_, _, b) in covered}
        assert set(covered.values()) == {1}
        for mb in range(layout.num_microbatches):  # DualPipeV mixes B and I + W over micro-batches
            for block in blocks:
                split = ("I", mb, block) in covered
                kinds = ("F", "I", "W") if split else ("F", "B")
                assert all((kind, mb, block) in covered for kind in kinds)
                assert not split or ("B", mb, block) not in covered
        assert pp_rank == 0 or 0 not in blocks


def test_stage_and_block_granularity_carry_the_same_work() -> None:
    """Folding a stage into one op keeps its FLOPs, and its TP collectives' count and bytes."""
    layout = Layout(tp=2, pp=2, dp=2, recompute="full", sequence_parallel=True, global_batch_size=4)
    block = build_program(TINY, layout, granularity="block")
    stage = build_program(TINY, layout, granularity="stage")
    for rank in range(layout.world_size):
        def totals(ops: tuple) -> tuple[float, int, int]:
            flops = sum(op.flops for op in ops if isinstance(op, Compute))
            colls = [op for op in ops if isinstance(op, Collective) and op.purpose == "tp"]
            return round(flops), sum(op.count for op in colls), sum(op.bytes for op in colls)
        assert totals(block.ranks[rank]) == totals(stage.ranks[rank])


def test_ranks_of_a_pipeline_rank_share_ops_and_differ_only_in_groups_and_peers() -> None:
    """dp/tp replicas issue the same op sequence; collectives name their own groups, p2p their own peers,
    and rank-independent ops are the very same objects (shared, not copied)."""
    layout = Layout(dp=2, tp=2, pp=2, global_batch_size=4)
    program = build_program(TINY, layout)
    mesh = Mesh(layout)
    base = program.ranks[mesh.rank(pp=1, dp=0, tp=0)]
    other_rank = mesh.rank(pp=1, dp=1, tp=1)
    other = program.ranks[other_rank]
    assert len(base) == len(other)
    for a, b in zip(base, other, strict=True):
        if isinstance(a, Collective):
            assert other_rank in program.groups[b.group]
            assert (a.kind, a.bytes, a.purpose, a.handle) == (b.kind, b.bytes, b.purpose, b.handle)
        elif isinstance(a, (Send, Recv)):
            assert mesh.coords(b.peer).dp == 1 and mesh.coords(b.peer).tp == 1
            assert a.key == b.key
        elif isinstance(a, Compute) and a.kind != "OPT":
            assert a is b


@pytest.mark.slow
def test_gpt3_175b_on_1024_gpus_builds_quickly_at_stage_granularity() -> None:
    """tp 8, pp 8, dp 16, 96 micro-batches: the stage-granular program builds in a few seconds even on a
    busy 2-core CI machine (about a second when idle), and validates."""
    model = get_model("gpt3-175b")
    layout = Layout(tp=8, pp=8, dp=16, global_batch_size=96 * 16)
    start = time.perf_counter()
    program = build_program(model, layout, granularity="stage")
    elapsed = time.perf_counter() - start
    assert program.world_size == 1024
    assert elapsed < 8.0, f"build took {elapsed:.1f} s"


def test_parameter_server_roots_follow_each_data_parallel_group() -> None:
    """The REDUCE/BROADCAST root of every rank is the first rank of its own data-parallel group."""
    layout = Layout(dp=2, tp=2, pp=2, dp_mode="parameter-server", global_batch_size=4)
    program = build_program(TINY, layout)
    mesh = Mesh(layout)
    for rank, ops in enumerate(program.ranks):
        roots = {op.root for op in ops if isinstance(op, Collective) and op.root is not None}
        assert roots == {mesh.dp_group(rank)[0]}


@pytest.mark.parametrize(("tp", "dp", "pp"), [(1, 1, 2), (2, 3, 4), (8, 16, 8), (4, 1, 3), (2, 2, 1)])
def test_mesh_groups_equal_the_meshs_own_groups(tp: int, dp: int, pp: int) -> None:
    """The arithmetic group table equals Mesh.groups() (names, members, member order and name order)."""
    from simgrid.schedules.build import mesh_groups

    layout = Layout(tp=tp, dp=dp, pp=pp, global_batch_size=2 * dp * pp, schedule="1f1b" if pp > 1 else "none")
    expected = Mesh(layout).groups()
    found = mesh_groups(layout)
    assert found == expected and list(found) == list(expected)


def test_a_built_program_makes_ranks_on_demand_and_equals_its_eager_copy() -> None:
    """build_program derives replica ranks lazily: nothing beyond what is read is made, and the program
    equals (and hashes like) one constructed from every rank's op tuple."""
    from simgrid.ir.program import LazyRanks, Program

    layout = Layout(dp=2, tp=2, pp=2, global_batch_size=4, recompute="full")
    program = build_program(TINY, layout)
    assert isinstance(program.ranks, LazyRanks) and program.ranks.made == 0
    assert program.num_ops == sum(len(program.ranks[r]) for r in (0, 4)) * 4  # replicas have equal lengths
    assert program.ranks.made == 2
    eager = Program(model=program.model, layout=program.layout, groups=program.groups,
                    ranks=[tuple(ops) for ops in program.ranks], meta=program.meta)
    assert program.ranks.made == layout.world_size
    assert eager == program and hash(eager) == hash(program)
