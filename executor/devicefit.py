"""A GPU profile fitted to device micro-benchmarks (:mod:`executor.kernelbench`), and the calibrated cluster profile.

The engine prices a GPU op with the roofline of :mod:`simgrid.costs.compute`; calibration replaces the
datasheet's assumed efficiencies with measured ones and keeps the datasheet's peaks, so every number stays
a fraction of a published rate:

* ``matmul.max_efficiency``: the *sustained* large-GEMM rate (median of the last third of a long run) over
  the dtype's peak: a training step runs for hours, not for the first second of boost clock;
* ``matmul.relative``: the inner-dimension sweep (``8192 x 8192 x K``) normalised to its largest K, the
  same experiment the shipped curve comes from (H800 sweep, shared/reference/hardware.md);
* ``fused_attention_efficiency``: FLOPs over time of the fused causal attention cores at the calibration
  models' own shapes, in the cost model's FLOP convention (forward causal tiles, backward 2.5x);
* ``hbm_efficiency``: the largest device-to-device copy (bytes read plus written) over the datasheet bandwidth;
* ``kernel_overhead_us``: the device-side time per tiny kernel replayed from a CUDA graph (the executor
  queues kernels ahead of the GPU, so the host's launch cost, also recorded, is hidden unless the host lags);
* ``memory_GiB``: the device's reported capacity.

The profile is the datasheet cluster with the calibrated GPU inlined and every raw measurement in its
``[measured]`` compute table under keys starting with :data:`KERNEL_PREFIX` (the same TOML shape as the CPU
calibration; those keys never match an op, so the engine keeps its roofline formulas for GPU ops).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from executor.kernelbench import AttentionRow, DeviceBench, GemmRow, MemoryRow
from simgrid.hardware import ClusterSpec, ComputeRow, GPUSpec, MatmulEfficiency, MeasuredTables

KERNEL_PREFIX = "KERNEL:"
"""Key prefix of device micro-benchmark rows in a profile's measured compute table."""


@dataclass(frozen=True, kw_only=True)
class DeviceFit:
    """Efficiencies of one GPU fitted to its micro-benchmarks."""

    matmul: MatmulEfficiency
    """GEMM efficiency: sustained plateau and the inner-dimension curve."""
    burst_efficiency: float
    """First-window GEMM rate of the long run over the peak."""
    fused_attention_efficiency: float | None
    """Fused attention FLOP rate over the peak at the fitted shapes (None: no attention rows)."""
    hbm_efficiency: float
    """Largest copy's bandwidth over the datasheet's."""
    kernel_overhead_us: float
    """Device-side microseconds per kernel."""


def efficiency(rate_flops: float, peak_flops: float) -> float:
    """A measured rate as a fraction of the peak, kept inside (0, 1] (a profile's efficiency range)."""
    return min(1.0, max(rate_flops / peak_flops, 1e-6))


def fit_matmul(sweep: Sequence[GemmRow], plateau_tflops: float, peak_flops: float) -> MatmulEfficiency:
    """``max_efficiency`` from the plateau rate; ``relative`` by inner dimension from the sweep."""
    if not sweep:
        return MatmulEfficiency(max_efficiency=efficiency(plateau_tflops * 1e12, peak_flops))
    rows = sorted(sweep, key=lambda r: min(r.m, r.n, r.k))
    top = rows[-1].tflops
    dims = tuple(min(r.m, r.n, r.k) for r in rows)
    relative = tuple(min(1.0, max(r.tflops / top, 1e-6)) for r in rows)
    return MatmulEfficiency(max_efficiency=efficiency(plateau_tflops * 1e12, peak_flops), min_dim=dims,
                            relative=relative)


def fit_attention(rows: Iterable[AttentionRow], peak_flops: float) -> float | None:
    """FLOP-weighted efficiency of the fused attention cores (total FLOPs over total time over the peak)."""
    chosen = list(rows)
    if not chosen:
        return None
    seconds = sum(r.fwd_s + r.bwd_s for r in chosen)
    return efficiency(sum(r.flops for r in chosen) / seconds, peak_flops)


def copy_bandwidth_GBps(memory: Iterable[MemoryRow]) -> float | None:
    """GB/s of the largest copy measured, or None."""
    copies = [r for r in memory if r.kernel == "copy"]
    return max(copies, key=lambda r: r.bytes_moved).GBps if copies else None


def fit_device(bench: DeviceBench, base: GPUSpec, *, dtype: str,
               attention_shapes: Iterable[tuple[int, int, int]] | None = None) -> DeviceFit:
    """Fit ``base``'s efficiencies to ``bench``; ``attention_shapes`` (heads, head_dim, seq) pick the attention
    rows the efficiency is fitted on (None: all of them)."""
    peak = base.peak_flops(dtype)
    if bench.sustained is not None:
        burst, plateau = bench.sustained.burst_tflops, bench.sustained.sustained_tflops
    elif bench.sweep:
        burst = plateau = max(bench.sweep, key=lambda r: r.k).tflops
    else:  # nothing measured: the datasheet's plateau stays
        burst = plateau = base.matmul.max_efficiency * peak / 1e12
    shapes = set(attention_shapes) if attention_shapes is not None else None
    attention = [r for r in bench.attention if shapes is None or (r.heads, r.head_dim, r.seq_length) in shapes]
    copy = copy_bandwidth_GBps(bench.memory)
    return DeviceFit(
        matmul=fit_matmul(bench.sweep, plateau, peak),
        burst_efficiency=efficiency(burst * 1e12, peak),
        fused_attention_efficiency=fit_attention(attention, peak),
        hbm_efficiency=efficiency(copy, base.hbm_bandwidth_GBps) if copy is not None else base.hbm_efficiency,
        kernel_overhead_us=bench.launch.device_us if bench.launch is not None else base.kernel_overhead_us,
    )


def calibrated_gpu(base: GPUSpec, fit: DeviceFit, bench: DeviceBench, *, memory_GiB: float | None = None,
                   when: str = "") -> GPUSpec:
    """``base`` with the fitted efficiencies, each with a source line naming the measurement."""
    where = f"measured on {bench.device}{f' on {when}' if when else ''} by simgrid-exec calibrate"
    sources = dict(base.sources)
    sustained = bench.sustained
    sources.update({
        "matmul.max_efficiency": f"{where}: sustained {bench.dtype} GEMM rate (median of the last third of a "
        f"{len(sustained.window_tflops) if sustained else 0}-window run of {sustained.size if sustained else 0}^3 "
        f"GEMMs; first window {fit.burst_efficiency:.3f} of peak) over the datasheet peak",
        "matmul.min_dim": f"{where}: inner-dimension sweep, M = N = 8192",
        "matmul.relative": f"{where}: sweep throughput at each K over its largest-K value",
        "hbm_efficiency": f"{where}: largest device-to-device copy (bytes read + written) over the datasheet bandwidth",
        "kernel_overhead_us": f"{where}: device time per tiny kernel replayed from a CUDA graph (eager host launch: "
        f"{bench.launch.host_us:.1f} us)" if bench.launch else f"{where}: not measured, datasheet value kept",
    })
    if fit.fused_attention_efficiency is not None:
        sources["fused_attention_efficiency"] = (f"{where}: causal scaled_dot_product_attention forward + backward "
                                                 "at the calibration models' shapes, cost-model FLOP convention")
    if memory_GiB is not None:
        sources["memory_GiB"] = f"{where}: torch.cuda.get_device_properties().total_memory"
    # The fitted max_efficiency is the measured sustained rate, so the datasheet's sustained-clock fraction
    # must not apply again; a measured attention figure replaces the published FlashAttention tables.
    sources["sustained_clock_fraction"] = f"{where}: 1.0, the measured max_efficiency is already the sustained rate"
    measured_attention = fit.fused_attention_efficiency is not None
    if measured_attention:
        sources.pop("fused_attention", None)
    return dataclasses.replace(
        base, name=f"{base.name}-calibrated", description=f"{base.description}, efficiencies {where}",
        matmul=fit.matmul, hbm_efficiency=fit.hbm_efficiency, kernel_overhead_us=fit.kernel_overhead_us,
        sustained_clock_fraction=1.0,
        fused_attention={} if measured_attention else base.fused_attention,
        attention_kernel=None if measured_attention else base.attention_kernel,
        fused_attention_efficiency=(fit.fused_attention_efficiency if fit.fused_attention_efficiency is not None
                                    else base.fused_attention_efficiency),
        memory_GiB=memory_GiB if memory_GiB is not None else base.memory_GiB, sources=sources)


def bench_rows(bench: DeviceBench) -> list[ComputeRow]:
    """Every raw measurement as a measured compute row (time in microseconds) under :data:`KERNEL_PREFIX`."""
    rows: dict[str, float] = {}
    for r in (*bench.gemms, *bench.sweep):
        rows[f"{KERNEL_PREFIX}gemm:{bench.dtype}:m={r.m}:n={r.n}:k={r.k}"] = r.seconds * 1e6
    for a in bench.attention:
        shape = f"{bench.dtype}:b={a.batch}:heads={a.heads}:d={a.head_dim}:s={a.seq_length}"
        rows[f"{KERNEL_PREFIX}attention-fwd:{shape}"] = a.fwd_s * 1e6
        rows[f"{KERNEL_PREFIX}attention-bwd:{shape}"] = a.bwd_s * 1e6
    for m in bench.memory:
        rows[f"{KERNEL_PREFIX}memory:{m.kernel}:{bench.dtype}:elements={m.elements}"] = m.seconds * 1e6
    if bench.sustained is not None:
        s = bench.sustained
        gemm_us = 2.0 * s.size**3 / 1e6  # microseconds of one GEMM at 1 TFLOP/s
        rows[f"{KERNEL_PREFIX}gemm-burst:{bench.dtype}:m={s.size}:n={s.size}:k={s.size}"] = gemm_us / s.burst_tflops
        rows[f"{KERNEL_PREFIX}gemm-sustained:{bench.dtype}:m={s.size}:n={s.size}:k={s.size}"] = (
            gemm_us / s.sustained_tflops)
    if bench.launch is not None:
        rows[f"{KERNEL_PREFIX}launch:host"] = bench.launch.host_us
        rows[f"{KERNEL_PREFIX}launch:device"] = bench.launch.device_us
    return [ComputeRow(key=k, time_us=v) for k, v in sorted(rows.items())]


def device_profile(base: ClusterSpec, gpu: GPUSpec, bench: DeviceBench, *, name: str) -> ClusterSpec:
    """The datasheet cluster ``base`` with the calibrated ``gpu`` and the raw tables (self-contained TOML)."""
    node = dataclasses.replace(base.node, name=f"{base.node.name}-calibrated", gpu=gpu)
    measured = MeasuredTables(compute=tuple(bench_rows(bench)), memory_bandwidth_GBps=copy_bandwidth_GBps(bench.memory))
    return dataclasses.replace(
        base, name=name, node=node, measured=measured,
        description=f"{base.description}; GPU calibrated on {bench.device} (node and network from the datasheet)",
        sources={**base.sources, "measured": f"simgrid-exec calibrate --device cuda on {bench.device}"})


def has_device_rows(tables: MeasuredTables | None) -> bool:
    """Whether a profile's measured compute table holds device micro-benchmarks (a GPU calibration)."""
    return tables is not None and any(r.key.startswith(KERNEL_PREFIX) for r in tables.compute)


def predicted_gemm_s(row: GemmRow, gpu: GPUSpec, *, dtype: str) -> float:
    """The cost model's time of a GEMM row on ``gpu`` (:func:`simgrid.costs.compute.gemm_time_s`)."""
    from simgrid.costs.compute import gemm_time_s

    return gemm_time_s(row.flops, (row.m, row.n, row.k), gpu, dtype=dtype)
