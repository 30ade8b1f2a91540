"""benchmarks/attention_published.py: the op sequence of flash-attention's PyTorch baseline is counted as its
code runs it, the FlashAttention-2 control reproduces its own figure, and the comparison prints every point."""

from __future__ import annotations

from types import ModuleType

import pytest
from script_modules import load_benchmark

from simgrid.hardware import load_gpu


def _load() -> ModuleType:
    return load_benchmark("attention_published", "attention_published_benchmark")


def test_gemm_flops_are_the_benchmarks_count_and_bytes_are_counted_by_hand() -> None:
    """Non-causal: the two forward GEMMs do the script's 4 b s^2 h d, the four backward ones twice that.
    Bytes for b 2, s 8192, 32 heads of 64: forward q/k/v copies (2 each) and softmax (read, write); backward
    softmax (3), two alpha multiplies (2 each) and the stack of three gradients (6); causal adds the mask
    (18 s^2 to build, read scores and mask, write scores)."""
    mod = _load()
    b, s, h, hd = 2, 8192, 32, 64
    fwd, bwd = mod.pytorch_attention_ops(b, s, h, hd, False)
    flops = mod.benchmark_flops(b, s, h, hd, False)
    assert sum(2 * m * n * k for m, n, k in fwd.gemms) == flops
    assert sum(2 * m * n * k for m, n, k in bwd.gemms) == 2 * flops
    S, Q = b * h * s * s * 2, b * h * s * hd * 2
    assert fwd.hbm_bytes == 6 * Q + 2 * S and bwd.hbm_bytes == 3 * S + 10 * Q
    causal, _ = mod.pytorch_attention_ops(b, s, h, hd, True)
    assert causal.hbm_bytes - fwd.hbm_bytes == 18 * s * s + 3 * S
    assert mod.benchmark_flops(b, s, h, hd, True) == flops / 2


def test_flash2_control_reproduces_the_figure_it_was_read_from() -> None:
    """The profile's FA2 table came from the same figure: the control agrees to rounding at every point."""
    mod = _load()
    gpu = mod.burst(load_gpu(mod.PROFILE))
    for (causal, hd), values in mod.FLASH2_FWD_BWD.items():
        for (b, s), measured in zip(mod.SHAPES, values, strict=True):
            assert mod.flash2_tflops(gpu, causal, hd, b, s) == pytest.approx(measured, abs=1.5)


def test_main_prints_every_point_and_the_azure_line(capsys: pytest.CaptureFixture[str]) -> None:
    """20 PyTorch rows, the summary, the Azure point and the mask-alone rates."""
    mod = _load()
    mod.main()
    out = capsys.readouterr().out
    assert out.count("| none |") == 10 and out.count("| causal |") == 10
    assert "PyTorch points: n = 20" in out and "Azure ND A100 v4" in out and "Mask alone" in out
