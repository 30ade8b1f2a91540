"""benchmarks/kernels_published*.py: every published kernel timing is well-formed and sourced, each is priced with
the simulator's own byte and launch counts (simgrid.model.kernels constants), and the script prints its summary
and writes its doc."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import ModuleType

import pytest
from script_modules import load_benchmark, written_doc

from simgrid.costs.compute import memory_time_s
from simgrid.hardware import load_gpu
from simgrid.model.kernels import (
    EAGER_RMSNORM_BYTES,
    EAGER_ROPE_BYTES,
    LOSS_FWD_BYTES_PER_LOGIT_EXTRA,
    MEGATRON_LOSS_FWD_BYTES_PER_LOGIT_EXTRA,
)


def _load() -> ModuleType:
    return load_benchmark("kernels_published", "kernels_published_benchmark")


def test_points_are_well_formed_and_sourced() -> None:
    """A known GPU, kernel, provider and mode, a positive time, a 40-hex-prefix commit and a CSV line past the
    header; at least 250 points over four GPUs; no duplicate (kernel, provider, mode, GPU, shape)."""
    bench = _load()
    points = bench.POINTS
    assert len(points) >= 250 and len({p.gpu for p in points}) == 4
    for p in points:
        assert p.gpu in bench.GPUS and p.mode in ("forward", "backward", "full") and p.ms > 0, p
        assert p.provider in ("huggingface", "liger", "megatron-unfused"), p
        assert len(p.commit) == 10 and int(p.commit, 16) >= 0 and p.line >= 2 and p.file.endswith(".csv"), p
    assert len({(p.kernel, p.provider, p.mode, p.gpu, p.shape) for p in points}) == len(points)


def test_traffic_is_the_simulators_counts() -> None:
    """Bytes per element or logit equal simgrid.model.kernels' constants: eager RMSNorm 36 / 60 (fused 4 / 6),
    eager rotary 20 per Q and K element each way (fused 4), Megatron's loss 2 + 36 per bf16 logit forward,
    PyTorch's on fp32 logits the eager constant less the cast's write (16)."""
    bench = _load()
    rows, hidden = 2048, 4096
    eager, fused = bench.rms_norm_traffic(rows, hidden, "huggingface"), bench.rms_norm_traffic(rows, hidden, "liger")
    assert (eager.fwd_bytes, eager.bwd_bytes) == (EAGER_RMSNORM_BYTES[0] * rows * hidden, EAGER_RMSNORM_BYTES[1] * rows * hidden)
    assert (fused.fwd_bytes, fused.bwd_bytes, fused.fwd_launches) == (4 * rows * hidden, 6 * rows * hidden, 1)
    assert eager.fwd_launches == 8  # x.float(), pow, mean, + eps, rsqrt, multiply, type_as, weight multiply
    seq, q_heads, kv_heads = 1024, 32, 8
    qk = seq * (q_heads + kv_heads) * (hidden // q_heads)
    rope = bench.rope_traffic(seq, hidden, q_heads, kv_heads, "huggingface")
    assert rope.fwd_bytes == rope.bwd_bytes == EAGER_ROPE_BYTES * qk
    assert bench.rope_traffic(seq, hidden, q_heads, kv_heads, "liger").fwd_bytes == 4 * qk
    tokens, vocab = 4096, 50000
    megatron = bench.cross_entropy_traffic(tokens, vocab, "megatron-unfused")
    assert megatron.fwd_bytes == (2 + MEGATRON_LOSS_FWD_BYTES_PER_LOGIT_EXTRA) * tokens * vocab
    assert bench.cross_entropy_traffic(tokens, vocab, "huggingface").fwd_bytes == (
        (LOSS_FWD_BYTES_PER_LOGIT_EXTRA - 4) * tokens * vocab)


def test_compare_prices_bytes_at_the_profile_bandwidth_plus_launches() -> None:
    """The modelled time is memory_time_s on the point's profile plus kernel_overhead_us per launch; a PCIe A100
    point runs on the SXM profile at 1935 GB/s; error = measured / modelled time - 1 (+ = model faster)."""
    bench = _load()
    point = next(p for p in bench.POINTS if p.gpu == "NVIDIA A100 80GB PCIe" and p.kernel == "rms_norm")
    (row,) = bench.compare([point])
    gpu = dataclasses.replace(load_gpu("a100-80gb-sxm"), hbm_bandwidth_GBps=1935.0)
    nbytes, launches = bench.traffic(point).pick(point.mode)
    expected_ms = (memory_time_s(nbytes, gpu) + launches * gpu.kernel_overhead_us * 1e-6) * 1e3
    assert row.model_ms == pytest.approx(expected_ms) and row.hbm_GBps == 1935.0
    assert row.error == pytest.approx(point.ms / expected_ms - 1)
    assert row.achieved_GBps == pytest.approx(nbytes / point.ms / 1e6)


def test_report_and_doc_on_a_subset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The report lists every point and the summaries by provider, GPU and kernel and the largest-shape table;
    main() writes the doc (to a temporary path here) with its sources, and --skip-write leaves it alone."""
    bench = _load()
    subset = [p for p in bench.POINTS if p.kernel in ("rms_norm", "megatron_cross_entropy")][::7]
    rows = bench.compare(subset)
    text = bench.report(rows)
    assert "| all | " in text and "| bandwidth-bound, provider liger" in text and "| largest shape of each sweep" in text
    assert "Non-vectorised launch paths" in text
    assert text.count("\n| ") >= len(subset)
    written = written_doc(bench, rows, tmp_path, monkeypatch)
    assert written.startswith("# Memory-bound kernels against published") and "## Sources" in written
    assert "benchmark/data/" in written


def test_harness_adds_the_gradient_accumulation_of_the_cross_entropy_full_mode() -> None:
    """The Liger cross-entropy script's full mode never resets the input gradient: 12 bytes per logit and one
    launch more than the kernel's own traffic; other rows get nothing."""
    bench = _load()
    full = next(p for p in bench.POINTS if p.kernel == "cross_entropy" and p.mode == "full")
    forward = next(p for p in bench.POINTS if p.kernel == "cross_entropy" and p.mode == "forward")
    s = full.dims
    assert bench.harness(full) == (12 * s["B"] * s["T"] * s["V"], 1)
    assert bench.harness(forward) == (0.0, 0)
    (row,) = bench.compare([full])
    nbytes, launches = bench.traffic(full).pick("full")
    assert (row.bytes, row.launches) == (nbytes + 12 * s["B"] * s["T"] * s["V"], launches + 1)


def test_path_split_covers_each_chains_bytes() -> None:
    """The launch-path split of Megatron's loss adds up to the simulator's bytes per bf16 logit (2 + 36); HF's
    RMSNorm to the simulator's 36 plus 2 for its fp32 weight's fp32 output (4 bytes written, not 2)."""
    bench = _load()
    assert sum(bench.PATH_BYTES[("megatron_cross_entropy", "megatron-unfused", "forward")]) == (
        2 + MEGATRON_LOSS_FWD_BYTES_PER_LOGIT_EXTRA)
    assert sum(bench.PATH_BYTES[("rms_norm", "huggingface", "forward")]) == EAGER_RMSNORM_BYTES[0] + 2


def test_implied_other_rate_inverts_the_two_path_time() -> None:
    """A timing built as vectorised bytes at hbm_efficiency + other bytes at 0.5 of the datasheet + launches gives
    back 0.5; a chain without a split (Liger's fused norm) gives None."""
    bench = _load()
    point = max((p for p in bench.POINTS if p.kernel == "megatron_cross_entropy" and p.mode == "forward"),
                key=lambda p: p.dims["V"])
    gpu = load_gpu("h100-sxm")
    vec, other = bench.PATH_BYTES[(point.kernel, point.provider, point.mode)]
    n = point.dims["B"] * point.dims["S"] * point.dims["V"]
    (row,) = bench.compare([point])
    seconds = (memory_time_s(vec * n, gpu) + other * n / (0.5 * gpu.hbm_bandwidth_GBps * 1e9)
               + row.launches * gpu.kernel_overhead_us * 1e-6)
    (built,) = bench.compare([dataclasses.replace(point, ms=seconds * 1e3)])
    assert bench.implied_other_rate(built, gpu) == pytest.approx(0.5)
    liger = next(p for p in bench.POINTS if p.kernel == "rms_norm" and p.provider == "liger")
    assert bench.implied_other_rate(bench.compare([liger])[0], gpu) is None
