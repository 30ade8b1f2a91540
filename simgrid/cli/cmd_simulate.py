"""``simgrid simulate``: one training step of a model on a cluster under a layout, as a report or JSON."""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import TYPE_CHECKING, Any

from simgrid.cli.common import add_model_layout_args, model_layout_from_args, positive_int, print_json

if TYPE_CHECKING:
    from simgrid.simulation import SimulationResult

EPILOG = """examples:
  simgrid simulate --model gpt3-175b --cluster dgx-a100-hdr --gpus 1024 --tp 8 --pp 8 --mbs 1 --gbs 1536
  simgrid simulate --model llama2-7b --cluster dgx-a100-hdr --gpus 8 --tp 2 --pp 2 --gbs 64 \\
      --json --trace step.json --gantt step.png
"""


def register(subparsers: Any) -> None:
    """Add the ``simulate`` sub-command."""
    p = subparsers.add_parser(
        "simulate",
        help="simulate one training step and report step time, MFU, bubble, communication and memory",
        description="Simulate one training step of MODEL on CLUSTER under a parallel layout and print "
        "step time, throughput, TFLOP/s and MFU/HFU, pipeline bubble, exposed communication and peak "
        "memory with a fit verdict.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_layout_args(p)
    p.add_argument("--cluster", required=True, help="cluster profile name (see `simgrid profiles`)")
    p.add_argument("--gpus", type=positive_int, help="GPUs in the run (default: dp * tp * pp)")
    p.add_argument("--mode", choices=("symmetric", "full"), default="symmetric",
                   help="symmetric: one rank per pipeline stage when exact (default); full: every rank")
    p.add_argument("--comm", choices=("fast", "flow"), default="fast",
                   help="fast: closed-form collectives (default); flow: link-sharing flows")
    p.add_argument("--granularity", choices=("auto", "block", "stage"), default="auto",
                   help="program granularity (default auto: stage above 64 GPUs)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--trace", metavar="OUT.json", help="write a Chrome/Perfetto trace of the step")
    p.add_argument("--gantt", metavar="OUT.png", help="write a pipeline Gantt chart (PNG or SVG)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Simulate, print the report or JSON, and write the requested files."""
    from simgrid.hardware import load_cluster
    from simgrid.io import check_output_paths
    from simgrid.plots.canvas import SAVE_FORMATS
    from simgrid.simulation import simulate

    # Every output is checked before any work, so one bad path leaves no other file behind.
    check_output_paths([("--trace", args.trace), ("--gantt", args.gantt)], suffixes={"--gantt": SAVE_FORMATS})
    model, layout = model_layout_from_args(args, gpus=args.gpus)
    cluster = load_cluster(args.cluster, gpus=layout.world_size)  # a bad name fails before "simulating ..."
    print(f"simulating {model.name} on {layout.world_size} GPUs of {args.cluster} ...", file=sys.stderr)
    result = simulate(model, cluster, layout, mode=args.mode, comm_model=args.comm,
                      granularity=args.granularity)
    print(f"simulated {len(result.engine.simulated_ranks)} of {layout.world_size} ranks ({result.engine.mode} mode) "
          f"in {result.wall_s:.2f} s", file=sys.stderr)
    write_outputs(result, trace=args.trace, gantt=args.gantt)
    if args.json:
        print_json(result.to_json_dict())
    else:
        print(format_report(result))
    return 0


def write_outputs(result: SimulationResult, *, trace: str | None, gantt: str | None) -> None:
    """Write the trace and the Gantt chart atomically and together: both appear, or neither does."""
    from simgrid.io import atomic_output

    with contextlib.ExitStack() as stack:
        if trace:
            temp = stack.enter_context(atomic_output(trace, flag="--trace"))
            result.trace.to_chrome_trace(temp)
        if gantt:
            from simgrid.plots import plot_gantt
            from simgrid.plots.canvas import save_figure

            temp = stack.enter_context(atomic_output(gantt, flag="--gantt"))
            save_figure(plot_gantt(result.trace, title=f"{result.model.name}, {_layout_line(result)}"), temp)
    if trace:
        print(f"wrote trace {trace} (open in https://ui.perfetto.dev)", file=sys.stderr)
    if gantt:
        print(f"wrote Gantt chart {gantt}", file=sys.stderr)


def _layout_line(result: SimulationResult) -> str:
    lay = result.layout
    parts = [f"dp {lay.dp}", f"tp {lay.tp}", f"pp {lay.pp}"] + ([f"cp {lay.cp}"] if lay.cp > 1 else [])
    if lay.vpp > 1:
        parts.append(f"vpp {lay.vpp}")
    parts += [f"mbs {lay.micro_batch_size}", f"gbs {lay.gbs} (m = {lay.num_microbatches})", f"{lay.schedule}"]
    if lay.zero:
        parts.append(f"ZeRO-{lay.zero}")
    if lay.recompute != "none":
        parts.append(f"recompute {lay.recompute}")
    if lay.sequence_parallel:
        parts.append("SP")
    if lay.flash_attention:
        parts.append("flash attention")
    return ", ".join(parts)


def _seconds(s: float) -> str:
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} us"


def _gib(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def _tflops(x: float) -> str:
    return f"{x:.1f}" if x >= 10 else f"{x:.3g}"


def format_report(result: SimulationResult) -> str:
    """The human-readable report: aligned labels, one fact per line."""
    m = result.metrics
    kinds = ("tp", "cp", "pp", "dp") if result.layout.cp > 1 else ("tp", "pp", "dp")
    exposed = "  ".join(f"{k} {_seconds(m.exposed_comm_s.get(k, 0.0))}" for k in kinds)
    verdict = "fits" if m.fits else "DOES NOT FIT"
    share = m.peak_memory_bytes / m.memory_capacity_bytes if m.memory_capacity_bytes else float("inf")
    rows = [
        ("model", result.model.name),
        ("cluster", f"{result.cluster_name}, {m.world_size} GPUs"),
        ("layout", _layout_line(result)),
        ("step time", _seconds(m.step_time_s)),
        ("throughput", f"{m.tokens_per_s:,.0f} tokens/s"),
        ("TFLOP/s per GPU", f"{_tflops(m.tflops_per_gpu)} model, {_tflops(m.hw_tflops_per_gpu)} hardware"),
        ("MFU / HFU", f"{m.mfu:.3g} / {m.hfu:.3g}" if m.mfu < 0.001 else f"{m.mfu:.1%} / {m.hfu:.1%}"),
        ("pipeline bubble", f"{m.bubble_fraction:.1%}"),
        ("exposed comm", exposed),
        ("peak memory", f"{_gib(m.peak_memory_bytes)} of {_gib(m.memory_capacity_bytes)} ({share:.0%}): {verdict}"),
        ("simulation", f"{result.engine.mode} mode, {result.engine.comm_model} comm, "
                       f"{result.granularity} granularity, {result.wall_s:.2f} s wall"),
    ]
    width = max(len(label) for label, _ in rows)
    lines = [f"{label:<{width}}  {value}" for label, value in rows]
    lines += [f"{'note':<{width}}  {note}" for note in result.notes]
    return "\n".join(lines)
