"""Compute time of one IR compute op on a GPU (roofline) or on the host CPU (offloaded optimizer).

GPU model, per op::

    time = (flops - attention_flops) / (peak(dtype) * matmul_efficiency(M, N, K))  # GEMM work
         + attention_flops / (peak(dtype) * attention_efficiency)  # fused attention core
         + hbm_bytes / (hbm_bandwidth * hbm_efficiency)           # memory-bound kernels
         + kernels * kernel_overhead                              # launch + tail per kernel

The first two terms are the two ceilings of the roofline model (Williams, Waterman & Patterson,
"Roofline: an insightful visual performance model for multicore architectures", CACM 52(4), 2009).
A single kernel is bound by the larger of its two ceilings, but an IR op stands for a layer's *sequence*
of kernels: its GEMMs (compute-bound; their operand traffic is what ``matmul.efficiency`` already
accounts for) and its element-wise / normalisation / softmax kernels (memory-bound; ``op.hbm_bytes``
counts only their traffic, see :class:`simgrid.ir.ops.Compute`). Those kernels run one after the other
on one CUDA stream, so their times add rather than overlap, and each kernel pays its launch overhead.

A fused attention core (FlashAttention) does its ``Q K^T`` and ``P V`` products on the tensor cores but
its online softmax on the CUDA cores inside the same kernel, so it sustains less of the peak than a GEMM:
FlashAttention-2 reports 50-73% of A100 peak (Dao 2023, arXiv:2307.08691) against 86% for a large GEMM.
The GPU profile's ``fused_attention_efficiency`` prices those FLOPs (``op.attention_flops``).

``speed`` divides the whole time: a straggler at 0.9 or an older GPU generation in a mixed cluster.
The engine applies :func:`overlap_slowdown` on top while a communication kernel shares the GPU.
"""

from __future__ import annotations

from simgrid.errors import SimgridError
from simgrid.hardware import GPUSpec, NodeSpec
from simgrid.ir.ops import Compute

ADAM_FLOPS_PER_PARAM = 14.0
"""FLOPs per parameter the schedule builder writes into an Adam ``OPT`` op (Kingma & Ba 2015, Alg. 1:
moments 3 + 4, bias corrections 2, update 5; ``simgrid.schedules.lower.optimizer.OPTIMIZER_FLOPS_PER_PARAM``,
kept equal by a test). The node's CPU-Adam rate times this is the host's optimizer FLOP rate, so an
offloaded SGD or 8-bit Adam step scales by its own FLOPs per parameter."""


def _check_speed(speed: float) -> None:
    if not speed > 0:
        raise SimgridError(f"speed = {speed!r} must be > 0 (1.0 = nominal; 0.5 = a GPU running at half speed)")


def gemm_time_s(flops: float, gemm_mnk: tuple[int, int, int], gpu: GPUSpec, *, dtype: str) -> float:
    """Seconds of tensor-core work: flops at the dtype's peak times the shape's matmul efficiency."""
    if flops <= 0:
        return 0.0
    m, n, k = gemm_mnk
    return flops / (gpu.peak_flops(dtype) * gpu.matmul.efficiency(m, n, k))


def fused_attention_time_s(flops: float, gpu: GPUSpec, *, dtype: str) -> float:
    """Seconds of a fused attention core's FLOPs at the GPU's attention-kernel efficiency."""
    if flops <= 0:
        return 0.0
    return flops / (gpu.peak_flops(dtype) * gpu.attention_efficiency)


def memory_time_s(hbm_bytes: float, gpu: GPUSpec) -> float:
    """Seconds of memory-bound work: bytes at the achievable HBM bandwidth (GB/s = 1e9 B/s)."""
    if hbm_bytes <= 0:
        return 0.0
    return hbm_bytes / (gpu.hbm_bandwidth_GBps * 1e9 * gpu.hbm_efficiency)


def compute_time_s(op: Compute, gpu: GPUSpec, *, dtype: str, speed: float = 1.0) -> float:
    """Seconds a GPU compute op takes on ``gpu`` at relative ``speed`` (see module docstring)."""
    if op.device != "gpu":
        raise SimgridError(
            f"compute op {op.kind} has device = {op.device!r}; host ops are timed by host_compute_time_s(op, node)"
        )
    _check_speed(speed)
    if op.flops < 0 or op.hbm_bytes < 0 or op.kernels < 0:
        raise SimgridError(
            f"compute op {op.kind} (stage {op.stage}, micro-batch {op.microbatch}) has negative cost: "
            f"flops = {op.flops}, hbm_bytes = {op.hbm_bytes}, kernels = {op.kernels}; costs must be >= 0"
        )
    if not 0 <= op.attention_flops <= op.flops:
        raise SimgridError(
            f"compute op {op.kind} (stage {op.stage}, micro-batch {op.microbatch}) has attention_flops = "
            f"{op.attention_flops} outside 0 .. flops = {op.flops}; the fused-attention FLOPs are part of flops"
        )
    time = (
        gemm_time_s(op.flops - op.attention_flops, op.gemm_mnk, gpu, dtype=dtype)
        + fused_attention_time_s(op.attention_flops, gpu, dtype=dtype)
        + memory_time_s(op.hbm_bytes, gpu)
        + op.kernels * gpu.kernel_overhead_us * 1e-6
    )
    return time / speed


def host_optimizer_time_s(params: float, node: NodeSpec) -> float:
    """Seconds the node's CPUs take to Adam-update ``params`` parameters (ZeRO-Offload's CPU-Adam rate,
    ``host_adam_params_per_s`` in the node profile)."""
    if params < 0:
        raise SimgridError(f"params = {params!r} must be >= 0")
    return params / node.host_adam_params_per_s


def host_compute_time_s(op: Compute, node: NodeSpec, *, speed: float = 1.0) -> float:
    """Seconds an offloaded (``device="cpu"``) optimizer op takes on the node's CPUs:
    ``op.flops / (host_adam_params_per_s * ADAM_FLOPS_PER_PARAM)``."""
    if op.device != "cpu":
        raise SimgridError(f"compute op {op.kind} has device = {op.device!r}; GPU ops are timed by compute_time_s")
    if op.kind != "OPT":
        raise SimgridError(f"compute op kind = {op.kind!r} on the host; only OPT (optimizer step) can be offloaded")
    _check_speed(speed)
    return host_optimizer_time_s(op.flops / ADAM_FLOPS_PER_PARAM, node) / speed


def overlap_slowdown(gpu: GPUSpec) -> float:
    """Fraction by which compute slows while a communication kernel runs on the same GPU.

    NCCL kernels occupy SMs and HBM bandwidth, so overlapped compute progresses at ``1 - s`` of its
    normal rate (the profile's ``comm_compute_slowdown``; 0 on the ideal GPU). The engine applies it to
    the part of a compute op that overlaps communication: duration stretches by ``1 / (1 - s)``.
    """
    return gpu.comm_compute_slowdown
