# %% [markdown]
# # Is ZeRO-3 over 10 GbE on RTX 4090 boxes worth it?
#
# A common question: *I have (or can rent) a few 4-GPU RTX 4090 workstations on a 10 GbE switch.
# Can I train a 7B or 13B model with ZeRO-3 across them, or do I need an 8x A100 node?*
# We answer with simulated numbers for Llama 2 7B and 13B:
#
# * **RTX 4090 boxes, ZeRO-3**: 2 or 4 boxes (8 or 16 GPUs), data parallel with ZeRO-3 (every
#   forward and backward gathers the weights over the network), the largest micro-batch that fits;
# * **RTX 4090 boxes, pipeline across boxes**: one pipeline stage per box, data parallel with
#   ZeRO-1 inside the box, so only activations cross 10 GbE;
# * **one DGX A100 (8x A100 80 GB, NVSwitch)**: the best of a few 3-D layouts.
#
# The same global batch for all: 128 sequences of 4096 tokens (0.5 M tokens per step), bf16,
# Adam, full activation recompute on the 4090s (24 GiB), selective on the A100s.

# %%
# %matplotlib inline
import dataclasses

import pandas as pd
from IPython.display import Markdown, display
from matplotlib.figure import Figure

from simgrid.hardware import LinkSpec, load_cluster, load_cluster_spec, load_gpu
from simgrid.layout import Layout
from simgrid.memory import estimate_memory
from simgrid.model import get_model
from simgrid.simulation import simulate

GLOBAL_BATCH = 128
MODELS = ["llama2-7b", "llama2-13b"]
RTX, A100 = load_gpu("rtx-4090"), load_gpu("a100-80gb-sxm")

# %% [markdown]
# ## Price assumptions (change them to yours)
#
# These are **assumptions**, not simulator output: on-demand rental prices per GPU-hour quoted by
# one GPU cloud (RunPod, as listed by deploybase.ai in March 2026: RTX 4090 $0.34, A100 SXM 80 GB
# $1.39). Owned hardware, spot prices or another provider change the dollar figures but not the
# GPU-hours, which come from the simulation alone.

# %%
PRICE_PER_GPU_HOUR_USD = {"rtx-4090": 0.34, "a100-80gb-sxm": 1.39}  # ASSUMPTION, see above

# %%
def best(model, cluster, gpu, candidates):
    """Simulate the candidates that fit in memory; return the fastest (layout, metrics) and a log."""
    log, winner = [], None
    model = get_model(model)
    for layout in candidates:
        est = estimate_memory(model, layout, gpu)
        if not est.fits:
            log.append(f"{layout_name(layout)}: does not fit ({est.total_bytes / 2**30:.1f} GiB)")
            continue
        m = simulate(model, cluster, layout).metrics
        log.append(f"{layout_name(layout)}: {m.step_time_s:.1f} s per step")
        if winner is None or m.step_time_s < winner[1].step_time_s:
            winner = (layout, m)
    return winner, log

def layout_name(layout):
    parts = [f"dp{layout.dp}", f"tp{layout.tp}", f"pp{layout.pp}", f"mbs{layout.micro_batch_size}"]
    return " ".join(parts) + (f" ZeRO-{layout.zero}" if layout.zero else "")

def zero3_candidates(gpus):
    return [Layout(dp=gpus, zero=3, micro_batch_size=mbs, global_batch_size=GLOBAL_BATCH, recompute="full")
            for mbs in (1, 2, 4)]

def pipeline_candidates(boxes):
    return [Layout(dp=4, pp=boxes, zero=1, micro_batch_size=mbs, global_batch_size=GLOBAL_BATCH,
                   recompute="full", schedule="1f1b") for mbs in (1, 2)]

def a100_candidates():
    out = []
    for tp, pp in ((1, 1), (2, 1), (1, 2), (1, 4)):
        dp = 8 // (tp * pp)
        out.append(Layout(dp=dp, tp=tp, pp=pp, zero=1 if dp > 1 else 0, micro_batch_size=1,
                          global_batch_size=GLOBAL_BATCH, recompute="selective", sequence_parallel=tp > 1))
    return out

# %%
rows, logs, winners = [], {}, {}
for name in MODELS:
    options = [(f"{boxes} x 4090 box, ZeRO-3 over 10 GbE", "rtx4090-10gbe", 4 * boxes, RTX,
                zero3_candidates(4 * boxes)) for boxes in (2, 4)]
    options += [(f"{boxes} x 4090 box, pipeline across boxes", "rtx4090-10gbe", 4 * boxes, RTX,
                 pipeline_candidates(boxes)) for boxes in (2, 4)]
    options += [("1 x DGX A100 node, 3-D", "dgx-a100-hdr", 8, A100, a100_candidates())]
    for label, cluster, gpus, gpu, candidates in options:
        winner, log = best(name, load_cluster(cluster, gpus=gpus), gpu, candidates)
        logs[(name, label)] = log
        row = {"model": name, "setup": label, "gpus": gpus, "gpu": gpu.name}
        if winner is None:
            rows.append(row | {"layout": "nothing fits"})
            continue
        layout, m = winner
        winners[(name, label)] = layout
        tokens_per_step = m.tokens_per_s * m.step_time_s
        gpu_hours_per_mtok = gpus * m.step_time_s / 3600 / (tokens_per_step / 1e6)
        rows.append(row | {
            "layout": layout_name(layout), "step_time_s": m.step_time_s, "tokens_per_s": m.tokens_per_s,
            "mfu": m.mfu, "exposed_comm_s": sum(m.exposed_comm_s.values()),
            "gpu_hours_per_Mtok": gpu_hours_per_mtok,
            "usd_per_Mtok": gpu_hours_per_mtok * PRICE_PER_GPU_HOUR_USD[gpu.name],
        })
answer = pd.DataFrame(rows)
answer.style.format({"step_time_s": "{:.1f}", "tokens_per_s": "{:,.0f}", "mfu": "{:.1%}",
                     "exposed_comm_s": "{:.1f}", "gpu_hours_per_Mtok": "{:.2f}", "usd_per_Mtok": "${:.2f}"},
                    na_rep="-")

# %% [markdown]
# Every candidate that was tried, with its memory verdict or step time:

# %%
for (name, label), log in logs.items():
    print(f"{name} / {label}:")
    for line in log:
        print("    " + line)

# %%
fig = Figure(figsize=(12, 4.5), layout="constrained")
ax_t, ax_c = fig.subplots(1, 2)
ok = answer.dropna(subset=["step_time_s"])
for ax, column, label in ((ax_t, "tokens_per_s", "tokens/s"), (ax_c, "gpu_hours_per_Mtok", "GPU-hours per million tokens")):
    pivot = ok.pivot(index="setup", columns="model", values=column)
    pivot.plot.barh(ax=ax)
    ax.set_xlabel(label)
    ax.set_ylabel("")
    ax.grid(axis="x", alpha=0.3)
ax_t.set_title("Throughput (higher is better)")
ax_c.set_title("GPU-hours per million tokens (lower is better)")
display(fig)

# %% [markdown]
# ## The cost of the network
#
# How much of the ZeRO-3 step is the 10 GbE network? We simulate the same ZeRO-3 layout on a
# hypothetical variant of the RTX 4090 boxes with a 100 GbE NIC (same switch, ten times the
# bandwidth; everything else unchanged) and compare.

# %%
base = load_cluster_spec("rtx4090-10gbe")
nic = base.node.nic_link
fast_spec = dataclasses.replace(base, name="rtx4090-100gbe (hypothetical)", node=dataclasses.replace(
    base.node, nic_link=LinkSpec(bandwidth_GBps=10 * nic.bandwidth_GBps, latency_us=nic.latency_us,
                                 efficiency=nic.efficiency)))
network_rows = []
for name in MODELS:
    sub = answer[(answer.model == name) & answer.setup.str.contains("ZeRO-3") & answer.step_time_s.notna()]
    for r in sub.itertuples():
        fast = simulate(name, fast_spec.sized(r.gpus), winners[(name, r.setup)]).metrics
        network_rows.append({"model": name, "setup": r.setup, "layout": r.layout,
                             "10 GbE step (s)": r.step_time_s, "100 GbE step (s)": fast.step_time_s,
                             "10 GbE MFU": r.mfu, "100 GbE MFU": fast.mfu})
network = pd.DataFrame(network_rows)
network.style.format({"10 GbE step (s)": "{:.1f}", "100 GbE step (s)": "{:.1f}", "10 GbE MFU": "{:.1%}",
                      "100 GbE MFU": "{:.1%}"})

# %%
lines = []
for name in MODELS:
    sub = answer[(answer.model == name)].set_index("setup")
    a100 = sub.loc["1 x DGX A100 node, 3-D"]
    z = sub[sub.index.str.contains("ZeRO-3") & sub.step_time_s.notna()]
    p = sub[sub.index.str.contains("pipeline") & sub.step_time_s.notna()]
    text = f"* **{name}**: one DGX A100 node ({a100.layout}) runs {a100.tokens_per_s:,.0f} tokens/s at MFU {a100.mfu:.1%}"
    if len(z):
        zb = z.loc[z.tokens_per_s.idxmax()]
        text += (f"; the best ZeRO-3 setup ({zb.name}) reaches {zb.tokens_per_s:,.0f} tokens/s at MFU {zb.mfu:.1%}, "
                 f"spending {zb.exposed_comm_s:.0f} of {zb.step_time_s:.0f} s per step waiting on the network, "
                 f"and costs {zb.gpu_hours_per_Mtok / a100.gpu_hours_per_Mtok:.1f}x the A100 node's GPU-hours "
                 f"and {zb.usd_per_Mtok / a100.usd_per_Mtok:.1f}x its dollars per million tokens (at the assumed prices)")
    else:
        text += "; ZeRO-3 on the 4090 boxes does not fit"
    if len(p):
        pb = p.loc[p.tokens_per_s.idxmax()]
        text += (f". Pipelining across the boxes instead ({pb.name}) reaches {pb.tokens_per_s:,.0f} tokens/s "
                 f"(MFU {pb.mfu:.1%}, ${pb.usd_per_Mtok:.2f} per million tokens).")
    lines.append(text)
display(Markdown("\n".join(lines)))

# %%
zero3 = answer[answer.setup.str.contains("ZeRO-3") & answer.step_time_s.notna()]
piped = answer[answer.setup.str.contains("pipeline") & answer.step_time_s.notna()]
a100 = answer[answer.setup.str.contains("DGX A100")].set_index("model")
dearer = [f"{r.model} ({r.setup}: {r.usd_per_Mtok / a100.loc[r.model, 'usd_per_Mtok']:.1f}x)"
          for r in zero3.itertuples() if r.usd_per_Mtok > a100.loc[r.model, "usd_per_Mtok"]]
speedup = network["10 GbE step (s)"] / network["100 GbE step (s)"]
price_ratio = PRICE_PER_GPU_HOUR_USD["rtx-4090"] / PRICE_PER_GPU_HOUR_USD["a100-80gb-sxm"]
pipeline_vs_zero3 = [
    f"{name}: {piped[piped.model == name].tokens_per_s.max() / zero3[zero3.model == name].tokens_per_s.max():.1f}x "
    "the tokens/s of the best ZeRO-3 setup"
    for name in MODELS if (piped.model == name).any() and (zero3.model == name).any()
]
display(Markdown(
    f"**What to conclude:** ZeRO-3 gathers all the weights over the network for every micro-batch's "
    f"forward and backward, and the box's one 10 GbE NIC carries {nic.effective_bandwidth_GBps:.2f} GB/s "
    f"for all {base.node.gpus_per_node} GPUs, so the RTX 4090s mostly wait "
    f"(MFU {zero3.mfu.min():.0%}-{zero3.mfu.max():.0%}). It works, in that the model fits, but per million "
    f"tokens it costs more than one DGX A100 node in {len(dearer)} of {len(zero3)} cases even at a GPU-hour "
    f"price {price_ratio:.0%} of the A100's ({'; '.join(dearer) or 'none'}). A ten times faster network "
    f"would cut the ZeRO-3 step by {speedup.min():.1f}x-{speedup.max():.1f}x. With the 10 GbE boxes you have, "
    "pipeline parallelism across boxes puts only activations on the wire: "
    + ("; ".join(pipeline_vs_zero3) or "it does not fit for these models") + "."
))
