# %% [markdown]
# # Serving an LLM on many GPUs: prefill, decode and capacity
#
# Training keeps every GPU busy on one big step; serving is a stream of requests, each a prompt to
# *prefill* (compute-bound: thousands of tokens in one pass) and then tokens to *decode* one at a time
# (bound by reading every weight and the whole KV cache from HBM). This notebook uses `simgrid.serving`
# to see where the time goes in one iteration, what a load does to time to first token (TTFT) and time
# per output token (TPOT), how the KV cache fills, and which layout of 8 GPUs serves Llama 2 70B best
# within latency targets. The last cell runs greedy generation with a KV cache for real on two processes.

# %%
# %matplotlib inline
import pandas as pd

from simgrid.hardware import load_cluster, load_gpu
from simgrid.model import get_model
from simgrid.plots import plot_capacity, plot_kv_occupancy, plot_latency_vs_load
from simgrid.serving import (
    IterationCostModel,
    LatencyTargets,
    ServingConfig,
    ServingLayout,
    capacity_search,
    chunk_shape,
    combine,
    kv_budget,
    poisson_requests,
    simulate_serving,
)
from simgrid.topology import Topology

model = get_model("llama2-70b")
CLUSTER = "dgx-a100-hdr"

# %% [markdown]
# ## 1. Weights and KV cache per GPU
#
# Llama 2 70B has 8 KV heads for 64 query heads (grouped-query attention), so a token's cache is small:
# 2 x 8 heads x 128 x 2 bytes per layer. Tensor parallelism splits weights and KV heads; an fp8 cache
# halves it. What is left of 90% of an 80 GB A100 after the weights holds the cache.

# %%
a100 = load_gpu("a100-80gb-sxm")
rows = []
for tp in (2, 4, 8):
    for kv in ("auto", "fp8"):
        budget = kv_budget(model, ServingLayout(tp=tp), ServingConfig(kv_dtype=kv), a100, max_context=4096)
        stage = budget.stages[0]
        rows.append({"tp": tp, "kv dtype": "bf16" if kv == "auto" else kv,
                     "weights GiB/GPU": stage.weight_bytes / 2**30,
                     "KV KiB/token/GPU": stage.kv_bytes_per_token / 1024,
                     "KV tokens per replica": budget.capacity_tokens})
pd.DataFrame(rows).round(1)

# %% [markdown]
# ## 2. One iteration: prefill is compute, decode is memory
#
# The iteration cost model prices each sub-block with the roofline: GEMMs at
# `max(FLOPs / achievable peak, weight bytes / HBM rate)`, the attention core at
# `max(FLOPs / fused-attention rate, KV bytes / HBM rate)`, plus element-wise traffic, kernel launches and
# the tensor-parallel all-reduces. A decode step costs about the same for 1 or 64 sequences (weights are read
# once per iteration) until the batch is large enough for the GEMMs to become compute-bound.

# %%
topo = Topology(load_cluster(CLUSTER, gpus=4))
cost = IterationCostModel(model, ServingLayout(tp=4), ServingConfig(), topo)
steps = []
for batch in (1, 8, 32, 64, 128, 256):
    t = cost.time(combine([chunk_shape(1, 1000, sampled=True)] * batch))
    steps.append({"decode batch": batch, "step ms": t.latency_s * 1e3,
                  **{f"{k} ms": v * 1e3 for k, v in t.breakdown_s.items() if k != "pp_comm"},
                  "tokens/s per GPU": batch / t.latency_s / 4})
prefill = cost.time(chunk_shape(2048, 0, sampled=True))
print(f"prefill of 2048 tokens: {prefill.latency_s * 1e3:.0f} ms, of which GEMMs "
      f"{prefill.breakdown_s['gemm'] * 1e3:.0f} ms (compute-bound)")
pd.DataFrame(steps).round(2)

# %% [markdown]
# ## 3. A load: 4 requests per second on two tp 4 replicas
#
# Requests arrive by a Poisson process with prompts of 128-1024 tokens and outputs of 32-256. The engine
# batches continuously (requests join and leave between iterations) with chunked prefill: running sequences
# decode first, then prompt chunks fill the token budget.

# %%
layout = ServingLayout(tp=4, replicas=2)
config = ServingConfig(policy="chunked")
requests = poisson_requests(4.0, 300, prompt_tokens=(128, 1024), output_tokens=(32, 256), seed=0)
result = simulate_serving(model, CLUSTER, layout, requests, config)
m = result.metrics
print(f"TTFT p50/p90/p99: {m.ttft.p50 * 1e3:.0f} / {m.ttft.p90 * 1e3:.0f} / {m.ttft.p99 * 1e3:.0f} ms")
print(f"TPOT p50/p90/p99: {m.tpot.p50 * 1e3:.1f} / {m.tpot.p90 * 1e3:.1f} / {m.tpot.p99 * 1e3:.1f} ms")
print(f"{m.output_tokens_per_s_per_gpu:.1f} output tokens/s per GPU, GPUs busy {m.gpu_busy:.0%}, "
      f"KV cache {m.kv_occupancy_mean:.1%} full on average")

# %%
plot_kv_occupancy(result)

# %% [markdown]
# ## 4. Latency against load, and what the scheduling policy changes
#
# Pushing the rate up fills the batch: TPOT grows with it, and once the GPUs cannot keep up requests queue
# and TTFT explodes. The policy moves latency between TTFT and TPOT: `prefill-first` (vLLM's default) runs
# waiting prompts at once and stalls every decode meanwhile (the worst TPOT); `mixed` (Orca) lets decodes
# ride along with the prompts; `chunked` with a small budget (Sarathi-Serve) never makes a decode wait
# behind a whole prompt, but a prompt now takes several iterations (TTFT rises) and every iteration
# carries a chunk, so the per-request mean TPOT does not improve on `mixed` here. Sarathi-Serve's gain is
# on the longest gap between two tokens, which TPOT (a mean per request) smooths out.

# %%
results = {}
for rate in (2.0, 4.0, 6.0, 8.0):
    reqs = poisson_requests(rate, 300, prompt_tokens=(128, 1024), output_tokens=(32, 256), seed=0)
    results[rate] = simulate_serving(model, CLUSTER, ServingLayout(tp=8), reqs, ServingConfig())
plot_latency_vs_load(results, targets={"ttft_p90": 0.5, "tpot_p99": 0.05})

# %%
reqs = poisson_requests(6.0, 300, prompt_tokens=(128, 1024), output_tokens=(32, 256), seed=0)
table = []
for name, cfg in {"prefill-first": ServingConfig(policy="prefill-first"),
                  "mixed": ServingConfig(policy="mixed"),
                  "chunked, 256-token budget": ServingConfig(policy="chunked", max_batched_tokens=256)}.items():
    mm = simulate_serving(model, CLUSTER, ServingLayout(tp=8), reqs, cfg).metrics
    table.append({"policy": name, "TTFT p90 ms": mm.ttft.p90 * 1e3, "TPOT p50 ms": mm.tpot.p50 * 1e3,
                  "TPOT p99 ms": mm.tpot.p99 * 1e3, "tokens/s/GPU": mm.output_tokens_per_s_per_gpu})
pd.DataFrame(table).round(1)

# %% [markdown]
# ## 5. Which layout of 8 GPUs serves the most within targets?
#
# The capacity search finds, for each `tp x pp x replicas = 8`, the highest arrival rate whose run meets
# TTFT p90 <= 0.5 s and TPOT p99 <= 50 ms, and ranks layouts by output tokens/s per GPU at that rate. A
# short workload keeps this cell fast; the command line default is 500 requests per replica.

# %%
workload = poisson_requests(1.0, 60, prompt_tokens=(128, 1024), output_tokens=(32, 256), seed=0)
search = capacity_search(model, CLUSTER, 8, workload, LatencyTargets(ttft_p90=0.5, tpot_p99=0.05),
                         ServingConfig(policy="chunked"))
pd.DataFrame([{"layout": r.layout.label(), "rate/s": r.rate_per_s, "tokens/s/GPU": r.tokens_per_s_per_gpu,
               "note": r.note[:70]} for r in search.results]).round(2)

# %%
plot_capacity(search)

# %% [markdown]
# ## 6. For real: greedy generation with a KV cache on two processes
#
# `executor.generate` runs the executor's own transformer with a KV cache on gloo: here tensor parallel
# over two processes. Its tokens must equal those of a single process that re-runs the whole sequence
# at every step without a cache. (Needs PyTorch; without it this cell says so.)

# %%
import importlib.util

if importlib.util.find_spec("torch") is None:
    print("SKIPPED: PyTorch is not installed; install the executor extra to generate for real.")
else:
    import torch

    from executor.generate import generate, reference_generate
    from simgrid.model.spec import ModelSpec

    tiny_llama = ModelSpec(name="tiny-llama", num_layers=2, hidden_size=32, num_heads=4, num_kv_heads=2,
                           ffn_hidden_size=64, gated_mlp=True, vocab_size=64, seq_length=32,
                           tied_embeddings=False, norm="rmsnorm", position="rope", bias=False)
    prompt = torch.randint(0, 64, (2, 6), generator=torch.Generator().manual_seed(0))
    real = generate(tiny_llama, prompt, 10, tp=2)
    print("TP2 tokens:      ", real.tokens)
    print("reference tokens:", reference_generate(tiny_llama, prompt, 10))
    print(f"TTFT {real.ttft_s * 1e3:.1f} ms, TPOT {real.tpot_s * 1e3:.1f} ms on this machine")
