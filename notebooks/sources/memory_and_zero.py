# %% [markdown]
# # Memory: what fits where, ZeRO stages, memory over time
#
# Training memory per GPU is model states (weights, gradients, optimizer states: 16 bytes per
# parameter for mixed-precision Adam, Rajbhandari et al. 2020), activations saved for the backward
# (Korthikanti et al. 2022), and communication buffers. Parallelism and ZeRO divide these in
# different ways. The analytic estimate (`simgrid.memory.estimate_memory`) answers "does it fit?"
# instantly; a simulated trace shows memory over time.

# %%
# %matplotlib inline
import pandas as pd
from IPython.display import Markdown, display
from matplotlib.figure import Figure

from simgrid.hardware import load_gpu
from simgrid.layout import Layout
from simgrid.memory import estimate_memory
from simgrid.model import get_model, param_count
from simgrid.plots import plot_memory_breakdown, plot_memory_timeline
from simgrid.simulation import simulate

GIB = 2**30
GPUS = {name: load_gpu(name) for name in ("rtx-4090", "a100-80gb-sxm", "h100-sxm")}
MODELS = ["llama2-7b", "llama2-13b", "llama2-70b"]
for gpu in GPUS.values():
    print(f"{gpu.name:15s} {gpu.memory_GiB:5.0f} GiB")

# %% [markdown]
# ## What fits where
#
# Three ways to train each model, all with micro-batch 1 and full activation recompute (the
# smallest activation footprint): one GPU alone, eight GPUs with data parallelism and ZeRO-3,
# and eight GPUs with tensor parallelism 8. The table gives GiB per GPU and whether it fits.

# %%
OPTIONS = {
    "1 GPU": Layout(recompute="full"),
    "8 GPUs, ZeRO-3": Layout(dp=8, zero=3, recompute="full"),
    "8 GPUs, TP 8": Layout(tp=8, recompute="full", sequence_parallel=True),
}
rows = []
for name in MODELS:
    model = get_model(name)
    for option, layout in OPTIONS.items():
        row = {"model": f"{name} ({param_count(model) / 1e9:.0f}B)", "layout": option}
        for gpu_name, gpu in GPUS.items():
            est = estimate_memory(model, layout, gpu)
            row[gpu_name] = f"{est.total_bytes / GIB:.0f} GiB {'fits' if est.fits else 'NO'}"
        rows.append(row)
pd.DataFrame(rows).set_index(["model", "layout"])

# %% [markdown]
# And the fewest GPUs that can train each model with ZeRO-3 data parallelism (model states shard
# over the GPUs; activations do not):

# %%
def fewest_gpus(model, gpu, limit=1024):
    gpus = 1
    while gpus <= limit:
        if estimate_memory(model, Layout(dp=gpus, zero=3, recompute="full", global_batch_size=gpus), gpu).fits:
            return gpus
        gpus *= 2
    return None

fewest = pd.DataFrame({gpu_name: {name: fewest_gpus(get_model(name), gpu) for name in MODELS}
                       for gpu_name, gpu in GPUS.items()})
display(fewest)

# %%
display(Markdown(
    f"Llama 2 7B needs at least **{fewest.loc['llama2-7b', 'rtx-4090']}** RTX 4090s but "
    f"**{fewest.loc['llama2-7b', 'a100-80gb-sxm']}** A100/H100 80 GB with ZeRO-3; Llama 2 70B needs "
    f"**{fewest.loc['llama2-70b', 'rtx-4090']}** RTX 4090s or **{fewest.loc['llama2-70b', 'h100-sxm']}** "
    "H100s. A100 80 GB and H100 80 GB give identical answers: capacity, not speed, decides what fits."
))

# %% [markdown]
# ## ZeRO stages compared
#
# Llama 2 7B on 8 GPUs with data parallelism: ZeRO-1 shards the optimizer states, ZeRO-2 also the
# gradients, ZeRO-3 also the weights (Rajbhandari et al. 2020, Figure 1). Stacked per category,
# against the capacity of an RTX 4090 (24 GiB); the A100/H100 have 80 GiB.

# %%
model = get_model("llama2-7b")
estimates = {}
for zero in range(4):
    estimates[f"ZeRO-{zero}" if zero else "DP (no ZeRO)"] = estimate_memory(
        model, Layout(dp=8, zero=zero, recompute="full", global_batch_size=8))
breakdown = pd.DataFrame({label: est.breakdown for label, est in estimates.items()}).T / GIB
breakdown["total"] = breakdown.sum(axis=1)

rtx_capacity = GPUS["rtx-4090"].memory_bytes
fig = plot_memory_breakdown(estimates, capacity_bytes=rtx_capacity,
                            title="Llama 2 7B, 8-way data parallel, full recompute, micro-batch 1 (line: RTX 4090)")
display(fig)
breakdown.round(2)

# %%
display(Markdown(
    f"Without ZeRO each GPU holds {breakdown.loc['DP (no ZeRO)', 'total']:.1f} GiB; ZeRO-1 brings it to "
    f"{breakdown.loc['ZeRO-1', 'total']:.1f} GiB, ZeRO-2 to {breakdown.loc['ZeRO-2', 'total']:.1f} GiB and "
    f"ZeRO-3 to {breakdown.loc['ZeRO-3', 'total']:.1f} GiB. On a {GPUS['rtx-4090'].memory_GiB:.0f} GiB "
    f"RTX 4090 this fits with: **{', '.join(l for l, e in estimates.items() if e.total_bytes <= rtx_capacity) or 'none'}**."
))

# %% [markdown]
# ## Recompute or FlashAttention?
#
# At long sequences the unfused attention core dominates the activations: it saves the `s x s`
# scores, softmax output and dropout (5 a s^2 b bytes per layer; Korthikanti et al. 2022, Table 2).
# Selective recompute drops them and re-runs the core; FlashAttention (`Layout.flash_attention`,
# Dao et al. 2022) never writes them to memory at all and recomputes `Q K^T` inside its backward.
# Llama 2 7B, sequence 4096, 8 A100s with ZeRO-1, micro-batch 1: activation memory per GPU and the
# simulated step.

# %%
variants = {"none": Layout(), "selective": Layout(recompute="selective"), "full": Layout(recompute="full"),
            "flash": Layout(flash_attention=True), "flash + full": Layout(flash_attention=True, recompute="full")}
rows = {}
for label, variant in variants.items():
    layout = Layout(dp=8, zero=1, global_batch_size=8, recompute=variant.recompute,
                    flash_attention=variant.flash_attention)
    run = simulate(model, "dgx-a100-hdr", layout)
    est = estimate_memory(model, layout, GPUS["a100-80gb-sxm"])
    rows[label] = {"activations GiB": est.activations_bytes / GIB, "total GiB": est.total_bytes / GIB,
                   "fits": est.fits, "step s": run.metrics.step_time_s, "MFU": run.metrics.mfu}
flash_table = pd.DataFrame(rows).T
flash_table.style.format({"activations GiB": "{:.1f}", "total GiB": "{:.1f}", "step s": "{:.3f}", "MFU": "{:.1%}"})

# %%
display(Markdown(
    f"FlashAttention keeps {flash_table.loc['flash', 'activations GiB']:.1f} GiB of activations against "
    f"{flash_table.loc['none', 'activations GiB']:.1f} GiB unfused and "
    f"{flash_table.loc['selective', 'activations GiB']:.1f} GiB with selective recompute. The shortest step "
    f"is **{flash_table['step s'].astype(float).idxmin()}** ({flash_table['step s'].astype(float).min():.3f} s): "
    "the fused core moves no `s x s` matrix through HBM, and it skips the score tiles the causal mask hides."
))

# %% [markdown]
# ## Long sequences: context parallelism
#
# FlashAttention removes the `s x s` terms, but every other activation still grows with the sequence.
# Context parallelism (`Layout.cp`, Llama 3's all-gather variant) gives each GPU `s / cp` tokens of every
# sequence and all-gathers the other GPUs' keys and values before attention. Llama 3 8B at 64K tokens on
# 8 H100s, with FlashAttention, full recompute and ZeRO-1, 8 sequences per step (accumulated over
# micro-batches where there are fewer than 8 replicas): memory per GPU and the simulated step as data
# parallelism is traded for context parallelism.

# %%
long_model = get_model("llama3-8b").with_seq_length(65536)
cp_rows = {}
for cp in (1, 2, 4, 8):
    layout = Layout(dp=8 // cp, cp=cp, zero=1, global_batch_size=8, flash_attention=True, recompute="full")
    run = simulate(long_model, "dgx-h100-ndr", layout)
    est = estimate_memory(long_model, layout, GPUS["h100-sxm"])
    cp_rows[f"dp {8 // cp}, cp {cp}"] = {
        "activations GiB": est.activations_bytes / GIB, "total GiB": est.total_bytes / GIB, "fits": est.fits,
        "tokens/s": run.metrics.tokens_per_s, "exposed cp s": run.metrics.exposed_comm_s["cp"],
        "step s": run.metrics.step_time_s,
    }
cp_table = pd.DataFrame(cp_rows).T
cp_table.style.format({"activations GiB": "{:.1f}", "total GiB": "{:.1f}", "tokens/s": "{:,.0f}",
                       "exposed cp s": "{:.3f}", "step s": "{:.3f}"})

# %%
fitting = cp_table[cp_table["fits"].astype(bool)]
first = fitting.index[0]
display(Markdown(
    f"Without context parallelism a GPU needs {cp_table['total GiB'].iloc[0]:.1f} GiB; the first layout that "
    f"fits is **{first}** ({fitting.loc[first, 'total GiB']:.1f} GiB). Each doubling of cp halves the "
    f"activations and costs a little throughput, mostly in the exposed K/V gathers: "
    f"{fitting.loc[first, 'tokens/s']:,.0f} tokens/s at {first} against "
    f"{cp_table['tokens/s'].iloc[-1]:,.0f} at {cp_table.index[-1]}."
))

# %% [markdown]
# ## Memory over time: GPipe vs 1F1B
#
# The simulated program allocates and frees memory as the schedule runs, so each rank has a
# memory timeline. GPipe runs every forward before any backward, so the first stage holds the
# activations of all `m` micro-batches at once; 1F1B starts backwards early and holds at most `p`
# (Narayanan et al., SC'21, sec. 2.2). Llama 2 7B on one DGX A100 node: 4 pipeline stages x 2
# replicas with ZeRO-1, 16 micro-batches per replica, selective recompute.

# %%
timelines = {}
for schedule in ("gpipe", "1f1b"):
    layout = Layout(dp=2, pp=4, schedule=schedule, micro_batch_size=1, global_batch_size=32, zero=1,
                    recompute="selective")
    res = simulate(model, "dgx-a100-hdr", layout)
    timelines[schedule] = res

fig = Figure(figsize=(14, 4.5), layout="constrained")
axes = fig.subplots(1, 2, sharey=True)
for ax, (schedule, res) in zip(axes, timelines.items(), strict=True):
    plot_memory_timeline(res.memory, ax=ax, title=f"{schedule}: one rank per pipeline stage")
display(fig)

# %%
g, o = (timelines[s].memory.timelines[0] for s in ("gpipe", "1f1b"))
display(Markdown(
    f"On the first stage GPipe peaks at **{g.peak_bytes / GIB:.1f} GiB** "
    f"({g.peak_by_category.get('activations', 0) / GIB:.1f} GiB of activations) and 1F1B at "
    f"**{o.peak_bytes / GIB:.1f} GiB** ({o.peak_by_category.get('activations', 0) / GIB:.1f} GiB) against "
    f"{timelines['1f1b'].metrics.memory_capacity_bytes / GIB:.0f} GiB of capacity: GPipe "
    f"{'fits' if timelines['gpipe'].metrics.fits else 'does NOT fit'}, 1F1B "
    f"{'fits' if timelines['1f1b'].metrics.fits else 'does NOT fit'} (worst rank: "
    f"{timelines['gpipe'].metrics.peak_memory_bytes / GIB:.1f} GiB vs "
    f"{timelines['1f1b'].metrics.peak_memory_bytes / GIB:.1f} GiB). The steps take "
    f"{timelines['gpipe'].metrics.step_time_s:.2f} s and {timelines['1f1b'].metrics.step_time_s:.2f} s: "
    "1F1B buys memory, not time."
))
