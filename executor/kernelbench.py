"""Device micro-benchmarks of calibration: GEMMs by shape, fused attention by sequence length, memory-bound
kernels, sustained against burst matrix throughput, and kernel launch overhead.

One code path for every device: each benchmark builds random inputs on the device (never zeros, which run
faster than real data and hide unwritten outputs) and times calls through :func:`time_calls`, which reads
CUDA events on a GPU and the host clock on a CPU. The CUDA-only parts are the two small timing functions
and the CUDA-graph replay of :func:`measure_launch`; the CPU tests run everything else at small sizes.
Inputs rotate over several copies when one set is small enough to stay in the GPU's L2 cache
(:data:`ROTATE_BYTES`), so repeated calls read device memory as a training step does.

The FLOP conventions are the cost model's (:mod:`simgrid.model.flops`): a GEMM is ``2 m n k``; a causal
fused attention core is ``4 b s^2 H d`` forward times :func:`simgrid.model.flops.causal_tile_fraction`,
its backward 2.5 times that (FlashAttention recomputes ``Q K^T``), so an efficiency fitted from these
rows reproduces the measured times when the engine prices the same ops.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from simgrid.model.flops import causal_tile_fraction

ROTATE_BYTES = 256 * 2**20
"""Input copies rotate until they span this many bytes (several times the 50-60 MB L2 of an H100/H200,
KINDS.md), up to :data:`MAX_INPUT_SETS` copies."""
MAX_INPUT_SETS = 4
"""Most input copies a benchmark rotates over."""
SWEEP_MN = 8192
"""M = N of the inner-dimension sweep: the shipped profiles' curve is an H800 sweep over K at M = N = 8192."""
SWEEP_K = (256, 512, 1024, 2048, 4096, 8192)
"""Inner dimensions of the sweep (the shipped curve's points, shared/reference/hardware.md)."""
ATTENTION_SEQS = (512, 1024, 2048, 4096, 8192)
"""Sequence lengths of the fused-attention table."""
LAUNCH_CALLS = 2000
"""Tiny kernels launched back to back to time the host's launch overhead."""
GRAPH_KERNELS = 100
"""Tiny kernels captured in one CUDA graph to time the device-side cost per kernel."""


@dataclass(frozen=True, kw_only=True)
class GemmRow:
    """One timed GEMM: ``(m x k) @ (k x n)`` as ``F.linear`` runs it (the weight stored ``n x k``)."""

    label: str
    """What it is (``gpt3-1.3b tp1 qkv fwd``, ``sweep k=1024``, ``sustained``)."""
    m: int
    """Rows of the output (tokens for a forward linear)."""
    n: int
    """Columns of the output."""
    k: int
    """Inner (reduced) dimension."""
    seconds: float
    """Median time of one call."""

    @property
    def flops(self) -> float:
        """``2 m n k``."""
        return 2.0 * self.m * self.n * self.k

    @property
    def tflops(self) -> float:
        """Achieved TFLOP/s."""
        return self.flops / self.seconds / 1e12


@dataclass(frozen=True, kw_only=True)
class AttentionRow:
    """One timed causal fused attention core (``scaled_dot_product_attention``), forward and backward."""

    seq_length: int
    """Sequence length (queries = keys)."""
    heads: int
    """Attention heads."""
    head_dim: int
    """Width of one head."""
    batch: int
    """Sequences."""
    fwd_s: float
    """Median forward time."""
    bwd_s: float
    """Median backward time (forward and backward together, minus the forward)."""

    @property
    def fwd_flops(self) -> float:
        """The cost model's forward FLOPs of the core (causal tiles only)."""
        return 4.0 * self.batch * self.seq_length**2 * self.heads * self.head_dim * causal_tile_fraction(self.seq_length)

    @property
    def flops(self) -> float:
        """Forward plus backward (2.5x the forward) FLOPs, as :func:`simgrid.model.flops.block_flops` counts."""
        return 3.5 * self.fwd_flops

    @property
    def tflops(self) -> float:
        """Achieved TFLOP/s over forward and backward."""
        return self.flops / (self.fwd_s + self.bwd_s) / 1e12


@dataclass(frozen=True, kw_only=True)
class MemoryRow:
    """One timed memory-bound kernel."""

    kernel: str
    """``copy``, ``add``, ``gelu`` or ``layer_norm``."""
    elements: int
    """Elements of one operand."""
    bytes_moved: int
    """Bytes read plus written by one call (each operand once)."""
    seconds: float
    """Median time of one call."""

    @property
    def GBps(self) -> float:
        """Achieved GB/s (10^9 bytes)."""
        return self.bytes_moved / self.seconds / 1e9


@dataclass(frozen=True, kw_only=True)
class SustainedRun:
    """Matrix throughput window by window over a long run of one large GEMM."""

    size: int
    """M = N = K of the GEMM."""
    window_tflops: tuple[float, ...]
    """Achieved TFLOP/s of each window, in order."""
    window_s: float
    """Target length of one window."""

    @property
    def burst_tflops(self) -> float:
        """The first window: clocks before power and heat pull them down."""
        return self.window_tflops[0]

    @property
    def sustained_tflops(self) -> float:
        """Median of the last third of the windows: what a long training run sees."""
        tail = self.window_tflops[-max(1, len(self.window_tflops) // 3):]
        return float(statistics.median(tail))


@dataclass(frozen=True, kw_only=True)
class LaunchCost:
    """Per-kernel overheads."""

    host_us: float
    """Microseconds per tiny kernel launched eagerly back to back (the host's launch path bounds it)."""
    device_us: float
    """Microseconds per tiny kernel replayed from a CUDA graph (device-side gap; on a CPU the host figure)."""


@dataclass(frozen=True, kw_only=True)
class DeviceBench:
    """Everything :func:`executor.devicecal.device_benchmarks` measured on one device."""

    device: str
    """Device name."""
    dtype: str
    """Dtype of the matrix and attention work (``bf16``, or ``fp32`` on a CPU)."""
    gemms: tuple[GemmRow, ...] = ()
    """GEMMs at the shapes of the calibration models."""
    sweep: tuple[GemmRow, ...] = ()
    """GEMMs ``SWEEP_MN x SWEEP_MN x K`` over :data:`SWEEP_K`."""
    attention: tuple[AttentionRow, ...] = ()
    """Fused attention cores by shape and sequence length."""
    memory: tuple[MemoryRow, ...] = ()
    """Memory-bound kernels."""
    sustained: SustainedRun | None = None
    """The long GEMM run."""
    launch: LaunchCost | None = None
    """Launch overheads."""
    environment: dict[str, str] = field(default_factory=dict)
    """Versions and properties (:func:`executor.devices.environment`)."""


def _inputs(make: Callable[[], tuple[torch.Tensor, ...]]) -> list[tuple[torch.Tensor, ...]]:
    """Copies of one input set, enough to span :data:`ROTATE_BYTES` (at most :data:`MAX_INPUT_SETS`)."""
    first = make()
    size = sum(t.numel() * t.element_size() for t in first)
    count = min(MAX_INPUT_SETS, max(1, math.ceil(ROTATE_BYTES / max(1, size))))
    return [first] + [make() for _ in range(count - 1)]


def time_calls(fn: Callable[[int], object], device: torch.device, *, warmup: int = 3, repeats: int = 10) -> list[float]:
    """Seconds of each of ``repeats`` calls ``fn(i)`` after ``warmup`` untimed ones (CUDA events on a GPU)."""
    for i in range(warmup):
        fn(i)
    if device.type == "cuda":
        return _cuda_times(fn, repeats, warmup)
    return _host_times(fn, repeats, warmup)


def _cuda_times(fn: Callable[[int], object], repeats: int, first: int) -> list[float]:
    """Events around each call, recorded back to back and read after one synchronisation (the GPU stays busy)."""
    marks = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
    for i, (start, end) in enumerate(marks):
        start.record()
        fn(first + i)
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) / 1e3 for start, end in marks]


def _host_times(fn: Callable[[int], object], repeats: int, first: int) -> list[float]:
    times = []
    for i in range(repeats):
        begin = time.perf_counter()
        fn(first + i)
        times.append(time.perf_counter() - begin)
    return times


def _median(times: list[float]) -> float:
    return float(statistics.median(times))


def measure_gemm(label: str, m: int, n: int, k: int, *, dtype: torch.dtype, device: torch.device,
                 repeats: int = 10) -> GemmRow:
    """Median time of ``F.linear`` of an ``m x k`` input with an ``n x k`` weight."""
    sets = _inputs(lambda: (torch.randn(m, k, dtype=dtype, device=device), torch.randn(n, k, dtype=dtype, device=device)))
    out = torch.empty(m, n, dtype=dtype, device=device)

    def call(i: int) -> None:
        a, w = sets[i % len(sets)]
        torch.matmul(a, w.t(), out=out)

    return GemmRow(label=label, m=m, n=n, k=k, seconds=_median(time_calls(call, device, repeats=repeats)))


def measure_sweep(*, dtype: torch.dtype, device: torch.device, mn: int = SWEEP_MN,
                  ks: tuple[int, ...] = SWEEP_K) -> list[GemmRow]:
    """``mn x mn x K`` GEMMs over ``ks`` (the inner-dimension sweep the shipped efficiency curve comes from)."""
    return [measure_gemm(f"sweep k={k}", mn, mn, k, dtype=dtype, device=device) for k in ks]


def measure_attention(seq_length: int, heads: int, head_dim: int, *, batch: int = 1, dtype: torch.dtype,
                      device: torch.device, repeats: int = 10) -> AttentionRow:
    """Causal ``scaled_dot_product_attention`` forward, and forward + backward, on ``[s, b, heads, d]`` tensors
    permuted to ``[b, heads, s, d]`` as the executor's attention block passes them."""
    def make() -> tuple[torch.Tensor, ...]:
        return tuple(torch.randn(seq_length, batch, heads, head_dim, dtype=dtype, device=device, requires_grad=True)
                     for _ in range(3))

    sets = _inputs(make)
    grad = torch.randn(batch, heads, seq_length, head_dim, dtype=dtype, device=device)

    def forward(i: int) -> torch.Tensor:
        q, k, v = (t.permute(1, 2, 0, 3) for t in sets[i % len(sets)])
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def forward_backward(i: int) -> None:
        # autograd.grad, not backward(): no accumulation into .grad after the first call (an extra kernel).
        torch.autograd.grad(forward(i), sets[i % len(sets)], grad)

    with torch.no_grad():
        fwd = _median(time_calls(forward, device, repeats=repeats))
    both = _median(time_calls(forward_backward, device, repeats=repeats))
    return AttentionRow(seq_length=seq_length, heads=heads, head_dim=head_dim, batch=batch, fwd_s=fwd,
                        bwd_s=max(both - fwd, 1e-9))


MEMORY_KERNELS: dict[str, tuple[int, Callable[[torch.Tensor, torch.Tensor], object]]] = {
    "copy": (2, lambda x, y: x.clone()),
    "add": (3, lambda x, y: x + y),
    "gelu": (2, lambda x, y: F.gelu(x)),
    "layer_norm": (2, lambda x, y: F.layer_norm(x, (x.shape[-1],))),
}
"""Kernel -> (operand passes counted: reads plus writes of one operand's size, the function)."""


def measure_memory(kernel: str, elements: int, *, width: int, dtype: torch.dtype, device: torch.device,
                   repeats: int = 10) -> MemoryRow:
    """Median time of a memory-bound kernel on ``elements`` values shaped ``[-1, width]``."""
    passes, fn = MEMORY_KERNELS[kernel]
    rows = max(1, elements // width)
    sets = _inputs(lambda: (torch.randn(rows, width, dtype=dtype, device=device),
                            torch.randn(rows, width, dtype=dtype, device=device)))
    seconds = _median(time_calls(lambda i: fn(*sets[i % len(sets)]), device, repeats=repeats))
    size = rows * width
    return MemoryRow(kernel=kernel, elements=size, bytes_moved=passes * size * sets[0][0].element_size(),
                     seconds=seconds)


def measure_sustained(*, dtype: torch.dtype, device: torch.device, duration_s: float = 60.0, size: int = 8192,
                      window_s: float = 1.0) -> SustainedRun:
    """TFLOP/s window by window over ``duration_s`` of back-to-back ``size``-cubed GEMMs."""
    a = torch.randn(size, size, dtype=dtype, device=device)
    b = torch.randn(size, size, dtype=dtype, device=device)
    out = torch.empty(size, size, dtype=dtype, device=device)
    one = _median(time_calls(lambda i: torch.matmul(a, b, out=out), device, warmup=2, repeats=3))
    per_window = max(1, round(window_s / max(one, 1e-9)))
    windows = max(1, round(duration_s / window_s))
    flops = 2.0 * size**3 * per_window
    times = time_calls(lambda i: [torch.matmul(a, b, out=out) for _ in range(per_window)], device, warmup=0,
                       repeats=windows)
    return SustainedRun(size=size, window_tflops=tuple(flops / t / 1e12 for t in times), window_s=window_s)


def measure_launch(device: torch.device, *, calls: int = LAUNCH_CALLS) -> LaunchCost:
    """Per-kernel cost of tiny kernels: launched eagerly (host-bound), and replayed from a CUDA graph."""
    x = torch.zeros(1, device=device)
    for _ in range(10):
        x.add_(1.0)
    if device.type == "cuda":
        torch.cuda.synchronize()
    begin = time.perf_counter()
    for _ in range(calls):
        x.add_(1.0)
    if device.type == "cuda":
        torch.cuda.synchronize()
    host_us = (time.perf_counter() - begin) / calls * 1e6
    device_us = _graph_kernel_us(x) if device.type == "cuda" else host_us
    return LaunchCost(host_us=host_us, device_us=device_us)


def _graph_kernel_us(x: torch.Tensor) -> float:
    """Device time per kernel of :data:`GRAPH_KERNELS` tiny kernels captured in a CUDA graph (CUDA only)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up on a side stream before capture, as torch.cuda.graphs asks
        for _ in range(3):
            x.add_(1.0)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(GRAPH_KERNELS):
            x.add_(1.0)
    times = time_calls(lambda i: graph.replay(), x.device, warmup=2, repeats=10)
    return _median(times) / GRAPH_KERNELS * 1e6
