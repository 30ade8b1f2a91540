"""Element-wise optimizers shared by the single-process reference and every sharded executor rank.

Because Adam and SGD act element by element, updating a 1/dp shard of a flattened bucket (ZeRO-1/2/3),
the whole tensor on a parameter server, or a host copy (optimizer offload) gives bit-for-bit the same
values as updating the full tensor, given the same gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from simgrid.errors import LayoutError


@dataclass(frozen=True, kw_only=True)
class OptimizerConfig:
    """Hyper-parameters of the optimizer the layout names."""

    name: str = "adam"
    """``adam`` (Kingma & Ba 2015, Algorithm 1) or ``sgd`` (heavy-ball momentum, PyTorch's form)."""
    lr: float = 1e-3
    """Learning rate."""
    beta1: float = 0.9
    """Adam first-moment decay (Kingma & Ba 2015 default)."""
    beta2: float = 0.999
    """Adam second-moment decay (Kingma & Ba 2015 default)."""
    eps: float = 1e-8
    """Adam denominator epsilon (Kingma & Ba 2015 default)."""
    momentum: float = 0.9
    """SGD momentum."""

    def __post_init__(self) -> None:
        if self.name not in ("adam", "sgd"):
            raise LayoutError(
                f"executor: optimizer = {self.name!r} is not supported for real runs; use 'adam' or 'sgd' "
                "(8-bit Adam is simulated only)"
            )
        if not self.lr > 0:
            raise LayoutError(f"executor: optimizer lr = {self.lr!r} must be > 0")


def optimizer_for(layout_optimizer: str, *, lr: float | None = None) -> OptimizerConfig:
    """The executor's optimizer for a layout's ``optimizer`` field (SGD gets a larger default step)."""
    if lr is None:
        lr = 1e-3 if layout_optimizer == "adam" else 0.05
    return OptimizerConfig(name=layout_optimizer, lr=lr)


def optimizer_step(param: torch.Tensor, grad: torch.Tensor, state: dict[str, torch.Tensor],
                   config: OptimizerConfig, step: int) -> None:
    """Update ``param`` in place from ``grad``; ``state`` holds this tensor's moments; ``step`` counts from 1."""
    with torch.no_grad():
        if config.name == "sgd":
            buf = state.get("momentum")
            if buf is None:
                buf = grad.detach().clone()
                state["momentum"] = buf
            else:
                buf.mul_(config.momentum).add_(grad)
            param.add_(buf, alpha=-config.lr)
            return
        m = state.setdefault("exp_avg", torch.zeros_like(param))
        v = state.setdefault("exp_avg_sq", torch.zeros_like(param))
        m.mul_(config.beta1).add_(grad, alpha=1 - config.beta1)
        v.mul_(config.beta2).addcmul_(grad, grad, value=1 - config.beta2)
        bias1 = 1 - config.beta1**step
        bias2 = 1 - config.beta2**step
        denom = (v / bias2).sqrt_().add_(config.eps)
        param.addcdiv_(m, denom, value=-config.lr / bias1)
