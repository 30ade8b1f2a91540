"""Forward and backward of one block on one micro-batch, advanced segment by segment across cuts.

A :class:`BlockRun` holds the autograd state of one (block, micro-batch): the block input as a leaf that
requires grad (the autograd cut at block boundaries), each segment's output, and the leaf that continues
after each cut. Forward runs segments until it meets a cut whose collective has not delivered its result;
backward runs segments in reverse until it meets a cut whose gradient collective has not delivered. The
op handlers (:mod:`executor.handlers`) issue the collectives between compute ops and feed results back,
so nothing is communicated inside autograd.

Backward comes in three flavours: ``B`` (full: :func:`torch.autograd.backward`, accumulating parameter
grads), ``I`` (input grads only, :func:`torch.autograd.grad` with ``retain_graph=True``) and ``W`` (weight
grads of every segment from the stored output gradients, later). ``I`` then ``W`` accumulates the same
values as ``B``.
"""

from __future__ import annotations

from typing import Any

import torch

from executor.block import BlockModule
from executor.precision import autocast
from executor.tp import VOCAB_CE, vocab_ce_stats
from simgrid.errors import ProgramError


class BlockRun:
    """Autograd state of one block on one micro-batch."""

    def __init__(self, module: BlockModule, microbatch: int, block_input: torch.Tensor,
                 targets: torch.Tensor | None = None, *, no_grad_forward: bool = False) -> None:
        self.module = module
        self.microbatch = microbatch
        self.targets = targets
        if block_input.is_floating_point():
            block_input = block_input.detach().requires_grad_(True)
        self.block_input = block_input
        n = module.num_segments
        self.outputs: list[torch.Tensor | None] = [None] * n
        self.leaves: list[torch.Tensor | None] = [None] * (n - 1)
        #: Forward collective results kept for recomputation (the value after each cut).
        self.cut_values: list[torch.Tensor | None] = [None] * (n - 1)
        self.fwd_done = 0
        self.output_grads: list[torch.Tensor | None] = [None] * n
        self.bwd_next = n - 1
        self.leaf_grads: list[torch.Tensor | None] = [None] * (n - 1)
        self.input_grad: torch.Tensor | None = None
        self.pending_w: list[tuple[torch.Tensor, torch.Tensor]] = []
        #: Forward without autograd graph (activation recomputation will rebuild it with an R op).
        self.no_grad_forward = no_grad_forward
        self.bwd_mode: str | None = None
        self.recomputing = False
        #: Values the block's segments share (MoE routing; :attr:`executor.block.SegmentInputs.scratch`).
        self.scratch: dict[str, Any] = {}

    # -- forward ---------------------------------------------------------------------------------
    @property
    def forward_complete(self) -> bool:
        """Every segment has run forward."""
        return self.fwd_done == self.module.num_segments

    @property
    def output(self) -> torch.Tensor:
        """Block output (the loss for the head)."""
        out = self.outputs[-1]
        if out is None:
            raise ProgramError(f"block {self.module.index} micro-batch {self.microbatch}: forward not finished")
        return out

    def forward(self) -> int | None:
        """Run segments until done (returns None) or blocked on a cut's collective (returns the cut)."""
        while self.fwd_done < self.module.num_segments:
            j = self.fwd_done
            if j > 0 and self.leaves[j - 1] is None:
                return j - 1
            with torch.set_grad_enabled(not self.no_grad_forward), \
                    autocast(self.module.compute_dtype, self.block_input.device):
                out = self.module.segment(j, self)
            self.outputs[j] = out
            self.fwd_done += 1
            if j < len(self.leaves):
                cut = self.module.cuts[j]
                if cut.forward is None:
                    self._set_leaf(j, out.detach())
                elif cut.forward == VOCAB_CE and self.module.tp.size == 1:
                    # One tensor-parallel rank holds the whole vocabulary: the statistics need no collective.
                    assert self.targets is not None
                    self.set_forward_comm_result(j, vocab_ce_stats(out.detach(), self.targets, 0, _same, _same))
                elif self.cut_values[j] is not None:  # recomputation: reuse the collective's result
                    self._take_result(j)
        return None

    def leaf(self, cut: int) -> torch.Tensor:
        """The tensor that continues after ``cut`` (input of segment ``cut + 1``)."""
        leaf = self.leaves[cut]
        if leaf is None:
            raise ProgramError(f"block {self.module.index}: segment after cut {cut} ran before its collective")
        return leaf

    def forward_comm_input(self, cut: int) -> torch.Tensor:
        """The tensor the forward collective of ``cut`` sends (segment output, pre-scaled)."""
        out = self.outputs[cut]
        if out is None:
            raise ProgramError(f"block {self.module.index}: collective of cut {cut} issued before its segment ran")
        return out.detach().clone()

    def set_forward_comm_result(self, cut: int, value: torch.Tensor) -> None:
        """The forward collective of ``cut`` delivered ``value``: continue from it."""
        self.cut_values[cut] = value.detach()
        self._take_result(cut)

    def _take_result(self, cut: int) -> None:
        value = self.cut_values[cut]
        assert value is not None
        if self.module.cuts[cut].forward == VOCAB_CE:
            # The loss cut delivers statistics; the logits themselves continue as the leaf.
            out = self.outputs[cut]
            assert out is not None
            self._set_leaf(cut, out.detach())
        else:
            self._set_leaf(cut, value)

    def _set_leaf(self, cut: int, value: torch.Tensor) -> None:
        self.leaves[cut] = value.detach().requires_grad_(not self.no_grad_forward)

    def start_recompute(self, *, fresh_collectives: bool) -> None:
        """Prepare the R op: forget the forward; with ``fresh_collectives`` the cuts wait for new results."""
        self.recomputing = True
        self.no_grad_forward = False
        self.fwd_done = 0
        self.leaves = [None] * (self.module.num_segments - 1)
        if fresh_collectives:
            self.cut_values = [None] * (self.module.num_segments - 1)

    # -- backward --------------------------------------------------------------------------------
    def set_output_grad(self, grad: torch.Tensor) -> None:
        """Gradient of the block output (a scalar loss scale for the head)."""
        self.output_grads[-1] = grad

    @property
    def backward_complete(self) -> bool:
        """Every segment has run backward (input grad known)."""
        return self.bwd_next < 0

    def backward(self, mode: str = "B") -> int | None:
        """Run segments backward (``B`` or ``I``) until done (None) or blocked on a cut's gradient collective."""
        if not self.forward_complete:
            raise ProgramError(
                f"block {self.module.index} micro-batch {self.microbatch}: backward before its forward finished "
                "(missing F or R?)"
            )
        if self.bwd_mode is None:
            self.bwd_mode = mode
        mode = self.bwd_mode
        while self.bwd_next >= 0:
            j = self.bwd_next
            grad = self.output_grads[j]
            if grad is None:
                leaf_grad = self.leaf_grads[j]
                if leaf_grad is None:
                    raise ProgramError(f"block {self.module.index}: no gradient for segment {j}")
                if self.module.cuts[j].backward is not None:
                    return j
                grad = leaf_grad
                self.output_grads[j] = grad
            self._backward_segment(j, grad, mode)
            self.bwd_next -= 1
        return None

    def backward_comm_input(self, cut: int) -> torch.Tensor:
        """The gradient the backward collective of ``cut`` sends (pre-scaled)."""
        grad = self.leaf_grads[cut]
        if grad is None:
            raise ProgramError(
                f"block {self.module.index}: gradient collective of cut {cut} issued before the backward reached it"
            )
        return grad.clone()

    def set_backward_comm_result(self, cut: int, value: torch.Tensor) -> None:
        """The backward collective of ``cut`` delivered the gradient of the segment output."""
        self.output_grads[cut] = value

    def _inputs_of(self, j: int) -> list[tuple[int, torch.Tensor]]:
        """Leaves segment ``j`` reads: (-1 for the block input or the cut index, tensor)."""
        found: list[tuple[int, torch.Tensor]] = []
        if self.block_input.requires_grad:
            found.append((-1, self.block_input))
        if j > 0:
            leaf = self.leaves[j - 1]
            assert leaf is not None
            found.append((j - 1, leaf))
        return found

    def _backward_segment(self, j: int, grad: torch.Tensor, mode: str) -> None:
        out = self.outputs[j]
        assert out is not None
        inputs = self._inputs_of(j)
        if mode == "B":
            torch.autograd.backward(out, grad)
            for where, tensor in inputs:
                if tensor.grad is not None:
                    self._store_grad(where, tensor.grad)
                    tensor.grad = None
        else:
            needed = [t for _, t in inputs]
            grads = torch.autograd.grad(out, needed, grad, retain_graph=True, allow_unused=True) if needed else ()
            for (where, _), g in zip(inputs, grads, strict=True):
                if g is not None:
                    self._store_grad(where, g)
            self.pending_w.append((out, grad))
        if j == 0:
            self.outputs = [o.detach() if o is not None else None for o in self.outputs] if mode == "B" else self.outputs

    def _store_grad(self, where: int, grad: torch.Tensor) -> None:
        if where == -1:
            self.input_grad = grad if self.input_grad is None else self.input_grad + grad
        else:
            prev = self.leaf_grads[where]
            self.leaf_grads[where] = grad if prev is None else prev + grad

    def weight_backward(self) -> None:
        """The W op: accumulate parameter grads of every segment from the gradients stored by ``I``."""
        params = [p for p in self.module.parameters() if p.requires_grad]
        for out, grad in self.pending_w:
            grads = torch.autograd.grad(out, params, grad, retain_graph=True, allow_unused=True)
            for p, g in zip(params, grads, strict=True):
                if g is not None:
                    p.grad = g if p.grad is None else p.grad + g
        self.pending_w = []
        self.outputs = [o.detach() if o is not None else None for o in self.outputs]


def _same(tensor: torch.Tensor) -> torch.Tensor:
    return tensor
