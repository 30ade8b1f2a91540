# %% [markdown]
# # Scaling curves: data parallelism alone vs 3-D parallelism
#
# How do GPT-3 175B and Llama 2 70B scale from 8 to 4096 A100s? We compare two families of
# layouts on a DGX A100 SuperPOD (`dgx-a100-hdr`: NVSwitch inside a node, 8x HDR InfiniBand per
# node):
#
# * **data-parallel only**: every GPU holds the whole model (or a ZeRO shard of it) and processes
#   its own sequences; the lowest ZeRO stage that fits in memory is used;
# * **3-D**: tensor parallelism 8 inside a node, the fewest pipeline stages that fit, data
#   parallelism over the rest (Megatron-LM's recipe).
#
# Weak scaling: the global batch grows with the cluster, one sequence per GPU per step (GPT-3:
# 2048-token sequences; Llama 2: 4096). Data parallelism alone cannot use fewer sequences than GPUs,
# so at 4096 GPUs the batch is larger than either model was trained with (GPT-3: 3.2 M tokens, Brown
# et al. 2020 Table 2.1; Llama 2: 4 M tokens, Touvron et al. 2023). Both families use full activation
# recompute and bf16 with Adam. The memory verdict comes from the analytic estimate
# (`simgrid.memory.estimate_memory`): all runs are simulated at *stage granularity* in *symmetric
# mode* (one op per pipeline stage, one simulated rank per distinct role, which keeps a 4096-GPU step
# to seconds), and at stage granularity the simulated memory timeline is coarser than the estimate.

# %%
# %matplotlib inline
import time

import pandas as pd
from IPython.display import Markdown, display

from simgrid.hardware import load_gpu
from simgrid.layout import Layout
from simgrid.memory import estimate_memory
from simgrid.model import get_model
from simgrid.plots import plot_scaling
from simgrid.simulation import simulate

CLUSTER = "dgx-a100-hdr"
GPU = load_gpu("a100-80gb-sxm")
GPU_COUNTS = [8, 64, 512, 4096]
MODELS = ["gpt3-175b", "llama2-70b"]

# %% [markdown]
# ## Choosing the layouts
#
# For each model and GPU count: the data-parallel layout with the lowest ZeRO stage that fits, and
# the 3-D layout (tp = 8) with the fewest pipeline stages that fits. Where nothing fits, the point
# is missing from the curves and the table says why.

# %%
def data_parallel_layout(model, gpus):
    for zero in (0, 1, 2, 3):
        layout = Layout(dp=gpus, zero=zero, recompute="full", global_batch_size=gpus)
        estimate = estimate_memory(model, layout, GPU)
        if estimate.fits:
            return layout, estimate
    return None, estimate  # the ZeRO-3 estimate, to say by how much it misses

def three_d_layout(model, gpus):
    estimate = None
    for pp in (1, 2, 4, 8, 16, 32):
        if 8 * pp > gpus or model.num_layers % pp:
            continue
        layout = Layout(dp=gpus // (8 * pp), tp=8, pp=pp, recompute="full", sequence_parallel=True,
                        global_batch_size=gpus)
        estimate = estimate_memory(model, layout, GPU)
        if estimate.fits:
            return layout, estimate
    return None, estimate

def describe(layout):
    parts = [f"dp{layout.dp}"] + [f"tp{layout.tp}"] * (layout.tp > 1) + [f"pp{layout.pp}"] * (layout.pp > 1)
    return " ".join(parts) + (f" ZeRO-{layout.zero}" if layout.zero else "")

rows = []
t_start = time.perf_counter()
for name in MODELS:
    model = get_model(name)
    for gpus in GPU_COUNTS:
        for family, choose in (("data-parallel only", data_parallel_layout), ("3-D (tp 8)", three_d_layout)):
            layout, estimate = choose(model, gpus)
            row = {"model": name, "label": family, "gpus": gpus, "global_batch": gpus}
            if layout is None:
                need = "" if estimate is None else f": best option needs {estimate.total_bytes / 2**30:.0f} GiB"
                rows.append(row | {"layout": "does not fit" + need, "fits": False})
                continue
            result = simulate(model, CLUSTER, layout, granularity="stage")
            m = result.metrics
            rows.append(row | {"layout": describe(layout), "fits": True,
                               "memory_GiB": estimate.total_bytes / 2**30,
                               "step_time_s": m.step_time_s, "tokens_per_s": m.tokens_per_s,
                               "mfu": m.mfu, "bubble_fraction": m.bubble_fraction,
                               "exposed_dp_s": m.exposed_comm_s["dp"]})
results = pd.DataFrame(rows)
print(f"{int(results.fits.sum())} layouts simulated in {time.perf_counter() - t_start:.1f} s")
results.drop(columns="global_batch").style.format(
    {"memory_GiB": "{:.1f}", "step_time_s": "{:.2f}", "tokens_per_s": "{:,.0f}", "mfu": "{:.1%}",
     "bubble_fraction": "{:.1%}", "exposed_dp_s": "{:.2f}"}, na_rep="-")

# %%
needs_zero = results[(results.label == "data-parallel only") & results.fits]
lines = []
for name in MODELS:
    sub = needs_zero[needs_zero.model == name]
    stages = sorted(set(sub.layout.str.extract(r"ZeRO-(\d)")[0].dropna()))
    lines.append(f"* **{name}**: data parallelism alone only fits with ZeRO stage(s) "
                 f"{', '.join(stages) or 'none'}; plain data parallelism (a full copy of weights, "
                 "gradients and Adam states on every GPU) does not fit on an 80 GiB GPU.")
none_fit = results[~results.fits]
lines.append(f"* {len(none_fit)} (model, GPUs, family) points do not fit at all, e.g. "
             f"{none_fit.iloc[0].model} on {none_fit.iloc[0].gpus} GPUs ({none_fit.iloc[0].layout}).")
display(Markdown("\n".join(lines)))

# %% [markdown]
# ## Throughput and MFU
#
# One figure per model; the dotted line is perfect linear scaling from the smallest run of the
# first family.

# %%
simulated = results[results.fits]
for name in MODELS:
    fig = plot_scaling(simulated[simulated.model == name], x="gpus", y=("tokens_per_s", "mfu"), by="label",
                       scaling="weak", title=f"{name} on DGX A100 (HDR InfiniBand)")
    display(fig)

# %%
lines = []
for name in MODELS:
    sub = simulated[(simulated.model == name) & (simulated.gpus == max(GPU_COUNTS))].set_index("label")
    dp, td = sub.loc["data-parallel only"], sub.loc["3-D (tp 8)"]
    lines.append(
        f"* **{name} on {max(GPU_COUNTS)} GPUs**: 3-D ({td.layout}) reaches MFU {td.mfu:.1%} and "
        f"{td.tokens_per_s:,.0f} tokens/s; data-parallel only ({dp.layout}) {dp.mfu:.1%} and "
        f"{dp.tokens_per_s:,.0f} tokens/s, with {dp.exposed_dp_s:.1f} s per step of exposed "
        f"data-parallel communication (ZeRO-3 gathers the full weights every forward and backward)."
    )
display(Markdown("\n".join(lines)))

# %%
efficiency = []
for (name, family), group in simulated.groupby(["model", "label"], sort=False):
    first, last = group.sort_values("gpus").iloc[[0, -1]].itertuples()
    efficiency.append(f"{name} {family}: {last.tokens_per_s / first.tokens_per_s / (last.gpus / first.gpus):.0%} "
                      f"from {first.gpus} to {last.gpus} GPUs")
display(Markdown(
    "**What to conclude:** for models of this size data parallelism needs ZeRO-3 just to fit, and then every "
    "step moves the whole model over the InfiniBand NICs several times; 3-D parallelism keeps the heavy "
    "tensor-parallel traffic on NVSwitch inside a node and only sends activations between pipeline stages, "
    "which is why Megatron-LM trains GPT-3-class models with tp = 8 and pipelining. Under weak scaling the "
    "per-GPU work is constant, so the scaling efficiency (throughput gain over GPU gain) is what the network "
    "costs as the cluster grows: " + "; ".join(efficiency) + "."
))
