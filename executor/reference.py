"""Single-process reference: the training step every distributed layout must reproduce.

One process holds the whole model (tensor-parallel size 1) and runs, for every micro-batch of every
data-parallel replica, forward then backward through the same block modules and segments the ranks use,
accumulating gradients of the mean loss (each micro-batch loss scaled by ``1 / (m * dp)``). Then the
layout's optimizer updates every weight.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from executor.blockrun import BlockRun
from executor.data import global_batch, microbatch
from executor.model import BlockModule, build_blocks, init_weights, owned_parameters
from executor.optim import OptimizerConfig, optimizer_for, optimizer_step
from executor.tp import TPContext
from simgrid.layout.spec import Layout, check_layout
from simgrid.model.spec import ModelSpec


@dataclass(kw_only=True)
class ReferenceResult:
    """Losses and weights after the reference's steps."""

    losses: list[float]
    """Mean loss of each step (before its update)."""
    weights: dict[str, torch.Tensor]
    """Full weights after the last step, by full name."""
    optimizer_state: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    """Optimizer moments by full weight name."""


def run_forward_backward(modules: dict[int, BlockModule], tokens: torch.Tensor, targets: torch.Tensor,
                         loss_scale: float) -> float:
    """Forward and backward of one micro-batch through all blocks; returns the unscaled loss."""
    runs: list[BlockRun] = []
    x: torch.Tensor = tokens
    for index in sorted(modules):
        module = modules[index]
        run = BlockRun(module, 0, x, targets if index == max(modules) else None)
        drive_local(run, forward=True)
        runs.append(run)
        x = run.output
    loss = float(runs[-1].output.detach())
    grad = torch.tensor(loss_scale)
    for run in reversed(runs):
        run.set_output_grad(grad)
        drive_local(run, forward=False)
        if run.input_grad is not None:
            grad = run.input_grad
    return loss


def drive_local(run: BlockRun, forward: bool) -> None:
    """Advance a block, completing every cut's collective as the identity (tensor-parallel size 1)."""
    while True:
        cut = run.forward() if forward else run.backward("B")
        if cut is None:
            return
        if forward:
            run.set_forward_comm_result(cut, run.forward_comm_input(cut))
        else:
            run.set_backward_comm_result(cut, run.backward_comm_input(cut))


def reference_training(spec: ModelSpec, layout: Layout, *, seed: int = 0, steps: int = 1,
                       optimizer: OptimizerConfig | None = None) -> ReferenceResult:
    """Run ``steps`` optimizer steps of the full model on one process and return losses and weights."""
    check_layout(spec, layout)
    config = optimizer or optimizer_for(layout.optimizer)
    weights = init_weights(spec, seed)
    modules = build_blocks(spec, list(range(2 * spec.num_layers + 2)), weights, TPContext(),
                           flash_attention=layout.flash_attention)
    params = [pair for module in modules.values() for pair in owned_parameters(module)]
    states: dict[str, dict[str, torch.Tensor]] = {name: {} for name, _ in params}
    m, dp = layout.num_microbatches, layout.dp
    losses: list[float] = []
    for step in range(steps):
        tokens = global_batch(spec, layout, seed, step)
        total = 0.0
        for mb in range(m):
            for replica in range(dp):
                inputs, targets = microbatch(tokens, mb, replica)
                total += run_forward_backward(modules, inputs, targets, 1.0 / (m * dp))
        losses.append(total / (m * dp))
        for name, p in params:
            grad = p.grad if p.grad is not None else torch.zeros_like(p)
            optimizer_step(p.data, grad, states[name], config, step + 1)
            p.grad = None
    final = {name: p.detach().clone() for name, p in params}
    return ReferenceResult(losses=losses, weights=final, optimizer_state=states)
