"""The executor on a CUDA GPU: a step matches the CPU single-process reference (fp32 exactly as on CPU, bf16
autocast within the bf16 tolerance), ops are timed with CUDA events, the device micro-benchmarks and the GPU
calibration run, and the accuracy benchmark measures a case. Every test skips without CUDA; on a GPU
machine ``bash benchmarks/gpu_session.sh numerics`` runs this file (docs/gpu_validation.md)."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import pytest
from script_modules import load_benchmark

torch = pytest.importorskip("torch")

from executor.launch import LaunchConfig  # noqa: E402
from executor.model import init_weights  # noqa: E402
from executor.reference import reference_training  # noqa: E402
from executor.runner import run_program  # noqa: E402
from simgrid.ir.ops import Compute  # noqa: E402
from simgrid.layout.spec import Layout  # noqa: E402
from simgrid.model import param_count  # noqa: E402
from simgrid.model.presets import get_model  # noqa: E402
from simgrid.schedules import build_program  # noqa: E402
from tests.executor.reference_checks import (  # noqa: E402
    BF16_LOSS_TOL,
    BF16_UPDATE_TOL,
    assert_run_matches,
    update_relative_error,
)

pytestmark = [
    pytest.mark.torch,
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason="needs a CUDA GPU (torch.cuda.is_available() is False); run "
                              "`bash benchmarks/gpu_session.sh numerics` on a GPU machine (docs/gpu_validation.md)"),
    pytest.mark.timeout(240),
]

TINY = get_model("tiny-gpt")
NCCL = LaunchConfig(world_size=1, backend="nccl", run_timeout_s=180)
SGD = {"optimizer": "sgd", "micro_batch_size": 1, "global_batch_size": 2}
LAYOUTS = {"plain": Layout(**SGD), "flash-full-recompute": Layout(flash_attention=True, recompute="full", **SGD)}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_fp32_step_on_cuda_matches_the_cpu_reference(name: str) -> None:
    """fp32 on the GPU (TF32 off, torch's default for matrix products) differs from the CPU only in summation
    order, as the multi-rank CPU runs do: the CPU numerics tolerances apply (each loss and weight 1e-5, the
    update 1e-4)."""
    layout = dataclasses.replace(LAYOUTS[name], precision="fp32")
    run = run_program(build_program(TINY, layout), steps=2, config=NCCL)
    ref = reference_training(TINY, layout, steps=2)
    assert_run_matches(name, run.losses, run.weights, ref.losses, ref.weights, init_weights(TINY, 0))


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_bf16_step_on_cuda_matches_the_cpu_reference_within_the_bf16_tolerance(name: str) -> None:
    """A bf16 layout on CUDA autocasts by default (fp32 master weights): losses within BF16_LOSS_TOL and the
    update within BF16_UPDATE_TOL of the CPU fp32 reference (reasons in tests/executor/reference_checks.py),
    and not equal to it (autocast ran)."""
    layout = dataclasses.replace(LAYOUTS[name], precision="bf16")
    run = run_program(build_program(TINY, layout), steps=2, config=NCCL)
    ref = reference_training(TINY, dataclasses.replace(layout, precision="fp32"), steps=2)
    assert run.losses == pytest.approx(ref.losses, rel=BF16_LOSS_TOL)
    assert 1e-5 < update_relative_error(run.weights, ref.weights, init_weights(TINY, 0)) <= BF16_UPDATE_TOL


def test_cuda_steps_are_timed_with_events_and_report_device_memory() -> None:
    """Every compute op of the last step has a row; the compute stream's rows do not overlap and lie inside
    the step; the allocator's peak holds at least the fp32 weights, gradients and Adam moments (16 B per
    parameter)."""
    layout = Layout(micro_batch_size=1, global_batch_size=2, flash_attention=True)
    program = build_program(TINY, layout)
    run = run_program(program, steps=3, config=NCCL, collect_weights=False)
    compute_ops = [op for op in program.ranks[0] if isinstance(op, Compute)]
    rows = sorted((r for r in run.trace.rows if r.stream == "compute"), key=lambda r: r.start_s)
    assert len([r for r in rows if "deferred" not in r.op]) == len(compute_ops)
    for before, after in itertools.pairwise(rows):
        assert after.start_s >= before.end_s - 1e-6
    assert rows[0].start_s >= 0 and rows[-1].end_s <= run.step_times_s[-1] + 1e-6
    assert all(t > 0 for t in run.step_times_s)
    assert run.peak_device_bytes[0] >= 16 * param_count(TINY)


def test_kernel_benchmarks_time_the_gpu() -> None:
    """A 2048-cubed bf16 GEMM runs above 10 TFLOP/s on any tensor-core GPU; graph-replayed tiny kernels cost
    device time per kernel, eager launches host time; a causal attention core has positive forward and
    backward times."""
    from executor.kernelbench import measure_attention, measure_gemm, measure_launch

    device = torch.device("cuda", 0)
    row = measure_gemm("check", 2048, 2048, 2048, dtype=torch.bfloat16, device=device)
    assert row.tflops > 10
    launch = measure_launch(device, calls=200)
    assert 0 < launch.device_us < 100 and 0 < launch.host_us < 1000
    attention = measure_attention(1024, 8, 64, dtype=torch.bfloat16, device=device)
    assert attention.fwd_s > 0 and attention.bwd_s > 0


def test_calibrate_device_writes_a_loadable_profile(tmp_path: Path) -> None:
    """A shrunk GPU calibration fits every efficiency inside (0, 1] and writes a profile that loads."""
    from executor.devicecal import calibrate_device
    from executor.devices import datasheet_for, default_device, device_name
    from simgrid.hardware import load_cluster_spec

    # A GPU without a shipped datasheet profile is fitted against the H100's (the test checks the plumbing).
    datasheet = None if datasheet_for(device_name(default_device())) else "dgx-h100-ndr"
    cal = calibrate_device([(TINY, 1)], out=tmp_path / "gpu.toml", datasheet=datasheet, sustained_s=1.0, seqs=(512,),
                           sweep_mn=2048, sweep_ks=(256, 2048), copy_elements=2**24, sustained_size=2048)
    spec = load_cluster_spec(tmp_path / "gpu.toml")
    gpu = spec.node.gpu
    assert gpu.name.endswith("-calibrated") and spec.measured is not None and spec.measured.compute
    assert 0 < gpu.matmul.max_efficiency <= 1 and 0 < gpu.hbm_efficiency <= 1
    assert cal.fit.fused_attention_efficiency is not None


def test_gpu_accuracy_benchmark_measures_a_case(capsys: pytest.CaptureFixture[str]) -> None:
    """The accuracy benchmark trains gpt3-125m with the fused core for three steps and prints the measured step
    beside the datasheet prediction."""
    bench = load_benchmark("gpu_accuracy", "gpu_accuracy_cuda")
    from executor.devices import datasheet_for, default_device, device_name

    extra = [] if datasheet_for(device_name(default_device())) else ["--datasheet", "dgx-h100-ndr"]
    assert bench.main(["--models", "gpt3-125m", "--variants", "sdpa", "--steps", "3", "--microbatches", "1",
                       *extra]) == 0
    out = capsys.readouterr().out
    assert "FAILED" not in out and "measured -" not in out
