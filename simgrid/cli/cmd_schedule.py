"""``simgrid schedule``: print or write a compute-only pipeline order (grid, CSV, torch CSV or JSON)."""

from __future__ import annotations

import argparse
from typing import Any

from simgrid.cli.common import positive_int
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
        "  simgrid schedule --schedule interleaved-1f1b --pp 4 --vpp 2 --microbatches 8\n"
        "  simgrid schedule --schedule zb-h1 --pp 4 --microbatches 8 --format torch-csv --out zb.csv",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--schedule", required=True, choices=SCHEDULES, help="pipeline schedule")
    p.add_argument("--pp", type=positive_int, required=True, help="pipeline ranks")
    p.add_argument("--microbatches", type=positive_int, required=True, help="micro-batches per step")
    p.add_argument("--vpp", type=positive_int, help="model chunks per rank (default 1; 2 for zbv)")
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


def run(args: argparse.Namespace) -> int:
    """Build the order and print or write it."""
    from simgrid.io import atomic_write_text, check_output_path
    from simgrid.limits import check_schedule_size

    if args.out is not None:
        check_output_path(args.out, flag="--out")
    vpp = args.vpp if args.vpp is not None else (2 if args.schedule == "zbv" else 1)
    check_schedule_size(args.pp, vpp, args.microbatches)
    text = render(args.schedule, args.pp, args.microbatches, vpp, args.format)
    if args.out is None:
        print(text, end="")
        return 0
    atomic_write_text(args.out, text, flag="--out")
    print(f"wrote {args.format} order of {args.schedule} (pp {args.pp}, {args.microbatches} micro-batches) "
          f"to {args.out}")
    return 0
