"""Expert-parallel lowering: all-to-alls around MoE sub-blocks on each rank's own groups, dispatcher buffers,
expert gradient sync over the expert data-parallel group, and memory replay against the analytic model."""

from __future__ import annotations

import pytest
from schedule_helpers import replay_peaks

from simgrid.ir import validate_program
from simgrid.ir.dryrun import dry_run
from simgrid.ir.ops import Alloc, Collective, Compute, Free
from simgrid.layout import Layout
from simgrid.memory.states import stage_state_bytes
from simgrid.model import block_cost, get_model
from simgrid.model.moe import dispatcher_buffer_bytes
from simgrid.schedules import build_program

MOE = get_model("tiny-moe")  # 4 layers, layer 0 dense: MoE sub-blocks 4, 6, 8
MOE_BLOCKS = (4, 6, 8)

LAYOUTS = [
    Layout(dp=2, ep=2, global_batch_size=4),
    Layout(dp=4, ep=2, global_batch_size=4),
    Layout(dp=4, ep=2, etp=2, global_batch_size=4, zero=1),
    Layout(tp=2, dp=2, ep=2, sequence_parallel=True, global_batch_size=4),
    Layout(dp=2, pp=2, ep=2, global_batch_size=4, zero=1),
    Layout(dp=2, cp=2, ep=4, global_batch_size=4),
    Layout(dp=2, pp=2, vpp=2, ep=2, schedule="interleaved-1f1b", global_batch_size=4, recompute="full"),
]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_moe_programs_validate_and_run_dry(layout: Layout) -> None:
    """Every rank issues each group's collectives in the same order, and the dependency-only run finishes."""
    program = build_program(MOE, layout)
    validate_program(program)
    dry_run(program)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_all_to_all_runs_on_a_group_holding_the_rank(layout: Layout) -> None:
    """Each rank's dispatch/combine names its own ep group (instantiation renames the canonical one)."""
    program = build_program(MOE, layout)
    for rank, ops in enumerate(program.ranks):
        groups = {op.group for op in ops if isinstance(op, Collective) and op.purpose == "ep"}
        assert groups, rank
        assert all(rank in program.groups[g] for g in groups)


def test_dispatch_and_combine_wrap_only_moe_blocks() -> None:
    """ep 2: each MoE block's forward is dispatch all-to-all, WAIT, F, combine all-to-all, WAIT on the rank's
    ep group; the backward likewise; dense blocks have no ep collective."""
    program = build_program(MOE, Layout(dp=2, ep=2, global_batch_size=2))
    ops = program.ranks[0]
    labels = [op.label for op in ops if isinstance(op, Collective) and op.purpose == "ep"]
    assert sorted(set(labels)) == sorted(f"b{b}:{phase}" for b in MOE_BLOCKS for phase in ("fwd", "bwd"))
    assert all(labels.count(label) == 2 for label in labels)
    for i, op in enumerate(ops):
        if isinstance(op, Compute) and op.kind == "F" and op.block_start in MOE_BLOCKS:
            dispatch, combine = ops[i - 2], ops[i + 1]
            assert isinstance(dispatch, Collective) and isinstance(combine, Collective)
            assert (dispatch.kind, combine.kind) == ("all_to_all", "all_to_all")
            assert dispatch.group == combine.group == "ep/pp0-edp0-etp0"


def test_stage_granularity_folds_the_stage_all_to_alls() -> None:
    """One stage-wide forward stands for its 3 MoE blocks: count 3, bytes 3 times one block's."""
    lay = Layout(dp=2, ep=2, global_batch_size=2)
    program = build_program(MOE, lay, granularity="stage")
    one = block_cost(MOE, lay, 4).ep_comm[0].bytes
    a2a = [op for op in program.ranks[0] if isinstance(op, Collective) and op.kind == "all_to_all"]
    assert len(a2a) == 4  # forward dispatch and combine, backward two
    assert all(op.count == 3 and op.bytes == 3 * one for op in a2a)


def test_dispatcher_buffers_are_allocated_and_freed_around_each_moe_block() -> None:
    """An ALLOC of the dispatcher's buffers before each MoE block's first all-to-all and its FREE after the
    last; they are never live for two blocks at once."""
    lay = Layout(dp=2, ep=2, global_batch_size=2)
    ops = build_program(MOE, lay).ranks[0]
    allocs = [op for op in ops if isinstance(op, Alloc) and op.name.startswith("ep-dispatch")]
    frees = [op for op in ops if isinstance(op, Free) and op.name.startswith("ep-dispatch")]
    assert len(allocs) == len(frees) == 2 * 3  # forward and backward of three MoE blocks, one micro-batch
    assert allocs[0].bytes == dispatcher_buffer_bytes(MOE, lay) > 0
    assert replay_peaks(ops)["comm"] == dispatcher_buffer_bytes(MOE, lay)


def test_expert_grads_sync_over_the_expert_data_parallel_group() -> None:
    """dp 4, ep 2: edp 2. Dense buckets all-reduce over dp (4 ranks), expert buckets over edp (2 ranks), the
    expert buckets carrying exactly the rank's expert gradient bytes."""
    lay = Layout(dp=4, ep=2, global_batch_size=4)
    program = build_program(MOE, lay)
    ops = program.ranks[1]
    dense = [op for op in ops if isinstance(op, Collective) and op.purpose == "dp-grad" and "ebucket" not in op.label]
    experts = [op for op in ops if isinstance(op, Collective) and "ebucket" in op.label]
    assert dense and all(len(program.groups[op.group]) == 4 for op in dense)
    assert experts and all(op.group == "edp/pp0-ep1-etp0" for op in experts)
    assert program.groups["edp/pp0-ep1-etp0"] == (1, 3)
    expert_grad_bytes = 2 * sum(block_cost(MOE, lay, b).expert_param_count for b in MOE_BLOCKS)
    assert sum(op.bytes for op in experts) == expert_grad_bytes


def test_zero1_reduce_scatters_and_gathers_expert_shards() -> None:
    """ZeRO-1 over edp: expert buckets reduce-scatter in the backward and all-gather after the step."""
    lay = Layout(dp=4, ep=2, zero=1, global_batch_size=4)
    ops = build_program(MOE, lay).ranks[0]
    kinds = [op.kind for op in ops if isinstance(op, Collective) and "ebucket" in op.label]
    assert kinds.count("reduce_scatter") == kinds.count("all_gather") >= 1


@pytest.mark.parametrize("zero", [0, 1])
def test_model_state_peaks_equal_the_analytic_model(zero: int) -> None:
    """Replayed weights/grads/optimizer ALLOCs equal simgrid.memory's states (experts sharded over edp)."""
    lay = Layout(dp=4, ep=2, zero=zero, global_batch_size=4)
    expected = stage_state_bytes(MOE, lay, 0)
    for ops in build_program(MOE, lay).ranks:
        peaks = replay_peaks(ops)
        assert (peaks["weights"], peaks["grads"]) == (expected.weights_bytes, expected.grads_bytes)
        assert peaks["optimizer"] == expected.optimizer_bytes


def test_optimizer_updates_dense_and_expert_shards() -> None:
    """ZeRO-1, dp 4, ep 2: the OPT op updates dense parameters / 4 plus expert parameters / edp 2."""
    lay = Layout(dp=4, ep=2, zero=1, global_batch_size=4)
    costs = [block_cost(MOE, lay, b) for b in range(10)]
    experts = sum(c.expert_param_count for c in costs)
    dense = sum(c.param_count for c in costs) - experts
    opt = next(op for op in build_program(MOE, lay).ranks[0] if isinstance(op, Compute) and op.kind == "OPT")
    assert opt.flops == 14 * (-(-dense // 4) + -(-experts // 2))
