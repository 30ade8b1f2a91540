"""AttentionKernelTable: the causal backward is the table's own where given, else derived from the forward."""

from __future__ import annotations

import pytest

from simgrid.hardware.attention import AttentionKernelTable
from simgrid.hardware.rules import FieldError


def _table(**extra: object) -> AttentionKernelTable:
    return AttentionKernelTable(name="fa2", seq_len=(1024, 4096), head_dim=(64,), fwd_causal_tflops=((100, 150),),
                                fwd_tflops=((200, 200),), bwd_tflops=((160, 180),), **extra)  # type: ignore[arg-type]


def test_causal_backward_without_its_own_grid_scales_by_the_forwards_causal_ratio() -> None:
    """No causal backward given: at 1024 it is 160 x 100 / 200 = 80 TFLOP/s."""
    table = _table()
    assert table.bwd_causal_tflops is None
    assert table.tflops("bwd", 1024, 64) == pytest.approx(80)
    assert table.tflops("bwd", 1024, 64, causal=False) == pytest.approx(160)


def test_a_given_causal_backward_is_read_directly_and_interpolated() -> None:
    """With its own grid the causal backward is read (and interpolated in log2 length) from it."""
    table = _table(bwd_causal_tflops=((90, 130),))
    assert table.tflops("bwd", 1024, 64) == pytest.approx(90)
    assert table.tflops("bwd", 2048, 64) == pytest.approx(110)
    assert table.tflops("bwd", 2048, 64, causal=False) == pytest.approx(170)
    assert table.tflops("fwd", 2048, 64) == pytest.approx(125)


def test_a_causal_backward_grid_of_the_wrong_shape_is_refused() -> None:
    """The optional grid is checked like the others: one row per head dim, one value per length."""
    with pytest.raises(FieldError, match=r"bwd_causal_tflops\[0\] = .* must have 2 values, one per seq_len"):
        _table(bwd_causal_tflops=((90,),))
