"""The base of every model block: parameters cut to this rank's shard, and a forward split into segments.

A block is one IR sub-block (:mod:`executor.model` lists them). Its forward is a chain of *segments*
separated by *cuts* (:class:`executor.tp.CutComm`); a segment reads what :class:`SegmentInputs` offers (the
block input, the leaf after each cut), which :class:`executor.blockrun.BlockRun` provides. The block never
sees the run's type, so the model sits below the code that drives it.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from executor.cp import CPContext
from executor.tp import CutComm, TPContext, shard
from simgrid.model.spec import ModelSpec


class SegmentInputs(Protocol):
    """What a segment reads of the (block, micro-batch) it runs for."""

    @property
    def block_input(self) -> torch.Tensor:
        """The block's input (token ids for the embedding, ``[s, b, h]`` activations otherwise)."""

    @property
    def targets(self) -> torch.Tensor | None:
        """Target token ids (the head only)."""

    @property
    def cut_values(self) -> list[torch.Tensor | None]:
        """The forward collective's result at each cut (the head's loss cut: the reduced logit statistics)."""

    def leaf(self, cut: int) -> torch.Tensor:
        """The tensor that continues after ``cut`` (input of segment ``cut + 1``)."""

    @property
    def scratch(self) -> dict[str, Any]:
        """Values the segments of one run share besides tensors on the autograd path (a MoE block's routing:
        which token goes to which expert, and the token counts its all-to-alls exchange)."""


NORM_EPS = 1e-5
"""Epsilon of LayerNorm / RMSNorm."""


class BlockModule(nn.Module):
    """One IR sub-block: parameters plus a forward split into segments separated by cuts."""

    positions: torch.Tensor
    """Under context parallelism: global positions of the rank's tokens (:meth:`CPContext.positions`)."""
    compute_dtype: torch.dtype | None = None
    """Autocast dtype of the forward segments (None: fp32); set by the rank that runs the block
    (:func:`executor.precision.compute_dtype`). Parameters stay fp32: they are the master weights."""

    def __init__(self, spec: ModelSpec, index: int, tp: TPContext, cp: CPContext | None = None) -> None:
        super().__init__()
        self.spec = spec
        self.index = index
        self.tp = tp
        self.cp = cp or CPContext()
        if self.cp.size > 1:
            # Global positions of the rank's tokens (a buffer, so ``.to(device)`` moves it with the weights).
            self.register_buffer("positions", self.cp.positions(spec.seq_length), persistent=False)
        self.cuts: tuple[CutComm, ...] = ()
        #: Local parameter attribute name -> (full weight name, tensor-parallel shard dim).
        self.full_names: dict[str, tuple[str, int | None]] = {}

    @property
    def num_segments(self) -> int:
        """Segments of the forward chain (one more than the cuts)."""
        return len(self.cuts) + 1

    def segment(self, j: int, run: SegmentInputs) -> torch.Tensor:
        """Run segment ``j`` on the run's block input and the leaf of cut ``j-1``; return its output."""
        raise NotImplementedError

    def _param(self, attr: str, full_name: str, weights: dict[str, torch.Tensor], dim: int | None) -> None:
        tensor = shard(weights[full_name], dim, self.tp)
        self.register_parameter(attr, nn.Parameter(tensor))
        self.full_names[attr] = (full_name, dim)

    def _norm_params(self, prefix: str, weights: dict[str, torch.Tensor]) -> None:
        self._param("norm_weight", f"{prefix}.norm.weight", weights, None)
        if self.spec.norm == "layernorm":
            self._param("norm_bias", f"{prefix}.norm.bias", weights, None)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        if self.spec.norm == "layernorm":
            return F.layer_norm(x, (x.shape[-1],), self.norm_weight, self.norm_bias, NORM_EPS)
        rms = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + NORM_EPS)
        return x * rms * self.norm_weight

    def _linear_params(self, attr: str, full: str, weights: dict[str, torch.Tensor], dim: int) -> None:
        self._param(f"{attr}_weight", f"{full}.weight", weights, dim)
        if self.spec.bias:
            self._param(f"{attr}_bias", f"{full}.bias", weights, 0 if dim == 0 else None)

    def _linear(self, x: torch.Tensor, attr: str, *, with_bias: bool = True) -> torch.Tensor:
        bias = getattr(self, f"{attr}_bias", None) if with_bias else None
        return F.linear(x, getattr(self, f"{attr}_weight"), bias)



def owned_parameters(module: BlockModule) -> list[tuple[str, nn.Parameter]]:
    """(full name, parameter) pairs this block owns: a head tied to a local embedding owns no weight copy."""
    return [(module.full_names[attr][0], p) for attr, p in module.named_parameters(recurse=False)
            if attr in module.full_names]


def shard_dim(module: BlockModule, full_name: str) -> int | None:
    """Tensor-parallel shard dimension of one of the block's parameters."""
    for name, dim in module.full_names.values():
        if name == full_name:
            return dim
    raise KeyError(full_name)
