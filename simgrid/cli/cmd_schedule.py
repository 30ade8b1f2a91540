"""``simgrid schedule``: print or write a compute-only pipeline order (grid, CSV, torch CSV or JSON)."""

from __future__ import annotations

import argparse
from typing import Any

from simgrid.cli.common import positive_int
from simgrid.errors import SimgridError
from simgrid.layout.spec import SCHEDULES

FORMATS = ("grid", "csv", "torch-csv", "json")


def register(subparsers: Any) -> None:
    """Add the ``schedule`` sub-command."""
    p = subparsers.add_parser(
        "schedule",
        help="show a pipeline schedule's compute order per rank (with its bubbles)",
        description="The compute order of a pipeline schedule, per pipeline rank. 'grid' draws it in unit "
        "time (F = 1, B = 2, I = W = 1) with '.' for idle slots and reports the idle fraction; 'csv' is our "
        "per-rank op CSV; 'torch-csv' loads with torch.distributed.pipelining's _load_csv; 'json' is a "
        "compute-only program file.",
        epilog="examples:\n"
        "  simgrid schedule --schedule 1f1b --pp 4 --microbatches 8\n"
        "  simgrid schedule --schedule interleaved-1f1b --pp 4 --vpp 2 --microbatches 6\n"
        "  simgrid schedule --schedule dualpipev --pp 4 --microbatches 8 --format torch-csv --out dv.csv\n"
        "  simgrid schedule --pipeline-csv dv.csv            # draw a torch schedule CSV in unit time",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--schedule", choices=SCHEDULES, help="pipeline schedule (required unless --pipeline-csv)")
    p.add_argument("--pp", type=positive_int, help="pipeline ranks (required with --schedule)")
    p.add_argument("--microbatches", type=positive_int, help="micro-batches per step (required with --schedule)")
    p.add_argument("--pipeline-csv", metavar="F.csv",
                   help="show a torch schedule CSV instead (grid; torch-csv writes it back byte for byte)")
    p.add_argument("--vpp", type=positive_int, help="model chunks per rank (default 2 for zbv, dualpipev and the interleaved schedules, else 1)")
    p.add_argument("--format", choices=FORMATS, default="grid", help="output format (default grid)")
    p.add_argument("--out", help="write to this file instead of printing")
    p.set_defaults(func=run)


def render(schedule: str, pp: int, microbatches: int, vpp: int, fmt: str) -> str:
    """The order in the requested format, as text."""
    from simgrid.ir.jsonio import program_to_json
    from simgrid.ir.torch_csv import actions_to_csv, to_csv
    from simgrid.schedules.compute_only import compute_only_program
    from simgrid.schedules.pipeline import pipeline_order
    from simgrid.schedules.unit_time import format_grid

    if fmt == "grid":
        return format_grid(pipeline_order(schedule, pp, microbatches, vpp)) + "\n"
    if fmt == "torch-csv":
        return actions_to_csv(pipeline_order(schedule, pp, microbatches, vpp))
    program = compute_only_program(schedule, pp, microbatches, vpp)
    return to_csv(program) if fmt == "csv" else program_to_json(program) + "\n"


def _imported(args: argparse.Namespace) -> str:
    from simgrid.ir.torch_csv import actions_to_csv, cells_from_csv
    from simgrid.schedules.imported import read_pipeline_csv
    from simgrid.schedules.unit_time import format_grid

    if args.schedule or args.pp or args.microbatches:
        raise SimgridError("--pipeline-csv gives the order; drop --schedule, --pp and --microbatches")
    if args.format not in ("grid", "torch-csv"):
        raise SimgridError(f"--format {args.format} needs a generated schedule; an imported CSV shows as grid or "
                           "torch-csv")
    if args.format == "torch-csv":  # idle cells and bookkeeping actions kept: torch's own dump comes back unchanged
        from simgrid.io import read_input_text

        text = read_input_text(args.pipeline_csv, what="--pipeline-csv", error=SimgridError)
        return actions_to_csv(cells_from_csv(text, args.pipeline_csv))
    return format_grid(read_pipeline_csv(args.pipeline_csv)) + "\n"


def run(args: argparse.Namespace) -> int:
    """Build the order (or read it) and print or write it."""
    from simgrid.io import check_output_path
    from simgrid.limits import check_schedule_size

    if args.out is not None:
        check_output_path(args.out, flag="--out")
    if args.pipeline_csv:
        return _emit(args, _imported(args), f"{args.format} view of {args.pipeline_csv}")
    missing = [flag for flag, value in (("--schedule", args.schedule), ("--pp", args.pp),
                                        ("--microbatches", args.microbatches)) if value is None]
    if missing:
        raise SimgridError(f"give {', '.join(missing)} (or --pipeline-csv F.csv to show a torch schedule file)")
    chunked = ("zbv", "dualpipev", "interleaved-1f1b", "interleaved-zb")
    vpp = args.vpp if args.vpp is not None else (2 if args.schedule in chunked else 1)
    check_schedule_size(args.pp, vpp, args.microbatches)
    text = render(args.schedule, args.pp, args.microbatches, vpp, args.format)
    return _emit(args, text, f"{args.format} order of {args.schedule} (pp {args.pp}, {args.microbatches} "
                 "micro-batches)")


def _emit(args: argparse.Namespace, text: str, what: str) -> int:
    if args.out is None:
        print(text, end="")
        return 0
    from simgrid.io import atomic_write_text

    atomic_write_text(args.out, text, flag="--out")
    print(f"wrote {what} to {args.out}")
    return 0
