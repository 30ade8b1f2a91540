# %% [markdown]
# # Predicted vs measured on this machine
#
# The simulator and the executor are two interpreters of the same schedule program. Here we run a
# tiny GPT for real with 2 processes over gloo on this machine's CPU (a 2-stage pipeline with the
# 1F1B schedule), calibrate a hardware profile of this machine, simulate the very same program on
# it, and overlay the two Gantt charts.
#
# This needs PyTorch (the `executor` extra: `pip install llm-simgrid[executor]`). Without it the
# notebook says so and stops.

# %%
# %matplotlib inline
import importlib.util

HAVE_TORCH = importlib.util.find_spec("torch") is not None
if not HAVE_TORCH:
    print("SKIPPED: PyTorch is not installed, so nothing can run for real here. "
          "Install the executor extra (pip install 'llm-simgrid[executor]') and re-run this notebook.")
else:
    print("PyTorch found: running for real.")

# %% [markdown]
# ## Quick calibration
#
# The full `simgrid-exec calibrate` measures every collective at many sizes; to stay under a minute
# this notebook measures fewer sizes and fits the compute model (FLOPs, memory traffic and a
# per-op overhead) to a short real run of a *different* layout (2-way data parallel), so the
# pipeline run below is a prediction, not a fit. The profile is written to the working directory
# and can be reused with `simgrid simulate --cluster ./localhost-quick.toml`.

# %%
if HAVE_TORCH:
    import time
    from pathlib import Path

    import pandas as pd
    from IPython.display import Markdown, display

    from executor.calibrate import build_profile, fit_compute, measure_communication
    from executor.runner import Job, run_programs
    from simgrid.hardware import load_cluster, write_profile
    from simgrid.ir.ops import Compute
    from simgrid.ir.text import parse_op
    from simgrid.layout import Layout
    from simgrid.model import get_model
    from simgrid.plots import plot_overlay
    from simgrid.schedules import build_program
    from simgrid.simulation import simulate

    model = get_model("tiny-gpt")
    calibration_layout = Layout(dp=2, micro_batch_size=1, global_batch_size=4, precision="fp32")
    target_layout = Layout(pp=2, schedule="1f1b", micro_batch_size=1, global_batch_size=8, precision="fp32")
    calibration_program = build_program(model, calibration_layout)
    target_program = build_program(model, target_layout)

    t0 = time.perf_counter()
    comm = measure_communication(2, sizes=(4096, 262144))
    # Both real runs share one pair of processes: the calibration run first, then the run to predict.
    calibration_run, measured_run = run_programs([
        Job(program=calibration_program, steps=2, collect_weights=False),
        Job(program=target_program, steps=5, collect_weights=False),
    ])
    samples = []
    for row in calibration_run.trace.rows:
        if row.purpose == "compute":
            op = parse_op(row.op.split("  #")[0])
            if isinstance(op, Compute) and op.device == "gpu":
                samples.append((op, row.end_s - row.start_s))
    fit = fit_compute(samples)
    profile_path = write_profile(build_profile(name="localhost-quick", world_size=2, comm=comm, fit=fit),
                                 Path("localhost-quick.toml").resolve())
    print(f"calibrated and measured in {time.perf_counter() - t0:.1f} s; profile: {profile_path}")
    print(f"fitted compute model: {fit.describe()}")

# %% [markdown]
# ## Predict the pipeline run
#
# Simulate the same program (`mode="full"`: every rank) on the calibrated profile and compare step
# times. The measured step is the median of the steps after the first (warm-up).

# %%
if HAVE_TORCH:
    cluster = load_cluster(str(profile_path), gpus=2)
    predicted = simulate(model, cluster, target_layout, mode="full")
    pred_s, meas_s = predicted.metrics.step_time_s, measured_run.measured_step_s
    error = (pred_s - meas_s) / meas_s

    def per_kind(trace):
        df = trace.to_dataframe()
        df = df[df.kind != "WAIT"]
        return df.groupby("kind")["duration_s"].sum() / df["rank"].nunique()

    kinds = pd.DataFrame({"predicted ms": per_kind(predicted.trace) * 1e3,
                          "measured ms": per_kind(measured_run.trace) * 1e3}).fillna(0.0)
    display(kinds.round(3))
    display(Markdown(
        f"Predicted step **{pred_s * 1e3:.1f} ms**, measured **{meas_s * 1e3:.1f} ms** "
        f"(median of {len(measured_run.step_times_s) - 1} steps after warm-up): error **{error:+.1%}**."
    ))

# %% [markdown]
# ## Overlay: predicted above, measured below
#
# Both are `simgrid.trace.Trace` objects, so the same plotting code draws them on a common time
# axis (the measured panel is the last step run; its length can differ from the median above). Differences in the op widths are compute-model error; differences in the gaps are
# communication and scheduling (Python and gloo overheads on a shared 2-core machine).

# %%
if HAVE_TORCH:
    fig = plot_overlay(predicted.trace, measured_run.trace, style="panels", include_comm=True,
                       title="tiny-gpt, PP2 1F1B, 2 ranks on gloo (measured: last step)")
    display(fig)

# %%
if HAVE_TORCH:
    verdict = ("close to" if abs(error) <= 0.15 else "noticeably off from")
    display(Markdown(
        f"**What to conclude:** the prediction ({pred_s * 1e3:.1f} ms) comes from micro-benchmarks and a "
        f"different layout's compute ops, and is {verdict} the measurement ({meas_s * 1e3:.1f} ms, error "
        f"{error:+.1%}). Per op kind, the table above shows where the difference comes from. The measured "
        f"steps of this run ranged from {min(measured_run.step_times_s[1:]) * 1e3:.1f} to "
        f"{max(measured_run.step_times_s[1:]) * 1e3:.1f} ms: on a shared CPU, other processes add noise "
        "that no profile can predict. `simgrid-exec validate` does the same comparison for any layout with "
        "the full calibration, and also checks that the real step's numerics match a single-process reference."
    ))
