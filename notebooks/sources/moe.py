# %% [markdown]
# # Mixture-of-Experts: expert parallelism against tensor parallelism, all-to-alls, memory per GPU
#
# A MoE layer routes each token to `k` of `E` expert MLPs. Expert parallelism (`ep`) puts `E / ep` experts
# on each rank of a group and moves the tokens to them with an all-to-all (dispatch) and back (combine);
# expert tensor parallelism (`etp`) splits each expert instead. With Megatron-Core's *MoE parallel
# folding* the experts are laid over the same ranks as attention's tensor, context and data parallelism,
# so `ep * etp` only has to divide `tp * cp * dp` (docs/moe.md).

# %%
# %matplotlib inline
import dataclasses

import pandas as pd
from IPython.display import Markdown, display
from matplotlib.figure import Figure

from simgrid.costs import collective_time_s
from simgrid.hardware import load_cluster, load_gpu
from simgrid.layout import Layout
from simgrid.memory import estimate_memory
from simgrid.model import get_model
from simgrid.model.params import active_param_count, param_count
from simgrid.simulation import simulate
from simgrid.topology import Topology

presets = ["mixtral-8x7b", "mixtral-8x22b", "qwen2-57b-a14b", "qwen3-30b-a3b"]
display(pd.DataFrame({
    name: {"experts": get_model(name).moe.num_experts, "top-k": get_model(name).moe.top_k,
           "expert width": get_model(name).moe.expert_ffn_hidden_size,
           "total params (B)": param_count(get_model(name)) / 1e9,
           "active params (B)": active_param_count(get_model(name)) / 1e9}
    for name in presets
}).T.round(2))

# %% [markdown]
# ## Expert parallelism or tensor parallelism?
#
# Mixtral 8x7B on 16 H100s (two DGX nodes), global batch 64 sequences of 4096 tokens, ZeRO-1, FlashAttention.
# The same 16 GPUs split the experts in different ways: all 8 experts spread over an EP group of 8
# (one expert per rank), fewer experts per group with expert tensor parallelism, or plain tensor
# parallelism of every layer (ep 1, etp = tp).

# %%
MIXTRAL = get_model("mixtral-8x7b")
RECIPE = {"global_batch_size": 64, "zero": 1, "flash_attention": True}
layouts = {
    "tp 1, ep 8 (etp 1)": Layout(dp=16, ep=8, etp=1, **RECIPE),
    "tp 2, ep 8 (etp 1)": Layout(tp=2, dp=8, ep=8, etp=1, sequence_parallel=True, **RECIPE),
    "tp 2, ep 4, etp 2": Layout(tp=2, dp=8, ep=4, etp=2, sequence_parallel=True, **RECIPE),
    "tp 4, ep 2, etp 4": Layout(tp=4, dp=4, ep=2, etp=4, sequence_parallel=True, **RECIPE),
    "tp 8, ep 1, etp 8": Layout(tp=8, dp=2, ep=1, etp=8, sequence_parallel=True, **RECIPE),
}
rows = {}
for label, layout in layouts.items():
    m = simulate(MIXTRAL, "dgx-h100-ndr", layout).metrics
    rows[label] = {"step (s)": m.step_time_s, "MFU": m.mfu, "exposed ep (s)": m.exposed_comm_s["ep"],
                   "exposed tp (s)": m.exposed_comm_s["tp"], "exposed dp (s)": m.exposed_comm_s["dp"],
                   "peak memory (GiB)": m.peak_memory_bytes / 2**30, "fits": m.fits}
ep_vs_tp = pd.DataFrame(rows).T
display(ep_vs_tp.style.format({"step (s)": "{:.2f}", "MFU": "{:.1%}", "exposed ep (s)": "{:.3f}",
                               "exposed tp (s)": "{:.3f}", "exposed dp (s)": "{:.3f}",
                               "peak memory (GiB)": "{:.1f}"}))

fig = Figure(figsize=(11, 4), layout="constrained")
ax_mfu, ax_comm = fig.subplots(1, 2)
ax_mfu.barh(list(ep_vs_tp.index), ep_vs_tp["MFU"] * 100, color="#1f77b4")
ax_mfu.set_xlabel("MFU (%)")
ax_mfu.invert_yaxis()
ax_mfu.set_title("Mixtral 8x7B on 16 H100s")
left = [0.0] * len(ep_vs_tp)
for column, color in (("exposed ep (s)", "#ff9896"), ("exposed tp (s)", "#9edae5"), ("exposed dp (s)", "#7f7f7f")):
    ax_comm.barh(list(ep_vs_tp.index), ep_vs_tp[column], left=left, color=color, label=column.split(" (")[0])
    left = [a + b for a, b in zip(left, ep_vs_tp[column], strict=True)]
ax_comm.invert_yaxis()
ax_comm.set_xlabel("exposed communication per step (s)")
ax_comm.legend(fontsize="small")
display(fig)
best = ep_vs_tp["MFU"].idxmax()
fitting = ep_vs_tp[ep_vs_tp["fits"].astype(bool)]
best_fit = fitting["MFU"].idxmax() if not fitting.empty else None
display(Markdown(
    f"The fastest split is **{best}** ({ep_vs_tp.loc[best, 'MFU']:.1%} MFU"
    + ("" if ep_vs_tp.loc[best, "fits"] else f", but it needs {ep_vs_tp.loc[best, 'peak memory (GiB)']:.0f} GiB "
       f"per GPU; the fastest that fits in 80 GB is **{best_fit}** at {ep_vs_tp.loc[best_fit, 'MFU']:.1%}")
    + "). Tensor parallelism cuts every expert GEMM into thinner slices and all-gathers / reduce-scatters the "
    "tokens around it, while expert parallelism keeps whole experts and only moves each token's `k` copies: "
    "Megatron-Core's rule of thumb \"prefer EP over TP for the expert layer\". Pure tensor parallelism pays the "
    f"most exposed communication ({ep_vs_tp.loc['tp 8, ep 1, etp 8', 'exposed ep (s)'] + ep_vs_tp.loc['tp 8, ep 1, etp 8', 'exposed tp (s)']:.2f} s "
    "of ep and tp time per step)."
))

# %% [markdown]
# ## The all-to-all inside a node and across nodes
#
# One dispatch moves every rank's `k` token copies. Inside a DGX H100 it runs over NVLink/NVSwitch; an EP
# group that spans two nodes sends most of its bytes through the InfiniBand NICs instead. Below: the
# all-to-all time of 8 ranks on one node (ranks 0-7) and of 8 ranks spread over two nodes (every second
# rank of 16), against the bytes each rank sends.

# %%
topo = Topology(load_cluster("dgx-h100-ndr", gpus=16))
groups = {"8 ranks in one node": list(range(8)), "8 ranks over two nodes": list(range(0, 16, 2))}
sizes = [2**k for k in range(16, 31, 2)]
a2a = pd.DataFrame({label: [collective_time_s("all_to_all", size, group, topo) for size in sizes]
                    for label, group in groups.items()}, index=sizes)
fig = Figure(figsize=(6, 4), layout="constrained")
ax = fig.subplots()
for label in a2a.columns:
    ax.plot(a2a.index, a2a[label] * 1e3, marker="o", label=label)
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set_xlabel("bytes each rank sends")
ax.set_ylabel("all-to-all time (ms)")
ax.grid(alpha=0.3)
ax.legend()
display(fig)
tokens_bytes = 2 * 4096 * 4096 * 2  # k = 2 copies of 4096 tokens of width 4096 in bf16
inside = collective_time_s("all_to_all", tokens_bytes, groups["8 ranks in one node"], topo)
across = collective_time_s("all_to_all", tokens_bytes, groups["8 ranks over two nodes"], topo)
display(Markdown(
    f"One Mixtral 8x7B dispatch of a 4096-token micro-batch ({tokens_bytes / 2**20:.0f} MiB per rank) takes "
    f"**{inside * 1e3:.2f} ms** inside a node and **{across * 1e3:.2f} ms** over two nodes "
    f"({across / inside:.1f}x): keep the EP group inside the NVLink domain where the experts fit."
))

# %% [markdown]
# In a whole step: the same EP 8 either on consecutive ranks (etp 1: inside each node) or strided by an
# expert tensor-parallel degree of 2 (the EP group spans both nodes).

# %%
step_rows = {}
for label, layout in {"ep 8 inside a node (etp 1)": Layout(dp=16, ep=8, etp=1, **RECIPE),
                      "ep 8 across nodes (etp 2)": Layout(dp=16, ep=8, etp=2, **RECIPE)}.items():
    m = simulate(MIXTRAL, "dgx-h100-ndr", layout).metrics
    step_rows[label] = {"step (s)": m.step_time_s, "MFU": m.mfu, "exposed ep (s)": m.exposed_comm_s["ep"]}
display(pd.DataFrame(step_rows).T.style.format({"step (s)": "{:.2f}", "MFU": "{:.1%}", "exposed ep (s)": "{:.3f}"}))

# %% [markdown]
# ## Memory per GPU
#
# Every rank keeps the weights, gradients and optimizer states of the experts it holds; the attention and the
# router stay replicated. On two DGX H100 nodes (data parallelism 16, ZeRO-1, full recompute), spreading
# Mixtral 8x7B's experts over more ranks is what makes it fit. The optimizer states do not move: ZeRO-1
# already shards them over every rank holding the same parameters, and expert parallelism only changes which
# ranks those are (the expert data-parallel group shrinks as the experts spread).

# %%
gpu = load_gpu("h100-sxm")
mem_rows = {}
for ep in (1, 2, 4, 8):
    layout = Layout(dp=16, ep=ep, zero=1, global_batch_size=16, recompute="full", flash_attention=True)
    mem_rows[f"ep {ep}"] = {k: v / 2**30 for k, v in estimate_memory(MIXTRAL, layout, gpu).breakdown.items()}
memory = pd.DataFrame(mem_rows).T
fig = Figure(figsize=(8, 4), layout="constrained")
ax = fig.subplots()
bottom = [0.0] * len(memory)
for column in memory.columns:
    ax.bar(list(memory.index), memory[column], bottom=bottom, label=column)
    bottom = [a + b for a, b in zip(bottom, memory[column], strict=True)]
ax.axhline(gpu.memory_bytes / 2**30, color="black", linestyle="--", label="H100 80 GB")
ax.set_ylabel("GiB per GPU")
ax.set_title("Mixtral 8x7B on 16 H100s, ZeRO-1, full recompute")
ax.legend(fontsize="small")
display(fig)
display(memory.round(1))
fits = [label for label, total in memory.sum(axis=1).items() if total <= gpu.memory_bytes / 2**30]
display(Markdown(f"Layouts that fit in 80 GB: {', '.join(fits) if fits else 'none'}."))

# %% [markdown]
# Without recompute the experts' saved activations grow with the tokens they receive: a load imbalance of
# 1.25 (the busiest rank gets 25% more routed tokens than the mean) raises the activations of the busiest rank.

# %%
no_recompute = Layout(dp=16, ep=8, zero=1, global_batch_size=16, flash_attention=True)
skewed = dataclasses.replace(MIXTRAL, moe=dataclasses.replace(MIXTRAL.moe, load_imbalance=1.25))
balanced_act = estimate_memory(MIXTRAL, no_recompute).breakdown["activations"] / 2**30
skewed_act = estimate_memory(skewed, no_recompute).breakdown["activations"] / 2**30
display(Markdown(f"ep 8, no recompute: activations **{balanced_act:.1f} GiB** balanced, **{skewed_act:.1f} GiB** "
                 "at 1.25 imbalance."))
