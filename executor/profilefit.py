"""The fitted compute model of one rank and the self-contained cluster profile calibration writes.

Compute ops timed inside short real runs are fitted to the engine's compute model
``time = flops / peak + hbm_bytes / bandwidth + kernels * overhead`` (:mod:`simgrid.costs.compute`) by
least squares with non-negative coefficients. The profile starts from the shipped ``ideal`` cluster and
replaces its node and "GPU" (here: one CPU rank with ``cores / ranks`` threads) with the fitted and
measured figures, so it is self-contained and loads anywhere.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from executor.hostprobe import HOST_DRIFT_WARNING
from simgrid.hardware import (
    DTYPES,
    ClusterSpec,
    CollectiveRow,
    ComputeRow,
    LinkSpec,
    MatmulEfficiency,
    MeasuredTables,
    P2PRow,
    load_cluster_spec,
)
from simgrid.ir.ops import Compute


@dataclass(frozen=True, kw_only=True)
class ComputeFit:
    """Fitted compute model of one rank."""

    peak_flops: float
    """FLOP/s of matrix work (fp32)."""
    bandwidth_Bps: float
    """Bytes/s of memory-bound work."""
    overhead_s: float
    """Seconds per kernel launch (here: per operator call, Python dispatch included)."""
    samples: int
    """Compute ops the fit used."""
    mean_abs_error: float
    """Mean absolute relative error of the fit over the samples."""
    host_drift: float = 0.0
    """Relative change of the host-speed probe from before to after the in-situ measurements (0: steady
    host); above :data:`HOST_DRIFT_WARNING` the calibration is suspect."""
    generation_summary: str = ""
    """One line on generation's in-situ rows (:mod:`executor.gencal`), or '' when generation was not timed."""

    def describe(self) -> str:
        """The fit in one line. A term the least-squares fit dropped (its coefficient would be negative or
        it does not lower the residual) is named as dropped rather than printed as an infinite rate."""
        rate = f"{self.peak_flops / 1e9:.2f} GFLOP/s" if math.isfinite(self.peak_flops) else "no FLOP term"
        bw = f"{self.bandwidth_Bps / 1e9:.2f} GB/s" if math.isfinite(self.bandwidth_Bps) else "no byte term"
        return (f"{rate}, {bw}, {self.overhead_s * 1e6:.1f} us per op "
                f"(fit over {self.samples} ops, mean error {self.mean_abs_error:.0%})")

    @property
    def host_was_steady(self) -> bool:
        """Whether the host-speed probe stayed within :data:`HOST_DRIFT_WARNING` while calibrating."""
        return self.host_drift <= HOST_DRIFT_WARNING

    def drift_warning(self) -> str:
        """A one-line warning when the host was not steady, else ''."""
        if self.host_was_steady:
            return ""
        return (f"warning: the host-speed probe changed by {self.host_drift:.0%} while calibrating (other load on "
                "this machine); predictions from this profile may be off: calibrate again on a quiet machine")


def fit_compute(samples: Sequence[tuple[Compute, float]]) -> ComputeFit:
    """Least squares ``t = a*flops + b*hbm_bytes + c*kernels`` with a, b, c >= 0 (best non-negative subset)."""
    if not samples:
        raise ValueError("no compute samples to fit")
    # One point per distinct op, the median over repeats and ranks (the measured step is a median too);
    # the weight keeps frequent ops important.
    groups: dict[tuple[object, ...], list[float]] = {}
    ops: dict[tuple[object, ...], Compute] = {}
    for op, seconds in samples:
        key = (op.kind, op.flops, op.hbm_bytes, op.kernels)
        groups.setdefault(key, []).append(seconds)
        ops[key] = op
    # Absolute least squares: the step time is a sum of op times, so absolute errors are what add up
    # (a relative fit under-predicted steps by ~50% here); sqrt(count) keeps frequent ops important.
    times = np.array([statistics.median(v) for v in groups.values()], dtype=float)
    weight = np.sqrt(np.array([len(v) for v in groups.values()], dtype=float))
    x = np.array([[ops[k].flops, ops[k].hbm_bytes, ops[k].kernels] for k in groups], dtype=float) * weight[:, None]
    y = times * weight
    best: tuple[float, np.ndarray] | None = None
    for mask in itertools.product((True, False), repeat=3):
        cols = [i for i, keep in enumerate(mask) if keep]
        if not cols:
            continue
        coef, *_ = np.linalg.lstsq(x[:, cols], y, rcond=None)
        if (coef < 0).any():
            continue
        full = np.zeros(3)
        full[cols] = coef
        residual = float(((x @ full - y) ** 2).sum())
        if best is None or residual < best[0]:
            best = (residual, full)
    assert best is not None
    a, b, c = best[1]
    rel = float(np.mean(np.abs(x @ best[1] - y) / np.maximum(y, 1e-12)))  # weights cancel in the ratio
    return ComputeFit(peak_flops=1.0 / a if a > 0 else float("inf"), bandwidth_Bps=1.0 / b if b > 0 else float("inf"),
                      overhead_s=float(c), samples=len(samples), mean_abs_error=rel)


def build_profile(*, name: str, world_size: int, comm: dict[str, Any], fit: ComputeFit,
                  compute_rows: Sequence[tuple[str, float]] = (), slowdown: float | None = None) -> ClusterSpec:
    """A self-contained cluster profile of this machine (one node of ``world_size`` CPU ranks)."""
    base = load_cluster_spec("ideal")
    cores = os.cpu_count() or 1
    threads = max(1, cores // world_size)
    p2p = sorted(comm["p2p"])
    small_s = p2p[0][1]
    (s0, t0), (s1, t1) = p2p[-2], p2p[-1]
    p2p_bw = (s1 - s0) / max(t1 - t0, 1e-12)
    memory_GBps = comm["memory_Bps"] / 1e9
    tflops = fit.peak_flops / 1e12
    gpu = dataclasses.replace(
        base.node.gpu, name=f"{name}-rank", description=f"one CPU rank with {threads} thread(s), fp32, measured",
        memory_GiB=float(max(1, _host_memory_GiB() // world_size)), hbm_bandwidth_GBps=fit.bandwidth_Bps / 1e9,
        hbm_efficiency=1.0, peak_tflops={d: tflops for d in DTYPES}, matmul=MatmulEfficiency(max_efficiency=1.0),
        kernel_overhead_us=fit.overhead_s * 1e6, comm_compute_slowdown=slowdown or 0.0,
        sources={"peak_tflops": f"fitted to {fit.samples} real compute ops (mean abs error {fit.mean_abs_error:.1%})",
                 "hbm_bandwidth_GBps": "fitted with peak_tflops", "kernel_overhead_us": "fitted with peak_tflops",
                 "comm_compute_slowdown": "assumed 0: not measured" if slowdown is None else
                 "measured: matmul loop on every rank alone vs with a background gloo all-reduce"},
    )
    node = dataclasses.replace(
        base.node, name=f"{name}-node", description=f"this machine: {cores} cores, {world_size} ranks, gloo",
        gpu=gpu, gpus_per_node=world_size, intra_fabric="pcie", gpus_per_pcie_switch=world_size,
        intra_link=LinkSpec(bandwidth_GBps=p2p_bw / 1e9, latency_us=small_s * 1e6, efficiency=1.0),
        pcie_link=LinkSpec(bandwidth_GBps=memory_GBps, latency_us=0.0, efficiency=1.0),
        host_memory_GiB=float(_host_memory_GiB()),
        sources={"intra_link": "measured: gloo send/recv over loopback (bandwidth from the two largest sizes)",
                 "pcie_link": "measured: memory bandwidth (host copies stand in for PCIe)"},
    )
    measured = MeasuredTables(
        collectives=tuple(CollectiveRow(kind=k, group_size=world_size, bytes=b, time_us=t * 1e6)
                          for k, b, t in comm["collectives"]),
        p2p=tuple(P2PRow(bytes=b, time_us=t * 1e6) for b, t in comm["p2p"]),
        compute=tuple(ComputeRow(key=k, time_us=t * 1e6) for k, t in compute_rows),
        memory_bandwidth_GBps=memory_GBps,
    )
    return dataclasses.replace(base, name=name, description=f"calibrated on this machine ({world_size} ranks, gloo)",
                               node=node, max_nodes=1, measured=measured,
                               sources={"measured": "simgrid-exec calibrate"})


def _host_memory_GiB() -> int:
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        return max(1, int(pages // 2**30))
    except (ValueError, OSError, AttributeError):
        return 16
