"""ZeRO-3 combined with tensor parallelism: runs for real and reproduces the single-process reference.

Under tensor parallelism a block is a chain of segments, and the executor runs the segment after a cut
(residual add and bias after the row-parallel all-reduce; the norm backward after the gradient
all-reduce) when its result is first needed. ZeRO-3 frees a unit's gathered parameters at the FREE the
IR places after the unit's last compute op, so those segments must run at that FREE, before the release. The
4-rank layouts run one after another in one spawned world (module-scoped fixture), as in
``test_executor_numerics.py``; SGD keeps per-tensor comparisons meaningful (see that module's docstring).
The time of those late segments is traced as the compute op they finish, never twice.
"""

from __future__ import annotations

import itertools
import re
import time
import types

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from executor import runner  # noqa: E402
from executor.blockrun import BlockRun  # noqa: E402
from executor.collectives import release_zero3  # noqa: E402
from executor.grads import GradBook  # noqa: E402
from executor.interpreter import DEFERRED_NOTE, RankInterpreter, StepResult  # noqa: E402
from executor.launch import LaunchConfig  # noqa: E402
from executor.model import build_blocks, init_weights  # noqa: E402
from executor.optim import optimizer_for  # noqa: E402
from executor.reference import reference_training  # noqa: E402
from executor.runner import Job, RunResult, run_programs  # noqa: E402
from executor.timing import HostTimer  # noqa: E402
from executor.tp import TPContext  # noqa: E402
from executor.validate import per_kind_seconds  # noqa: E402
from simgrid.ir.ops import Collective, Compute, Free  # noqa: E402
from simgrid.ir.program import Program  # noqa: E402
from simgrid.ir.text import format_op  # noqa: E402
from simgrid.layout.spec import Layout  # noqa: E402
from simgrid.model.presets import get_model  # noqa: E402
from simgrid.schedules import build_program  # noqa: E402
from tests.executor.reference_checks import NOISE_NORM, assert_run_matches  # noqa: E402

TINY = get_model("tiny-gpt")
SGD = {"optimizer": "sgd", "precision": "fp32", "micro_batch_size": 1}
STEPS = 2
"""Two steps: the second step's loss checks that the updated shards are what the next gathers deliver."""

ZERO3_TP: dict[str, Layout] = {
    "tp2xdp2-zero3": Layout(tp=2, dp=2, zero=3, zero_impl="fsdp2", global_batch_size=4, **SGD),
    "tp2xdp2-zero3-sp": Layout(tp=2, dp=2, zero=3, sequence_parallel=True, global_batch_size=4, **SGD),
    "tp2xdp2-zero3-sp-full-recompute": Layout(tp=2, dp=2, zero=3, sequence_parallel=True, recompute="full",
                                              global_batch_size=4, **SGD),
}


@pytest.fixture(scope="module")
def zero3_tp_programs() -> dict[str, Program]:
    return {name: build_program(TINY, layout) for name, layout in ZERO3_TP.items()}


@pytest.fixture(scope="module")
def zero3_tp_results(zero3_tp_programs: dict[str, Program]) -> dict[str, RunResult]:
    jobs = [Job(program=zero3_tp_programs[name], steps=STEPS) for name in ZERO3_TP]
    results = run_programs(jobs, config=LaunchConfig(world_size=4, run_timeout_s=240, comm_timeout_s=120))
    return dict(zip(ZERO3_TP, results, strict=True))


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(ZERO3_TP))
def test_zero3_with_tensor_parallelism_matches_single_process_reference(
        name: str, zero3_tp_results: dict[str, RunResult]) -> None:
    """TP2 x DP2 with ZeRO-3 (with and without sequence parallelism): the losses of both steps and every
    updated weight agree with one process running the full model (relative error <= 1e-5)."""
    layout = ZERO3_TP[name]
    result = zero3_tp_results[name]
    ref = reference_training(TINY, layout, steps=STEPS)
    start = init_weights(TINY, 0)
    for key, value in ref.weights.items():
        moved = float((value - start[key]).norm())
        assert moved > 0 or float(value.norm()) <= NOISE_NORM, f"{name}: reference never updated {key}"
    assert_run_matches(name, result.losses, result.weights, ref.losses, ref.weights, start)


@pytest.mark.torch
def test_zero3_with_tensor_parallelism_is_no_longer_refused_before_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """run_programs validates a TP2 x DP2 ZeRO-3 program and goes on to launch it (stubbed here)."""
    launched: list[int] = []

    def fake_spawn(worker: object, payload: list[object], config: LaunchConfig) -> list[list[object]]:
        launched.append(config.world_size)
        raise RuntimeError("launch reached")

    monkeypatch.setattr(runner, "spawn_world", fake_spawn)
    program = build_program(TINY, ZERO3_TP["tp2xdp2-zero3"])
    with pytest.raises(RuntimeError, match="launch reached"):
        run_programs([Job(program=program)])
    assert launched == [4]


# -- the trace: late segments timed as the compute op they finish, nothing counted twice -------------------
def _deferred_rows(result: RunResult, rank: int) -> list[tuple[str, str, object]]:
    """(owner op text, where it ran, row) of the rank's deferred-segment rows."""
    out = []
    for row in result.trace.rows:
        if row.rank == rank and DEFERRED_NOTE in row.op:
            owner, where = row.op.split(f"  # {DEFERRED_NOTE}, run at #", 1)
            out.append((owner, where.split(" ", 1)[1], row))
    return out


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_segments_run_at_the_zero3_free_are_traced_as_the_compute_op_they_finish(
        zero3_tp_programs: dict[str, Program], zero3_tp_results: dict[str, RunResult]) -> None:
    """TP2 x DP2 ZeRO-3 with FSDP2's units: a layer's gathered parameters are freed right after the last
    compute op of the layer in each pass (the MLP's forward, the attention's backward), so that op's
    late segment (after its TP all-reduce) runs at the FREE: exactly one row there, on every rank and
    micro-batch, carrying the kind, stage, micro-batch and text of the op, on the compute stream, taking
    time, with no FLOPs."""
    name = "tp2xdp2-zero3"
    program, result = zero3_tp_programs[name], zero3_tp_results[name]
    for rank, ops in enumerate(program.ranks):
        rows = _deferred_rows(result, rank)
        computes = [op for op in ops if isinstance(op, Compute)]
        for phase, kind, first_of_layer in (("fwd", "F", 2), ("bwd", "B", 1)):
            blocks = {int(m.group(1)) for op in ops if isinstance(op, Collective) and op.purpose == "tp"
                      for m in [re.fullmatch(rf"b(\d+):{phase}", op.label)] if m}
            last_of_unit = [op for op in computes if op.kind == kind and op.block_start in blocks
                            and op.block_start % 2 == first_of_layer % 2 and 0 < op.block_start <= 2 * TINY.num_layers]
            assert last_of_unit, (rank, phase)
            for op in last_of_unit:
                found = [row for owner, where, row in rows if owner == format_op(op)]
                assert len(found) == 1, (rank, format_op(op), len(found))
                row = found[0]
                where = next(w for owner, w, r in rows if r is row)
                assert where.startswith("FREE name=zero3-param:"), (rank, where)
                assert (row.kind, row.stage, row.microbatch) == (kind, op.stage, op.microbatch)
                assert (row.stream, row.purpose, row.flops) == ("compute", "compute", 0.0)
                assert row.end_s > row.start_s


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(ZERO3_TP))
def test_measured_compute_rows_never_overlap_and_flops_are_counted_once(
        name: str, zero3_tp_programs: dict[str, Program], zero3_tp_results: dict[str, RunResult]) -> None:
    """Per rank: the compute stream's rows (ops and deferred segments) are disjoint in time, so their sum is
    at most the rank's step time; every deferred row names a compute op of the rank's program with the same
    kind, stage and micro-batch; the FLOPs on the rows add up to the program's compute FLOPs exactly once;
    and the per-kind totals the validation compares include the deferred time."""
    program, result = zero3_tp_programs[name], zero3_tp_results[name]
    texts_by_rank = [{format_op(op): op for op in ops if isinstance(op, Compute)} for ops in program.ranks]
    deferred_s = 0.0
    for rank, ops in enumerate(program.ranks):
        rows = [r for r in result.trace.rows if r.rank == rank]
        compute = sorted((r for r in rows if r.stream == "compute"), key=lambda r: r.start_s)
        for before, after in itertools.pairwise(compute):
            assert after.start_s >= before.end_s, (name, rank, before.op, after.op)
        step_s = max(r.end_s for r in rows)
        assert sum(r.end_s - r.start_s for r in compute) <= step_s
        deferred = _deferred_rows(result, rank)
        assert deferred, (name, rank)
        for owner, _, row in deferred:
            op = texts_by_rank[rank][owner]
            assert (row.kind, row.stage, row.microbatch) == (op.kind, op.stage, op.microbatch)
            deferred_s += row.end_s - row.start_s
        assert sum(r.flops for r in rows) == pytest.approx(sum(op.flops for op in ops if isinstance(op, Compute)))
    without = per_kind_seconds(type(result.trace)([r for r in result.trace.rows if DEFERRED_NOTE not in r.op]))
    with_deferred = per_kind_seconds(result.trace)
    gained = sum(with_deferred.get(k, 0.0) - without.get(k, 0.0) for k in ("F", "B", "R", "I"))
    assert gained == pytest.approx(deferred_s / len(program.ranks), rel=1e-9)


# -- the FREE handler, in one process -------------------------------------------------------------------
def _sharded_attention_block() -> tuple[types.SimpleNamespace, dict[str, torch.Tensor]]:
    """Attention block 1 as tensor-parallel rank 0 of 2 holds it, ZeRO-3 sharded over dp = 2, inside a
    stand-in for the interpreter that has just what the FREE handler uses; plus its full local weights."""
    tp = TPContext(size=2, rank=0)
    modules = build_blocks(TINY, [1], init_weights(TINY, 0), tp)
    full = {name: p.detach().clone() for name, p in modules[1].named_parameters()}
    book = GradBook(modules, dp_size=2, dp_index=0, optimizer=optimizer_for("sgd"))
    book.shard_zero3()
    # Op #0 is the F op that reached the cut, #1 the B op, #2 the FREE being handled.
    ops = (Compute(kind="F", stage=0, microbatch=0, chunk=0, block_start=1, block_end=2, flops=1e6, hbm_bytes=1e5),
           Compute(kind="B", stage=0, microbatch=0, chunk=0, block_start=1, block_end=2, flops=2e6, hbm_bytes=2e5),
           Free(name="zero3-param:m0:F:b1"))
    interp = types.SimpleNamespace(book=book, modules=modules, zero3_live={}, runs={}, head=-1,
                                   result=StepResult(), rank=0, ops=ops, texts=[format_op(op) for op in ops],
                                   current_index=2, in_compute=False, stage_of={1: 0},
                                   segment_owner={(1, 0, "fwd"): 0, (1, 0, "bwd"): 1}, timer=HostTimer(),
                                   unresolved=[])
    for method in ("finish_forward", "finish_ready_segments", "deferred_segments", "_deferred_row", "add_row",
                   "resolve_rows"):
        setattr(interp, method, types.MethodType(getattr(RankInterpreter, method), interp))
    return interp, full


def _gather(interp: types.SimpleNamespace, full: dict[str, torch.Tensor]) -> None:
    """What a completed zero-param all-gather of block 1 leaves behind."""
    for name, p in interp.modules[1].named_parameters():
        p.data = full[name].clone()
    interp.zero3_live[1] = interp.zero3_live.get(1, 0) + 1


def test_zero3_free_runs_the_segment_after_the_forward_all_reduce_then_releases() -> None:
    """The residual add with the output bias (after the row-parallel all-reduce) runs at the FREE with the
    gathered bias, and the parameters are released afterwards (not kept alive)."""
    interp, full = _sharded_attention_block()
    module = interp.modules[1]
    assert all(p.numel() == 0 for p in module.parameters())
    _gather(interp, full)
    x = torch.randn(TINY.seq_length, 1, TINY.hidden_size, generator=torch.Generator().manual_seed(1))
    run = BlockRun(module, 0, x)
    interp.runs[(1, 0)] = run
    assert run.forward() == 1  # blocked on the all-reduce of the row-parallel output
    reduced = torch.randn(TINY.seq_length, 1, TINY.hidden_size, generator=torch.Generator().manual_seed(2))
    run.set_forward_comm_result(1, reduced)  # the all-reduce's WAIT delivered the sum

    release_zero3(interp, 1)

    assert run.forward_complete
    torch.testing.assert_close(run.output.detach(), x + reduced + full["o_bias"], rtol=0, atol=1e-6)
    assert all(p.numel() == 0 for p in module.parameters())


def test_zero3_free_runs_the_norm_backward_after_the_gradient_all_reduce_then_releases() -> None:
    """The norm backward (after the all-reduce of the column-parallel input gradient) runs at the FREE with
    the gathered norm weight: its gradient is sum(grad * normalised input), the weights are released, and
    its time is one row of the B op."""
    interp, full = _sharded_attention_block()
    module = interp.modules[1]
    _gather(interp, full)
    x = torch.randn(TINY.seq_length, 1, TINY.hidden_size, generator=torch.Generator().manual_seed(3))
    run = BlockRun(module, 0, x)
    interp.runs[(1, 0)] = run
    run.forward()
    run.set_forward_comm_result(1, run.forward_comm_input(1))
    assert run.forward() is None
    release_zero3(interp, 1)  # the forward unit's FREE
    _gather(interp, full)  # the backward unit's gather
    run.set_output_grad(torch.ones_like(x))
    assert run.backward("B") == 0  # blocked on the all-reduce of the norm-output gradient
    summed = torch.randn(TINY.seq_length, 1, TINY.hidden_size, generator=torch.Generator().manual_seed(4))
    run.set_backward_comm_result(0, summed)

    release_zero3(interp, 1)

    assert run.backward_complete
    normalised = F.layer_norm(x, (TINY.hidden_size,), eps=1e-5)
    expected = (summed * normalised).sum(dim=(0, 1))
    grad = module.norm_weight.grad
    assert grad is not None
    torch.testing.assert_close(grad, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(module.norm_bias.grad, summed.sum(dim=(0, 1)), rtol=1e-5, atol=1e-5)
    assert all(p.numel() == 0 for p in module.parameters())
    # Only the norm backward ran at a FREE (the forward had finished before the first one): one B row.
    interp.resolve_rows()  # rows are built from their timer marks when the step ends
    assert [(r.kind, r.op.split("  #")[0]) for r in interp.result.rows] == [("B", interp.texts[1])]


def test_zero3_free_times_the_late_segment_into_a_row_of_the_compute_op_it_finishes() -> None:
    """A late segment made to take 30 ms lands in one row of at least 30 ms at the FREE, with the F op's
    kind, stage, micro-batch and text (no FLOPs: the op's own row has them); inside a compute op (whose
    row already covers it) the same work adds no row."""
    for in_compute in (False, True):
        interp, full = _sharded_attention_block()
        interp.in_compute = in_compute
        module = interp.modules[1]
        _gather(interp, full)
        original = module.segment

        def slow_residual(j: int, run: BlockRun, original: object = original) -> torch.Tensor:
            if j == 2:
                time.sleep(0.03)
            return original(j, run)  # type: ignore[operator]

        module.segment = slow_residual
        x = torch.randn(TINY.seq_length, 1, TINY.hidden_size, generator=torch.Generator().manual_seed(5))
        run = BlockRun(module, 0, x)
        interp.runs[(1, 0)] = run
        assert run.forward() == 1
        run.set_forward_comm_result(1, run.forward_comm_input(1))

        release_zero3(interp, 1)

        assert run.forward_complete
        interp.resolve_rows()
        rows = interp.result.rows
        if in_compute:
            assert rows == []
            continue
        assert len(rows) == 1
        row = rows[0]
        assert row.end_s - row.start_s >= 0.03
        assert (row.kind, row.stage, row.microbatch, row.stream, row.flops) == ("F", 0, 0, "compute", 0.0)
        assert row.op == f"{interp.texts[0]}  # {DEFERRED_NOTE}, run at #2 {interp.texts[2]}"


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_deepspeed_zero3_gathers_a_tied_heads_own_norm() -> None:
    """A tied model whose word embedding is over DeepSpeed's persistence threshold (2048 x 64 = 131,072
    elements) but whose head owns only its final norm: the head gathers that norm whole besides the shared
    embedding (before, no gather named the head, its norm stayed an empty shard and the forward failed, as
    the calibration's ZeRO-3 program on small-gpt did), and two DeepSpeed ZeRO-3 steps on 2 ranks match the
    single-process reference."""
    from simgrid.model.spec import ModelSpec

    tied = ModelSpec(name="tied-wide-vocab", num_layers=2, hidden_size=64, num_heads=4, vocab_size=2048,
                     seq_length=32)
    layout = Layout(dp=2, zero=3, zero_impl="deepspeed", global_batch_size=4, **SGD)
    program = build_program(tied, layout)
    head = 2 * tied.num_layers + 1
    labels = [op.label for op in program.ranks[0] if isinstance(op, Collective) and op.purpose == "zero-param"]
    assert any(str(head) in re.findall(r"b(\d+)", label) for label in labels), labels
    result = run_programs([Job(program=program, steps=STEPS)],
                          config=LaunchConfig(world_size=2, run_timeout_s=240, comm_timeout_s=120))[0]
    ref = reference_training(tied, layout, steps=STEPS)
    assert_run_matches("deepspeed-tied", result.losses, result.weights, ref.losses, ref.weights, init_weights(tied, 0))
