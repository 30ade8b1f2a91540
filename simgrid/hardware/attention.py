"""Measured speed of fused attention kernels (FlashAttention-2/3) by sequence length, head dim and direction.

A GPU profile may carry one :class:`AttentionKernelTable` per kernel family (``fa2``, ``fa3``) transcribed
from the papers' benchmark figures. Speeds are TFLOP/s as the papers count them: forward ``4 s^2 d`` per
head and sequence, halved for the causal mask; backward 2.5 times the forward (the FlashAttention
benchmark scripts' convention). A table lists the forward with the causal mask (what a decoder trains
with), and the forward and backward without it. FlashAttention-3 publishes the backward only without the
mask, so the causal backward is derived from it with the forward's causal-to-full ratio at the same length
(:meth:`AttentionKernelTable.tflops`): the mask costs both directions the same diagonal-tile waste and load
imbalance. A table may instead carry its own causal backward (``bwd_causal_tflops``) where the source
measured one (FlashAttention-2 on A100, with and without the mask in every direction).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from simgrid.hardware.rules import FieldError, check_positive, check_strictly_ascending, check_text, piecewise_linear

Direction = Literal["fwd", "bwd"]
ATTENTION_KERNELS: tuple[str, ...] = ("fa2", "fa3")
"""Kernel families a profile may tabulate: FlashAttention-2 (Dao 2023) and FlashAttention-3 (Shah et al. 2024)."""


def _grid(owner: str, field: str, value: Sequence[Sequence[float]], rows: int, cols: int) -> tuple[tuple[float, ...], ...]:
    grid = tuple(tuple(float(x) for x in row) for row in value)
    if len(grid) != rows:
        raise FieldError(field, grid, f"must have {rows} rows, one per head_dim", owner=owner)
    for i, row in enumerate(grid):
        if len(row) != cols:
            raise FieldError(f"{field}[{i}]", row, f"must have {cols} values, one per seq_len", owner=owner)
        for j, x in enumerate(row):
            check_positive(owner, f"{field}[{i}][{j}]", x)
    return grid


def _ascending(owner: str, field: str, values: tuple[int, ...]) -> None:
    if not values:
        raise FieldError(field, values, "must have at least one point", owner=owner)
    check_strictly_ascending(owner, field, values)


@dataclass(frozen=True, kw_only=True)
class AttentionKernelTable:
    """Published speed of one fused-attention kernel on one GPU, TFLOP/s at the benchmark's (burst) clock."""

    name: str
    """Kernel family: ``fa2`` or ``fa3``."""
    seq_len: tuple[int, ...]
    """Sequence lengths of the table's columns, ascending (the papers use 512 ... 16k)."""
    head_dim: tuple[int, ...]
    """Head dimensions of the table's rows, ascending."""
    fwd_causal_tflops: tuple[tuple[float, ...], ...]
    """Forward with the causal mask, one row per head dim, causal FLOPs (half the square)."""
    fwd_tflops: tuple[tuple[float, ...], ...]
    """Forward without the mask."""
    bwd_tflops: tuple[tuple[float, ...], ...]
    """Backward without the mask (2.5 times the forward's FLOPs)."""
    bwd_causal_tflops: tuple[tuple[float, ...], ...] | None = None
    """Backward with the causal mask where the source gives it; ``None``: the backward without the mask times
    the forward's causal-to-full ratio at the same shape."""

    def __post_init__(self) -> None:
        owner = "AttentionKernelTable"
        check_text(owner, "name", self.name)
        if self.name not in ATTENTION_KERNELS:
            raise FieldError("name", self.name, "must be one of " + ", ".join(map(repr, ATTENTION_KERNELS)), owner=owner)
        object.__setattr__(self, "seq_len", tuple(self.seq_len))
        object.__setattr__(self, "head_dim", tuple(self.head_dim))
        _ascending(owner, "seq_len", self.seq_len)
        _ascending(owner, "head_dim", self.head_dim)
        rows, cols = len(self.head_dim), len(self.seq_len)
        for field in ("fwd_causal_tflops", "fwd_tflops", "bwd_tflops"):
            object.__setattr__(self, field, _grid(owner, field, getattr(self, field), rows, cols))
        if self.bwd_causal_tflops is not None:
            object.__setattr__(self, "bwd_causal_tflops",
                               _grid(owner, "bwd_causal_tflops", self.bwd_causal_tflops, rows, cols))

    def _at(self, grid: tuple[tuple[float, ...], ...], seq_len: float, head_dim: float) -> float:
        logs = [math.log2(s) for s in self.seq_len]
        x = math.log2(max(seq_len, 1.0))
        per_dim = [piecewise_linear(logs, row, x) for row in grid]
        return piecewise_linear([float(d) for d in self.head_dim], per_dim, float(head_dim))

    def tflops(self, direction: Direction, seq_len: float, head_dim: float, *, causal: bool = True) -> float:
        """Speed at one shape: piecewise-linear in log2(sequence length) and in head dim, clamped outside
        the table. The causal backward is the table's own where it has one, otherwise its backward times the
        forward's causal-to-full ratio."""
        if direction == "fwd":
            return self._at(self.fwd_causal_tflops if causal else self.fwd_tflops, seq_len, head_dim)
        full = self._at(self.bwd_tflops, seq_len, head_dim)
        if not causal:
            return full
        if self.bwd_causal_tflops is not None:
            return self._at(self.bwd_causal_tflops, seq_len, head_dim)
        ratio = self._at(self.fwd_causal_tflops, seq_len, head_dim) / self._at(self.fwd_tflops, seq_len, head_dim)
        return full * ratio
