"""Calibration: the compute fit recovers known rates, and the written profile loads back for the engine."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from executor.calibrate import build_profile, fit_compute
from simgrid.hardware import load_cluster
from simgrid.ir.ops import Compute


def _op(flops: float, hbm: float, kernels: int) -> Compute:
    return Compute(kind="F", stage=0, microbatch=0, chunk=0, block_start=1, block_end=2, flops=flops,
                   hbm_bytes=hbm, kernels=kernels)


def test_fit_recovers_rates_of_synthetic_ops() -> None:
    """Times made from 10 GFLOP/s, 2 GB/s and 30 us/kernel are fitted back to those figures."""
    ops = [_op(f, b, k) for f in (1e6, 5e6, 2e7) for b in (1e5, 8e5) for k in (3, 8)]
    samples = [(op, op.flops / 10e9 + op.hbm_bytes / 2e9 + op.kernels * 30e-6) for op in ops]
    fit = fit_compute(samples)
    assert fit.peak_flops == pytest.approx(10e9, rel=1e-6)
    assert fit.bandwidth_Bps == pytest.approx(2e9, rel=1e-6)
    assert fit.overhead_s == pytest.approx(30e-6, rel=1e-6)
    assert fit.mean_abs_error < 1e-9


def test_written_profile_loads_with_measured_tables(tmp_path: Path) -> None:
    """A profile built from measurements is self-contained: it loads and returns the measured times."""
    from executor.calibrate import ComputeFit
    from simgrid.hardware import write_profile

    comm = {"collectives": [("all_reduce", 256, 100e-6), ("all_reduce", 65536, 400e-6),
                            ("reduce_scatter", 256, 120e-6)],
            "p2p": [(256, 50e-6), (65536, 150e-6)], "memory_Bps": 5e9}
    fit = ComputeFit(peak_flops=8e9, bandwidth_Bps=3e9, overhead_s=20e-6, samples=10, mean_abs_error=0.05)
    spec = build_profile(name="test-host", world_size=2, comm=comm, fit=fit, compute_rows=[("F:b1", 123.0)])
    path = write_profile(spec, tmp_path / "host.toml")
    cluster = load_cluster(path, gpus=2)
    measured = cluster.spec.measured
    assert measured is not None
    assert measured.collective_time_us("all_reduce", 2, 256) == pytest.approx(100.0)
    assert measured.collective_time_us("all_reduce", 2, 32896) == pytest.approx(250.0)  # midway, linear
    assert measured.p2p_time_us(256) == pytest.approx(50.0)
    assert cluster.gpu.peak_flops("fp32") == pytest.approx(8e9)
    assert cluster.gpu.kernel_overhead_us == pytest.approx(20.0)
    # Send/recv bandwidth from the two sizes: (65536 - 256) B / 100 us.
    assert cluster.node.intra_link.bandwidth_GBps == pytest.approx((65536 - 256) / 100e-6 / 1e9)
