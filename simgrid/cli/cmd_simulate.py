"""``simgrid simulate``: one training step of a model on a cluster under a layout, as a report or JSON."""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import TYPE_CHECKING, Any

from simgrid.cli.common import (
    add_hardware_args,
    add_headroom_arg,
    add_model_layout_args,
    add_pipeline_csv_arg,
    headroom_from_args,
    model_layout_from_args,
    pipeline_order_from_args,
    print_json,
)
from simgrid.cli.format import describe_layout

if TYPE_CHECKING:
    from simgrid.simulation import SimulationResult

EPILOG = """examples:
  simgrid simulate --model gpt3-175b --cluster dgx-a100-hdr --gpus 1024 --tp 8 --pp 8 --mbs 1 --gbs 1536
  simgrid simulate --model llama2-7b --cluster dgx-a100-hdr --gpus 8 --tp 2 --pp 2 --gbs 64 \\
      --json --trace step.json --gantt step.png
  simgrid simulate --model mixtral-8x22b --cluster dgx-h100-ndr --gpus 128 --tp 2 --pp 8 --ep 8 --etp 1 \\
      --sequence-parallel --flash-attention --zero 1 --gbs 256
  simgrid program --model tiny-gpt --pp 2 --gbs 8 --out p.json && simgrid simulate --program p.json \\
      --cluster dgx-a100-hdr
  simgrid schedule --schedule dualpipev --pp 4 --microbatches 8 --format torch-csv --out dv.csv
  simgrid simulate --model llama2-7b --cluster dgx-a100-hdr --gpus 8 --pipeline-csv dv.csv
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
    add_model_layout_args(p, model_required=False)
    add_hardware_args(p, cluster_required=True, gpu_profile=False)
    add_headroom_arg(p)
    src = p.add_argument_group("schedule source (default: build it from the model and layout flags)")
    src.add_argument("--program", metavar="F.json",
                     help="simulate a saved program (`simgrid program --out`); it carries its model and layout")
    add_pipeline_csv_arg(src)
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
    program = None
    if args.program:
        model, layout, program = _saved_program(args)
    else:
        order = pipeline_order_from_args(args)
        model, layout = model_layout_from_args(args, gpus=args.gpus, order=order)
        if order is not None:
            from simgrid.schedules import build_program
            from simgrid.simulation import resolve_granularity

            gran = resolve_granularity(args.granularity, layout.world_size)
            program = build_program(model, layout, granularity=gran, order=order)  # type: ignore[arg-type]
    cluster = load_cluster(args.cluster, gpus=layout.world_size)  # a bad name fails before "simulating ..."
    print(f"simulating {model.name} on {layout.world_size} GPUs of {args.cluster} ...", file=sys.stderr)
    result = simulate(model, cluster, layout, mode=args.mode, comm_model=args.comm,
                      granularity=args.granularity, memory_headroom=headroom_from_args(args), program=program)
    print(f"simulated {len(result.engine.simulated_ranks)} of {layout.world_size} ranks ({result.engine.mode} mode) "
          f"in {result.wall_s:.2f} s", file=sys.stderr)
    write_outputs(result, trace=args.trace, gantt=args.gantt)
    if args.json:
        print_json(result.to_json_dict())
    else:
        print(format_report(result, source=_source(args, program)))
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


def _source(args: argparse.Namespace, program: Any) -> str | None:
    if args.program:
        return f"{args.program} (saved program)"
    if args.pipeline_csv:
        from simgrid.schedules.imported import describe_order, read_pipeline_csv

        return (f"{args.pipeline_csv} ({describe_order(read_pipeline_csv(args.pipeline_csv))}); the schedule "
                f"name above only places the stages")
    return None


def _saved_program(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """Model, layout and program of ``--program``; model/layout/order flags would contradict it."""
    from simgrid.errors import ProgramError
    from simgrid.ir.jsonio import load_program

    given = [flag for flag, value in (("--model", args.model), ("--params", args.params),
                                      ("--pipeline-csv", args.pipeline_csv)) if value]
    if given:
        raise ProgramError(f"--program {args.program} carries its own model, layout and order; drop {', '.join(given)}")
    program = load_program(args.program)
    if program.model is None or program.layout is None:
        raise ProgramError(f"--program {args.program} has no model or layout to cost it with; write it with "
                           "`simgrid program` (or Program(model=..., layout=...))")
    if args.gpus is not None and args.gpus != program.world_size:
        raise ProgramError(f"--gpus {args.gpus} but --program {args.program} has {program.world_size} ranks; drop --gpus")
    return program.model, program.layout, program


def _layout_line(result: SimulationResult) -> str:
    return describe_layout(result.layout)


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


def format_report(result: SimulationResult, *, source: str | None = None) -> str:
    """The human-readable report: aligned labels, one fact per line (``source``: where the schedule came
    from, when not from the layout flags)."""
    m = result.metrics
    kinds = ("tp",) + (("cp",) if result.layout.cp > 1 else ()) + (("ep",) if result.model.moe else ()) + ("pp", "dp")
    exposed = "  ".join(f"{k} {_seconds(m.exposed_comm_s.get(k, 0.0))}" for k in kinds)
    share = m.peak_memory_bytes / m.memory_capacity_bytes if m.memory_capacity_bytes else float("inf")
    reserve = f"{_gib(m.memory_reserved_bytes)} kept free for the CUDA context and allocator fragmentation"
    verdict = {"fits": f"fits ({reserve})",
               "tight": f"tight: fits with {_gib(m.memory_capacity_bytes - m.memory_reserved_bytes - m.peak_memory_bytes)}"
                        f" to spare after {reserve}",
               }.get(m.memory_verdict, f"DOES NOT FIT in the {_gib(m.memory_capacity_bytes - m.memory_reserved_bytes)} "
                                       f"left after {reserve}")
    rows = [
        ("model", result.model.name),
        ("cluster", f"{result.cluster_name}, {m.world_size} GPUs"),
        ("layout", _layout_line(result)),
        *([("schedule from", source)] if source else []),
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
    lines += [f"{'warning':<{width}}  {warning}" for warning in result.warnings]
    return "\n".join(lines)
