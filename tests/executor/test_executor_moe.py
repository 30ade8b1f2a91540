"""Expert parallelism run for real on gloo: MoE layouts reproduce the single-process reference step.

The MoE block (:mod:`executor.moe_layers`) is first checked against a token-by-token computation of the
layer, then EP2, EP2 with full recompute, EP2 with a shared expert, EP2 x DP2 (ZeRO-1 over the expert data-
parallel group too), EP2 x TP2 (sequence parallelism, experts folded over the tensor-parallel ranks),
EP2 x PP2 and EP4 run on 2 and 4 gloo ranks for two SGD steps; every loss and weight must match the
reference (tolerances of :mod:`tests.executor.reference_checks`). Routing is deterministic (top-k on float64
logits), so a rank and the reference pick the same experts.
"""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

from executor.blockrun import BlockRun  # noqa: E402
from executor.launch import LaunchConfig  # noqa: E402
from executor.model import MoeBlock, build_blocks, init_weights  # noqa: E402
from executor.reference import drive_local, reference_training  # noqa: E402
from executor.runner import Job, RunResult, run_programs, validate_or_raise  # noqa: E402
from executor.tp import TPContext  # noqa: E402
from simgrid.errors import LayoutError  # noqa: E402
from simgrid.layout.spec import Layout  # noqa: E402
from simgrid.model.moe_spec import MoESpec  # noqa: E402
from simgrid.model.presets import get_model  # noqa: E402
from simgrid.model.spec import ModelSpec  # noqa: E402
from simgrid.schedules import build_program  # noqa: E402
from tests.executor.reference_checks import assert_run_matches  # noqa: E402

pytestmark = [pytest.mark.torch]

MOE = get_model("tiny-moe")
SHARED = dataclasses.replace(
    MOE, name="tiny-moe-shared",
    moe=MoESpec(num_experts=4, top_k=2, expert_ffn_hidden_size=32, shared_expert_ffn_hidden_size=48,
                shared_expert_gate=True, normalize_top_k=False, first_dense_layers=1))
SGD = {"optimizer": "sgd", "precision": "fp32", "micro_batch_size": 1}
STEPS = 2

TWO_RANK: dict[str, tuple[ModelSpec, Layout]] = {
    "ep2": (MOE, Layout(dp=2, ep=2, global_batch_size=4, **SGD)),
    "ep2-full-recompute": (MOE, Layout(dp=2, ep=2, recompute="full", global_batch_size=4, **SGD)),
    "ep2-shared-expert": (SHARED, Layout(dp=2, ep=2, global_batch_size=4, **SGD)),
}
FOUR_RANK: dict[str, tuple[ModelSpec, Layout]] = {
    "ep2xdp2-zero1": (MOE, Layout(dp=4, ep=2, zero=1, global_batch_size=4, **SGD)),
    "ep2xtp2-sp": (MOE, Layout(tp=2, dp=2, ep=2, etp=1, sequence_parallel=True, global_batch_size=4, **SGD)),
    "ep2xpp2": (MOE, Layout(pp=2, dp=2, ep=2, global_batch_size=4, **SGD)),
    "ep4": (MOE, Layout(dp=4, ep=4, global_batch_size=4, **SGD)),
}


def _naive_moe(block: MoeBlock, x: torch.Tensor) -> torch.Tensor:
    """The MoE layer token by token: each token's k experts weighted by router probabilities, plus the gated
    shared expert and the residual."""
    tokens = block._norm(x).reshape(-1, x.shape[-1])
    out = []
    for t in range(tokens.shape[0]):
        probs = F.linear(tokens[t], block.router_weight).softmax(-1)
        top = probs.topk(block.top_k)
        weights = top.values / top.values.sum() if block.normalize_top_k else top.values
        y = sum(w * block._mlp(f"expert{int(e)}", tokens[t]) for w, e in zip(weights, top.indices, strict=True))
        if block.shared:
            shared = block._mlp("shared", tokens[t])
            y = y + shared * torch.sigmoid(F.linear(tokens[t], block.shared_gate_weight))
        out.append(y)
    return x + torch.stack(out).view_as(x)


@pytest.mark.parametrize("spec", [MOE, SHARED], ids=["tiny-moe", "shared-expert"])
def test_moe_block_equals_the_layer_token_by_token(spec: ModelSpec) -> None:
    """Permute, experts, unpermute and the weighted sum (three segments) give the per-token formula, and the
    gradients of both agree."""
    weights = init_weights(spec, 3)
    block = build_blocks(spec, [4], weights, TPContext())[4]
    assert isinstance(block, MoeBlock)
    x = torch.randn(spec.seq_length, 2, spec.hidden_size)
    run = BlockRun(block, 0, x)
    drive_local(run, forward=True)
    expected = _naive_moe(block, x)
    assert torch.allclose(run.output, expected, atol=1e-6)
    grad = torch.randn_like(expected)
    run.set_output_grad(grad)
    drive_local(run, forward=False)
    segmented = {n: p.grad.clone() for n, p in block.named_parameters()}
    block.zero_grad(set_to_none=True)
    xr = x.clone().requires_grad_(True)
    _naive_moe(block, xr).backward(grad)
    assert run.input_grad is not None and torch.allclose(run.input_grad, xr.grad, atol=1e-5)
    for name, p in block.named_parameters():
        assert torch.allclose(segmented[name], p.grad, atol=1e-5), name


def _run(cases: dict[str, tuple[ModelSpec, Layout]], world: int) -> dict[str, RunResult]:
    jobs = [Job(program=build_program(spec, layout), steps=STEPS) for spec, layout in cases.values()]
    results = run_programs(jobs, config=LaunchConfig(world_size=world, run_timeout_s=360, comm_timeout_s=120))
    return dict(zip(cases, results, strict=True))


@pytest.fixture(scope="module")
def two_rank_results() -> dict[str, RunResult]:
    """Every 2-rank MoE case in one gloo world."""
    return _run(TWO_RANK, 2)


@pytest.fixture(scope="module")
def four_rank_results() -> dict[str, RunResult]:
    """Every 4-rank MoE case in one gloo world."""
    return _run(FOUR_RANK, 4)


def _check(name: str, spec: ModelSpec, layout: Layout, result: RunResult) -> None:
    ref = reference_training(spec, layout, steps=STEPS)
    assert_run_matches(name, result.losses, result.weights, ref.losses, ref.weights, init_weights(spec, 0))


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("name", list(TWO_RANK))
def test_two_rank_expert_parallel_matches_reference(name: str, two_rank_results: dict[str, RunResult]) -> None:
    """EP2 (alone, with full recompute re-dispatching, with a gated shared expert) equals the reference."""
    _check(name, *TWO_RANK[name], two_rank_results[name])


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("name", list(FOUR_RANK))
def test_four_rank_expert_parallel_matches_reference(name: str, four_rank_results: dict[str, RunResult]) -> None:
    """EP2 x DP2 with ZeRO-1, EP2 x TP2 with sequence parallelism, EP2 x PP2 and EP4 equal the reference."""
    _check(name, *FOUR_RANK[name], four_rank_results[name])


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_trace_has_the_all_to_alls(two_rank_results: dict[str, RunResult]) -> None:
    """The measured trace has the dispatch and combine all-to-alls (purpose ep) of every MoE block, forward
    and backward: 3 MoE blocks x 2 micro-batches x 4 per rank."""
    rows = [r for r in two_rank_results["ep2"].trace.timing_rows if r.kind == "all_to_all"]
    assert rows and all(r.purpose == "ep" for r in rows)
    assert len([r for r in rows if r.rank == 0]) == 3 * 2 * 4


@pytest.mark.parametrize(
    ("spec", "layout", "match"),
    [
        (MOE, Layout(dp=4, ep=2, etp=2, global_batch_size=4), r"expert tensor parallelism \(etp = 2\)"),
        (MOE, Layout(tp=2, dp=2, ep=2, sequence_parallel=True, global_batch_size=4), "pass --etp 1"),
        (dataclasses.replace(MOE, moe=dataclasses.replace(MOE.moe, capacity_factor=1.25)),  # type: ignore[arg-type]
         Layout(dp=2, ep=2, global_batch_size=2), "capacity_factor = 1.25 .token dropping. is not implemented"),
        (SHARED, Layout(tp=2, ep=2, sequence_parallel=True, etp=1, global_batch_size=2),
         "a shared expert with tp > 1 is not implemented"),
    ],
)
def test_unsupported_moe_settings_are_refused_before_launch(spec: ModelSpec, layout: Layout, match: str) -> None:
    """What the executor does not run fails validation with a message saying what to change."""
    with pytest.raises(LayoutError, match=match):
        validate_or_raise(build_program(spec, layout))
