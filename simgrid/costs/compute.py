"""Compute time of one IR compute op on a GPU (roofline per kernel) or on the host CPU (offloaded optimizer).

GPU model, per op::

    time = sum over the op's GEMMs of gemm_time(m, n, k)         # tensor cores, by full shape (fp8 ones at fp8)
         + fused_attention_time(attention_flops, shape, direction) # FlashAttention core, by shape
         + hbm_bytes / (hbm_bandwidth * hbm_efficiency)           # memory-bound kernels
         + kernels * kernel_overhead                              # launch + tail per kernel

An IR op stands for a layer's *sequence* of kernels on one CUDA stream, so their times add. Each term is
itself bounded by its own roofline (Williams, Waterman & Patterson, CACM 52(4), 2009): a GEMM
(:mod:`simgrid.costs.gemm`) by its tiles' waves at the sustained tensor rate plus its output write, and
never faster than its operands' HBM traffic; the fused attention core
(:mod:`simgrid.costs.attention`) by the FlashAttention-2/3 papers' measured speed at its sequence length
and head dim; the element-wise, normalisation, softmax and optimizer kernels by their bytes
(``op.hbm_bytes``, :mod:`simgrid.model.kernels`) at the achievable HBM bandwidth. Tensor-core work runs at
the GPU's ``sustained_clock_fraction`` of its benchmark speed: long GEMM-heavy phases hold the SM clock
below boost under the power limit, while HBM-bound kernels are not slowed (the memory clock is not
throttled). An op without a GEMM list (hand-written programs) prices ``flops - attention_flops`` at the
efficiency of its one ``gemm_mnk`` shape.

``speed`` divides the whole time: a straggler at 0.9 or an older GPU generation in a mixed cluster.
The engine applies :func:`overlap_slowdown` on top while communication shares the GPU (by its kind: SM-based
NCCL collective, point-to-point, or copy engine).
"""

from __future__ import annotations

from typing import Literal

from simgrid.costs.attention import AUTO, fused_attention_time_s
from simgrid.costs.gemm import gemm_efficiency, gemms_time_s
from simgrid.errors import SimgridError
from simgrid.hardware import GPUSpec, NodeSpec
from simgrid.hardware.attention import Direction
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
    """Seconds of ``flops`` of tensor-core work at the efficiency of one representative ``gemm_mnk`` shape."""
    if flops <= 0:
        return 0.0
    m, n, k = gemm_mnk
    return flops / (gpu.peak_flops(dtype) * gemm_efficiency(m, n, k, gpu, dtype=dtype))


def _direction(op: Compute) -> Direction:
    """Forward kernels for F and R (a recompute reruns the forward), backward for B and I."""
    return "fwd" if op.kind in ("F", "R") else "bwd"


def memory_time_s(hbm_bytes: float, gpu: GPUSpec) -> float:
    """Seconds of memory-bound work: bytes at the achievable HBM bandwidth (GB/s = 1e9 B/s)."""
    if hbm_bytes <= 0:
        return 0.0
    return hbm_bytes / (gpu.hbm_bandwidth_GBps * 1e9 * gpu.hbm_efficiency)


def compute_time_s(op: Compute, gpu: GPUSpec, *, dtype: str, speed: float = 1.0, attention_kernel: str = AUTO) -> float:
    """Seconds a GPU compute op takes on ``gpu`` at relative ``speed`` (see module docstring);
    ``attention_kernel`` picks the fused-attention table (``auto``: the profile's default)."""
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
    if op.gemms or op.accumulate_gemms or op.fp8_gemms or op.fp8_accumulate_gemms:
        tensor = gemms_time_s(op.gemms, gpu, dtype=dtype, streams=op.gemm_streams)
        if op.accumulate_gemms:
            tensor += gemms_time_s(op.accumulate_gemms, gpu, dtype=dtype, accumulate_bytes=op.accumulate_bytes,
                                   streams=op.gemm_streams)
        if op.fp8_gemms or op.fp8_accumulate_gemms:
            # Transformer Engine's fp8 GEMMs: 1-byte operands at the fp8 tensor rate, a 16-bit (or main_grad) output.
            tensor += gemms_time_s(op.fp8_gemms, gpu, dtype="fp8", streams=op.gemm_streams)
            tensor += gemms_time_s(op.fp8_accumulate_gemms, gpu, dtype="fp8", accumulate_bytes=op.accumulate_bytes,
                                   streams=op.gemm_streams)
    else:
        tensor = gemm_time_s(op.flops - op.attention_flops, op.gemm_mnk, gpu, dtype=dtype)
    attention = fused_attention_time_s(op.attention_flops, gpu, dtype=dtype, direction=_direction(op),
                                       shape=op.attention_shape, kernel=attention_kernel)
    time = tensor + attention + memory_time_s(op.hbm_bytes, gpu) + op.kernels * gpu.kernel_overhead_us * 1e-6
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


USERBUFFERS_NUM_SM = 16
"""SMs of a Transformer Engine userbuffers reduce-scatter / all-gather kernel: ``num_sm`` = 16 for every method but
``ring_exchange`` in ``initialize_ub``'s ``get_default_config`` (transformer_engine/pytorch/module/base.py, v1.8 and
v1.9); Megatron-Core passes no ``ub_cfgs`` unless ``--tp-comm-overlap-cfg`` is given."""

OverlapKind = Literal["collective", "p2p", "copy_engine", "userbuffers"]
"""What a communication op runs on, which decides what it takes from compute (:func:`overlap_slowdown`)."""


def overlap_slowdown(gpu: GPUSpec, kind: OverlapKind = "collective") -> float:
    """Fraction by which compute slows while one communication op of ``kind`` runs on the same GPU.

    * ``collective``: an NCCL collective (or an SM-based userbuffers kernel) holds one SM per CTA, which
      compute cannot share (NCCL's maintainers, NVIDIA/nccl#689), so compute keeps about
      ``1 - CTAs / sm_count`` of its rate: the profile's ``comm_compute_slowdown``.
    * ``p2p``: an NCCL send/receive runs on few CTAs per peer (``NCCL_NCHANNELS_PER_NET_PEER``):
      ``p2p_compute_slowdown``.
    * ``copy_engine``: a copy-engine memcpy (Transformer Engine's ring exchange, ``use_ce``) holds no SM;
      only its HBM traffic competes (NVIDIA/nccl#1433): ``copy_engine_compute_slowdown``.
    * ``userbuffers``: a Transformer Engine userbuffers reduce-scatter or all-gather (``--tp-comm-overlap``'s
      ``pipeline`` and ``bulk`` methods) launches exactly ``num_sm`` CTAs, one per SM (``SETUP_LAUNCH_CONFIG(sms,
      ...)`` with ``sms = comm->sms``, csrc/userbuffers/userbuffers.cu; cooperative launch), and TE's default
      ``num_sm`` is :data:`USERBUFFERS_NUM_SM`: compute keeps ``1 - num_sm / sm_count`` of its rate, the same
      SM-share rule as ``comm_compute_slowdown``'s NCCL CTAs (``comm_compute_slowdown`` without ``sm_count``).

    The last two fall back to ``comm_compute_slowdown`` when the profile predates them. The engine
    multiplies the rates ``1 - s`` of what is in flight (:mod:`simgrid.engine.overlap`): each collective
    holds its own SMs, so two take twice the share (to first order) and the rate never reaches 0.
    """
    if kind == "collective":
        return gpu.comm_compute_slowdown
    if kind == "userbuffers":
        # Without an SM count, or on a part too small to keep SMs beside TE's 16, the profile's NCCL figure
        # stands in (a share of 1 would stop compute for the collective's whole duration).
        if not gpu.sm_count or gpu.sm_count <= USERBUFFERS_NUM_SM:
            return gpu.comm_compute_slowdown
        return USERBUFFERS_NUM_SM / gpu.sm_count
    value = gpu.p2p_compute_slowdown if kind == "p2p" else gpu.copy_engine_compute_slowdown
    return gpu.comm_compute_slowdown if value is None else value
