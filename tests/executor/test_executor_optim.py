"""The executor's element-wise optimizers equal torch.optim and are shard-invariant."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from executor.optim import OptimizerConfig, optimizer_for, optimizer_step  # noqa: E402
from simgrid.errors import LayoutError  # noqa: E402


@pytest.mark.parametrize("name", ["adam", "sgd"])
def test_optimizer_step_matches_torch_optim_over_three_steps(name: str) -> None:
    """Adam (betas 0.9/0.999, eps 1e-8) and SGD with momentum 0.9 reproduce torch.optim exactly."""
    gen = torch.Generator().manual_seed(1)
    start = torch.randn(7, 3, generator=gen)
    grads = [torch.randn(7, 3, generator=gen) for _ in range(3)]
    config = OptimizerConfig(name=name, lr=0.01)
    ours, state = start.clone(), {}
    ref = torch.nn.Parameter(start.clone())
    opt = (torch.optim.Adam([ref], lr=0.01, betas=(0.9, 0.999), eps=1e-8) if name == "adam"
           else torch.optim.SGD([ref], lr=0.01, momentum=0.9))
    for step, g in enumerate(grads, start=1):
        optimizer_step(ours, g, state, config, step)
        ref.grad = g.clone()
        opt.step()
    assert torch.allclose(ours, ref.detach(), rtol=1e-6, atol=1e-8)


def test_updating_shards_equals_updating_the_whole_tensor() -> None:
    """ZeRO's premise: the update of a 1/2 shard is exactly that slice of the full update."""
    gen = torch.Generator().manual_seed(2)
    full, grad = torch.randn(10, generator=gen), torch.randn(10, generator=gen)
    config = OptimizerConfig(name="adam", lr=0.1)
    whole = full.clone()
    optimizer_step(whole, grad, {}, config, 1)
    for lo, hi in ((0, 5), (5, 10)):
        piece = full[lo:hi].clone()
        optimizer_step(piece, grad[lo:hi], {}, config, 1)
        assert torch.equal(piece, whole[lo:hi])


def test_unsupported_optimizer_is_refused_with_a_fix() -> None:
    """8-bit Adam is simulated only; the executor says which optimizers it runs."""
    with pytest.raises(LayoutError, match="optimizer = 'adam-8bit' is not supported for real runs; use 'adam' or 'sgd'"):
        optimizer_for("adam-8bit")
