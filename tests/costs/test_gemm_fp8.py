"""fp8 GEMMs (``matmul.max_efficiency_fp8``, ``dtype="fp8"``): each shipped profile reproduces the fp8 MAMF its
constant was solved from, an fp8 GEMM is faster than the same bf16 one but never above the fp8 roofline, a
profile without the constant falls back to ``max_efficiency``, and a compute op prices its fp8 GEMM list at
the fp8 rate."""

from __future__ import annotations

import dataclasses

import pytest

from simgrid.costs import compute_time_s, gemm_shape_time_s
from simgrid.costs.gemm import sustained_tensor_flops
from simgrid.errors import ProfileError
from simgrid.hardware import GPUSpec, load_gpu
from simgrid.ir import Compute

# stas00/ml-engineering compute/accelerator/README.md, 'FP8 (float8_e4m3fn)' MAMF rows (Best Shape MxNxK).
FP8_MAMF = [("h100-sxm", (1024, 9216, 14336), 1402.6), ("h200-sxm", (1280, 4096, 12032), 1453.4),
            ("b200", (15360, 4096, 3072), 3432.5)]


@pytest.mark.parametrize(("name", "shape", "tflops"), FP8_MAMF)
def test_profiles_reproduce_the_fp8_mamf_they_cite(name: str, shape: tuple[int, int, int], tflops: float) -> None:
    """At the boost clock and with mamf-finder's fp8 output, the solved constant gives the measured rate (1%)."""
    gpu = load_gpu(name)
    burst = GPUSpec(**{**gpu.__dict__, "sustained_clock_fraction": 1.0})
    m, n, k = shape
    modelled = 2 * m * n * k / gemm_shape_time_s(m, n, k, burst, dtype="fp8", out_bytes=1) / 1e12
    assert modelled == pytest.approx(tflops, rel=0.01)
    assert gpu.matmul.max_efficiency_fp8 is not None and "fp8 MAMF" in gpu.sources["matmul.max_efficiency_fp8"]


@pytest.mark.parametrize("shape", [(4096, 4096, 4096), (8192, 12288, 4096), (4096, 4096, 11008), (512, 4096, 4096)])
def test_fp8_is_faster_than_bf16_but_never_above_its_roofline(shape: tuple[int, int, int]) -> None:
    gpu = load_gpu("h100-sxm")
    m, n, k = shape
    fp8 = gemm_shape_time_s(m, n, k, gpu, dtype="fp8")
    assert fp8 < gemm_shape_time_s(m, n, k, gpu, dtype="bf16")
    assert fp8 >= 2.0 * m * n * k / gpu.peak_flops("fp8")
    assert fp8 >= (m * k + k * n + 2 * m * n) / (gpu.hbm_bandwidth_GBps * 1e9 * gpu.hbm_efficiency)


def test_missing_fp8_constant_falls_back_to_max_efficiency() -> None:
    gpu = load_gpu("h100-sxm")
    bare = dataclasses.replace(gpu, matmul=dataclasses.replace(gpu.matmul, max_efficiency_fp8=None))
    assert sustained_tensor_flops(bare, "fp8") == pytest.approx(
        gpu.peak_flops("fp8") * gpu.matmul.max_efficiency * gpu.sustained_clock_fraction)
    assert sustained_tensor_flops(gpu, "fp8") < sustained_tensor_flops(bare, "fp8")  # 0.770 < 0.845
    assert sustained_tensor_flops(gpu, "bf16") == sustained_tensor_flops(bare, "bf16")


def test_a_compute_op_prices_its_fp8_list_at_the_fp8_rate() -> None:
    """Moving a GEMM from ``gemms`` to ``fp8_gemms`` costs what one fp8 GEMM of that shape costs; an A100 has no
    fp8 peak, so an fp8 list there is a one-line profile error."""
    gpu = load_gpu("h100-sxm")
    g = (4096, 4096, 4096, 2)
    base = Compute(kind="F", stage=0, microbatch=0, chunk=0, block_start=1, block_end=2, flops=2.0 * 4096**3 * 2,
                   hbm_bytes=0.0, kernels=0, gemms=(g,))
    fp8 = dataclasses.replace(base, gemms=(), fp8_gemms=(g,))
    assert compute_time_s(base, gpu, dtype="bf16") == pytest.approx(
        gemm_shape_time_s(4096, 4096, 4096, gpu, dtype="bf16", count=2))
    assert compute_time_s(fp8, gpu, dtype="bf16") == pytest.approx(
        gemm_shape_time_s(4096, 4096, 4096, gpu, dtype="fp8", count=2))
    with pytest.raises(ProfileError, match=r"GPU 'a100-80gb-sxm' has no peak rate for dtype 'fp8'"):
        compute_time_s(fp8, load_gpu("a100-80gb-sxm"), dtype="bf16")
