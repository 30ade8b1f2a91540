"""GPU calibration without a GPU: the fit of a datasheet profile to device micro-benchmarks
(executor/devicefit.py) on made-up measurements with hand-computed answers, and the whole calibration
(executor/devicecal.py) on the CPU at small sizes, which runs the code a GPU calibration runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from executor.devicecal import (  # noqa: E402
    CALIBRATION_MODELS,
    attention_shapes,
    bench_from_json,
    bench_to_json,
    calibrate_device,
    format_calibration,
    model_gemms,
)
from executor.devicefit import (  # noqa: E402
    KERNEL_PREFIX,
    bench_rows,
    calibrated_gpu,
    device_profile,
    fit_attention,
    fit_device,
    fit_matmul,
    has_device_rows,
    predicted_gemm_s,
)
from executor.kernelbench import AttentionRow, DeviceBench, GemmRow, LaunchCost, MemoryRow, SustainedRun  # noqa: E402
from simgrid.costs.compute import fused_attention_time_s  # noqa: E402
from simgrid.errors import SimgridError  # noqa: E402
from simgrid.hardware import MeasuredTables, load_cluster_spec, load_gpu, write_profile  # noqa: E402
from simgrid.hardware.measured import ComputeRow  # noqa: E402
from simgrid.model.presets import get_model  # noqa: E402

pytestmark = [pytest.mark.torch]

H100 = load_gpu("h100-sxm")
PEAK = H100.peak_flops("bf16")


def _gemm(label: str, m: int, n: int, k: int, tflops: float) -> GemmRow:
    return GemmRow(label=label, m=m, n=n, k=k, seconds=2.0 * m * n * k / (tflops * 1e12))


SWEEP = tuple(_gemm(f"sweep k={k}", 8192, 8192, k, t)
              for k, t in zip((256, 1024, 4096, 8192), (300.0, 600.0, 720.0, 750.0), strict=True))
ATTENTION = (AttentionRow(seq_length=2048, heads=16, head_dim=128, batch=1, fwd_s=1e-3, bwd_s=2e-3),
             AttentionRow(seq_length=4096, heads=16, head_dim=128, batch=1, fwd_s=3e-3, bwd_s=7e-3))
BENCH = DeviceBench(
    device="NVIDIA H100 80GB HBM3", dtype="bf16", gemms=(_gemm("gpt3-1.3b tp1 qkv fwd", 2048, 6144, 2048, 650.0),),
    sweep=SWEEP, attention=ATTENTION,
    memory=(MemoryRow(kernel="copy", elements=2**28, bytes_moved=2**30, seconds=2**30 / 3.0e12),
            MemoryRow(kernel="copy", elements=2**20, bytes_moved=2**22, seconds=2**22 / 2.0e12)),
    sustained=SustainedRun(size=8192, window_tflops=(760.0, 750.0, 740.0, 700.0, 700.0, 700.0), window_s=1.0),
    launch=LaunchCost(host_us=6.0, device_us=1.5))


def test_matmul_plateau_is_the_sustained_rate_and_the_curve_the_sweep() -> None:
    """max_efficiency = sustained TFLOP/s / peak; relative(K) = sweep rate at K / rate at the largest K."""
    fit = fit_matmul(SWEEP, 700.0, PEAK)
    assert fit.max_efficiency == pytest.approx(700e12 / PEAK)
    assert fit.min_dim == (256, 1024, 4096, 8192)
    assert fit.relative == pytest.approx((300 / 750, 600 / 750, 720 / 750, 1.0))


def test_attention_efficiency_is_flop_weighted() -> None:
    """Total FLOPs over total time over the peak, not a mean of per-row efficiencies."""
    expected = sum(r.flops for r in ATTENTION) / sum(r.fwd_s + r.bwd_s for r in ATTENTION) / PEAK
    assert fit_attention(ATTENTION, PEAK) == pytest.approx(expected)
    assert fit_attention([], PEAK) is None


def test_fit_takes_sustained_plateau_largest_copy_and_graph_launch_cost() -> None:
    """Burst is the first window; HBM efficiency comes from the largest copy (3.0 of 3.35 TB/s); the kernel
    overhead is the device-side figure; only the chosen attention shapes are fitted."""
    fit = fit_device(BENCH, H100, dtype="bf16", attention_shapes={(16, 128, 2048)})
    assert fit.matmul.max_efficiency == pytest.approx(700e12 / PEAK)
    assert fit.burst_efficiency == pytest.approx(760e12 / PEAK)
    assert fit.hbm_efficiency == pytest.approx(3000 / 3350)
    assert fit.kernel_overhead_us == 1.5
    assert fit.fused_attention_efficiency == pytest.approx(ATTENTION[0].flops / 3e-3 / PEAK)


def test_calibrated_profile_reproduces_the_measurements_it_was_fitted_to() -> None:
    """With the sustained rate equal to the sweep's top (here set so), the calibrated GPU prices that GEMM at
    its measured time, and a single attention row at its measured time; peaks stay the datasheet's."""
    bench = DeviceBench(device="x", dtype="bf16", sweep=SWEEP, attention=ATTENTION[:1],
                        sustained=SustainedRun(size=8192, window_tflops=(750.0,), window_s=1.0))
    gpu = calibrated_gpu(H100, fit_device(bench, H100, dtype="bf16"), bench)
    top = SWEEP[-1]
    assert predicted_gemm_s(top, gpu, dtype="bf16") == pytest.approx(top.seconds)
    row = ATTENTION[0]
    assert fused_attention_time_s(row.flops, gpu, dtype="bf16") == pytest.approx(row.fwd_s + row.bwd_s)
    assert gpu.peak_tflops == H100.peak_tflops and gpu.name == "h100-sxm-calibrated"


def test_calibrated_fields_name_their_measurement() -> None:
    """Each replaced field has a source line naming the device; the capacity is the device's when given."""
    gpu = calibrated_gpu(H100, fit_device(BENCH, H100, dtype="bf16"), BENCH, memory_GiB=79.1, when="2026-11-24")
    for key in ("matmul.max_efficiency", "matmul.relative", "hbm_efficiency", "kernel_overhead_us",
                "fused_attention_efficiency", "memory_GiB"):
        assert "NVIDIA H100 80GB HBM3 on 2026-11-24" in gpu.sources[key], key
    assert gpu.memory_GiB == 79.1 and "first window 0.768 of peak" in gpu.sources["matmul.max_efficiency"]


def test_profile_round_trips_and_is_recognised_as_a_device_calibration(tmp_path: Path) -> None:
    """The calibrated cluster loads back equal; its raw rows carry the KERNEL: prefix; a CPU calibration's
    in-situ op table is not taken for one (validation keeps pricing those from the table)."""
    base = load_cluster_spec("dgx-h100-ndr")
    gpu = calibrated_gpu(H100, fit_device(BENCH, H100, dtype="bf16"), BENCH)
    spec = device_profile(base, gpu, BENCH, name="h100-test")
    write_profile(spec, tmp_path / "p.toml")
    loaded = load_cluster_spec(tmp_path / "p.toml")
    assert loaded == spec and has_device_rows(loaded.measured)
    keys = [r.key for r in bench_rows(BENCH)]
    assert all(k.startswith(KERNEL_PREFIX) for k in keys) and len(keys) == len(set(keys))
    assert f"{KERNEL_PREFIX}gemm-sustained:bf16:m=8192:n=8192:k=8192" in keys
    assert not has_device_rows(MeasuredTables(compute=(ComputeRow(key="F:blocks=1-2:flops=10", time_us=1.0),)))
    assert not has_device_rows(None)


def test_bench_json_round_trips() -> None:
    """The raw measurements survive JSON."""
    assert bench_from_json(json.loads(json.dumps(bench_to_json(BENCH)))) == BENCH


def test_model_gemms_are_the_layer_and_head_products_in_three_passes() -> None:
    """gpt3-1.3b at tp 1: QKV is 2048 tokens x 6144 x 2048 forward, its input gradient 2048 x 2048 x 6144,
    its weight gradient 6144 x 2048 x 2048 (k = tokens); at tp 8 the MLP-out input width is 8192 / 8."""
    gemms = {label: (m, n, k) for label, m, n, k in model_gemms(get_model("gpt3-1.3b"))}
    assert len(gemms) == 15
    assert gemms["gpt3-1.3b tp1 qkv fwd"] == (2048, 6144, 2048)
    assert gemms["gpt3-1.3b tp1 qkv dgrad"] == (2048, 2048, 6144)
    assert gemms["gpt3-1.3b tp1 qkv wgrad"] == (6144, 2048, 2048)
    tp8 = {label: (m, n, k) for label, m, n, k in model_gemms(get_model("gpt3-1.3b"), tp=8)}
    assert tp8["gpt3-1.3b tp8 mlp-out fwd"] == (2048, 2048, 1024)
    assert attention_shapes([(get_model("gpt3-175b"), 8)]) == {(12, 128, 2048)}
    assert {name for name, _ in CALIBRATION_MODELS} >= {"gpt3-125m", "gpt3-350m", "gpt3-1.3b", "gpt3-2.7b"}


def test_calibrate_device_needs_a_datasheet_for_an_unknown_device() -> None:
    """A CPU has no shipped datasheet profile: the error says how to give one."""
    with pytest.raises(SimgridError, match=r"no shipped datasheet profile describes the device 'CPU.*--datasheet"):
        calibrate_device([(get_model("tiny-gpt"), 1)], device=torch.device("cpu"))


@pytest.mark.slow
def test_calibrate_device_on_the_cpu_writes_a_loadable_profile(tmp_path: Path) -> None:
    """The GPU calibration's code on the CPU at small sizes (fp32; the timing is the host clock): every
    benchmark fills its table, the fit stays in range and the profile loads with the raw rows."""
    cal = calibrate_device([(get_model("tiny-gpt"), 1)], device=torch.device("cpu"), out=tmp_path / "c.toml",
                           datasheet="dgx-h100-ndr", sustained_s=0.2, seqs=(32,), sweep_mn=64, sweep_ks=(16, 64),
                           copy_elements=2**14, sustained_size=64)
    bench = cal.bench
    assert bench.dtype == "fp32" and len(bench.gemms) > 5 and len(bench.sweep) == 2
    assert {a.seq_length for a in bench.attention} == {32} and bench.sustained is not None
    assert {m.kernel for m in bench.memory} == {"copy", "add", "gelu", "layer_norm"}
    loaded = load_cluster_spec(tmp_path / "c.toml")
    assert loaded.node.gpu.name == "h100-sxm-calibrated" and has_device_rows(loaded.measured)
    assert 0 < loaded.node.gpu.matmul.max_efficiency <= 1
    text = format_calibration(cal)
    for heading in ("GEMM", "attention (causal)", "memory-bound", "sustained", "launch overhead", "profile field"):
        assert heading in text


def test_cli_calibrate_on_cuda_without_a_gpu_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    """``simgrid-exec calibrate --device cuda`` on a machine without CUDA says so and how to proceed."""
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    from executor.cli import main

    assert main(["calibrate", "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "needs a CUDA GPU" in err and "--device cpu" in err
