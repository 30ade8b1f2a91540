"""Every supported layout, run for real on gloo, reproduces the single-process reference step.

Process start-up costs seconds per world on a small machine, so all 2-rank layouts run one after another
in one spawned world and the 4-rank layouts in another (module-scoped fixtures), context-parallel ones
(Llama 3's all-gather CP, :mod:`executor.cp`; two steps each, also on a Llama-style model) included. Weight comparisons use
SGD, whose update is linear in the gradient: Adam's first step divides each gradient element by its own
magnitude, so an element whose exact gradient is zero (e.g. the key bias: softmax ignores a constant
added to every key) turns fp32 summation-order noise into a full ``lr``-sized step; one Adam case checks
the global relative error instead.
"""

from __future__ import annotations

import dataclasses
import re

import pytest

torch = pytest.importorskip("torch")

from executor.cp import REGATHER_NOTE  # noqa: E402
from executor.launch import ExecutionError, LaunchConfig  # noqa: E402
from executor.model import init_weights  # noqa: E402
from executor.reference import ReferenceResult, reference_training  # noqa: E402
from executor.runner import Job, RunResult, run_programs  # noqa: E402
from simgrid.ir.ops import Collective  # noqa: E402
from simgrid.layout.spec import Layout  # noqa: E402
from simgrid.model.presets import get_model  # noqa: E402
from simgrid.model.spec import ModelSpec  # noqa: E402
from simgrid.schedules import build_program  # noqa: E402
from tests.executor.reference_checks import (  # noqa: E402
    TOL,
    UPDATE_TOL,
    assert_each_weight_matches,
    assert_run_matches,
    global_relative_error,
    update_relative_error,
)

pytestmark = [pytest.mark.torch, pytest.mark.slow, pytest.mark.timeout(400)]

TINY = get_model("tiny-gpt")
SGD = {"optimizer": "sgd", "precision": "fp32", "micro_batch_size": 1}

TWO_RANK: dict[str, Layout] = {
    "dp2-bucketed-allreduce": Layout(dp=2, global_batch_size=4, **SGD),
    "dp2-parameter-server": Layout(dp=2, dp_mode="parameter-server", global_batch_size=4, **SGD),
    "tp2": Layout(tp=2, global_batch_size=2, **SGD),
    "tp2-sequence-parallel": Layout(tp=2, sequence_parallel=True, global_batch_size=2, **SGD),
    "tp2-sp-full-recompute": Layout(tp=2, sequence_parallel=True, recompute="full", global_batch_size=2, **SGD),
    # The fused attention core (scaled_dot_product_attention) on both sides; the reference uses it too.
    "tp2-flash-attention": Layout(tp=2, flash_attention=True, global_batch_size=2, **SGD),
    "pp2-gpipe": Layout(pp=2, schedule="gpipe", global_batch_size=4, **SGD),
    "pp2-1f1b": Layout(pp=2, schedule="1f1b", global_batch_size=4, **SGD),
    "pp2-interleaved-vpp2": Layout(pp=2, vpp=2, schedule="interleaved-1f1b", global_batch_size=4, **SGD),
    "pp2-zb-h1": Layout(pp=2, schedule="zb-h1", global_batch_size=4, **SGD),
    "zero1": Layout(dp=2, zero=1, global_batch_size=4, **SGD),
    "zero2": Layout(dp=2, zero=2, global_batch_size=4, **SGD),
    "zero3": Layout(dp=2, zero=3, global_batch_size=4, **SGD),
    "offload": Layout(dp=2, offload_optimizer=True, global_batch_size=4, **SGD),
    "adam-dp2": Layout(dp=2, global_batch_size=4, precision="fp32", micro_batch_size=1),
}
FOUR_RANK: dict[str, Layout] = {
    "dp2xpp2": Layout(dp=2, pp=2, global_batch_size=4, **SGD),
    "tp2xpp2": Layout(tp=2, pp=2, global_batch_size=4, **SGD),
    "tp2xdp2-zero1": Layout(tp=2, dp=2, zero=1, global_batch_size=4, **SGD),
    # Sequence-parallel partial gradients summed by the IR's sp-grads all-reduce out of ZeRO-2 shards.
    "tp2xdp2-sp-zero2": Layout(tp=2, dp=2, zero=2, sequence_parallel=True, global_batch_size=4, **SGD),
    # NeMo's apex DistributedFusedAdam: per-layer buckets reduce-scattered per chunk, offset by pipeline rank (the
    # executor gathers parameters after its one step, so overlap_param_gather stays off).
    "dp2xpp2-interleaved-apex": Layout(dp=2, pp=2, vpp=2, schedule="interleaved-1f1b", zero=1, zero_impl="apex",
                                       global_batch_size=4, **SGD),
}
LLAMA = ModelSpec(name="t-llama", num_layers=2, hidden_size=32, num_heads=4, num_kv_heads=2,
                  ffn_hidden_size=48, gated_mlp=True, vocab_size=64, seq_length=16, tied_embeddings=False,
                  norm="rmsnorm", position="rope", bias=False)
CP_STEPS = 2
"""Two steps: the second step's loss checks that every rank applied the same, complete update."""

TWO_RANK_CP: dict[str, tuple[ModelSpec, Layout]] = {
    "cp2": (TINY, Layout(cp=2, global_batch_size=2, **SGD)),
    "cp2-llama-flash-full-recompute": (LLAMA, Layout(cp=2, flash_attention=True, recompute="full",
                                                     global_batch_size=2, **SGD)),
    # ZeRO shards over the dp * cp data-parallel group (here the two context-parallel ranks).
    "cp2-zero1": (TINY, Layout(cp=2, zero=1, global_batch_size=2, **SGD)),
}
FOUR_RANK_CP: dict[str, tuple[ModelSpec, Layout]] = {
    # Learned positions of the rank's chunks under sequence parallelism's extra sequence split.
    "cp2xtp2-sequence-parallel": (TINY, Layout(cp=2, tp=2, sequence_parallel=True, global_batch_size=2, **SGD)),
    "cp2xtp2-llama": (LLAMA, Layout(cp=2, tp=2, global_batch_size=2, **SGD)),
    "cp2xpp2-1f1b": (TINY, Layout(cp=2, pp=2, schedule="1f1b", global_batch_size=2, **SGD)),
    "cp2xdp2-zero2": (LLAMA, Layout(cp=2, dp=2, zero=2, global_batch_size=2, **SGD)),
}


LOSS_STEPS = 20
LOSS_LAYOUT = Layout(dp=2, global_batch_size=8, precision="fp32", micro_batch_size=2)


def _run_world(layouts: dict[str, Layout], cp_cases: dict[str, tuple[ModelSpec, Layout]],
               extra: list[Job] = ()) -> dict[str, RunResult]:  # type: ignore[assignment]
    """One spawned world: one step of each layout, ``CP_STEPS`` of each context-parallel case, the extras."""
    world = next(iter(layouts.values())).world_size
    jobs = ([Job(program=build_program(TINY, lay)) for lay in layouts.values()]
            + [Job(program=build_program(spec, lay), steps=CP_STEPS) for spec, lay in cp_cases.values()]
            + list(extra))
    results = run_programs(jobs, config=LaunchConfig(world_size=world, run_timeout_s=360, comm_timeout_s=120))
    names = [*layouts, *cp_cases, *(f"extra{i}" for i in range(len(extra)))]
    return dict(zip(names, results, strict=True))


@pytest.fixture(scope="module")
def two_rank_results() -> dict[str, RunResult]:
    loss_job = Job(program=build_program(TINY, LOSS_LAYOUT), steps=LOSS_STEPS, collect_weights=False)
    return _run_world(TWO_RANK, TWO_RANK_CP, [loss_job])


@pytest.fixture(scope="module")
def four_rank_results() -> dict[str, RunResult]:
    return _run_world(FOUR_RANK, FOUR_RANK_CP)


def check_against_reference(name: str, layout: Layout, result: RunResult) -> None:
    ref: ReferenceResult = reference_training(TINY, layout)
    assert result.losses[0] == pytest.approx(ref.losses[0], rel=TOL), name
    assert set(result.weights) == set(ref.weights)
    assert global_relative_error(result.weights, ref.weights) <= TOL, name
    if layout.optimizer == "sgd":
        start = init_weights(TINY, 0)
        assert update_relative_error(result.weights, ref.weights, start) <= UPDATE_TOL, name
        assert_each_weight_matches(name, result.weights, ref.weights)


@pytest.mark.parametrize("name", list(TWO_RANK))
def test_two_rank_layout_matches_single_process_reference(name: str, two_rank_results: dict[str, RunResult]
                                                          ) -> None:
    """One step under each 2-rank layout: same loss and updated weights as the reference (rel <= 1e-5)."""
    check_against_reference(name, TWO_RANK[name], two_rank_results[name])


@pytest.mark.parametrize("name", list(FOUR_RANK))
def test_four_rank_hybrid_layout_matches_single_process_reference(
        name: str, four_rank_results: dict[str, RunResult]) -> None:
    """DP2xPP2, TP2xPP2 and TP2xDP2 with ZeRO-1 (and with SP + ZeRO-2, and apex's interleaved ZeRO-1 sync) on 4 ranks
    match the reference too."""
    check_against_reference(name, FOUR_RANK[name], four_rank_results[name])


def test_tiny_gpt_loss_falls_over_twenty_steps(two_rank_results: dict[str, RunResult]) -> None:
    """Real DP training of tiny-gpt lowers the loss (synthetic counting sequences are learnable)."""
    losses = two_rank_results["extra0"].losses
    assert len(losses) == LOSS_STEPS
    start, end = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    assert end < start - 0.25, losses
    ref = reference_training(TINY, LOSS_LAYOUT, steps=3)  # the distributed run tracks the reference
    assert losses[:3] == pytest.approx(ref.losses, rel=1e-5)


def test_trace_has_a_row_per_compute_op_on_every_rank(two_rank_results: dict[str, RunResult]) -> None:
    """The measured trace holds each rank's compute ops with non-negative durations and IR stream names."""
    result = two_rank_results["pp2-1f1b"]
    program = build_program(TINY, TWO_RANK["pp2-1f1b"])
    rows = result.trace.rows_of(1)
    computes = [r for r in rows if r.purpose == "compute"]
    expected = sum(1 for op in program.ranks[1] if type(op).__name__ == "Compute")
    assert len(computes) == expected
    assert all(r.end_s >= r.start_s >= 0 for r in rows)
    assert {r.stream for r in rows} >= {"compute", "p2p:0"}


def test_sequence_parallel_grads_are_summed_by_the_programs_own_all_reduce(
        two_rank_results: dict[str, RunResult]) -> None:
    """Under SP the norm/bias gradients are all-reduced over the TP group by the program's s0:sp-grads op
    (a trace row with the IR's text); the executor adds no all-reduce of its own outside the IR."""
    rows = two_rank_results["tp2-sequence-parallel"].trace.rows_of(0)
    assert [r for r in rows if "s0:sp-grads" in r.op and r.kind == "all_reduce"]
    assert not [r for r in rows if "not in the IR" in r.op]


def test_program_failing_validation_never_launches() -> None:
    """A program whose SEND lost its RECV is refused before any process starts."""
    from simgrid.errors import ProgramError
    from simgrid.ir.ops import Recv

    program = build_program(TINY, TWO_RANK["pp2-1f1b"])
    broken = dataclasses.replace(program, ranks=(program.ranks[0],
                                                 tuple(op for op in program.ranks[1] if not isinstance(op, Recv))))
    with pytest.raises(ProgramError):
        run_programs([Job(program=broken)], config=LaunchConfig(world_size=2, run_timeout_s=1))


def test_rank_dying_mid_program_names_rank_and_op() -> None:
    """Rank 1 exits at its 5th op: the error names rank 1 and that op's text; nothing hangs."""
    program = build_program(TINY, TWO_RANK["pp2-1f1b"])
    from simgrid.ir.text import format_op

    text = format_op(program.ranks[1][5])
    with pytest.raises(ExecutionError, match=r"rank 1 died \(exit code 17\) while running op .#5 " + re.escape(text[:20])):
        run_programs([Job(program=program, fault=(1, 5, "exit"))],
                     config=LaunchConfig(world_size=2, run_timeout_s=120, comm_timeout_s=10))


def test_declared_memory_peak_is_tracked_per_rank(two_rank_results: dict[str, RunResult]) -> None:
    """The executor's live ALLOC/FREE counter peaks where a by-hand replay of rank 0's ops peaks."""
    from simgrid.ir.ops import Alloc, Free

    program = build_program(TINY, TWO_RANK["zero3"])
    live, peak, sizes = 0, 0, {}
    for op in program.ranks[0]:
        if isinstance(op, Alloc):
            sizes[op.name] = op.bytes
            live += op.bytes
            peak = max(peak, live)
        elif isinstance(op, Free):
            live -= sizes.pop(op.name)
    assert two_rank_results["zero3"].peak_ir_bytes[0] == peak


def test_gloo_reduce_scatter_is_recorded_as_all_reduce_in_the_trace(two_rank_results: dict[str, RunResult]) -> None:
    """ZeRO's reduce-scatter rows say how gloo really performed them."""
    rows = [r for r in two_rank_results["zero1"].trace.rows if r.kind == "reduce_scatter"]
    assert rows and all("reduce_scatter via all_reduce (gloo)" in r.op for r in rows)


def check_cp_against_reference(name: str, spec: ModelSpec, layout: Layout, result: RunResult) -> None:
    """Both steps' losses, every weight and the whole update agree with one process on full sequences."""
    ref = reference_training(spec, layout, steps=CP_STEPS)
    assert_run_matches(name, result.losses, result.weights, ref.losses, ref.weights, init_weights(spec, 0))


@pytest.mark.parametrize("name", list(TWO_RANK_CP))
def test_two_rank_context_parallel_matches_single_process_reference(
        name: str, two_rank_results: dict[str, RunResult]) -> None:
    """cp = 2 on tiny-gpt (also with ZeRO-1), and on a Llama-style model with the fused core and full
    recompute: both steps' losses and every weight match the reference."""
    spec, layout = TWO_RANK_CP[name]
    check_cp_against_reference(name, spec, layout, two_rank_results[name])


@pytest.mark.parametrize("name", list(FOUR_RANK_CP))
def test_four_rank_context_parallel_hybrid_matches_single_process_reference(
        name: str, four_rank_results: dict[str, RunResult]) -> None:
    """cp = 2 with tp = 2 (sequence-parallel tiny-gpt; Llama-style), with pp = 2 and with dp = 2 + ZeRO-2."""
    spec, layout = FOUR_RANK_CP[name]
    check_cp_against_reference(name, spec, layout, four_rank_results[name])


def test_context_parallel_trace_has_a_row_per_kv_collective(two_rank_results: dict[str, RunResult]) -> None:
    """Every CP collective of rank 0's program has one row in the trace of the last step (purpose cp); the
    backward re-gather and gloo's reduce-scatter say how they were really performed."""
    spec, layout = TWO_RANK_CP["cp2"]
    program = build_program(spec, layout)
    expected = sorted(op.kind for op in program.ranks[0] if isinstance(op, Collective) and op.purpose == "cp")
    rows = [r for r in two_rank_results["cp2"].trace.rows_of(0)
            if r.purpose == "cp" and r.kind != "WAIT" and r.stream != "compute"]
    assert sorted(r.kind for r in rows) == expected
    regathers = [r for r in rows if r.kind == "all_gather" and "b1:bwd" in r.op]
    assert regathers and all(REGATHER_NOTE in r.op for r in regathers)
    scatters = [r for r in rows if r.kind == "reduce_scatter"]
    assert scatters and all("reduce_scatter via all_reduce (gloo)" in r.op for r in scatters)
