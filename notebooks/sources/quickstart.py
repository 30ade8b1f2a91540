# %% [markdown]
# # Quickstart: one simulated training step
#
# This notebook walks the shortest path through `simgrid`: pick a cluster and a model, describe a
# parallel layout, simulate one training step, read the report, write a trace you can open in
# Perfetto, and draw the pipeline Gantt chart. Everything runs on a laptop CPU in seconds: the
# GPUs and the network are simulated.

# %%
# %matplotlib inline
from pathlib import Path

import pandas as pd
from IPython.display import Markdown, display

from simgrid.cli.cmd_simulate import format_report
from simgrid.hardware import list_profiles, load_cluster
from simgrid.layout import Layout
from simgrid.model import get_model, param_count
from simgrid.plots import plot_gantt
from simgrid.simulation import simulate

# %% [markdown]
# ## 1. Hardware profiles
#
# Hardware is data: TOML profiles of GPUs, nodes and clusters (`simgrid profiles` lists them on the
# command line). A cluster profile is sized to the number of GPUs you ask for.

# %%
profiles = pd.DataFrame([{"kind": p.kind, "name": p.name, "description": p.description}
                         for p in list_profiles()])
profiles[profiles.kind == "cluster"]

# %%
cluster = load_cluster("dgx-a100-hdr", gpus=16)
print(f"{cluster.num_gpus} x {cluster.gpu.name} in {cluster.num_nodes} nodes of {cluster.gpus_per_node}")
print(f"GPU: {cluster.gpu.memory_GiB:.0f} GiB, {cluster.gpu.peak_flops('bf16') / 1e12:.0f} TFLOP/s bf16 peak")
print(f"node fabric: {cluster.node.intra_fabric}, {cluster.node.intra_link.bandwidth_GBps:.0f} GB/s per GPU")
print(f"network: {cluster.network.kind}, {cluster.node.nics_per_node} NICs of "
      f"{cluster.node.nic_link.bandwidth_GBps:.0f} GB/s per node")

# %% [markdown]
# ## 2. Model and layout
#
# Models are presets (`simgrid models`) or your own `ModelSpec`. A `Layout` says how the step is
# split: data-parallel replicas (`dp`), tensor-parallel degree (`tp`), pipeline stages (`pp`), the
# pipeline schedule, ZeRO stage, micro-batch size and global batch, activation recompute.
# The layout below puts tensor parallelism inside a node (tp = 4), two pipeline stages and two
# replicas: 16 GPUs.

# %%
model = get_model("llama2-7b")
print(f"{model.name}: {param_count(model) / 1e9:.2f} B parameters, {model.num_layers} layers, "
      f"sequence {model.seq_length}")

layout = Layout(dp=2, tp=4, pp=2, micro_batch_size=1, global_batch_size=16,
                schedule="1f1b", recompute="selective", sequence_parallel=True)
print(f"world size {layout.world_size}, {layout.num_microbatches} micro-batches per replica")

# %% [markdown]
# ## 3. Simulate and read the report
#
# `simulate` builds the schedule program (every rank's compute, communication and memory ops),
# runs it on the discrete-event engine and derives the metrics from the resulting trace.
# The report is the one `simgrid simulate` prints.

# %%
result = simulate(model, cluster, layout)
print(format_report(result))

# %%
m = result.metrics
pd.Series({
    "step time (s)": m.step_time_s,
    "tokens/s": m.tokens_per_s,
    "model TFLOP/s per GPU": m.tflops_per_gpu,
    "MFU": m.mfu,
    "HFU": m.hfu,
    "pipeline bubble": m.bubble_fraction,
    "exposed TP comm (s)": m.exposed_comm_s["tp"],
    "exposed PP comm (s)": m.exposed_comm_s["pp"],
    "exposed DP comm (s)": m.exposed_comm_s["dp"],
    "peak memory (GiB)": m.peak_memory_bytes / 2**30,
    "fits in memory": m.fits,
}).to_frame("value")

# %%
display(Markdown(
    f"One step of {model.name} on {layout.world_size} A100s takes **{m.step_time_s:.2f} s** "
    f"({m.tokens_per_s:,.0f} tokens/s), an MFU of **{m.mfu:.1%}**. The pipeline bubble costs "
    f"{m.bubble_fraction:.1%} of the pipeline window and the peak memory of "
    f"{m.peak_memory_bytes / 2**30:.1f} GiB {'fits' if m.fits else 'does NOT fit'} in "
    f"{m.memory_capacity_bytes / 2**30:.0f} GiB."
))

# %% [markdown]
# ## 4. The trace
#
# Every executed op is a row: rank, stream (compute or a communication stream), op kind, start and
# end. It converts to a pandas DataFrame for your own analysis and to Chrome-trace JSON, which
# opens in [Perfetto](https://ui.perfetto.dev) (drag the file in): one process per rank, one
# thread per stream. With `mode="symmetric"` (the default) ranks that provably behave alike are
# simulated once, so the trace holds one representative rank per pipeline stage.

# %%
df = result.trace.to_dataframe()
print(f"{len(df)} rows, ranks traced: {sorted(int(r) for r in df['rank'].unique())}")
df.groupby("kind")["duration_s"].agg(["count", "sum"]).sort_values("sum", ascending=False)

# %%
trace_path = Path("quickstart_trace.json").resolve()
result.trace.to_chrome_trace(trace_path)
print(f"wrote {trace_path} ({trace_path.stat().st_size / 1e3:.0f} kB): open https://ui.perfetto.dev "
      "and drag the file in")

# %% [markdown]
# ## 5. Gantt chart
#
# Ranks are rows; forward (F), backward (B) and optimizer (OPT) ops are coloured by kind; the thin
# rows under each rank show tensor-, pipeline- and data-parallel communication in flight. Gaps in
# the compute row are the pipeline bubbles.

# %%
fig = plot_gantt(result.trace, title=f"{model.name}, dp2 tp4 pp2, 1F1B")
display(fig)

# %% [markdown]
# **What to take away:** a whole-step prediction with a breakdown (bubble, exposed communication,
# memory) comes from one call. The next notebooks vary one thing at a time: the pipeline schedule
# (`pipeline_bubbles`), the cluster size (`scaling_curves`), memory (`memory_and_zero`), the
# network (`communication`), a buying decision (`zero3_vs_3d`), and a check of the prediction
# against a real run (`predicted_vs_measured`).
