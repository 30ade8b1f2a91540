"""Memory-bound kernel pricing against published per-kernel timings (issue 12, kernelcheck).

Usage::

    python benchmarks/kernels_published.py               # print, and write docs/kernel_validation.md
    python benchmarks/kernels_published.py --skip-write  # print only

Each point of :mod:`kernels_published_data` (linkedin/Liger-Kernel's benchmark CSVs) is priced as the simulator
prices memory-bound work: the bytes the kernels read and write at the profile's achievable HBM bandwidth
(:func:`simgrid.costs.compute.memory_time_s`: datasheet bandwidth x ``hbm_efficiency``, BabelStream's streaming
rate) plus the profile's ``kernel_overhead_us`` per launch. Bytes and launches come from the simulator's own code
(:mod:`simgrid.model.kernels`), not a copy:

* RMSNorm (``LlamaRMSNorm`` eager; Liger's fused kernel): the fused norm reads x and writes y (2E forward, 3E
  backward, one launch each, the module's table); the eager extra is ``_eager_extra`` of a head block (the norm
  only): ``EAGER_RMSNORM_BYTES`` and its launch counts.
* RoPE (HF ``apply_rotary_pos_emb``; Liger's fused kernel): the difference of ``block_kernels`` (fused) and of
  ``_eager_extra`` (eager) between a rotary and a learned-position attention block: the simulator's rotary
  bytes and launches and nothing else. The simulator models torchtitan's complex-multiply rotary; HF's
  ``rotate_half`` form moves the same 20 bytes per element forward (mul, neg on half, cat, mul, add) in 5
  launches per tensor against the simulator's 5 for Q and K together (printed as a caveat, not corrected).
* Cross entropy (PyTorch ``nn.CrossEntropyLoss`` on fp32 logits; Megatron-Core's unfused vocab-parallel
  cross entropy on bf16 logits): the per-logit bytes are the slope of ``block_kernels`` of the head block in
  the vocabulary size (eager or fused kernels), so they are the simulator's constants. The Liger script feeds
  fp32 logits: PyTorch then runs no ``.float()`` copy and no cast back, so the cast's bytes (read d, write 4;
  read 4, write d) and launches are taken off. Its ``full`` mode never resets the input's gradient, so
  autograd accumulates into it (``harness``: 12 bytes per logit and a launch, added to the row).

Profiles: 'H100 80GB HBM3' (SXM) on ``h100-sxm`` and 'A100-SXM4-80GB' on ``a100-80gb-sxm`` as shipped
(``headline``); 'A100 80GB PCIe' and 'H100 NVL' on the same die's profile with the PCIe part's datasheet HBM
bandwidth (``variant``: power limits differ, which memory-bound kernels barely feel). Error = modelled rate / measured rate - 1
= measured time / modelled time - 1 (+ = model faster, optimistic; as benchmarks/gemm_published.py). ``GB/s`` = bytes / measured time; ``of HBM`` divides it by the datasheet bandwidth, to be
read against the profile's ``hbm_efficiency``. A row is ``launch-bound`` when the modelled launch overhead is
more than half its modelled time.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from simgrid.costs.compute import memory_time_s
from simgrid.hardware import GPUSpec, load_gpu
from simgrid.layout.spec import Layout
from simgrid.model.blocks import block_kind
from simgrid.model.kernels import _eager_extra, block_kernels
from simgrid.model.spec import ModelSpec

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the data module lives beside this script
import published_doc_cli
from kernels_published_data import POINTS, KernelPoint

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "kernel_validation.md"

#: CSV ``gpu_name`` -> (profile, datasheet HBM GB/s override or None, status, note).
GPUS: dict[str, tuple[str, float | None, str, str]] = {
    "NVIDIA A100-SXM4-80GB": ("a100-80gb-sxm", None, "headline", "as shipped"),
    "NVIDIA H100 80GB HBM3": ("h100-sxm", None, "headline", "as shipped"),
    # NVIDIA A100 Tensor Core GPU datasheet (A100 80GB PCIe column): 1,935 GB/s HBM2e, 300 W max TDP (SXM: 2,039
    # GB/s, 400 W). Same GA100, 108 SMs.
    "NVIDIA A100 80GB PCIe": ("a100-80gb-sxm", 1935.0, "variant", "HBM 1935 GB/s (datasheet, PCIe), 300 W not 400 W"),
    # NVIDIA H100 datasheet (H100 NVL column): 3.9 TB/s HBM3 per GPU, 350-400 W (SXM: 3.35 TB/s, 700 W); also
    # AnandTech, 'NVIDIA Announces H100 NVL', 2023-03-21, spec table. Same GH100 with 132 SMs.
    "NVIDIA H100 NVL": ("h100-sxm", 3900.0, "variant", "HBM 3900 GB/s (datasheet, NVL), 350-400 W not 700 W"),
}

_BASE = ModelSpec(name="kernelcheck", num_layers=1, hidden_size=4096, num_heads=32, num_kv_heads=8,
                  ffn_hidden_size=11008, gated_mlp=True, vocab_size=32000, seq_length=2048, tied_embeddings=False,
                  norm="rmsnorm", position="rope", bias=False)


def _block(model: ModelSpec, kind: str) -> int:
    return next(i for i in range(4 * model.num_layers + 4) if block_kind(model, i)[0] == kind)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Traffic:
    """Bytes and launches of one kernel sequence, forward and backward, as the simulator counts them."""

    fwd_bytes: float
    fwd_launches: int
    bwd_bytes: float
    bwd_launches: int

    def pick(self, mode: str) -> tuple[float, int]:
        """(bytes, launches) of ``forward``, ``backward`` or ``full``."""
        if mode == "forward":
            return self.fwd_bytes, self.fwd_launches
        if mode == "backward":
            return self.bwd_bytes, self.bwd_launches
        return self.fwd_bytes + self.bwd_bytes, self.fwd_launches + self.bwd_launches


def rms_norm_traffic(rows: int, hidden: int, provider: str) -> Traffic:
    """A bf16 ``[rows, hidden]`` RMSNorm: fused (2E, 1 / 3E, 1) plus, eagerly, the head block's ``_eager_extra``."""
    d = 2
    elems = rows * hidden
    fused = Traffic(fwd_bytes=2 * elems * d, fwd_launches=1, bwd_bytes=3 * elems * d, bwd_launches=1)
    if provider == "liger":
        return fused
    model = dataclasses.replace(_BASE, hidden_size=hidden, seq_length=rows)
    extra = _eager_extra(model, Layout(kernel_fusion="eager"), "head")
    return Traffic(fwd_bytes=fused.fwd_bytes + extra[0], fwd_launches=1 + extra[2],
                   bwd_bytes=fused.bwd_bytes + extra[1], bwd_launches=1 + extra[3])


def rope_traffic(seq: int, hidden: int, q_heads: int, kv_heads: int, provider: str) -> Traffic:
    """Rotary on Q and K: what a rotary attention block adds over a learned-position one, in the simulator."""
    rope = dataclasses.replace(_BASE, hidden_size=hidden, num_heads=q_heads, num_kv_heads=kv_heads, seq_length=seq)
    learned = dataclasses.replace(rope, position="learned")
    fused = Layout(kernel_fusion="fused", flash_attention=True)
    a, b = block_kernels(rope, fused, _block(rope, "attn")), block_kernels(learned, fused, _block(learned, "attn"))
    traffic = Traffic(fwd_bytes=a.fwd_hbm_bytes - b.fwd_hbm_bytes, fwd_launches=a.fwd_kernels - b.fwd_kernels,
                      bwd_bytes=a.bwd_hbm_bytes - b.bwd_hbm_bytes, bwd_launches=a.bwd_kernels - b.bwd_kernels)
    if provider == "liger":
        return traffic
    eager = Layout(kernel_fusion="eager", flash_attention=True)
    e, f = _eager_extra(rope, eager, "attn"), _eager_extra(learned, eager, "attn")
    return Traffic(fwd_bytes=traffic.fwd_bytes + e[0] - f[0], fwd_launches=traffic.fwd_launches + e[2] - f[2],
                   bwd_bytes=traffic.bwd_bytes + e[1] - f[1], bwd_launches=traffic.bwd_launches + e[3] - f[3])


def _loss_per_logit(layout: Layout) -> tuple[float, float]:
    """Forward and backward bytes per logit of the simulator's loss: the slope of the head block in the vocab."""
    model = dataclasses.replace(_BASE, seq_length=1024, vocab_size=32768)
    wider = dataclasses.replace(model, vocab_size=65536)
    a, b = block_kernels(model, layout, _block(model, "head")), block_kernels(wider, layout, _block(wider, "head"))
    logits = 1024 * (wider.vocab_size - model.vocab_size)
    return (b.fwd_hbm_bytes - a.fwd_hbm_bytes) / logits, (b.bwd_hbm_bytes - a.bwd_hbm_bytes) / logits


#: Launches of the loss alone in the head block's counts (simgrid.model.kernels.block_kernels: the head's
#: launches less its norm and GEMMs: 2 forward, 3 backward).
def _loss_launches(layout: Layout) -> tuple[int, int]:
    model = _BASE
    head = block_kernels(model, layout, _block(model, "head"))
    extra = _eager_extra(model, layout, "head")  # the eager norm's extra launches
    return head.fwd_kernels - 2 - extra[2], head.bwd_kernels - 3 - extra[3]


def cross_entropy_traffic(tokens: int, vocab: int, provider: str) -> Traffic:
    """PyTorch's eager cross entropy on fp32 logits (no cast either way) or Megatron's on bf16 logits."""
    if provider == "megatron-unfused":
        layout = Layout(kernel_fusion="fused")
        fwd, bwd = _loss_per_logit(layout)
        k_fwd, k_bwd = _loss_launches(layout)
        return Traffic(fwd_bytes=fwd * tokens * vocab, fwd_launches=k_fwd, bwd_bytes=bwd * tokens * vocab,
                       bwd_launches=k_bwd)
    layout = Layout(kernel_fusion="eager")
    fwd, bwd = _loss_per_logit(layout)
    k_fwd, k_bwd = _loss_launches(layout)
    d = layout.param_bytes
    # fp32 logits: no .float() copy (read d, write 4) and no cast of the gradient back (read 4, write d).
    return Traffic(fwd_bytes=(fwd - d - 4) * tokens * vocab, fwd_launches=k_fwd - 1,
                   bwd_bytes=(bwd - 4 - d) * tokens * vocab, bwd_launches=k_bwd - 1)


def traffic(p: KernelPoint) -> Traffic:
    """The simulator's bytes and launches for point ``p``'s kernel, provider and shape."""
    s = p.dims
    if p.kernel == "rms_norm":
        return rms_norm_traffic(s["M"], s["H"], p.provider)
    if p.kernel == "rope":
        # the sweep's x is the hidden size ``H`` (seq_len fixed) or the sequence length ``T`` (hidden_size fixed)
        seq, hidden = s.get("seq_len", s.get("T", 0)), s.get("hidden_size", s.get("H", 0))
        return rope_traffic(seq, hidden, s["num_q_heads"], s["num_kv_heads"], p.provider)
    if p.kernel == "cross_entropy":
        return cross_entropy_traffic(s["B"] * s["T"], s["V"], p.provider)
    if p.kernel == "megatron_cross_entropy":
        return cross_entropy_traffic(s["B"] * s["S"], s["V"] // s["TP"], p.provider)
    raise ValueError(f"kernel {p.kernel!r} has no pricing here")


#: Bytes per fp32 logit the Liger cross-entropy script's ``full`` mode adds outside the loss: it never resets
#: ``_input.grad`` (``do_bench(full)`` without ``grad_to_none``), so from the second call on autograd's
#: AccumulateGrad adds the new gradient into the old one in place (``variable_grad += new_grad``,
#: torch/csrc/autograd/functions/accumulate_grad.h): read 4 + 4, write 4, one launch. Training never does this
#: to logits (their gradient flows into the output GEMM), so it is the harness's, not the simulator's.
CE_FULL_ACCUMULATE_BYTES_PER_LOGIT = 12


def harness(p: KernelPoint) -> tuple[float, int]:
    """(bytes, launches) the benchmark script runs beyond the kernel itself (module constants above)."""
    if p.kernel == "cross_entropy" and p.provider == "huggingface" and p.mode == "full":
        s = p.dims
        return CE_FULL_ACCUMULATE_BYTES_PER_LOGIT * s["B"] * s["T"] * s["V"], 1
    return 0.0, 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Row:
    """One point compared."""

    point: KernelPoint
    bytes: float
    launches: int
    model_ms: float
    launch_ms: float
    hbm_GBps: float
    """Datasheet HBM bandwidth of the measured part."""
    status: str

    @property
    def error(self) -> float:
        """Modelled rate / measured rate - 1 = measured time / modelled time - 1 (+: the model is faster, as in
        benchmarks/gemm_published.py)."""
        return self.point.ms / self.model_ms - 1.0

    @property
    def achieved_GBps(self) -> float:
        """Bytes over the measured time."""
        return self.bytes / (self.point.ms * 1e-3) / 1e9

    @property
    def launch_bound(self) -> bool:
        """More than half the modelled time is per-launch overhead."""
        return self.launch_ms > 0.5 * self.model_ms


def _gpu(name: str, cache: dict[str, GPUSpec]) -> GPUSpec:
    if name not in cache:
        profile, bandwidth, _, _ = GPUS[name]
        gpu = load_gpu(profile)
        cache[name] = gpu if bandwidth is None else dataclasses.replace(gpu, hbm_bandwidth_GBps=bandwidth)
    return cache[name]


def compare(points: Iterable[KernelPoint] = POINTS) -> list[Row]:
    """Each point with the simulator's time for it."""
    cache: dict[str, GPUSpec] = {}
    rows = []
    for p in points:
        gpu = _gpu(p.gpu, cache)
        nbytes, launches = traffic(p).pick(p.mode)
        extra_bytes, extra_launches = harness(p)
        nbytes, launches = nbytes + extra_bytes, launches + extra_launches
        launch_s = launches * gpu.kernel_overhead_us * 1e-6
        seconds = memory_time_s(nbytes, gpu) + launch_s
        rows.append(Row(point=p, bytes=nbytes, launches=launches, model_ms=seconds * 1e3, launch_ms=launch_s * 1e3,
                        hbm_GBps=gpu.hbm_bandwidth_GBps, status=GPUS[p.gpu][2]))
    return rows


def _stats(rows: Sequence[Row]) -> str:
    if not rows:
        return "| 0 | - | - | - | - |"
    errors = [r.error for r in rows]
    share = statistics.median(r.achieved_GBps / r.hbm_GBps for r in rows)
    return (f"| {len(rows)} | {statistics.mean(errors):+.1%} | {statistics.mean(abs(e) for e in errors):.1%} | "
            f"{sum(abs(e) <= 0.10 for e in errors)}/{len(rows)} | {share:.2f} |")


def _shape(p: KernelPoint) -> str:
    return " ".join(f"{k}={v}" for k, v in p.shape)


def report(rows: Sequence[Row]) -> str:
    """Every point, then summaries by provider, GPU, kernel and regime."""
    lines = ["| # | kernel | provider | mode | GPU | shape | MB moved | launches | measured ms | model ms | error | "
             "GB/s | of HBM | regime |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(rows, 1):
        p = r.point
        lines.append(f"| {i} | {p.kernel} | {p.provider} | {p.mode} | {p.gpu.removeprefix('NVIDIA ')} | {_shape(p)} | "
                     f"{r.bytes / 1e6:.1f} | {r.launches} | {p.ms:.4f} | {r.model_ms:.4f} | {r.error:+.1%} | "
                     f"{r.achieved_GBps:.0f} | {r.achieved_GBps / r.hbm_GBps:.2f} | "
                     f"{'launch' if r.launch_bound else 'bandwidth'} |")
    band = [r for r in rows if not r.launch_bound]
    largest = _largest(rows)
    lines += ["", "Summary (error = measured time / modelled time - 1, + = model faster; 'of HBM' = median measured bytes/s over "
              "the datasheet bandwidth, against hbm_efficiency 0.81 on A100 and 0.88 on H100):", "",
              "| group | points | mean signed | MAE | within 10% | of HBM |", "|---|---|---|---|---|---|",
              f"| all {_stats(rows)}", f"| headline (SXM parts, profiles as shipped) "
              f"{_stats([r for r in rows if r.status == 'headline'])}",
              f"| bandwidth-bound rows {_stats(band)}",
              f"| largest shape of each sweep {_stats(largest)}", f"| launch-bound rows {_stats([r for r in rows if r.launch_bound])}"]
    for provider in sorted({r.point.provider for r in rows}):
        lines.append(f"| bandwidth-bound, provider {provider} {_stats([r for r in band if r.point.provider == provider])}")
    for gpu in sorted({r.point.gpu for r in rows}):
        lines.append(f"| bandwidth-bound, GPU {gpu.removeprefix('NVIDIA ')} "
                     f"{_stats([r for r in band if r.point.gpu == gpu])}")
    for key in sorted({(r.point.kernel, r.point.provider) for r in rows}):
        for mode in ("forward", "backward", "full"):
            group = [r for r in band if (r.point.kernel, r.point.provider) == key and r.point.mode == mode]
            if group:
                lines.append(f"| bandwidth-bound, {key[0]} {key[1]} {mode} {_stats(group)}")
    lines += ["", "Largest shape of each sweep (kernel, provider, mode, GPU, swept axis): the asymptotic rate, free of "
              "launch and host latency:", "", "| kernel | provider | mode | GPU | shape | error | of HBM |",
              "|---|---|---|---|---|---|---|"]
    for r in largest:
        lines.append(f"| {r.point.kernel} | {r.point.provider} | {r.point.mode} | {r.point.gpu.removeprefix('NVIDIA ')} | "
                     f"{_shape(r.point)} | {r.error:+.1%} | {r.achieved_GBps / r.hbm_GBps:.2f} |")
    return "\n".join(lines) + "\n" + path_report(rows)


def _largest(rows: Sequence[Row]) -> list[Row]:
    """The row moving the most bytes in each (kernel, provider, mode, GPU, fixed dimensions) sweep."""
    best: dict[tuple[str, ...], Row] = {}
    for r in rows:
        p = r.point
        key = (p.kernel, p.provider, p.mode, p.gpu, ",".join(sorted(k for k, _ in p.shape)))
        if key not in best or r.bytes > best[key].bytes:
            best[key] = r
    return list(best.values())


#: Bytes per element (RMSNorm) or logit (cross entropy) of two eager forward chains, split by the launch path
#: PyTorch's CUDA TensorIterator takes (read at pytorch/pytorch main; see docs/design.md "Eager kernel rates
#: (session 11)"): ``vectorised``: every operand contiguous and of the lambda's dtype (CUDALoops.cuh
#: ``gpu_kernel_impl_nocast`` -> ``launch_vectorized_kernel``), fp32 -> bf16 copies (Copy.cu
#: ``bfloat16_copy_kernel_cuda``, ``gpu_kernel_nocast``) and reductions over the contiguous dim (Reduce.cuh
#: ``vectorize_input``); ``other``: a broadcast (stride-0) or strided operand (``launch_legacy_kernel`` with an
#: ``OffsetCalculator``, one scalar access per operand and element) or a dtype cast inside the kernel (bf16 ->
#: fp32 copies and mixed-dtype binaries: ``needs_dynamic_casting`` -> the unrolled ``LoadWithCast`` kernel).
#: HF ``LlamaRMSNorm`` as Liger's benchmark_rms_norm.py defines it (fp32 weight): pow 4+4, mean 4, ``.to(bf16)``
#: 4+2 | ``.to(float32)`` 2+4, ``x * rsqrt(var)`` with var [M, 1] 4+4, fp32 weight [H] * bf16 -> fp32 2+4.
#: Megatron-Core ``VocabParallelCrossEntropy`` (cross_entropy.py): max 4, exp 4+4, sum 4 | ``.float()`` 2+4,
#: ``-= logits_max.unsqueeze(-1)`` 4+4, ``exp_logits.div_(sum.unsqueeze(-1))`` 4+4. (+ eps and rsqrt on [M, 1]
#: and the token-sized target ops are left out: under 0.1% of the bytes at these shapes.)
PATH_BYTES: dict[tuple[str, str, str], tuple[int, int]] = {
    ("rms_norm", "huggingface", "forward"): (18, 20),
    ("megatron_cross_entropy", "megatron-unfused", "forward"): (16, 22),
}


def _elements(p: KernelPoint) -> int:
    s = p.dims
    if p.kernel == "rms_norm":
        return s["M"] * s["H"]
    return s["B"] * s["S"] * s["V"] // s["TP"]


def implied_other_rate(row: Row, gpu: GPUSpec) -> float | None:
    """Share of the datasheet HBM bandwidth the ``other``-path bytes of ``row`` (:data:`PATH_BYTES`) would run at
    if its ``vectorised`` bytes ran at the profile's ``hbm_efficiency`` and each launch cost
    ``kernel_overhead_us``: ``other / (measured - vectorised at the streaming rate - launches) / datasheet``.
    None when the chain has no split here or nothing is left for the other path."""
    p = row.point
    split = PATH_BYTES.get((p.kernel, p.provider, p.mode))
    if split is None:
        return None
    n = _elements(p)
    rest_s = p.ms * 1e-3 - memory_time_s(split[0] * n, gpu) - row.launches * gpu.kernel_overhead_us * 1e-6
    if rest_s <= 0:
        return None
    return split[1] * n / rest_s / (gpu.hbm_bandwidth_GBps * 1e9)


def path_report(rows: Sequence[Row]) -> str:
    """The largest bandwidth-bound shape of each split chain and GPU, with the rate its ``other`` path implies."""
    cache: dict[str, GPUSpec] = {}
    lines = ["", "Non-vectorised launch paths (PATH_BYTES; docs/design.md, 'Eager kernel rates (session 11)'): the rate "
             "the broadcast / strided / casting kernels of a chain imply when its vectorised kernels run at the "
             "profile's hbm_efficiency:", "",
             "| kernel | provider | mode | GPU | shape | vectorised B | other B | other path, of HBM | other path, GB/s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in _largest([r for r in rows if not r.launch_bound]):
        gpu = _gpu(r.point.gpu, cache)
        rate = implied_other_rate(r, gpu)
        if rate is None:
            continue
        p = r.point
        vec, other = PATH_BYTES[(p.kernel, p.provider, p.mode)]
        lines.append(f"| {p.kernel} | {p.provider} | {p.mode} | {p.gpu.removeprefix('NVIDIA ')} | {_shape(p)} | {vec} | "
                     f"{other} | {rate:.2f} | {rate * gpu.hbm_bandwidth_GBps:.0f} |")
    return "\n".join(lines)


DOC_HEAD = """# Memory-bound kernels against published per-kernel timings

Generated by `python benchmarks/kernels_published.py` (do not edit by hand). Each row is one kernel timing from
linkedin/Liger-Kernel's benchmark CSVs (file, commit and line per row under Sources; data module
`benchmarks/kernels_published_data.py`), priced as the simulator prices memory-bound work: the bytes and launches
`simgrid.model.kernels` counts for that kernel, at `memory_time_s` (datasheet HBM x `hbm_efficiency`) plus
`kernel_overhead_us` per launch. `MB moved` = those bytes; `GB/s` = bytes / measured time; `of HBM` = that over
the datasheet bandwidth (the profile assumes 0.81 on A100, 0.88 on H100). `regime`: `launch` when the modelled
launch overhead is over half the modelled time (the measurement is then mostly host and launch latency),
`bandwidth` otherwise. A100 80GB PCIe and H100 NVL rows use the SXM profile with the PCIe/NVL datasheet
bandwidth (1935 and 3900 GB/s; lower power limits not modelled). See docs/design.md, "Memory-bound kernels
against Liger-Kernel's timings (session 10)", for the reading.

"""


def sources(rows: Sequence[Row]) -> str:
    """One line per CSV file and commit, with the row lines used."""
    files: dict[tuple[str, str], list[int]] = {}
    for r in rows:
        files.setdefault((r.point.file, r.point.commit), []).append(r.point.line)
    return "\n".join(f"- linkedin/Liger-Kernel benchmark/data/{f} at {c}: lines {', '.join(map(str, sorted(v)))}"
                     for (f, c), v in files.items())


def main(argv: Sequence[str] | None = None) -> int:
    return published_doc_cli.run(sys.modules[__name__], argv)


if __name__ == "__main__":
    sys.exit(main())
