"""Memory ops: model-state and activation ALLOC/FREE replay against the analytic memory model."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from schedule_helpers import TINY, context, flat, replay_peaks, tiny_with_layers

from simgrid.ir.ops import Alloc, Compute, Free, Op
from simgrid.layout.spec import Layout
from simgrid.memory.activations import stage_activation_bytes
from simgrid.memory.states import stage_state_bytes
from simgrid.model import block_cost, block_params_on_rank
from simgrid.schedules import build_program
from simgrid.schedules.lower.activations import add_activation_memory
from simgrid.schedules.lower.compute import compute_steps


def _saved_only(ops: Sequence[Op]) -> list[Op]:
    """The rank's ops without the loss working set (its own test below), leaving the saved activations."""
    return [op for op in ops if not (isinstance(op, (Alloc, Free)) and op.name.startswith("loss:"))]


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_model_state_peaks_equal_the_analytic_model(zero: int, optimizer: str) -> None:
    """Replaying weights/grads/optimizer ALLOCs gives simgrid.memory's per-rank model states exactly."""
    layout = Layout(dp=4, tp=2, zero=zero, optimizer=optimizer, global_batch_size=8)  # type: ignore[arg-type]
    program = build_program(TINY, layout)
    expected = stage_state_bytes(TINY, layout, 0)
    for ops in program.ranks:
        peaks = replay_peaks(ops)
        assert peaks["weights"] == expected.weights_bytes
        assert peaks["grads"] == expected.grads_bytes
        assert peaks.get("optimizer", 0) == expected.optimizer_bytes


def test_model_states_by_hand_for_zero1_adam() -> None:
    """ZeRO paper (Rajbhandari et al. 2020, table 1 row P_os): 2 + 2 + 12/dp bytes per parameter."""
    layout = Layout(dp=4, zero=1, global_batch_size=4)
    params = sum(block_params_on_rank(TINY, layout, b) for b in range(10))
    peaks = replay_peaks(build_program(TINY, layout).ranks[0])
    assert (peaks["weights"], peaks["grads"]) == (2 * params, 2 * params)
    assert peaks["optimizer"] == pytest.approx(12 * params / 4, abs=10)


def test_offload_keeps_no_optimizer_states_on_the_gpu() -> None:
    """ZeRO-Offload: optimizer states live on the host, so no optimizer ALLOC on the device."""
    ops = build_program(TINY, Layout(dp=2, zero=1, offload_optimizer=True, global_batch_size=2)).ranks[0]
    assert not [op for op in ops if isinstance(op, Alloc) and op.category == "optimizer"]


@pytest.mark.parametrize("m", [1, 2, 3, 4, 6])
def test_1f1b_first_stage_holds_min_pp_m_microbatches(m: int) -> None:
    """1F1B (Narayanan et al. SC'21): the first stage keeps min(pp, m) micro-batches' activations."""
    model = tiny_with_layers(4)
    layout = Layout(pp=4, global_batch_size=m)
    ranks = build_program(model, layout).ranks
    for pp_rank in range(4):
        peak = replay_peaks(_saved_only(ranks[pp_rank]))["activations"]
        assert peak == min(4 - pp_rank, m) * stage_activation_bytes(model, layout, pp_rank)


def test_gpipe_holds_every_microbatch() -> None:
    """GPipe keeps all m micro-batches' activations until the backwards start."""
    layout = Layout(pp=2, global_batch_size=5, schedule="gpipe")
    per_mb = stage_activation_bytes(TINY, layout, 0)
    assert replay_peaks(build_program(TINY, layout).ranks[0])["activations"] == 5 * per_mb


def test_zb_h1_keeps_at_most_pp_microbatches_in_flight_like_1f1b_first_stage() -> None:
    """Qi et al. 2023: ZB-H1 keeps 1F1B's peak of pp micro-batches; with W freeing the activations, a
    rank that defers r W's holds pp - r + r = pp of them (rank 0 exactly as in 1F1B)."""
    for m in (1, 3, 6):
        layout = Layout(pp=4, global_batch_size=m, schedule="zb-h1")
        model = tiny_with_layers(4)
        ranks = build_program(model, layout).ranks
        for pp_rank in range(4):
            held = replay_peaks(_saved_only(ranks[pp_rank]))["activations"] / stage_activation_bytes(model, layout,
                                                                                                     pp_rank)
            assert held == min(4, m) if pp_rank < m else held <= min(4, m)


def test_every_allocation_is_freed_by_the_end_of_the_step() -> None:
    """No buffer outlives the step program (activations, comm buffers, model states)."""
    layout = Layout(dp=2, tp=2, pp=2, zero=1, recompute="full", global_batch_size=4)
    for ops in build_program(TINY, layout).ranks:
        live: set[str] = set()
        for op in ops:
            if isinstance(op, Alloc):
                live.add(op.name)
            elif isinstance(op, Free):
                live.remove(op.name)
        assert not live


def test_recompute_rebuilds_the_dropped_activations_transiently() -> None:
    """Full recompute stores less between forward and backward; the recomputed rest is freed at once."""
    full = build_program(TINY, Layout(recompute="full"))
    plain = build_program(TINY, Layout())
    kept_full = [op.bytes for op in full.ranks[0] if isinstance(op, Alloc) and op.name.startswith("act:")]
    kept_plain = [op.bytes for op in plain.ranks[0] if isinstance(op, Alloc) and op.name.startswith("act:")]
    assert sum(kept_full) < sum(kept_plain)
    rebuilt = [op.bytes for op in full.ranks[0] if isinstance(op, Alloc) and op.name.startswith("rec:")]
    assert sum(kept_full) + sum(rebuilt) == sum(kept_plain)


def test_activation_pass_allocates_after_forward_and_frees_after_the_releasing_backward() -> None:
    """The pass alone: ALLOC right after each F op with the block's activation bytes; FREE right after
    the matching B (or, with a split backward, after W, not I)."""
    for schedule, release in (("1f1b", "B"), ("zb-h1", "W")):
        ctx = context(pp=2, schedule=schedule, global_batch_size=2)
        ops = flat(add_activation_memory(ctx, compute_steps(ctx, 0)))
        for index, op in enumerate(ops):
            if isinstance(op, Compute) and op.kind == "F":
                alloc = ops[index + 1]
                assert isinstance(alloc, Alloc) and alloc.category == "activations"
                assert alloc.bytes == block_cost(TINY, ctx.layout, op.block_start).activation_bytes
            if isinstance(op, Compute) and op.kind in ("B", "I", "W"):
                freed = index + 1 < len(ops) and isinstance(ops[index + 1], Free)
                assert freed == (op.kind == release)


def _worst_total_peak(ranks: Sequence[tuple[Op, ...]], pp: int, world: int) -> int:
    # one representative per pipeline rank: its tp/dp replicas allocate the same
    per_pp = world // pp
    return max(replay_peaks(ranks[p * per_pp])["total"] for p in range(pp))


@pytest.mark.parametrize(
    ("model_name", "pp", "schedule", "mbs", "gbs"),
    [("megatron-18.4b", 1, "none", 8, 16), ("megatron-1.7b", 2, "1f1b", 4, 16)],
)
def test_stage_granularity_full_recompute_peak_matches_block_granularity_and_the_analytic_model(
    model_name: str, pp: int, schedule: str, mbs: int, gbs: int
) -> None:
    """A stage-granularity R op holds one layer's rebuilt activations, not the whole stage's: its replayed
    peak equals simgrid.memory's (states + in-flight activations + one layer's recompute working set,
    Korthikanti et al. 2022 section 5) and lies within one layer's working set above block granularity,
    whose R ops rebuild one sub-block at a time (megatron-18.4b mbs 8 used to report 121.7 GiB for 44.9)."""
    from simgrid.memory import estimate_memory, recompute_working_bytes
    from simgrid.model import get_model

    model = get_model(model_name)
    layout = Layout(tp=8 if pp == 1 else 2, pp=pp, micro_batch_size=mbs, global_batch_size=gbs,
                    schedule=schedule, recompute="full")  # type: ignore[arg-type]
    block = _worst_total_peak(build_program(model, layout, granularity="block").ranks, pp, layout.world_size)
    stage = _worst_total_peak(build_program(model, layout, granularity="stage").ranks, pp, layout.world_size)
    analytic = estimate_memory(model, layout)
    one_layer = recompute_working_bytes(model, layout)
    assert one_layer > 0
    assert stage == pytest.approx(analytic.model_states_bytes + analytic.activations_bytes, rel=0.01)
    assert block <= stage <= block + one_layer


def test_stage_recompute_allocates_the_largest_layers_rebuilt_activations() -> None:
    """At stage granularity each R op's ALLOC is one layer's (attention + MLP) activations with recompute
    off minus those kept, from block_cost directly; at block granularity it is the sub-block's own."""
    layout = Layout(pp=2, schedule="1f1b", global_batch_size=2, recompute="full")
    plain = Layout(pp=2, schedule="1f1b", global_batch_size=2)
    rebuilt = {b: block_cost(TINY, plain, b).activation_bytes - block_cost(TINY, layout, b).activation_bytes
               for b in range(2 * TINY.num_layers + 2)}
    layer = max(rebuilt[1 + 2 * i] + rebuilt[2 + 2 * i] for i in range(TINY.num_layers))
    stage_program = build_program(TINY, layout, granularity="stage")
    stage_allocs = {op.bytes for ops in stage_program.ranks for op in ops
                    if isinstance(op, Alloc) and op.name.startswith("rec:")}
    assert stage_allocs == {layer}
    block_program = build_program(TINY, layout, granularity="block")
    block_allocs = {op.bytes for ops in block_program.ranks for op in ops
                    if isinstance(op, Alloc) and op.name.startswith("rec:")}
    assert block_allocs == {rebuilt[b] for b in rebuilt if rebuilt[b] > 0}


@pytest.mark.parametrize("granularity", ["block", "stage"])
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_loss_working_set_is_allocated_on_the_head_rank_before_its_backward(granularity: str, recompute: str) -> None:
    """The cross entropy's transient logit tensors (simgrid.memory.loss_working_bytes) are live once per
    micro-batch on the rank holding the head, from before its backward (or its stage-wide recompute) until
    that op ends, while the micro-batch's saved activations still are; no other rank allocates them."""
    from simgrid.memory import loss_working_bytes

    model = tiny_with_layers(4)
    layout = Layout(pp=2, global_batch_size=3, cross_entropy="unfused", recompute=recompute)  # type: ignore[arg-type]
    ranks = build_program(model, layout, granularity=granularity).ranks  # type: ignore[arg-type]
    # 1 micro-batch x 32 tokens x 256 vocabulary x two fp32 tensors
    assert loss_working_bytes(model, layout) == 32 * 256 * 8
    assert not [op for op in ranks[0] if isinstance(op, Alloc) and op.name.startswith("loss:")]
    ops = ranks[1]
    allocs = [i for i, op in enumerate(ops) if isinstance(op, Alloc) and op.name.startswith("loss:")]
    assert len(allocs) == 3 and all(ops[i].bytes == 32 * 256 * 8 for i in allocs)  # type: ignore[attr-defined]
    for i in allocs:
        following = ops[i + 1]
        assert isinstance(following, Compute) and following.kind in ("B", "R")
        assert isinstance(ops[i + 2], Free) and ops[i + 2].name == ops[i].name  # type: ignore[attr-defined]
    if recompute == "none":  # the peak is the last micro-batch's loss backward, on top of what it saved
        peak = replay_peaks(ops)["activations"]
        assert peak == replay_peaks(_saved_only(ops))["activations"] + 32 * 256 * 8
