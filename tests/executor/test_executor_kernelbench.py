"""Device micro-benchmarks (executor/kernelbench.py) on the CPU: the shared code path at small sizes, the FLOP
and byte conventions, and the timing helper. The CUDA-only parts run in tests/executor/test_executor_cuda.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from executor import kernelbench as kb  # noqa: E402
from simgrid.model.flops import block_flops  # noqa: E402
from simgrid.model.presets import get_model  # noqa: E402

pytestmark = [pytest.mark.torch]
CPU = torch.device("cpu")


def test_time_calls_warms_up_then_times_each_call_with_its_own_index() -> None:
    """warmup calls are untimed; the timed calls get the next indices (inputs rotate by index)."""
    seen: list[int] = []
    times = kb.time_calls(seen.append, CPU, warmup=2, repeats=3)
    assert seen == [0, 1, 2, 3, 4] and len(times) == 3 and all(t >= 0 for t in times)


def test_gemm_row_counts_two_mnk_flops() -> None:
    """A GEMM of (m x k) @ (k x n) is 2mnk FLOPs; the rate follows from the measured time."""
    row = kb.GemmRow(label="x", m=2, n=3, k=4, seconds=1e-12)
    assert row.flops == 48 and row.tflops == pytest.approx(48.0)


def test_attention_flops_are_the_cost_models_fused_core_flops() -> None:
    """Forward + backward FLOPs of one causal core equal block_flops' fused-attention core of the same shape
    (so a fitted efficiency reproduces the time when the engine prices the op)."""
    model = get_model("gpt3-1.3b")
    f = block_flops(model, 1, flash_attention=True)
    row = kb.AttentionRow(seq_length=model.seq_length, heads=model.num_heads, head_dim=model.head_dim, batch=1,
                          fwd_s=1.0, bwd_s=1.0)
    assert row.fwd_flops == pytest.approx(f.attention_core_fwd)
    assert row.flops == pytest.approx(f.attention_core_fwd + f.attention_core_bwd)


def test_memory_rows_count_each_operand_once() -> None:
    """copy moves 2 operands' bytes, add 3 (two reads, one write); GB/s = bytes / seconds / 1e9."""
    copy = kb.measure_memory("copy", 4096, width=64, dtype=torch.float32, device=CPU, repeats=2)
    add = kb.measure_memory("add", 4096, width=64, dtype=torch.float32, device=CPU, repeats=2)
    assert (copy.elements, copy.bytes_moved, add.bytes_moved) == (4096, 2 * 4096 * 4, 3 * 4096 * 4)
    assert copy.GBps == pytest.approx(copy.bytes_moved / copy.seconds / 1e9)


def test_small_benchmarks_run_on_the_cpu() -> None:
    """GEMM, sweep, attention (forward and backward), sustained windows and launch cost all produce positive
    times at small sizes; the sustained run has one window per window length."""
    gemm = kb.measure_gemm("g", 64, 32, 16, dtype=torch.float32, device=CPU, repeats=3)
    assert (gemm.m, gemm.n, gemm.k) == (64, 32, 16) and gemm.seconds > 0
    sweep = kb.measure_sweep(dtype=torch.float32, device=CPU, mn=64, ks=(16, 64))
    assert [r.k for r in sweep] == [16, 64] and all(r.m == r.n == 64 for r in sweep)
    attention = kb.measure_attention(32, 2, 16, dtype=torch.float32, device=CPU, repeats=3)
    assert attention.fwd_s > 0 and attention.bwd_s > 0
    run = kb.measure_sustained(dtype=torch.float32, device=CPU, duration_s=0.2, size=64, window_s=0.05)
    assert len(run.window_tflops) == 4 and run.burst_tflops == run.window_tflops[0]
    assert run.sustained_tflops > 0
    launch = kb.measure_launch(CPU, calls=50)
    assert launch.host_us > 0 and launch.device_us == launch.host_us  # no CUDA graph on a CPU


def test_sustained_rate_is_the_median_of_the_last_third() -> None:
    """Burst is the first window; sustained the median of the last third (windows 5-6 of 6 here)."""
    run = kb.SustainedRun(size=8, window_tflops=(800.0, 790.0, 760.0, 750.0, 700.0, 720.0), window_s=1.0)
    assert run.burst_tflops == 800.0 and run.sustained_tflops == pytest.approx(710.0)


def test_inputs_rotate_until_they_span_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Small input sets are copied (up to MAX_INPUT_SETS) so repeated calls read memory, not cache; a set
    spanning ROTATE_BYTES alone is not; in between, just enough copies to span it."""
    monkeypatch.setattr(kb, "ROTATE_BYTES", 4096)
    assert len(kb._inputs(lambda: (torch.empty(16),))) == kb.MAX_INPUT_SETS
    assert len(kb._inputs(lambda: (torch.empty(1024),))) == 1
    assert len(kb._inputs(lambda: (torch.empty(256), torch.empty(256)))) == 2
