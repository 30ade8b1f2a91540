"""``simgrid-exec calibrate --device cuda``: measure one GPU and write its calibrated cluster profile.

:func:`device_benchmarks` runs the micro-benchmarks of :mod:`executor.kernelbench` at the shapes the
calibration models use (every linear layer's forward, input-gradient and weight-gradient GEMM, the fused
attention core at the models' head shapes over a range of sequence lengths, element-wise kernels at the
models' activation sizes), plus the inner-dimension sweep, a large copy, a long GEMM run for sustained
against burst throughput, and the launch overheads. :func:`calibrate_device` fits the datasheet GPU of the
device (:func:`executor.devices.require_datasheet`) to them (:mod:`executor.devicefit`) and writes the
profile. The same functions run on a CPU at small sizes (the tests); only the timing differs.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from executor.devicefit import DeviceFit, calibrated_gpu, device_profile, fit_device, predicted_gemm_s
from executor.devices import default_device, device_name, environment, require_datasheet, synchronize
from executor.kernelbench import (
    ATTENTION_SEQS,
    SWEEP_K,
    SWEEP_MN,
    AttentionRow,
    DeviceBench,
    GemmRow,
    LaunchCost,
    MemoryRow,
    SustainedRun,
    measure_attention,
    measure_gemm,
    measure_launch,
    measure_memory,
    measure_sustained,
    measure_sweep,
)
from simgrid.hardware import ClusterSpec, GPUSpec, load_cluster_spec, write_profile
from simgrid.model import get_model
from simgrid.model.blocks import local_q_heads
from simgrid.model.params import mlp_in_width, qkv_width
from simgrid.model.spec import ModelSpec

CALIBRATION_MODELS: tuple[tuple[str, int], ...] = (
    ("gpt3-125m", 1), ("gpt3-350m", 1), ("gpt3-1.3b", 1), ("gpt3-2.7b", 1), ("llama3-8b", 1), ("gpt3-175b", 8),
)
"""(preset, tensor-parallel degree) whose GEMM and attention shapes calibration measures: the models
``benchmarks/gpu_accuracy.py`` trains, a Llama 3 layer (GQA, SwiGLU) and a GPT-3 175B layer at Megatron's tp 8."""
COPY_ELEMENTS = 2**28
"""Elements of the large copy (512 MiB in bf16, 1 GiB moved): far beyond any cache."""
TORCH_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def model_gemms(model: ModelSpec, *, tp: int = 1, micro_batch_size: int = 1) -> list[tuple[str, int, int, int]]:
    """(label, m, n, k) of every linear of one layer and the head, forward, input-gradient and weight-gradient."""
    tokens = micro_batch_size * model.seq_length
    h = model.hidden_size
    linears = {"qkv": (qkv_width(model, tp), h), "out": (h, local_q_heads(model, tp) * model.head_dim),
               "mlp-in": (mlp_in_width(model, tp), h), "mlp-out": (h, model.ffn_size // tp),
               "head": (model.vocab_size // tp, h)}
    out = []
    for name, (n_out, n_in) in linears.items():
        tag = f"{model.name} tp{tp} {name}"
        out += [(f"{tag} fwd", tokens, n_out, n_in), (f"{tag} dgrad", tokens, n_in, n_out),
                (f"{tag} wgrad", n_out, n_in, tokens)]
    return out


def attention_shapes(models: Sequence[tuple[ModelSpec, int]]) -> set[tuple[int, int, int]]:
    """(local heads, head dim, sequence length) of each model's attention core."""
    return {(local_q_heads(m, tp), m.head_dim, m.seq_length) for m, tp in models}


def device_benchmarks(models: Sequence[tuple[ModelSpec, int]], *, device: torch.device, dtype: str = "bf16",
                      sustained_s: float = 60.0, seqs: Sequence[int] = ATTENTION_SEQS, sweep_mn: int = SWEEP_MN,
                      sweep_ks: Sequence[int] = SWEEP_K, copy_elements: int = COPY_ELEMENTS,
                      sustained_size: int = 8192, progress: Callable[[str], None] | None = None) -> DeviceBench:
    """Every micro-benchmark at the shapes of ``models`` ((model, tp) pairs) on ``device``."""
    say = progress or (lambda text: None)
    torch_dtype = TORCH_DTYPES[dtype]
    gemm_shapes: dict[tuple[int, int, int], str] = {}
    for model, tp in models:
        for label, m, n, k in model_gemms(model, tp=tp):
            gemm_shapes.setdefault((m, n, k), label)
    # The long run goes first: its first window is then the burst rate of a GPU that has not been working
    # yet, and every table after it is measured at the clocks a long training run settles to.
    say(f"sustained GEMM rate over {sustained_s:g} s")
    sustained = measure_sustained(dtype=torch_dtype, device=device, duration_s=sustained_s, size=sustained_size,
                                  window_s=min(1.0, sustained_s / 3))
    say(f"GEMMs: {len(gemm_shapes)} shapes")
    gemms = [measure_gemm(label, m, n, k, dtype=torch_dtype, device=device)
             for (m, n, k), label in sorted(gemm_shapes.items(), key=lambda item: item[1])]
    say(f"inner-dimension sweep {sweep_mn} x {sweep_mn} x K, K in {list(sweep_ks)}")
    sweep = measure_sweep(dtype=torch_dtype, device=device, mn=sweep_mn, ks=tuple(sweep_ks))
    heads_dims = sorted({(heads, d) for heads, d, _ in attention_shapes(models)})
    lengths = sorted(set(seqs) | {s for _, _, s in attention_shapes(models)})
    say(f"fused attention: {len(heads_dims)} head shapes x sequence lengths {lengths}")
    attention = [measure_attention(s, heads, d, dtype=torch_dtype, device=device)
                 for heads, d in heads_dims for s in lengths]
    say("memory-bound kernels")
    memory = [measure_memory("copy", copy_elements, width=4096, dtype=torch_dtype, device=device)]
    sizes = sorted({(m.seq_length * m.hidden_size, m.hidden_size) for m, _ in models})
    memory += [measure_memory(kernel, elements, width=width, dtype=torch_dtype, device=device)
               for elements, width in sizes for kernel in ("copy", "add", "gelu", "layer_norm")]
    launch = measure_launch(device)
    synchronize(device)
    return DeviceBench(device=device_name(device), dtype=dtype, gemms=tuple(gemms), sweep=tuple(sweep),
                       attention=tuple(attention), memory=tuple(memory), sustained=sustained, launch=launch,
                       environment=environment(device))


@dataclasses.dataclass(frozen=True, kw_only=True)
class DeviceCalibration:
    """What :func:`calibrate_device` produced."""

    spec: ClusterSpec
    """The calibrated cluster profile."""
    fit: DeviceFit
    """The fitted efficiencies."""
    bench: DeviceBench
    """The raw measurements."""
    datasheet: GPUSpec
    """The datasheet GPU the fit started from."""


def calibrate_device(models: Sequence[tuple[ModelSpec, int]] | None = None, *, device: torch.device | None = None,
                     out: str | Path | None = None, datasheet: str | None = None, sustained_s: float = 60.0,
                     progress: Callable[[str], None] | None = None, **sizes: Any) -> DeviceCalibration:
    """Measure ``device`` (default: the first GPU), fit its datasheet profile, write the result to ``out``.

    ``datasheet``: a cluster profile of this GPU, when its device name has none among the shipped ones.
    ``sizes`` go to :func:`device_benchmarks` (the tests shrink every benchmark).
    """
    device = device or default_device()
    pairs = list(models) if models is not None else [(get_model(name), tp) for name, tp in CALIBRATION_MODELS]
    sheet = require_datasheet(device_name(device), datasheet)
    base = load_cluster_spec(sheet.cluster)
    dtype = "bf16" if device.type == "cuda" else "fp32"
    bench = device_benchmarks(pairs, device=device, dtype=dtype, sustained_s=sustained_s, progress=progress, **sizes)
    fit = fit_device(bench, base.node.gpu, dtype=dtype, attention_shapes=attention_shapes(pairs))
    memory_GiB = torch.cuda.get_device_properties(device).total_memory / 2**30 if device.type == "cuda" else None
    gpu = calibrated_gpu(base.node.gpu, fit, bench, memory_GiB=memory_GiB, when=datetime.date.today().isoformat())
    spec = device_profile(base, gpu, bench, name=f"{base.name}-calibrated")
    if out is not None:
        write_profile(spec, out)
    return DeviceCalibration(spec=spec, fit=fit, bench=bench, datasheet=base.node.gpu)


def format_calibration(cal: DeviceCalibration) -> str:
    """The measured tables beside what the datasheet and the calibrated profiles predict for them."""
    bench, sheet, gpu, dtype = cal.bench, cal.datasheet, cal.spec.node.gpu, cal.bench.dtype
    peak = sheet.peak_flops(dtype) / 1e12
    lines = [f"device {bench.device}, {dtype} peak {peak:.1f} TFLOP/s (datasheet {sheet.name})", "",
             f"{'GEMM':<34}{'m':>7}{'n':>7}{'k':>7}{'TFLOP/s':>9}{'of peak':>9}{'datasheet':>11}{'calibrated':>11}"]
    for r in (*bench.gemms, *bench.sweep):
        errors = [f"{(predicted_gemm_s(r, g, dtype=dtype) - r.seconds) / r.seconds:+.0%}" for g in (sheet, gpu)]
        lines.append(f"{r.label:<34}{r.m:>7}{r.n:>7}{r.k:>7}{r.tflops:>9.1f}{r.tflops / peak:>9.1%}"
                     f"{errors[0]:>11}{errors[1]:>11}")
    lines += ["", f"{'attention (causal)':<22}{'seq':>7}{'fwd ms':>9}{'bwd ms':>9}{'TFLOP/s':>9}{'of peak':>9}"]
    for a in bench.attention:
        lines.append(f"heads {a.heads:>3} d {a.head_dim:>4}{'':<6}{a.seq_length:>7}{a.fwd_s * 1e3:>9.3f}"
                     f"{a.bwd_s * 1e3:>9.3f}{a.tflops:>9.1f}{a.tflops / peak:>9.1%}")
    lines += ["", f"{'memory-bound':<14}{'elements':>12}{'GB/s':>9}{'of datasheet':>14}"]
    for m in bench.memory:
        lines.append(f"{m.kernel:<14}{m.elements:>12}{m.GBps:>9.0f}{m.GBps / sheet.hbm_bandwidth_GBps:>14.1%}")
    if bench.sustained is not None:
        s = bench.sustained
        lines += ["", f"{s.size}^3 GEMM over {len(s.window_tflops)} windows: burst {s.burst_tflops:.1f} TFLOP/s, "
                      f"sustained {s.sustained_tflops:.1f} TFLOP/s ({s.sustained_tflops / s.burst_tflops - 1:+.1%}), "
                      f"lowest window {min(s.window_tflops):.1f}"]
    if bench.launch is not None:
        lines.append(f"launch overhead: {bench.launch.host_us:.2f} us per eager launch (host), "
                     f"{bench.launch.device_us:.2f} us per kernel replayed from a graph (device)")
    fit = cal.fit
    attention = f"{fit.fused_attention_efficiency:.3f}" if fit.fused_attention_efficiency is not None else "n/a"
    lines += ["", f"{'profile field':<28}{'datasheet':>12}{'calibrated':>12}",
              f"{'matmul.max_efficiency':<28}{sheet.matmul.max_efficiency:>12.4f}{gpu.matmul.max_efficiency:>12.4f}",
              f"{'fused_attention_efficiency':<28}{sheet.attention_efficiency:>12.3f}{attention:>12}",
              f"{'hbm_efficiency':<28}{sheet.hbm_efficiency:>12.3f}{gpu.hbm_efficiency:>12.3f}",
              f"{'kernel_overhead_us':<28}{sheet.kernel_overhead_us:>12.2f}{gpu.kernel_overhead_us:>12.2f}",
              f"{'memory_GiB':<28}{sheet.memory_GiB:>12.1f}{gpu.memory_GiB:>12.1f}"]
    return "\n".join(lines)


def bench_to_json(bench: DeviceBench) -> dict[str, Any]:
    """The raw measurements as plain JSON data."""
    return dataclasses.asdict(bench)


def bench_from_json(data: dict[str, Any]) -> DeviceBench:
    """Inverse of :func:`bench_to_json`."""
    sustained = data.get("sustained")
    launch = data.get("launch")
    return DeviceBench(
        device=data["device"], dtype=data["dtype"], gemms=tuple(GemmRow(**r) for r in data.get("gemms", ())),
        sweep=tuple(GemmRow(**r) for r in data.get("sweep", ())),
        attention=tuple(AttentionRow(**r) for r in data.get("attention", ())),
        memory=tuple(MemoryRow(**r) for r in data.get("memory", ())),
        sustained=SustainedRun(size=sustained["size"], window_tflops=tuple(sustained["window_tflops"]),
                               window_s=sustained["window_s"]) if sustained else None,
        launch=LaunchCost(**launch) if launch else None, environment=dict(data.get("environment", {})))


def write_bench_json(bench: DeviceBench, path: str | Path) -> None:
    """Write :func:`bench_to_json` to ``path``."""
    Path(path).write_text(json.dumps(bench_to_json(bench), indent=1) + "\n", encoding="utf-8")
