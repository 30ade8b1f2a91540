"""Published, measured GEMM throughputs by full shape, each with the place it was read (issue 12, gemmcheck).

Every point is one ``(m, n, k)`` product ``(m x k) @ (k x n)`` timed on one GPU, as a stored public document
prints it; nothing here is from memory or derived from the model. ``benchmarks/gemm_published.py`` compares each
with :func:`simgrid.costs.gemm.gemm_shape_time_s`.

Regime (what the model must be compared with):

* ``burst``: one GPU, a short timed loop at the boost clock (stas00/ml-engineering calls this MAMF, "max
  achievable, boost burst"); compared with the model at ``sustained_clock_fraction = 1``, since that fraction is
  the power-limited clock of a long GEMM-heavy phase.
* ``sustained``: the power-limited rate; compared with the profile as shipped. On A100 (400 W) a short
  random-data GEMM already runs power-limited: the A100 profile's ``sustained_clock_fraction`` is itself solved
  from such a run (Horace He, 8192^3 randn, 257 TFLOP/s), and its ``matmul.max_efficiency`` source calls the
  MAMF table's A100 figures power-limited; so A100 MAMF rows are ``sustained`` and only all-zero inputs (no
  switching power) are ``burst``.

``status`` says how a point is counted: ``headline`` points are independent of every profile constant;
``calibration`` points are where a shipped constant was solved from (circular, printed apart); ``variant`` points
name the GPU without its variant (summarised apart); ``not-comparable`` points are printed, never summarised.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class GemmPoint:
    """One measured GEMM."""

    gpu: str
    """GPU as the source names it (A100 SXM, H100 SXM, H800, H200 SXM)."""
    profile: str
    """simgrid profile that models it (H800 is the GH100 die of H100 SXM with less NVLink: same SMs and HBM3)."""
    m: int
    """Rows of A and of the output (a batched GEMM is listed stacked along m, as simgrid.model.gemms does)."""
    n: int
    """Columns of B and of the output."""
    k: int
    """Inner (reduction) dimension."""
    dtype: str
    """bf16 or fp16 (both run at the same tensor-core rate), or fp8 (float8_e4m3fn operands)."""
    tflops: float
    """Measured TFLOP/s (2 m n k / seconds)."""
    regime: str
    """``burst`` or ``sustained`` (module docstring)."""
    source: str
    """Document, table or figure, and the line the number is read from."""
    status: str = "headline"
    """``headline`` (independent of every profile constant, provenance clear), ``calibration`` (a shipped profile
    constant was solved from it: circular), ``variant`` (the source names the GPU without its variant, e.g. H100
    without SXM/PCIe/NVL: summarised apart), ``not-comparable`` (the source's setup contradicts the same source's
    other figures: printed, never summarised)."""
    caveat: str = ""
    """Why the point is not ``headline`` (empty for headline points)."""
    out_bytes: int = 0
    """Output element width where the benchmark's differs from a training GEMM's (0: the model's own,
    ``simgrid.costs.gemm.output_bytes``): mamf-finder.py's fp8 run writes an fp8 output (``torch._scaled_mm(A, B,
    scale, scale, out=C)`` with ``C`` in the input dtype, compute/accelerator/benchmarks/mamf-finder.py)."""


_MAMF_OLD = ("stas00/ml-engineering compute/accelerator/README.md, 'Maximum Achievable Matmul FLOPS comparison table' "
             "as of 2024-08 (commit 7376725 ff., CUDA-12.1 rows; shape printed MxKxN before the 2025-01-04 'fix mnk "
             "order' commit 77da5bb, re-printed MxNxK in f0cca2f)")
_MAMF_NEW = ("stas00/ml-engineering compute/accelerator/README.md, 'Maximum Achievable Matmul FLOPS comparison table', "
             "BF16 rows, Best Shape MxNxK (commit b9e2972 and later; mean of 100 iterations after 50 warmup)")
_MAMF_FP8 = ("stas00/ml-engineering compute/accelerator/README.md, 'Maximum Achievable Matmul FLOPS comparison table', "
             "'FP8 (float8_e4m3fn)' rows, Best Shape MxNxK (commit 744d01e; mean of 100 iterations after 50 warmup; "
             "mamf-finder.py: A (m x k), B (n x k) transposed, fp8 output)")
_H800 = ("shared/reference/hardware.md, 'Measured matrix-multiply ceilings': H800 fp16, M = N = 8192, throughput by "
         "inner dimension K")
_HORACE = ("Horace He, 'Strangely, Matrix Multiplications on GPUs Run Faster When Given Predictable Data' "
           "(thonking.ai, 2024), as quoted in hardware_profiles/gpus/a100-80gb-sxm.toml [sources]")
_SWIGLU = ("stas00/ml-engineering training/performance/README.md, 'SwiGLU-based MLP': swiglu-maf-bench.py output "
           "'on H100 with h = 4096' (torch.bmm of batch 4, (4096 x d_ff) @ (d_ff x 4096), fp16, 50 warmup + 100 "
           "timed; the script's docstring: written for arXiv:2401.14489)")
_SWIGLU_CAVEAT = ("H100 variant, torch and CUDA versions not stated; 400 TFLOP/s on a 16384 x 4096 x 10944 GEMM is "
                  "half the same page's H100 SXM MAMF (794.5), so the setup is not comparable as stated")
_VLLM = ("vllm-project/vllm pull request #49363 (2026-07-21), 'H100 benchmarks for google/gemma-4-31B-it', "
         "benchmark_fp8_gemm.py --tp-sizes 1: N=12288 K=5376, column torch-bf16 by batch_size (= M)")
_VLLM_CAVEAT = "H100 variant (SXM or PCIe/NVL) not stated in the PR"
_TILEOPS = ("tile-ai/TileOPs pull request #2148 (2026-09-17), 'Accelerate H200 BMM with the shared GEMM template', "
            "Environment 'NVIDIA H200, CUDA 13.2, PyTorch 2.13.0', table BmmFwdOp, column torch-cublas (ms); shape "
            "(B, M, N, K), listed here stacked along m; TFLOP/s = 2 B M N K / time")
_AZURE = ("Azure/AI-benchmarking-guide (commit 8fd0c6e), Azure_Results/ND_A100_v4_results.md, 'GEMM CuBLASLt' table "
          "(NVIDIA A100-SXM4-80GB, CUDA 12.5, driver 550.90.07; FP16, random initialization, 10,000 warmup iterations). "
          "Benchmarks/GEMMCublasLt.py runs superbenchmark's cublaslt_gemm (fork gitaumark/superbenchmark, commit 3e2f95d "
          "of 2024-07-24, the one of the results' date): -m -n -k passed as given; D = m x n, A^T (k x m) times B "
          "(k x n), so k is the inner dimension; inputs uniform in [-1, 1]; cuBLASLt's first heuristic algorithm with "
          "a workspace of 2 m n bytes; mean of 1000 back-to-back launches (so each carries the gap between kernels); "
          "it prints m n (2k - 1) / time, converted here to 2 m n k / time (at most +0.05%)")
_TILEOPS_CAVEAT = ("H200 variant (SXM 700 W or NVL) not stated; the time is printed to 3 significant digits and a "
                   "12-31 us kernel carries its fixed per-kernel cost, which gemm_shape_time_s leaves out")

POINTS: tuple[GemmPoint, ...] = (
    # -- H800 sweep over K (same GH100 die as H100 SXM): small-K class ------------------------------------------
    *(GemmPoint(gpu="H800", profile="h100-sxm", m=8192, n=8192, k=k, dtype="fp16", tflops=t, regime="burst",
                source=f"{_H800}: {t:g} at K = {k}")
      for k, t in ((256, 386.0), (512, 520.0), (1024, 628.0), (2048, 705.0), (4096, 736.0), (8192, 758.0))),
    # -- MAMF best shapes ---------------------------------------------------------------------------------------
    GemmPoint(gpu="A100 SXM", profile="a100-80gb-sxm", m=6912, n=2048, k=16384, dtype="bf16", tflops=267.9,
              regime="sustained", source=f"{_MAMF_OLD}: 'NVIDIA A100 SXM | 267.9 | 312 | 85.9% | 6912x16384x2048'"),
    GemmPoint(gpu="A100 SXM", profile="a100-80gb-sxm", m=1024, n=10240, k=5120, dtype="bf16", tflops=271.2,
              regime="sustained", source=f"{_MAMF_NEW}: 'NVIDIA A100 SXM | 271.2 | 312 | 86.9% | 1024x10240x5120 | "
                                         "2.6.0+cu126'"),
    GemmPoint(gpu="H100 SXM", profile="h100-sxm", m=2816, n=4096, k=15616, dtype="bf16", tflops=738.6,
              regime="burst", source=f"{_MAMF_OLD} (commit of 2024-08-06): 'NVIDIA H100 SXM | 738.6 | 989 | 74.7% | "
                                     "2816x15616x4096 | CUDA-12.1'"),
    GemmPoint(gpu="H100 SXM", profile="h100-sxm", m=6144, n=2816, k=17920, dtype="bf16", tflops=792.1,
              regime="burst", source=f"{_MAMF_OLD}: 'NVIDIA H100 SXM | 792.1 | 989 | 80.1% | 6144x17920x2816 | "
                                     "CUDA-12.1'"),
    GemmPoint(gpu="H100 SXM", profile="h100-sxm", m=2048, n=2048, k=13312, dtype="bf16", tflops=794.5,
              regime="burst", status="calibration", caveat="h100-sxm matmul.max_efficiency is solved from it",
              source=f"{_MAMF_NEW}: 'NVIDIA H100 SXM | 794.5 | 989 | 80.3% | 2048x2048x13312 | 2.7.0+cu126'"),
    # -- fp8 MAMF best shapes (each profile's matmul.max_efficiency_fp8 is solved from its own) -----------------
    *(GemmPoint(gpu=gpu, profile=profile, m=m, n=n, k=k, dtype="fp8", tflops=t, regime="burst",
                status="calibration", caveat=f"{profile} matmul.max_efficiency_fp8 is solved from it", out_bytes=1,
                source=f"{_MAMF_FP8}: 'NVIDIA {gpu} | {t} | {theory} | {m}x{n}x{k} | {torch}'")
      for gpu, profile, t, theory, m, n, k, torch in (
          ("H100 SXM", "h100-sxm", 1402.6, 1979, 1024, 9216, 14336, "2.7.0+cu126"),
          ("H200 SXM", "h200-sxm", 1453.4, 1979, 1280, 4096, 12032, "2.7.1+cu128"),
          ("B200 SXM", "b200", 3432.5, 4500, 15360, 4096, 3072, "2.7.1+cu128"))),
    # -- Horace He, A100 8192^3 fp16 (both A100 matmul constants are solved from these) -------------------------
    GemmPoint(gpu="A100 SXM", profile="a100-80gb-sxm", m=8192, n=8192, k=8192, dtype="fp16", tflops=295.0,
              regime="burst", status="calibration", caveat="a100 matmul.max_efficiency is solved from it",
              source=f"{_HORACE}: 295 TFLOP/s with all-zero inputs"),
    GemmPoint(gpu="A100 SXM", profile="a100-80gb-sxm", m=8192, n=8192, k=8192, dtype="fp16", tflops=257.0,
              regime="sustained", status="calibration",
              caveat="a100 sustained_clock_fraction is solved from it", source=f"{_HORACE}: 257 TFLOP/s with randn inputs"),
    # -- Azure ND A100 v4, cuBLASLt fp16 after 10,000 warm-up launches (sustained, power-limited) ---------------
    *(GemmPoint(gpu="A100 SXM", profile="a100-80gb-sxm", m=m, n=n, k=k, dtype="fp16",
                tflops=t * 2 * k / (2 * k - 1), regime="sustained",
                source=f"{_AZURE}: row '{m} | {n} | {k} | {t:g}'")
      for m, n, k, t in ((1024, 1024, 1024, 119.4), (2048, 2048, 2048, 221.8), (4096, 4096, 4096, 228.0),
                         (8192, 8192, 8192, 253.7), (16384, 16384, 16384, 256.5), (1024, 2145, 1024, 132.8),
                         (6144, 12288, 12288, 250.8), (802816, 192, 768, 157.8))),
    # -- SwiGLU MLP GEMMs at h = 4096 (transformer class; provenance caveat) ------------------------------------
    *(GemmPoint(gpu="H100", profile="h100-sxm", m=4 * 4096, n=4096, k=d_ff, dtype="fp16", tflops=t, regime="burst",
                source=f"{_SWIGLU}: 'd_ff {d_ff}  tflops {t:.2f}'", status="not-comparable",
                caveat=_SWIGLU_CAVEAT)
      for d_ff, t in ((10944, 398.38), (10848, 395.62), (10880, 395.52), (10912, 395.16), (11008, 395.01))),
    GemmPoint(gpu="H100", profile="h100-sxm", m=4 * 4096, n=4096, k=10922, dtype="fp16", tflops=272.73,
              regime="burst", source=f"{_SWIGLU}: baseline 'd_ff 10922  tflops 272.73' (K not a multiple of 8)",
              status="not-comparable",
              caveat=_SWIGLU_CAVEAT + "; K = 10922 is misaligned for 16-byte loads, which the model does not price"),
    # -- vLLM decode/prefill GEMMs, small M (torch.mm bf16) -----------------------------------------------------
    *(GemmPoint(gpu="H100", profile="h100-sxm", m=m, n=12288, k=5376, dtype="bf16", tflops=t, regime="burst",
                source=f"{_VLLM}: row batch_size {m:g}, torch-bf16 {t}", status="variant", caveat=_VLLM_CAVEAT)
      for m, t in ((1, 2.870333), (16, 46.541434), (64, 182.588263), (128, 352.560566))),
    # -- H200 torch.bmm (cuBLAS) on small batched shapes: skinny class -------------------------------------------
    *(GemmPoint(gpu="H200", profile="h200-sxm", m=b * mm, n=nn, k=kk, dtype="bf16",
                tflops=round(2.0 * b * mm * nn * kk / (ms * 1e-3) / 1e12, 1), regime="burst",
                source=f"{_TILEOPS}: row '({b}, {mm}, {nn}, {kk}) | bfloat16', torch-cublas {ms} ms",
                status="variant", caveat=_TILEOPS_CAVEAT)
      for b, mm, nn, kk, ms in ((8, 1024, 1024, 1024, 0.0307), (16, 512, 512, 512, 0.0119))),
)
"""Every point, in source order."""


STATUSES = ("headline", "calibration", "variant", "not-comparable")
"""Every ``GemmPoint.status``."""
REGIMES = ("burst", "sustained")
"""Every ``GemmPoint.regime``."""
CLASSES = ("large", "small-K", "skinny", "narrow")
"""Every shape class, in the order the summary prints them."""


def shape_class(point: GemmPoint) -> str:
    """The shape class a point is summarised under: ``narrow`` (an output side below 256: decode steps, mostly
    bound by reading the weights),
    ``skinny`` (an output side 256-1024: the 512-row chunks of TE's ring exchange, few tiles per SM), ``small-K``
    (K < 2048 with large outputs: the epilogue's share), ``large`` (the rest)."""
    side = min(point.m, point.n)
    if side < 256:
        return "narrow"
    if side <= 1024:
        return "skinny"
    if point.k < 2048:
        return "small-K"
    return "large"
