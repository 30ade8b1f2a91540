# %% [markdown]
# # Communication: collectives on NVLink, PCIe, InfiniBand and 10 GbE
#
# A collective's time follows the alpha-beta model: a latency per step plus bytes over the
# bandwidth of the slowest link it crosses (Thakur et al. 2005; NCCL's tuning model). The
# simulator lays each algorithm's steps on the cluster's topology, so the same formula gives very
# different answers inside an NVSwitch node, across a PCIe tree, over InfiniBand or over 10 GbE.
# *Bus bandwidth* (nccl-tests' busbw) normalises the time so that it is comparable across group
# sizes and approaches the bottleneck link's speed for large messages.

# %%
# %matplotlib inline
import pandas as pd
from IPython.display import Markdown, display
from matplotlib.figure import Figure

from simgrid.costs import bus_bandwidth_GBps, collective_time_s
from simgrid.hardware import load_cluster
from simgrid.layout import Layout
from simgrid.simulation import simulate
from simgrid.topology import Topology

FABRICS = {  # label -> (cluster profile, GPUs, ranks in the collective)
    "NVLink3/NVSwitch: DGX A100, 8 GPUs": ("dgx-a100-hdr", 8, range(8)),
    "NVLink4/NVSwitch: DGX H100, 8 GPUs": ("dgx-h100-ndr", 8, range(8)),
    "PCIe 4.0: RTX 4090 box, 4 GPUs": ("rtx4090-10gbe", 4, range(4)),
    "InfiniBand HDR: 2 DGX A100, 16 GPUs": ("dgx-a100-hdr", 16, range(16)),
    "10 GbE: 2 RTX 4090 boxes, 8 GPUs": ("rtx4090-10gbe", 8, range(8)),
}
SIZES = [2**k for k in range(10, 31, 2)]  # 1 KiB .. 1 GiB
topologies = {label: Topology(load_cluster(name, gpus=n)) for label, (name, n, _) in FABRICS.items()}

# %% [markdown]
# ## All-reduce time and bus bandwidth against message size

# %%
rows = []
for label, (_, _, ranks) in FABRICS.items():
    group = list(ranks)
    for size in SIZES:
        t = collective_time_s("all_reduce", size, group, topologies[label])
        rows.append({"fabric": label, "bytes": size, "time_s": t,
                     "busbw_GBps": bus_bandwidth_GBps("all_reduce", size, len(group), t)})
curves = pd.DataFrame(rows)

fig = Figure(figsize=(13, 5), layout="constrained")
ax_t, ax_b = fig.subplots(1, 2)
for label, group in curves.groupby("fabric", sort=False):
    ax_t.plot(group["bytes"], group["time_s"], marker="o", label=label)
    ax_b.plot(group["bytes"], group["busbw_GBps"], marker="o", label=label)
for ax in (ax_t, ax_b):
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.grid(alpha=0.3)
ax_t.set_yscale("log")
ax_t.set_ylabel("all-reduce time (s)")
ax_b.set_yscale("log")
ax_b.set_ylabel("bus bandwidth (GB/s)")
ax_t.set_title("All-reduce time")
ax_b.set_title("All-reduce bus bandwidth (nccl-tests convention)")
ax_b.legend(fontsize="small")
display(fig)

# %%
big = curves[curves.bytes == max(SIZES)].set_index("fabric")
small = curves[curves.bytes == min(SIZES)].set_index("fabric")
table = pd.DataFrame({"1 KiB time (us)": small.time_s * 1e6, "1 GiB time (ms)": big.time_s * 1e3,
                      "1 GiB busbw (GB/s)": big.busbw_GBps})
display(table.round(1))
fastest, slowest = table["1 GiB busbw (GB/s)"].idxmax(), table["1 GiB busbw (GB/s)"].idxmin()
display(Markdown(
    f"A 1 GiB all-reduce takes {table.loc[fastest, '1 GiB time (ms)']:.0f} ms on *{fastest}* and "
    f"{table.loc[slowest, '1 GiB time (ms)'] / 1e3:.1f} s on *{slowest}*: a factor of "
    f"**{table.loc[slowest, '1 GiB time (ms)'] / table.loc[fastest, '1 GiB time (ms)']:.0f}**."
))

# Where does bandwidth start to matter? The smallest size whose time is twice the 1 KiB (latency) time.
knee = {label: group.loc[group.time_s > 2 * group.time_s.iloc[0], "bytes"].min()
        for label, group in curves.groupby("fabric", sort=False)}
display(Markdown(
    "Small messages are latency-bound on every fabric (the flat left end of the time curves). The time "
    "doubles over the small-message time at: "
    + "; ".join(f"{label}: {size / 2**20:g} MiB" if size >= 2**20 else f"{label}: {size / 2**10:g} KiB"
                for label, size in knee.items()) + "."
))

# %% [markdown]
# ## Where tensor parallelism across nodes breaks down
#
# Megatron tensor parallelism all-reduces the activations (micro-batch x sequence x hidden values)
# twice per layer in the forward and twice in the backward, on the critical path. Inside a node
# that is NVSwitch traffic; with tp = 16 on 8-GPU nodes it must cross InfiniBand. First the raw
# cost of one such all-reduce, then a whole step of Megatron's 18.4B model on 16 A100s:
# tp 8 inside each node with 2 data-parallel replicas, against tp 16 across the two nodes.

# %%
hidden, seq = 6144, 2048  # megatron-18.4b
tp_bytes = seq * hidden * 2  # one micro-batch's activations in bf16
two_nodes = Topology(load_cluster("dgx-a100-hdr", gpus=16))
t8 = collective_time_s("all_reduce", tp_bytes, list(range(8)), two_nodes)
t16 = collective_time_s("all_reduce", tp_bytes, list(range(16)), two_nodes)
display(Markdown(
    f"One tensor-parallel all-reduce of {tp_bytes / 2**20:.0f} MiB: **{t8 * 1e3:.2f} ms** over 8 GPUs in "
    f"a node, **{t16 * 1e3:.2f} ms** over 16 GPUs in two nodes ({t16 / t8:.1f}x)."
))

# %%
tp_runs = {
    "tp 8 in a node, dp 2": Layout(tp=8, dp=2, zero=1, micro_batch_size=1, global_batch_size=16,
                                   recompute="selective", sequence_parallel=True),
    "tp 16 across 2 nodes": Layout(tp=16, micro_batch_size=1, global_batch_size=16, recompute="selective",
                                   sequence_parallel=True),
}
rows = {}
for label, layout in tp_runs.items():
    m = simulate("megatron-18.4b", "dgx-a100-hdr", layout).metrics
    rows[label] = {"step time (s)": m.step_time_s, "MFU": m.mfu, "exposed TP comm (s)": m.exposed_comm_s["tp"],
                   "exposed DP comm (s)": m.exposed_comm_s["dp"], "peak memory (GiB)": m.peak_memory_bytes / 2**30}
tp_table = pd.DataFrame(rows).T
display(tp_table.style.format({"MFU": "{:.1%}", "step time (s)": "{:.2f}", "exposed TP comm (s)": "{:.2f}",
                               "exposed DP comm (s)": "{:.2f}", "peak memory (GiB)": "{:.1f}"}))
a, b = tp_table.loc["tp 8 in a node, dp 2"], tp_table.loc["tp 16 across 2 nodes"]
display(Markdown(
    f"Crossing nodes raises the exposed tensor-parallel communication from {a['exposed TP comm (s)']:.2f} s "
    f"to **{b['exposed TP comm (s)']:.2f} s** per step and drops MFU from {a['MFU']:.1%} to "
    f"**{b['MFU']:.1%}**. Two effects multiply: each collective crosses InfiniBand ({t16 / t8:.1f}x slower "
    f"above), and with tp 16 and no data parallelism every GPU runs all {tp_runs['tp 16 across 2 nodes'].num_microbatches} "
    f"micro-batches instead of {tp_runs['tp 8 in a node, dp 2'].num_microbatches}, each on a thinner slice "
    "of the layer: twice the collectives for the same compute. Keep tensor parallelism inside the NVLink "
    "domain and use pipeline or data parallelism across nodes."
))
