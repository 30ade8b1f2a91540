"""ZeRO-3 combined with tensor parallelism: runs for real and reproduces the single-process reference.

Under tensor parallelism a block is a chain of segments, and the executor runs the segment after a cut
(residual add and bias after the row-parallel all-reduce; the norm backward after the gradient
all-reduce) when its result is first needed. ZeRO-3 frees a block's gathered parameters at the FREE the
IR places after the block's compute, so those segments must run at that FREE, before the release. The
4-rank layouts run one after another in one spawned world (module-scoped fixture), as in
``test_executor_numerics.py``; SGD keeps per-tensor comparisons meaningful (see that module's docstring).
"""

from __future__ import annotations

import types

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from executor import runner  # noqa: E402
from executor.blockrun import BlockRun  # noqa: E402
from executor.collectives import release_zero3  # noqa: E402
from executor.grads import GradBook  # noqa: E402
from executor.interpreter import RankInterpreter, StepResult  # noqa: E402
from executor.launch import LaunchConfig  # noqa: E402
from executor.model import build_blocks, init_weights  # noqa: E402
from executor.optim import optimizer_for  # noqa: E402
from executor.reference import reference_training  # noqa: E402
from executor.runner import Job, RunResult, run_programs  # noqa: E402
from executor.tp import TPContext  # noqa: E402
from simgrid.layout.spec import Layout  # noqa: E402
from simgrid.model.presets import get_model  # noqa: E402
from simgrid.schedules import build_program  # noqa: E402

TINY = get_model("tiny-gpt")
SGD = {"optimizer": "sgd", "precision": "fp32", "micro_batch_size": 1}
TOL = 1e-5
STEPS = 2
"""Two steps: the second step's loss checks that the updated shards are what the next gathers deliver."""

ZERO3_TP: dict[str, Layout] = {
    "tp2xdp2-zero3": Layout(tp=2, dp=2, zero=3, global_batch_size=4, **SGD),
    "tp2xdp2-zero3-sp": Layout(tp=2, dp=2, zero=3, sequence_parallel=True, global_batch_size=4, **SGD),
    "tp2xdp2-zero3-sp-full-recompute": Layout(tp=2, dp=2, zero=3, sequence_parallel=True, recompute="full",
                                              global_batch_size=4, **SGD),
}


@pytest.fixture(scope="module")
def zero3_tp_results() -> dict[str, RunResult]:
    jobs = [Job(program=build_program(TINY, layout), steps=STEPS) for layout in ZERO3_TP.values()]
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
    assert result.losses == pytest.approx(ref.losses, rel=TOL), name
    assert set(result.weights) == set(ref.weights)
    start = init_weights(TINY, 0)
    for key, value in ref.weights.items():
        moved = float((value - start[key]).norm())
        assert moved > 0 or float(value.norm()) <= 1e-6, f"{name}: reference never updated {key}"
        if float(value.norm()) > 1e-6:  # zero-gradient tensors (key bias) hold only rounding noise
            err = float((result.weights[key] - value).norm() / value.norm())
            assert err <= TOL, f"{name}: {key} relative error {err:.2e}"
    # The update itself (w_after - w_start), not just the weights, must agree: a dropped sequence-parallel
    # partial gradient changes a norm weight by far less than 1e-5 of its norm but half of its update.
    num = sum(float((result.weights[k] - v).pow(2).sum()) for k, v in ref.weights.items())
    den = sum(float((v - start[k]).pow(2).sum()) for k, v in ref.weights.items())
    assert (num / den) ** 0.5 <= 1e-4, name


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


# -- the FREE handler, in one process -------------------------------------------------------------------
def _sharded_attention_block() -> tuple[types.SimpleNamespace, dict[str, torch.Tensor]]:
    """Attention block 1 as tensor-parallel rank 0 of 2 holds it, ZeRO-3 sharded over dp = 2, inside a
    stand-in for the interpreter that has just what the FREE handler uses; plus its full local weights."""
    tp = TPContext(size=2, rank=0)
    modules = build_blocks(TINY, [1], init_weights(TINY, 0), tp)
    full = {name: p.detach().clone() for name, p in modules[1].named_parameters()}
    book = GradBook(modules, dp_size=2, dp_index=0, optimizer=optimizer_for("sgd"))
    book.shard_zero3()
    interp = types.SimpleNamespace(book=book, modules=modules, zero3_live={}, runs={}, head=-1,
                                   result=StepResult())
    interp.finish_forward = types.MethodType(RankInterpreter.finish_forward, interp)
    interp.finish_ready_segments = types.MethodType(RankInterpreter.finish_ready_segments, interp)
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
    the gathered norm weight: its gradient is sum(grad * normalised input), and the weights are released."""
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
