"""Comparisons of an executor run with the single-process reference, shared by the numerics tests.

Tolerances are those of the numerics tests: each weight within 1e-5 relative, the weight *update*
(``w_after - w_start``) within 1e-4: a dropped partial gradient (a sequence-parallel norm gradient, one
context-parallel rank's share) moves a weight by far less than 1e-5 of its norm but changes its update by
about half.
"""

from __future__ import annotations

import pytest
import torch

#: Relative tolerance of losses and of each weight.
TOL = 1e-5
#: Relative tolerance of the whole update.
UPDATE_TOL = 1e-4
#: Tensors whose gradient is zero (the key bias: softmax ignores it) hold only rounding noise below this.
NOISE_NORM = 1e-6

#: bf16 autocast (fp32 master weights) against the fp32 reference: relative tolerance of each step's loss.
#: bf16 keeps 8 significant bits (unit roundoff u = 2^-8 = 3.9e-3); the loss is an fp32 cross entropy of fp32
#: logits computed from bf16-rounded operands with fp32 accumulation, so its relative error stays far below u
#: (1.3e-5 to 2.8e-5 measured on tiny-gpt, CPU autocast); 2e-3 (u / 2) leaves a wide margin and still fails a
#: wrong term (a missing bias, a mis-scaled residual: errors of order 1e-1).
BF16_LOSS_TOL = 2e-3
#: Relative tolerance of the whole weight update (SGD, so the update is the gradient) under bf16 autocast.
#: Every product rounds its operands to bf16 (relative error <= u each) and accumulates in fp32; independent
#: roundings through the few matrix products of a gradient add up to a few u (3e-3 to 9e-3 per tensor, 4.3e-3
#: to 4.4e-3 over all of them on tiny-gpt, CPU autocast). 2e-2 (about 5 u) is above that spread yet far below the O(1) error of
#: a wrong or missing gradient term. Per-tensor checks do not apply: tensors whose exact gradient is zero
#: (the key bias) hold bf16 rounding noise that is large relative to their fp32 noise.
BF16_UPDATE_TOL = 2e-2


def global_relative_error(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> float:
    """``||got - ref|| / ||ref||`` over all weights concatenated."""
    num = sum(float((got[k] - v).pow(2).sum()) for k, v in ref.items())
    den = sum(float(v.pow(2).sum()) for v in ref.values())
    return (num / den) ** 0.5


def update_relative_error(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor],
                          start: dict[str, torch.Tensor]) -> float:
    """Relative error of the weight *update* (``w1 - w0``): a strict check that the gradients agree."""
    num = sum(float((got[k] - v).pow(2).sum()) for k, v in ref.items())
    den = sum(float((v - start[k]).pow(2).sum()) for k, v in ref.items())
    return (num / den) ** 0.5


def assert_each_weight_matches(name: str, got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> None:
    """Every weight with a real gradient within :data:`TOL` relative of the reference."""
    assert set(got) == set(ref), name
    for key, value in ref.items():
        if float(value.norm()) > NOISE_NORM:
            err = float((got[key] - value).norm() / value.norm())
            assert err <= TOL, f"{name}: {key} relative error {err:.2e}"


def assert_run_matches(name: str, losses: list[float], got: dict[str, torch.Tensor], ref_losses: list[float],
                       ref: dict[str, torch.Tensor], start: dict[str, torch.Tensor]) -> None:
    """Every step's loss, every weight and the whole update agree with the reference."""
    assert losses == pytest.approx(ref_losses, rel=TOL), name
    assert_each_weight_matches(name, got, ref)
    assert update_relative_error(got, ref, start) <= UPDATE_TOL, name
