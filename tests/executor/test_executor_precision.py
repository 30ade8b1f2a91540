"""bf16 autocast over fp32 master weights (executor/precision.py): which runs use it, what it changes in a
block, and a real step on the CPU (CPU autocast, the same code path as CUDA's) against the fp32 reference."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from executor.blockrun import BlockRun  # noqa: E402
from executor.model import build_blocks, init_weights  # noqa: E402
from executor.precision import autocast, compute_dtype  # noqa: E402
from executor.reference import drive_local, reference_training  # noqa: E402
from executor.runner import Job, run_programs  # noqa: E402
from executor.tp import TPContext  # noqa: E402
from simgrid.errors import LayoutError  # noqa: E402
from simgrid.layout.spec import Layout  # noqa: E402
from simgrid.model.presets import get_model  # noqa: E402
from simgrid.schedules import build_program  # noqa: E402
from tests.executor.reference_checks import (  # noqa: E402
    BF16_LOSS_TOL,
    BF16_UPDATE_TOL,
    TOL,
    update_relative_error,
)

pytestmark = [pytest.mark.torch]

TINY = get_model("tiny-gpt")
CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


def test_layout_precision_is_followed_on_cuda_and_fp32_is_kept_on_cpu() -> None:
    """bf16 layouts autocast on CUDA; CPU runs stay fp32 (the numerics reference) unless mixed precision is
    asked for; fp32 layouts and mixed_precision=False never autocast."""
    assert compute_dtype("bf16", CUDA) is torch.bfloat16
    assert compute_dtype("fp32", CUDA) is None
    assert compute_dtype("bf16", CPU) is None
    assert compute_dtype("fp16", CPU) is None  # CPU runs compute fp32 whatever the layout says, as before
    assert compute_dtype("bf16", CPU, mixed_precision=True) is torch.bfloat16
    assert compute_dtype("bf16", CUDA, mixed_precision=False) is None


def test_fp16_is_refused_where_it_would_run() -> None:
    """fp16 needs dynamic loss scaling, which the executor lacks: a one-line error names the fix."""
    with pytest.raises(LayoutError, match=r"precision = 'fp16' is not supported.*loss scaling.*'bf16' or 'fp32'"):
        compute_dtype("fp16", CUDA)


def test_autocast_context_is_a_no_op_for_fp32() -> None:
    """None leaves fp32 products in fp32; bf16 makes them bf16."""
    x, w = torch.randn(4, 8), torch.randn(3, 8)
    with autocast(None, CPU):
        assert torch.nn.functional.linear(x, w).dtype is torch.float32
    with autocast(torch.bfloat16, CPU):
        assert torch.nn.functional.linear(x, w).dtype is torch.bfloat16


def test_bf16_blocks_multiply_in_bf16_and_keep_fp32_weights_residuals_logits_and_gradients() -> None:
    """Under bf16: a layer's row-parallel product (the segment before the residual add) is bf16, the residual
    stream and the head's logits and loss are fp32, and the parameters and their gradients stay fp32."""
    modules = build_blocks(TINY, list(range(2 * TINY.num_layers + 2)), init_weights(TINY, 0), TPContext())
    for module in modules.values():
        module.compute_dtype = torch.bfloat16
    tokens = torch.randint(0, TINY.vocab_size, (TINY.seq_length, 1), generator=torch.Generator().manual_seed(0))
    runs, x = [], tokens
    for index in sorted(modules):
        run = BlockRun(modules[index], 0, x, tokens if index == max(modules) else None)
        drive_local(run, forward=True)
        runs.append(run)
        x = run.output
    attention, head = runs[1], runs[-1]
    assert attention.outputs[1] is not None and attention.outputs[1].dtype is torch.bfloat16
    assert attention.output.dtype is torch.float32
    assert head.outputs[1] is not None and head.outputs[1].dtype is torch.float32  # logits
    assert head.output.dtype is torch.float32 and torch.isfinite(head.output)
    grad = torch.tensor(1.0)
    for run in reversed(runs):
        run.set_output_grad(grad)
        drive_local(run, forward=False)
        grad = run.input_grad if run.input_grad is not None else grad
    params = [p for m in modules.values() for p in m.parameters()]
    assert all(p.dtype is torch.float32 for p in params)
    assert all(p.grad is None or p.grad.dtype is torch.float32 for p in params)
    assert sum(p.grad is not None for p in params) > len(params) // 2


SGD = {"optimizer": "sgd", "precision": "bf16", "micro_batch_size": 1}
CASES = {
    "plain": Layout(global_batch_size=2, **SGD),
    "flash-full-recompute": Layout(global_batch_size=2, flash_attention=True, recompute="full", **SGD),
    "tp2-sequence-parallel": Layout(tp=2, sequence_parallel=True, global_batch_size=2, **SGD),
}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bf16_autocast_step_matches_the_fp32_reference_within_the_bf16_tolerance() -> None:
    """Two SGD steps under CPU bf16 autocast (one process; and TP2 with sequence parallelism, whose
    collectives then move bf16 tensors over gloo) against the single-process fp32 reference: every loss
    within BF16_LOSS_TOL and the whole update within BF16_UPDATE_TOL (the tolerances' reasons are in
    tests/executor/reference_checks.py). The same programs run without mixed precision match to 1e-5, and
    the bf16 update differs from the fp32 one by more than that: autocast really ran."""
    start = init_weights(TINY, 0)
    by_world: dict[int, list[tuple[str, Job]]] = {}
    for name, layout in CASES.items():
        program = build_program(TINY, layout)
        for mixed in (True, False):
            by_world.setdefault(layout.world_size, []).append(
                (f"{name} mixed={mixed}", Job(program=program, steps=2, mixed_precision=mixed)))
    results = {}
    for jobs in by_world.values():
        for (name, _), result in zip(jobs, run_programs([job for _, job in jobs]), strict=True):
            results[name] = result
    for name, layout in CASES.items():
        ref = reference_training(TINY, layout, steps=2)  # fp32: the reference never autocasts
        mixed, plain = results[f"{name} mixed=True"], results[f"{name} mixed=False"]
        assert mixed.losses == pytest.approx(ref.losses, rel=BF16_LOSS_TOL), name
        error = update_relative_error(mixed.weights, ref.weights, start)
        assert 1e-5 < error <= BF16_UPDATE_TOL, (name, error)
        assert plain.losses == pytest.approx(ref.losses, rel=TOL), name
        assert update_relative_error(plain.weights, ref.weights, start) <= 1e-4, name
