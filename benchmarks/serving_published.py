"""Compare (not validate) the serving simulator with TensorRT-LLM's published throughput and first-token
latency, each row with the layout it states (model, GPU, tensor parallelism, batch, input/output lengths).

Source: NVIDIA TensorRT-LLM, ``docs/source/performance.md`` (github.com/NVIDIA/TensorRT-LLM, commit
77d24b5fa178f11ed7fafdd9833b7245e075f721, "updated for v0.6.1"): "Peak Throughput" tables in output tokens/s
per GPU and "Low Latency" tables of first-token latency at batch 1 (from v0.5). The engines were built for
Llama 2 7B and 70B ("For the GPT-J, Llama2-7b, and Llama2-70b benchmarks ..."); A100 rows are FP16, H100
rows FP8 weights with an FP8 KV cache (``--enable_fp8 --fp8_kv_cache``). Throughput was measured with
``gptSessionBenchmark``: a static batch of identical requests is prefilled and decoded to the output length,
so the simulator runs ``batching="static"`` with every request at time 0 and ``max_batch_size`` = the batch.

Nothing here is fitted: the GPU profiles are the shipped ones (their ``[sources]`` name each figure), and
the rows are printed as they come out. Run: ``python benchmarks/serving_published.py`` (about 10 s).
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass

from simgrid.serving import Request, ServingConfig, ServingLayout, simulate_serving

SOURCE = ("TensorRT-LLM docs/source/performance.md (v0.6.1 tables; commit 77d24b5f), "
          "github.com/NVIDIA/TensorRT-LLM")
CLUSTERS = {"A100": "dgx-a100-hdr", "H100": "dgx-h100-ndr"}
PRECISION = {"A100": ("bf16", "auto"), "H100": ("fp8", "fp8")}  # A100 FP16 runs at the bf16 rate and bytes


@dataclass(frozen=True)
class ThroughputRow:
    """One row of the "Peak Throughput" tables."""

    gpu: str
    model: str
    tp: int
    batch: int
    input_tokens: int
    output_tokens: int
    published_tokens_per_s_per_gpu: float


@dataclass(frozen=True)
class LatencyRow:
    """One row of the "Low Latency" tables (batch 1)."""

    gpu: str
    model: str
    tp: int
    input_tokens: int
    published_first_token_ms: float


THROUGHPUT = (
    ThroughputRow("A100", "llama2-7b", 1, 384, 128, 128, 5586),
    ThroughputRow("A100", "llama2-7b", 1, 60, 128, 2048, 1928),
    ThroughputRow("A100", "llama2-7b", 1, 52, 2048, 128, 591),
    ThroughputRow("A100", "llama2-7b", 2, 64, 2048, 2048, 782),
    ThroughputRow("A100", "llama2-70b", 4, 1280, 128, 128, 670),
    ThroughputRow("A100", "llama2-70b", 4, 240, 128, 2048, 525),
    ThroughputRow("A100", "llama2-70b", 4, 120, 2048, 128, 79),
    ThroughputRow("H100", "llama2-7b", 1, 768, 128, 128, 19694),
    ThroughputRow("H100", "llama2-7b", 1, 112, 128, 2048, 6818),
    ThroughputRow("H100", "llama2-7b", 1, 80, 2048, 128, 2244),
    ThroughputRow("H100", "llama2-7b", 1, 48, 2048, 2048, 2740),
    ThroughputRow("H100", "llama2-70b", 2, 1024, 128, 128, 2657),
    ThroughputRow("H100", "llama2-70b", 4, 480, 128, 2048, 1486),
    ThroughputRow("H100", "llama2-70b", 2, 96, 2048, 128, 306),
    ThroughputRow("H100", "llama2-70b", 2, 64, 2048, 2048, 547),
)

LATENCY = (
    LatencyRow("A100", "llama2-7b", 1, 128, 16),
    LatencyRow("A100", "llama2-7b", 1, 2048, 133),
    LatencyRow("A100", "llama2-70b", 4, 128, 47),
    LatencyRow("A100", "llama2-70b", 4, 2048, 377),
    LatencyRow("H100", "llama2-7b", 1, 128, 7),
    LatencyRow("H100", "llama2-7b", 1, 2048, 36),
    LatencyRow("H100", "llama2-70b", 4, 128, 26),
    LatencyRow("H100", "llama2-70b", 4, 2048, 109),
)


def _config(gpu: str, batch: int) -> ServingConfig:
    dtype, kv = PRECISION[gpu]
    return ServingConfig(batching="static", max_batch_size=batch, dtype=dtype, kv_dtype=kv)  # type: ignore[arg-type]


def predict_throughput(row: ThroughputRow) -> float:
    """Output tokens/s per GPU of one static batch of identical requests, all at time 0."""
    requests = [Request(id=i, arrival_s=0.0, prompt_tokens=row.input_tokens, output_tokens=row.output_tokens)
                for i in range(row.batch)]
    result = simulate_serving(row.model, CLUSTERS[row.gpu], ServingLayout(tp=row.tp), requests,
                              _config(row.gpu, row.batch))
    return result.metrics.output_tokens_per_s_per_gpu


def predict_first_token_ms(row: LatencyRow) -> float:
    """Time to first token of one request alone on the deployment, in ms."""
    requests = [Request(id=0, arrival_s=0.0, prompt_tokens=row.input_tokens, output_tokens=1)]
    result = simulate_serving(row.model, CLUSTERS[row.gpu], ServingLayout(tp=row.tp), requests, _config(row.gpu, 1))
    return result.metrics.ttft.p50 * 1e3


def main() -> int:
    """Print both comparisons as markdown tables with the error of each row and a summary per GPU."""
    print(f"Source: {SOURCE}\n")
    print("Throughput, static batching (output tokens/s per GPU)\n")
    print("| GPU | model | TP | batch | in / out | published | simulated | sim / pub - 1 |")
    print("|---|---|---|---|---|---|---|---|")
    errors: dict[str, list[float]] = {}
    for row in THROUGHPUT:
        sim = predict_throughput(row)
        err = sim / row.published_tokens_per_s_per_gpu - 1
        errors.setdefault(f"throughput {row.gpu}", []).append(err)
        print(f"| {row.gpu} | {row.model} | {row.tp} | {row.batch} | {row.input_tokens} / {row.output_tokens} | "
              f"{row.published_tokens_per_s_per_gpu:,.0f} | {sim:,.0f} | {err:+.1%} |")
    print("\nFirst-token latency at batch 1 (ms)\n")
    print("| GPU | model | TP | input | published | simulated | sim / pub - 1 |")
    print("|---|---|---|---|---|---|---|")
    for lat in LATENCY:
        sim = predict_first_token_ms(lat)
        err = sim / lat.published_first_token_ms - 1
        errors.setdefault(f"first token {lat.gpu}", []).append(err)
        print(f"| {lat.gpu} | {lat.model} | {lat.tp} | {lat.input_tokens} | {lat.published_first_token_ms:.0f} | "
              f"{sim:.1f} | {err:+.1%} |")
    print("\nSummary (mean absolute error, signed mean, worst)\n")
    for name, errs in errors.items():
        worst = max(errs, key=abs)
        print(f"- {name}: {statistics.fmean(abs(e) for e in errs):.1%} mean abs, "
              f"{statistics.fmean(errs):+.1%} signed, worst {worst:+.1%} ({len(errs)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
