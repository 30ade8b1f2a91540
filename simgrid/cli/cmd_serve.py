"""``simgrid serve``: simulate LLM serving (prefill and decode under load) and search for the best layout."""

from __future__ import annotations

import argparse
import contextlib
import csv
import math
import sys
from typing import TYPE_CHECKING, Any

from simgrid.cli.common import add_model_args, model_from_args, positive_int, positive_number, print_json

if TYPE_CHECKING:
    from simgrid.serving import CapacitySearch, LatencyTargets, Request, ServingConfig, ServingResult

EPILOG = """examples:
  simgrid serve --model llama2-70b --cluster dgx-a100-hdr --tp 4 --replicas 2 --rate 4 --requests 500 \\
      --prompt-tokens 128-1024 --output-tokens 32-256 --policy chunked --kv-plot kv.png
  simgrid serve --model llama2-7b --cluster dgx-a100-hdr --rate 2,4,8,16 --latency-plot load.png --json
  simgrid serve --model llama2-70b --cluster dgx-a100-hdr --gpus 8 --ttft-p90 0.5 --tpot-p99 0.05
  simgrid serve --model llama3-8b --cluster dgx-h100-ndr --trace requests.csv --batching static --max-batch 64

A trace is a CSV file with columns arrival_s,prompt_tokens,output_tokens. With latency targets and no
--rate the command finds capacity: the highest Poisson rate meeting them, for the given layout, or with
--gpus N for every layout of N GPUs (best output tokens/s per GPU first); with --rate it marks the targets
each rate misses.
"""

TARGET_FLAGS = ("ttft_p50", "ttft_p90", "ttft_p99", "tpot_p50", "tpot_p90", "tpot_p99", "e2e_p50", "e2e_p90", "e2e_p99")


def token_lengths(text: str, flag: str) -> int | tuple[int, int]:
    """``512`` or an inclusive uniform range ``128-1024`` (a bad value is a one-line ServingError)."""
    from simgrid.serving import ServingError

    low_text, sep, high_text = str(text).partition("-")
    try:
        low, high = int(low_text), int(high_text if sep else low_text)
    except ValueError:
        raise ServingError(f"{flag} {text!r} is not a token count (512) or a range (128-1024)") from None
    if low < 1 or high < low:
        raise ServingError(f"{flag} {text!r} must be positive token counts with LOW <= HIGH")
    return (low, high) if sep else low


def rates(text: str) -> list[float]:
    """Comma-separated arrival rates in requests/s (``inf``: every request at time 0)."""
    from simgrid.serving import ServingError

    out = []
    for part in str(text).split(","):
        try:
            value = float(part)
        except ValueError:
            raise ServingError(f"--rate {part!r} is not a number of requests per second") from None
        if math.isnan(value) or value <= 0:
            raise ServingError(f"--rate {part!r} must be > 0 requests/s (or inf: every request at time 0)")
        out.append(value)
    return out


def register(subparsers: Any) -> None:
    """Add the ``serve`` sub-command."""
    from simgrid.serving.spec import BATCHINGS, KV_DTYPES, POLICIES, ROUTERS, WEIGHT_DTYPES

    p = subparsers.add_parser(
        "serve",
        help="simulate LLM serving under load (TTFT, TPOT, throughput per GPU, KV cache) or find the best layout",
        description="Simulate serving MODEL on CLUSTER with tp x pp x replicas GPUs: requests arrive (Poisson or a "
        "trace), are batched (continuous or static) and prefilled and decoded on the simulated GPUs. Prints "
        "latency percentiles, throughput per GPU, KV-cache occupancy and GPU busy; with latency targets, finds "
        "the highest rate meeting them.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_args(p)
    p.add_argument("--cluster", required=True, help="cluster profile name (see `simgrid profiles`)")
    g = p.add_argument_group("layout")
    g.add_argument("--tp", type=positive_int, help="tensor-parallel degree of a replica (default 1)")
    g.add_argument("--pp", type=positive_int, help="pipeline stages of a replica (default 1)")
    g.add_argument("--replicas", type=positive_int, help="data-parallel replicas (default 1)")
    g.add_argument("--gpus", type=positive_int, help="with latency targets: search every layout of this many GPUs")
    w = p.add_argument_group("workload")
    w.add_argument("--rate", help="Poisson arrival rate(s) in requests/s, e.g. 4 or 1,2,4,8 (inf: all at 0)")
    w.add_argument("--requests", type=positive_int, default=500,
                   help="requests per run (per replica in a capacity search; default 500)")
    w.add_argument("--prompt-tokens", default="512", help="prompt length or LOW-HIGH (default 512)")
    w.add_argument("--output-tokens", default="128", help="output length or LOW-HIGH (default 128)")
    w.add_argument("--trace", help="CSV trace (arrival_s,prompt_tokens,output_tokens); with --rate, its lengths "
                   "are replayed at that rate")
    w.add_argument("--seed", type=int, default=0, help="random seed of arrivals and lengths (default 0)")
    e = p.add_argument_group("engine")
    e.add_argument("--batching", choices=BATCHINGS, default="continuous", help="batching (default continuous)")
    e.add_argument("--policy", choices=POLICIES, default="prefill-first",
                   help="continuous-batching policy (default prefill-first, vLLM's)")
    e.add_argument("--max-batch", type=positive_int, default=256, help="sequences per iteration (default 256)")
    e.add_argument("--max-batched-tokens", type=positive_int, help="tokens per iteration (default: vLLM's)")
    e.add_argument("--block-tokens", type=positive_int, default=16, help="tokens per KV block (default 16)")
    e.add_argument("--memory-utilization", type=positive_number, default=0.9,
                   help="share of GPU memory for weights, activations and KV cache (default 0.9)")
    e.add_argument("--kv-budget-gib", type=positive_number, help="KV-cache GiB per GPU (default: what memory leaves)")
    e.add_argument("--dtype", choices=WEIGHT_DTYPES, default="bf16", help="weight and GEMM precision (default bf16)")
    e.add_argument("--kv-dtype", choices=KV_DTYPES, default="auto", help="KV-cache dtype (default: the activations')")
    e.add_argument("--router", choices=ROUTERS, default="round-robin", help="request routing over replicas")
    t = p.add_argument_group("latency targets (seconds): find capacity")
    for name in TARGET_FLAGS:
        t.add_argument(f"--{name.replace('_', '-')}", dest=name, type=positive_number, metavar="S")
    o = p.add_argument_group("output")
    o.add_argument("--json", action="store_true", help="print JSON")
    o.add_argument("--latency-plot", metavar="OUT.png", help="latency percentiles against the arrival rate")
    o.add_argument("--kv-plot", metavar="OUT.png", help="KV occupancy and GPU busy over time (last rate's run)")
    o.add_argument("--capacity-plot", metavar="OUT.png", help="tokens/s per GPU of each layout searched")
    o.add_argument("--records", metavar="OUT.csv", help="per-request records of the last run")
    p.set_defaults(func=run)


def _config(args: argparse.Namespace) -> ServingConfig:
    from simgrid.serving import ServingConfig

    return ServingConfig(batching=args.batching, policy=args.policy, max_batch_size=args.max_batch,
                         max_batched_tokens=args.max_batched_tokens, block_tokens=args.block_tokens,
                         memory_utilization=args.memory_utilization, kv_budget_GiB=args.kv_budget_gib,
                         dtype=args.dtype, kv_dtype=args.kv_dtype, router=args.router)


def _workload(args: argparse.Namespace, count: int, rate: float) -> list[Request]:
    from simgrid.serving import poisson_requests, read_trace, with_poisson_arrivals

    if args.trace:
        trace = read_trace(args.trace)
        return with_poisson_arrivals(trace, rate, seed=args.seed) if args.rate else trace
    return poisson_requests(rate, count, prompt_tokens=args.prompt_tokens, output_tokens=args.output_tokens,
                            seed=args.seed)


def run(args: argparse.Namespace) -> int:
    """Simulate at each rate, or search capacity when latency targets are given."""
    from simgrid.io import check_output_paths
    from simgrid.limits import check_request_count
    from simgrid.plots.canvas import SAVE_FORMATS
    from simgrid.serving import LatencyTargets, ServingError, ServingLayout

    plots = ("--latency-plot", "--kv-plot", "--capacity-plot")
    check_output_paths([(flag, getattr(args, flag[2:].replace("-", "_"))) for flag in (*plots, "--records")],
                       suffixes=dict.fromkeys(plots, SAVE_FORMATS))  # before any work: nothing half-written
    check_request_count(args.requests, what=f"--requests {args.requests}")
    args.rate = rates(args.rate) if args.rate is not None else None
    args.prompt_tokens = token_lengths(args.prompt_tokens, "--prompt-tokens")
    args.output_tokens = token_lengths(args.output_tokens, "--output-tokens")
    model = model_from_args(args)
    config = _config(args)
    targets = LatencyTargets(**{name: getattr(args, name) for name in TARGET_FLAGS})
    fixed = [f"--{n}" for n in ("tp", "pp", "replicas") if getattr(args, n) is not None]
    if args.gpus is not None and not targets.items():
        raise ServingError("--gpus searches layouts for latency targets; add one, e.g. --ttft-p90 0.5 --tpot-p99 0.05")
    if args.gpus is not None and fixed:
        raise ServingError(f"--gpus searches every layout; drop {', '.join(fixed)} or drop --gpus")
    layout = ServingLayout(tp=args.tp or 1, pp=args.pp or 1, replicas=args.replicas or 1)
    if targets.items() and not args.rate:
        return _capacity(args, model, layout, config, targets)
    if args.gpus is not None:
        raise ServingError("--gpus searches capacity, which finds the rate itself; drop --rate")
    if not args.rate and not args.trace:
        raise ServingError("give an arrival rate (--rate 4, or a list 1,2,4) or a trace (--trace FILE)")
    return _simulate(args, model, layout, config, targets)


def _simulate(args: argparse.Namespace, model: Any, layout: Any, config: ServingConfig,
              targets: LatencyTargets) -> int:
    from simgrid.serving import simulate_serving

    results: list[tuple[float, ServingResult]] = []
    for rate in args.rate or [math.nan]:
        requests = _workload(args, args.requests, rate)
        result = simulate_serving(model, args.cluster, layout, requests, config)
        results.append((rate, result))
        print(f"simulated {len(requests)} requests on {layout.world_size} GPUs in {result.wall_s:.2f} s",
              file=sys.stderr)
    last = results[-1][1]
    _write_outputs(args, results, last, None)
    if args.json:
        docs = [dict(res.to_json_dict(), rate_per_s=None if math.isnan(r) else r) for r, res in results]
        if targets.items():
            for doc, (_, res) in zip(docs, results, strict=True):
                doc["target_violations"] = targets.violations(res.metrics)
        print_json(docs[0] if len(docs) == 1 else {"runs": docs})
    elif len(results) == 1:
        print(format_report(last, rate=results[0][0], trace=args.trace))
        if targets.items():
            missed = targets.violations(last.metrics)
            print(f"targets        {'missed: ' + ', '.join(missed) if missed else 'all met'}")
    else:
        print(format_load_table(results, targets))
    return 0


def _capacity(args: argparse.Namespace, model: Any, layout: Any, config: ServingConfig,
              targets: LatencyTargets) -> int:
    from simgrid.serving import capacity_search, poisson_requests, read_trace

    workload = read_trace(args.trace) if args.trace else poisson_requests(
        1.0, args.requests, prompt_tokens=args.prompt_tokens, output_tokens=args.output_tokens, seed=args.seed)
    gpus = args.gpus or layout.world_size
    print(f"searching capacity on {gpus} GPUs ...", file=sys.stderr)
    search = capacity_search(model, args.cluster, gpus, workload, targets, config,
                             layouts=None if args.gpus else [layout], seed=args.seed)
    _write_outputs(args, [], None, search)
    if args.json:
        print_json(search.to_dict())
    else:
        print(format_capacity(search, model.name, args.cluster))
    return 0


def _write_outputs(args: argparse.Namespace, results: list[tuple[float, ServingResult]], last: ServingResult | None,
                   search: CapacitySearch | None) -> None:
    from simgrid.io import atomic_output
    from simgrid.plots.canvas import save_figure
    from simgrid.plots.serving import plot_capacity, plot_kv_occupancy, plot_latency_vs_load

    targets = {n: v for n in TARGET_FLAGS if (v := getattr(args, n)) is not None}
    if args.latency_plot and (not results or math.isnan(results[0][0])):
        from simgrid.serving import ServingError

        raise ServingError("--latency-plot draws latency against --rate; give one or more rates")
    # Every file is written atomically and together: all of them appear, or none does.
    with contextlib.ExitStack() as stack:
        if args.latency_plot:
            save_figure(plot_latency_vs_load(results, targets=targets),
                        stack.enter_context(atomic_output(args.latency_plot, flag="--latency-plot")))
        if args.kv_plot and last is not None:
            save_figure(plot_kv_occupancy(last), stack.enter_context(atomic_output(args.kv_plot, flag="--kv-plot")))
        if args.capacity_plot and search is not None:
            save_figure(plot_capacity(search),
                        stack.enter_context(atomic_output(args.capacity_plot, flag="--capacity-plot")))
        if args.records and last is not None:
            temp = stack.enter_context(atomic_output(args.records, flag="--records"))
            with open(temp, "w", newline="", encoding="utf-8") as fh:
                writer = csv.writer(fh)
                writer.writerow(("id", "replica", "arrival_s", "prompt_tokens", "output_tokens", "ttft_s", "tpot_s",
                                 "e2e_s", "preemptions"))
                for r in last.run.records:
                    writer.writerow((r.id, r.replica, r.arrival_s, r.prompt_tokens, r.output_tokens, r.ttft_s,
                                     "" if r.tpot_s is None else r.tpot_s, r.e2e_s, r.preemptions))


def _ms(seconds: float) -> str:
    return "n/a" if math.isnan(seconds) else (f"{seconds:.3f} s" if seconds >= 1 else f"{seconds * 1e3:.1f} ms")


def format_report(result: ServingResult, *, rate: float, trace: str | None = None) -> str:
    """The human-readable report of one run."""
    from simgrid.model import param_count

    m, run = result.metrics, result.run
    cfg, lay, budget = run.config, run.layout, run.budget
    weights = max(s.weight_bytes for s in budget.stages) / 2**30
    kv_gib = min(s.kv_budget_bytes for s in budget.stages) / 2**30
    per_token = max(s.kv_bytes_per_token for s in budget.stages)
    if cfg.batching == "static":
        engine = f"static batching, up to {cfg.max_batch_size} requests per batch"
    else:
        engine = f"continuous batching, {cfg.policy}, up to {cfg.max_batch_size} sequences"
    arrivals = (f"trace {trace}" if trace and math.isnan(rate) else
                ("all at time 0" if math.isinf(rate) else f"Poisson {rate:g}/s"))
    prompts = [r.prompt_tokens for r in run.records]
    outputs = [r.output_tokens for r in run.records]
    lines = [
        f"model          {result.model.name} ({param_count(result.model) / 1e9:.1f}B parameters, context "
        f"{result.model.seq_length})",
        f"deployment     {result.cluster_name}: {lay.world_size} GPUs = tp {lay.tp} x pp {lay.pp} x {lay.replicas} "
        "replica(s)",
        f"engine         {engine}, {cfg.dtype} weights, {cfg.kv_bytes}-byte KV",
        f"memory/GPU     {weights:.1f} GiB weights, {kv_gib:.1f} GiB KV cache ({per_token / 1024:.0f} KiB per token): "
        f"{run.kv_blocks_per_replica * budget.block_tokens:,} tokens per replica",
        f"workload       {m.requests} requests, {arrivals}, prompt {min(prompts)}-{max(prompts)}, output "
        f"{min(outputs)}-{max(outputs)} tokens",
        f"TTFT           p50 {_ms(m.ttft.p50)}   p90 {_ms(m.ttft.p90)}   p99 {_ms(m.ttft.p99)}",
        f"TPOT           p50 {_ms(m.tpot.p50)}   p90 {_ms(m.tpot.p90)}   p99 {_ms(m.tpot.p99)}",
        f"end-to-end     p50 {_ms(m.e2e.p50)}   p90 {_ms(m.e2e.p90)}   p99 {_ms(m.e2e.p99)}",
        f"throughput     {m.output_tokens_per_s:,.0f} output tokens/s = {m.output_tokens_per_s_per_gpu:,.1f} per GPU; "
        f"{m.requests_per_s:.2f} requests/s = {m.requests_per_s_per_gpu:.3f} per GPU",
        f"KV cache       mean {m.kv_occupancy_mean:.1%} in use, peak {m.kv_occupancy_peak:.1%}; "
        f"{m.preemptions} preemption(s)",
        f"GPU busy       {m.gpu_busy:.1%} over {m.makespan_s:.2f} s; {m.iterations} iterations, mean "
        f"{m.mean_batch_sequences:.1f} sequences and {m.mean_batch_tokens:.0f} tokens",
    ]
    return "\n".join(lines)


def format_load_table(results: list[tuple[float, ServingResult]], targets: LatencyTargets | None = None) -> str:
    """One row per arrival rate (with the targets missed, when there are targets)."""
    head = (f"{'rate/s':>8} {'TTFT p50':>10} {'TTFT p90':>10} {'TTFT p99':>10} {'TPOT p50':>10} {'TPOT p99':>10} "
            f"{'E2E p90':>10} {'tok/s/GPU':>10} {'KV mean':>8} {'busy':>6}" + ("  targets" if targets and targets.items()
                                                                                else ""))
    rows = [head]
    for rate, res in results:
        m = res.metrics
        rows.append(f"{rate:>8g} {_ms(m.ttft.p50):>10} {_ms(m.ttft.p90):>10} {_ms(m.ttft.p99):>10} "
                    f"{_ms(m.tpot.p50):>10} {_ms(m.tpot.p99):>10} {_ms(m.e2e.p90):>10} "
                    f"{m.output_tokens_per_s_per_gpu:>10,.1f} {m.kv_occupancy_mean:>8.1%} {m.gpu_busy:>6.0%}"
                    + (f"  {', '.join(targets.violations(m)) or 'met'}" if targets and targets.items() else ""))
    return "\n".join(rows)


def format_capacity(search: CapacitySearch, model: str, cluster: str) -> str:
    """The capacity table, best layout first."""
    targets = ", ".join(f"{name} <= {value:g} s" for name, value in search.targets.items())
    rows = [f"capacity of {model} on {search.gpus} GPUs of {cluster} ({targets})",
            f"{'layout':<14} {'rate/s':>8} {'tok/s/GPU':>10} {'TTFT p90':>10} {'TPOT p99':>10}  note"]
    for r in search.results:
        m = r.metrics
        ttft = _ms(m.ttft.p90) if m else "-"
        tpot = _ms(m.tpot.p99) if m else "-"
        rate = f"{r.rate_per_s:.2f}" if r.feasible else "-"
        rows.append(f"{r.layout.label():<14} {rate:>8} {r.tokens_per_s_per_gpu:>10,.1f} {ttft:>10} {tpot:>10}  {r.note}")
    best = search.best
    rows.append(f"best           {best.layout.label()}: {best.tokens_per_s_per_gpu:,.1f} output tokens/s per GPU at "
                f"{best.rate_per_s:.2f} requests/s" if best else "best           none meets the targets")
    return "\n".join(rows)
