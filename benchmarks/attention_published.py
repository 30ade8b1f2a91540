"""The unfused attention core against published A100 measurements of 'standard' (PyTorch) attention (issue 12).

Usage::

    python benchmarks/attention_published.py

Measurements (A100 80GB SXM4, fp16, batch x seqlen = 16k tokens, hidden 2048 = heads x head_dim, dropout 0):

* FlashAttention-2 paper (Dao 2023, arXiv:2307.08691, section 4.1, Fig. 4 'Attention forward + backward speed'),
  the 'Pytorch' bars as published in github.com/Dao-AILab/flash-attention assets/flash2_a100_fwd_bwd_benchmark.png
  (bar labels; the 16k bars are OOM).
* Azure/AI-benchmarking-guide Azure_Results/ND_A100_v4_results.md, 'Flash Attention 2.0': Standard
  Attention(PyTorch) 46.0 and Flash Attention 2.0 179.5 TFLOP/s for head_dim 64, batch 2, seqlen 8192.
  Benchmarks/FlashAttention.py runs benchmark_flash_attention.py and keeps the first two lines after the first
  '### ... batch_size=2, seqlen=8192 ###' header: the script's loops put causal=False, headdim=64 first, and its
  methods list puts Flash2 before Pytorch. Each line holds fwd, bwd and fwd + bwd; which one the table quotes
  is not stated. It is compared here as fwd + bwd: the PyTorch figure equals the paper's fwd + bwd bar (46).

What 'Pytorch' runs (``attention_pytorch``, benchmarks/benchmark_flash_attention.py, flash-attention commits
60499abc and e8c73447; timed by flash_attn/utils/benchmark.py ``benchmark_fwd_bwd``): from a packed
``qkv [b, s, 3, h, d]``, einops ``rearrange`` of q to ``(b h) t d`` and of k to ``(b h) d s`` (copies: the
packed strides do not merge), ``baddbmm`` (beta 0, alpha 1/sqrt(d)) into a fresh ``[b h, s, s]``; if causal an
fp32 mask built by ``full`` + ``triu`` + cast, added to the scores; ``softmax``; ``F.dropout`` with p = 0 (returns
its input: no kernel); ``einsum('bhts,bshd->bthd')``, which copies v to ``[b h, s, d]`` and runs one ``bmm``.
Backward (autograd): the einsum's two ``bmm`` (dP, dV), the softmax backward, the add's gradient (identity, no
kernel), baddbmm's two ``bmm`` each followed by a multiply by alpha, and unbind's backward, a ``stack`` of dq,
dk, dv into the packed gradient. FLOPs counted as the script does: ``4 b s^2 h d`` forward (halved when causal),
2.5x that backward.

The model prices exactly that sequence the way the simulator prices a core: each batched GEMM by its shape
stacked along m (:func:`simgrid.costs.gemm.gemm_shape_time_s`), each element-wise kernel as the bytes it reads
and writes at the profile's achievable HBM bandwidth (:func:`simgrid.costs.compute.memory_time_s`; a broadcast
operand read once per use, no cache reuse, as :mod:`simgrid.model.kernels` counts), plus the profile's
per-kernel overhead. These are short single-GPU bursts, so the profile is used at its boost clock
(``sustained_clock_fraction = 1``), as benchmarks/gemm_published.py does for bursts. Nothing is fitted. The
FlashAttention-2 bars of the same figure are the control: the profile's attention table was read from that
figure, so they agree by construction and check the FLOP and causal conventions.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import NamedTuple

from simgrid.costs import gemm_shape_time_s
from simgrid.costs.attention import fused_attention_time_s
from simgrid.costs.compute import memory_time_s
from simgrid.hardware import GPUSpec, load_gpu
from simgrid.model.flops import causal_tile_fraction

PROFILE = "a100-80gb-sxm"
HIDDEN = 2048
"""heads x head_dim in every configuration of the benchmark (``dim = 2048``)."""
SHAPES = ((32, 512), (16, 1024), (8, 2048), (4, 4096), (2, 8192))
"""(batch, seqlen) pairs with a PyTorch bar (16k ran out of memory)."""
#: FlashAttention-2 paper Fig. 4, 'Pytorch' bars, TFLOP/s fwd + bwd by (causal, head_dim), seqlen 512 ... 8k.
PYTORCH_FWD_BWD: dict[tuple[bool, int], tuple[int, ...]] = {
    (False, 64): (36, 40, 43, 45, 46),
    (False, 128): (53, 67, 76, 79, 86),
    (True, 64): (15, 16, 17, 18, 18),
    (True, 128): (23, 28, 32, 32, 34),
}
#: The same figure's 'FlashAttention-2' bars (the control), seqlen 512 ... 8k.
FLASH2_FWD_BWD: dict[tuple[bool, int], tuple[int, ...]] = {
    (False, 64): (132, 153, 162, 171, 175),
    (False, 128): (151, 173, 187, 196, 201),
    (True, 64): (88, 119, 140, 156, 165),
    (True, 128): (99, 133, 155, 173, 182),
}
#: Azure ND A100 v4 (head_dim 64, batch 2, seqlen 8192, no mask): (PyTorch, FlashAttention-2) TFLOP/s.
AZURE = (46.0, 179.5)


class Ops(NamedTuple):
    """The op sequence of one forward or backward: GEMMs ``(m, n, k)``, element-wise bytes and launches."""

    gemms: tuple[tuple[int, int, int], ...]
    hbm_bytes: int
    kernels: int


def pytorch_attention_ops(batch: int, seq: int, heads: int, head_dim: int, causal: bool) -> tuple[Ops, Ops]:
    """(forward, backward) of flash-attention's ``attention_pytorch`` in fp16 (see the module docstring)."""
    members = batch * heads
    scores = members * seq * seq * 2  # S: one [b h, s, s] fp16 tensor
    qkv = members * seq * head_dim * 2  # one of q, k, v, the output or their gradients
    qk, pv = (members * seq, seq, head_dim), (members * seq, head_dim, seq)
    # forward: q, k and v copies (read, write each), softmax (read, write)
    fwd_bytes, fwd_kernels = 3 * 2 * qkv + 2 * scores, 3 + 1
    if causal:
        # mask: full (write 4 s^2), triu (read 4, write 4), cast (read 4, write 2); add: scores and the
        # broadcast mask read, scores written
        fwd_bytes += 18 * seq * seq + 3 * scores
        fwd_kernels += 4
    fwd = Ops(gemms=(qk, pv), hbm_bytes=fwd_bytes, kernels=fwd_kernels + 2)
    # backward: dP = dO V^T and dV = P^T dO; softmax backward (read dP, P; write dS); dQ = dS K and dK = Q^T dS
    # each scaled by alpha (read, write); stack of dq, dk, dv (read 3, write 3)
    bwd_bytes = 3 * scores + 2 * 2 * qkv + 6 * qkv
    bwd = Ops(gemms=(qk, pv, pv, pv), hbm_bytes=bwd_bytes, kernels=4 + 1 + 2 + 1)
    return fwd, bwd


def burst(gpu: GPUSpec) -> GPUSpec:
    """The profile at its boost clock (a short single-GPU benchmark)."""
    return dataclasses.replace(gpu, sustained_clock_fraction=1.0)


def ops_time_s(ops: Ops, gpu: GPUSpec) -> tuple[float, float, float]:
    """(GEMM, element-wise, launch) seconds of ``ops`` as the simulator prices them."""
    gemm = sum(gemm_shape_time_s(m, n, k, gpu, dtype="fp16") for m, n, k in ops.gemms)
    return gemm, memory_time_s(ops.hbm_bytes, gpu), ops.kernels * gpu.kernel_overhead_us * 1e-6


def benchmark_flops(batch: int, seq: int, heads: int, head_dim: int, causal: bool) -> float:
    """Forward FLOPs as benchmark_flash_attention.py counts them (fwd + bwd is 3.5x)."""
    return 4.0 * batch * seq * seq * heads * head_dim / (2 if causal else 1)


class Point(NamedTuple):
    """One configuration compared: the measurement, the model's rate and its split."""

    causal: bool
    head_dim: int
    batch: int
    seq: int
    measured_tflops: float
    model_tflops: float
    gemm_s: float
    elementwise_s: float
    launch_s: float
    elementwise_bytes: int

    @property
    def error(self) -> float:
        return self.model_tflops / self.measured_tflops - 1.0

    @property
    def implied_bandwidth_GBps(self) -> float:
        """Bandwidth the element-wise bytes would need for the measured time if the GEMMs took the modelled time."""
        measured_s = self.model_tflops / self.measured_tflops * (self.gemm_s + self.elementwise_s + self.launch_s)
        return self.elementwise_bytes / max(measured_s - self.gemm_s - self.launch_s, 1e-12) / 1e9


def pytorch_point(gpu: GPUSpec, causal: bool, head_dim: int, batch: int, seq: int, measured: float) -> Point:
    heads = HIDDEN // head_dim
    fwd, bwd = pytorch_attention_ops(batch, seq, heads, head_dim, causal)
    gemm_s, elementwise_s, launch_s = (a + b for a, b in zip(ops_time_s(fwd, gpu), ops_time_s(bwd, gpu), strict=True))
    flops = 3.5 * benchmark_flops(batch, seq, heads, head_dim, causal)
    return Point(causal, head_dim, batch, seq, measured, flops / (gemm_s + elementwise_s + launch_s) / 1e12,
                 gemm_s, elementwise_s, launch_s, fwd.hbm_bytes + bwd.hbm_bytes)


def flash2_tflops(gpu: GPUSpec, causal: bool, head_dim: int, batch: int, seq: int) -> float:
    """The simulator's FlashAttention-2 fwd + bwd TFLOP/s for the same configuration (the control). A causal
    core goes through :func:`fused_attention_time_s` as a training op does (executed tiles converted back to
    the paper's half-square count); the simulator never runs a non-causal core, so that one reads the profile's
    non-causal rows directly."""
    heads = HIDDEN // head_dim
    paper_fwd = benchmark_flops(batch, seq, heads, head_dim, causal)
    if causal:
        executed = 2.0 * paper_fwd * causal_tile_fraction(seq)
        shape = (seq, seq, head_dim)
        t = (fused_attention_time_s(executed, gpu, dtype="fp16", direction="fwd", shape=shape)
             + fused_attention_time_s(2.5 * executed, gpu, dtype="fp16", direction="bwd", shape=shape))
    else:
        table = gpu.fused_attention["fa2"]
        t = (paper_fwd / (table.tflops("fwd", seq, head_dim, causal=False) * 1e12)
             + 2.5 * paper_fwd / (table.tflops("bwd", seq, head_dim, causal=False) * 1e12))
    return 3.5 * paper_fwd / t / 1e12


def _mask_add_rate_GBps(gpu: GPUSpec, head_dim: int, batch: int, seq: int, causal_tflops: float,
                        full_tflops: float) -> float:
    """The causal run minus the non-causal one is the mask (build and add) alone: its modelled bytes over the
    measured time difference."""
    heads = HIDDEN // head_dim
    flops = 3.5 * benchmark_flops(batch, seq, heads, head_dim, False)
    extra_s = flops / 2 / (causal_tflops * 1e12) - flops / (full_tflops * 1e12)
    scores = batch * heads * seq * seq * 2
    return (18 * seq * seq + 3 * scores) / extra_s / 1e9


def matching_hbm_efficiency(gpu: GPUSpec, point: Point) -> float:
    """Diagnostic only (never applied): the ``hbm_efficiency`` at which the modelled time of ``point`` (GEMMs
    through the tile model, whose epilogue and memory ceiling use it too, and the element-wise bytes) equals
    the measured time; bisection on the profile's own model."""
    lo, hi = 0.05, 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        trial = dataclasses.replace(gpu, hbm_efficiency=mid)
        model = pytorch_point(trial, point.causal, point.head_dim, point.batch, point.seq, point.measured_tflops)
        lo, hi = (lo, mid) if model.model_tflops > point.measured_tflops else (mid, hi)
    return (lo + hi) / 2


def main() -> None:
    gpu = burst(load_gpu(PROFILE))
    bandwidth = gpu.hbm_bandwidth_GBps * gpu.hbm_efficiency
    print(f"Unfused ('Pytorch') attention, fwd + bwd TFLOP/s, {PROFILE} at boost clock "
          f"(HBM {bandwidth:.0f} GB/s achievable); error = model / measured - 1 (+ = model faster)")
    print("| mask | d | b x s | measured | model | error | GEMM ms | elem ms | elem GB | implied elem GB/s | "
          "FA2 measured | FA2 model |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    points = []
    for (causal, head_dim), values in PYTORCH_FWD_BWD.items():
        for (batch, seq), measured, fa2 in zip(SHAPES, values, FLASH2_FWD_BWD[causal, head_dim], strict=True):
            pt = pytorch_point(gpu, causal, head_dim, batch, seq, measured)
            points.append(pt)
            print(f"| {'causal' if causal else 'none'} | {head_dim} | {batch} x {seq} | {measured} | "
                  f"{pt.model_tflops:.1f} | {pt.error:+.0%} | {pt.gemm_s * 1e3:.2f} | {pt.elementwise_s * 1e3:.2f} | "
                  f"{pt.elementwise_bytes / 1e9:.1f} | {pt.implied_bandwidth_GBps:.0f} | {fa2} | "
                  f"{flash2_tflops(gpu, causal, head_dim, batch, seq):.0f} |")
    errors = [p.error for p in points]
    matching = [matching_hbm_efficiency(gpu, p) for p in points]
    print(f"hbm_efficiency at which each PyTorch point would match (diagnostic, profile {gpu.hbm_efficiency}): "
          f"{min(matching):.2f} .. {max(matching):.2f}, median {statistics.median(matching):.2f}")
    print(f"PyTorch points: n = {len(points)}, mean error {statistics.mean(errors):+.1%}, "
          f"range {min(errors):+.0%} .. {max(errors):+.0%}")
    azure = pytorch_point(gpu, False, 64, 2, 8192, AZURE[0])
    print(f"Azure ND A100 v4 (d 64, b 2, s 8192, no mask, read as fwd + bwd): PyTorch measured {AZURE[0]}, "
          f"model {azure.model_tflops:.1f} ({azure.error:+.0%}); FlashAttention-2 measured {AZURE[1]}, model "
          f"{flash2_tflops(gpu, False, 64, 2, 8192):.0f}")
    print("Mask alone (causal minus no-mask time, modelled bytes 3 S + 18 s^2 over it), GB/s:")
    for head_dim in (64, 128):
        rates = [_mask_add_rate_GBps(gpu, head_dim, b, s, c, f) for (b, s), c, f in
                 zip(SHAPES, PYTORCH_FWD_BWD[True, head_dim], PYTORCH_FWD_BWD[False, head_dim], strict=True)]
        print(f"  d {head_dim}: " + ", ".join(f"s {s}: {r:.0f}" for (_, s), r in zip(SHAPES, rates, strict=True)))


if __name__ == "__main__":
    main()
