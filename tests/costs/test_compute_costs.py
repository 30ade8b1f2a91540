"""Compute costs: roofline terms by hand, speed factors, host optimizer, overlap slowdown."""

from __future__ import annotations

import pytest

from simgrid.costs import ADAM_FLOPS_PER_PARAM, compute_time_s, host_compute_time_s, overlap_slowdown
from simgrid.errors import SimgridError
from simgrid.hardware import load_cluster
from simgrid.ir.ops import Compute
from simgrid.topology import synthetic_cluster


def op(**kw: object) -> Compute:
    base: dict[str, object] = {"kind": "F", "stage": 0, "microbatch": 0, "chunk": 0, "block_start": 1,
                               "block_end": 2, "flops": 0.0, "hbm_bytes": 0.0}
    return Compute(**(base | kw))  # type: ignore[arg-type]


def test_roofline_terms_add_for_a_kernel_sequence() -> None:
    """GEMM at peak x efficiency + memory-bound bytes at HBM x efficiency + kernels x overhead, by hand."""
    gpu = synthetic_cluster(num_gpus=1, bf16_tflops=312, matmul_efficiency=0.86, hbm_GBps=2039,
                            hbm_efficiency=0.9, kernel_overhead_us=4.0).gpu
    o = op(flops=1e12, hbm_bytes=1e9, gemm_mnk=(8192, 8192, 8192), kernels=5)
    expected = 1e12 / (312e12 * 0.86) + 1e9 / (2039e9 * 0.9) + 5 * 4e-6
    assert compute_time_s(o, gpu, dtype="bf16") == pytest.approx(expected)


def test_speed_factor_divides_the_time() -> None:
    """A straggler at speed 0.5 takes exactly twice as long."""
    gpu = synthetic_cluster(num_gpus=1, kernel_overhead_us=4.0).gpu
    o = op(flops=1e12, hbm_bytes=1e9, kernels=3)
    assert compute_time_s(o, gpu, dtype="bf16", speed=0.5) == pytest.approx(2 * compute_time_s(o, gpu, dtype="bf16"))
    with pytest.raises(SimgridError, match="speed = 0 must be > 0"):
        compute_time_s(o, gpu, dtype="bf16", speed=0)


def test_a100_large_gemm_runs_at_its_measured_power_limited_rate() -> None:
    """A100 profile: cuBLAS 8192^3 with random inputs runs at 257 TFLOP/s under the 400 W limit (Horace He,
    thonking.ai 2024, the measurement the profile cites); a K = 1024 GEMM of the same M, N is slower by its
    epilogue share."""
    gpu = load_cluster("dgx-a100-hdr", gpus=1).gpu
    flops = 2 * 8192 * 8192 * 8192
    big = op(flops=flops, gemm_mnk=(8192, 8192, 8192), kernels=0)
    assert flops / compute_time_s(big, gpu, dtype="bf16") == pytest.approx(257e12, rel=0.01)
    thin = op(flops=flops, gemm_mnk=(8192, 8192, 1024), kernels=0)
    assert flops / compute_time_s(thin, gpu, dtype="bf16") < 0.9 * 257e12


def test_op_with_a_gemm_list_is_priced_gemm_by_gemm() -> None:
    """An op that lists its GEMMs costs their sum (each by shape), not its FLOPs at one shape's efficiency."""
    from simgrid.costs import gemm_shape_time_s

    gpu = load_cluster("dgx-h100-ndr", gpus=8).gpu
    gemms = ((4096, 4608, 12288, 1), (2048, 2048, 128, 96))
    flops = sum(2.0 * m * n * k * c for m, n, k, c in gemms)
    listed = op(flops=flops, gemm_mnk=(4096, 4608, 12288), gemms=gemms, kernels=0)
    by_hand = sum(gemm_shape_time_s(m, n, k, gpu, dtype="bf16", count=c) for m, n, k, c in gemms)
    assert compute_time_s(listed, gpu, dtype="bf16") == pytest.approx(by_hand)
    one_shape = op(flops=flops, gemm_mnk=(4096, 4608, 12288), kernels=0)
    assert compute_time_s(listed, gpu, dtype="bf16") > 1.2 * compute_time_s(one_shape, gpu, dtype="bf16")


def test_ideal_gpu_computes_at_peak() -> None:
    """The ideal profile's GPU runs every GEMM at its bf16 peak, with free memory traffic and launches."""
    gpu = load_cluster("ideal", gpus=8).gpu
    o = op(flops=1e15, hbm_bytes=1e12, kernels=10, gemm_mnk=(64, 64, 64))
    assert compute_time_s(o, gpu, dtype="bf16") == pytest.approx(1e15 / gpu.peak_flops("bf16"))


def test_unknown_dtype_names_the_choices() -> None:
    """Asking for a dtype the GPU profile lacks fails with the dtypes it has."""
    gpu = synthetic_cluster(num_gpus=1).gpu
    with pytest.raises(SimgridError, match="no peak rate for dtype 'fp8'"):
        compute_time_s(op(flops=1.0), gpu, dtype="fp8")


def test_host_optimizer_time_from_flops_and_cpu_adam_rate() -> None:
    """Offloaded Adam on 1e9 parameters (14 FLOPs each) at 2e9 params/s takes 0.5 s."""
    node = synthetic_cluster(num_gpus=1, host_adam_params_per_s=2e9).node
    step = op(kind="OPT", stage=-1, microbatch=-1, flops=14 * 1e9, device="cpu")
    assert host_compute_time_s(step, node) == pytest.approx(0.5)
    with pytest.raises(SimgridError, match="device = 'gpu'; GPU ops are timed by compute_time_s"):
        host_compute_time_s(op(flops=1.0), node)
    with pytest.raises(SimgridError, match="device = 'cpu'; host ops are timed by host_compute_time_s"):
        compute_time_s(step, synthetic_cluster(num_gpus=1).gpu, dtype="bf16")


def test_adam_flops_per_param_matches_the_schedule_builder() -> None:
    """The host rate conversion uses the same FLOPs per Adam parameter the OPT ops are built with."""
    from simgrid.schedules.lower.optimizer import OPTIMIZER_FLOPS_PER_PARAM

    assert OPTIMIZER_FLOPS_PER_PARAM["adam"] == ADAM_FLOPS_PER_PARAM


def test_overlap_slowdown_comes_from_the_profile() -> None:
    """The compute slowdown under overlapped communication is the GPU profile's figure."""
    assert overlap_slowdown(synthetic_cluster(num_gpus=1, comm_compute_slowdown=0.15).gpu) == 0.15


def test_fused_attention_flops_run_at_the_attention_efficiency() -> None:
    """A FlashAttention op: its core FLOPs at peak x 0.6, the rest at the GEMM efficiency, by hand."""
    gpu = synthetic_cluster(num_gpus=1, bf16_tflops=312, matmul_efficiency=0.86,
                            fused_attention_efficiency=0.6).gpu
    o = op(flops=1e12, attention_flops=2e11, gemm_mnk=(8192, 8192, 8192))
    expected = 8e11 / (312e12 * 0.86) + 2e11 / (312e12 * 0.6)
    assert compute_time_s(o, gpu, dtype="bf16") == pytest.approx(expected)


def test_fused_attention_falls_back_to_the_gemm_plateau_when_the_profile_has_no_figure() -> None:
    """A GPU without fused_attention_efficiency prices the core like its largest GEMMs (the old behaviour)."""
    gpu = synthetic_cluster(num_gpus=1, bf16_tflops=312, matmul_efficiency=0.86).gpu
    fused = op(flops=1e12, attention_flops=4e11, gemm_mnk=(8192, 8192, 8192))
    plain = op(flops=1e12, gemm_mnk=(8192, 8192, 8192))
    assert compute_time_s(fused, gpu, dtype="bf16") == pytest.approx(compute_time_s(plain, gpu, dtype="bf16"))


def test_attention_flops_beyond_the_ops_flops_are_refused() -> None:
    """The fused FLOPs are a part of flops; more than the whole is a broken op, named in the error."""
    gpu = synthetic_cluster(num_gpus=1).gpu
    with pytest.raises(SimgridError, match=r"attention_flops = 2000000000000.0 outside 0 .. flops"):
        compute_time_s(op(flops=1e12, attention_flops=2e12), gpu, dtype="bf16")


def test_profiles_price_flash_attention_below_their_gemm_plateau() -> None:
    """The A100 and B200 profiles carry a sourced flat fused-attention figure below their GEMM ceiling
    (FlashAttention-2 reports 50-73% of A100 peak; A100 uses it only where its FA2 table does not apply);
    H100 and H200 carry the FlashAttention-2/3 tables."""
    for name, low, high in (("dgx-a100-hdr", 0.50, 0.73), ("hgx-b200", 0.604, 0.682)):
        gpu = load_cluster(name, gpus=8).gpu
        assert gpu.fused_attention_efficiency is not None and "fused_attention_efficiency" in gpu.sources
        assert low <= gpu.attention_efficiency <= high
        assert gpu.attention_efficiency < gpu.matmul.max_efficiency
    a100 = load_cluster("dgx-a100-hdr", gpus=8).gpu
    assert set(a100.fused_attention) == {"fa2"} and a100.attention_kernel == "fa2"
    for name in ("dgx-h100-ndr", "hgx-h200-ndr"):
        gpu = load_cluster(name, gpus=8).gpu
        assert set(gpu.fused_attention) == {"fa2", "fa3"} and gpu.attention_kernel == "fa3"
        assert "fused_attention" in gpu.sources


def test_a_recompute_prices_its_fused_core_as_a_forward() -> None:
    """R reruns the forward kernels: its fused core is priced from the forward table, B's from the backward."""
    gpu = load_cluster("dgx-h100-ndr", gpus=8).gpu
    shape = (4096, 4096, 128)
    fwd = op(kind="R", flops=1e12, attention_flops=1e12, attention_shape=shape, kernels=0)
    bwd = op(kind="B", flops=1e12, attention_flops=1e12, attention_shape=shape, kernels=0)
    table = gpu.fused_attention["fa3"]
    ratio = table.tflops("fwd", 4096, 128) / table.tflops("bwd", 4096, 128)
    assert compute_time_s(bwd, gpu, dtype="bf16") / compute_time_s(fwd, gpu, dtype="bf16") == pytest.approx(ratio)


def test_overlap_slowdown_by_kind_falls_back_to_the_collective_figure() -> None:
    """A profile without the issue-12 keys applies comm_compute_slowdown to p2p and copy-engine ops too;
    with them, each kind reads its own key."""
    import dataclasses

    old = synthetic_cluster(num_gpus=1, comm_compute_slowdown=0.15).gpu
    assert [overlap_slowdown(old, kind) for kind in ("collective", "p2p", "copy_engine")] == [0.15, 0.15, 0.15]
    new = dataclasses.replace(old, p2p_compute_slowdown=0.02, copy_engine_compute_slowdown=0.0)
    assert [overlap_slowdown(new, kind) for kind in ("collective", "p2p", "copy_engine")] == [0.15, 0.02, 0.0]


def test_userbuffers_slowdown_is_te_sm_share_or_the_collective_figure() -> None:
    """A userbuffers collective holds TE's 16 SMs of the part's SM count; a profile without an SM count, or with
    no more SMs than that, falls back to comm_compute_slowdown instead of stopping compute."""
    import dataclasses

    gpu = synthetic_cluster(num_gpus=1, comm_compute_slowdown=0.15).gpu
    assert overlap_slowdown(dataclasses.replace(gpu, sm_count=132), "userbuffers") == pytest.approx(16 / 132)
    assert overlap_slowdown(dataclasses.replace(gpu, sm_count=None), "userbuffers") == 0.15
    assert overlap_slowdown(dataclasses.replace(gpu, sm_count=16), "userbuffers") == 0.15
