"""``simgrid program`` writes a full IR program; ``simgrid validate-program`` checks one and summarises it."""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

from simgrid.cli.common import add_model_layout_args, model_layout_from_args
from simgrid.errors import ProgramError


def register(subparsers: Any) -> None:
    """Add the ``program`` and ``validate-program`` sub-commands."""
    p = subparsers.add_parser(
        "program",
        help="lower a model and layout into a full schedule IR program (JSON)",
        description="Build the per-rank op lists of one training step (compute, tensor/pipeline/data "
        "parallel communication, ZeRO, optimizer, memory) and write them as a program file that "
        "`simgrid simulate` and the executor read. 'block' granularity has one compute op per sub-block "
        "(what the executor runs); 'stage' one per pipeline stage and micro-batch (fast simulation).",
        epilog="examples:\n"
        "  simgrid program --model tiny-gpt --dp 2 --tp 2 --pp 2 --gbs 8 --out tiny.json\n"
        "  simgrid program --model gpt3-175b --tp 8 --pp 8 --dp 16 --gbs 1536 --granularity stage "
        "--out gpt3.json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_layout_args(p)
    p.add_argument("--granularity", choices=("block", "stage"), default="block",
                   help="one compute op per sub-block (default) or per pipeline stage")
    p.add_argument("--out", required=True, help="program file to write (JSON)")
    p.set_defaults(func=run_program)

    v = subparsers.add_parser(
        "validate-program",
        help="validate a program file and print a summary (ranks, ops, groups, dry-run makespan)",
        description="Load a program file, check it (send/receive pairing, collective sequences, handles, "
        "memory) and dry-run it with unit compute costs to find deadlocks.",
        epilog="example:\n  simgrid validate-program tiny.json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    v.add_argument("file", help="program file (JSON) written by `simgrid program`")
    v.set_defaults(func=run_validate)


def run_program(args: argparse.Namespace) -> int:
    """Build the program for the model/layout flags and write it."""
    from simgrid.io import check_output_path
    from simgrid.ir.jsonio import save_program
    from simgrid.limits import check_program_size
    from simgrid.schedules import build_program

    check_output_path(args.out, flag="--out", error=ProgramError)
    model, layout = model_layout_from_args(args)
    check_program_size(model, layout, args.granularity, ranks=layout.world_size, what="the program file")
    program = build_program(model, layout, granularity=args.granularity)
    save_program(program, args.out, flag="--out")
    print(f"wrote {args.out}: {program.world_size} ranks, {program.num_ops} ops "
          f"({layout.schedule}, {layout.num_microbatches} micro-batches, granularity {args.granularity})")
    return 0


def summarize(program: Any) -> list[str]:
    """Summary lines: ranks, ops per kind, groups by kind, dry-run makespan and bubble."""
    from simgrid.ir.dryrun import dry_run
    from simgrid.ir.text import mnemonic

    kinds = Counter(mnemonic(op) for ops in program.ranks for op in ops)
    group_kinds = Counter(name.split("/")[0] for name in program.groups)
    result = dry_run(program)
    lines = [f"ranks     {program.world_size}"]
    if program.model is not None:
        lines.append(f"model     {program.model.name}")
    if program.layout is not None:
        lay = program.layout
        lines.append(f"layout    dp={lay.dp} tp={lay.tp} pp={lay.pp} "
                     f"{f'cp={lay.cp} ' if lay.cp > 1 else ''}"
        f"{f'ep={lay.ep} etp={lay.expert_tp} ' if lay.ep > 1 or lay.etp is not None else ''}"
        f"vpp={lay.vpp} zero={lay.zero} "
                     f"schedule={lay.schedule} micro-batches={lay.num_microbatches}")
    lines.append(f"ops       {program.num_ops}: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())))
    lines.append(f"groups    {len(program.groups)}: " + ", ".join(f"{k} {n}" for k, n in sorted(group_kinds.items())))
    lines.append(f"dry run   makespan {result.makespan:g} units (compute op = 1), "
                 f"idle fraction {result.bubble_fraction:.3f}")
    return lines


def run_validate(args: argparse.Namespace) -> int:
    """Load, validate, dry-run and summarise a program file."""
    from simgrid.ir.jsonio import load_program
    from simgrid.ir.validate import validate_program

    program = load_program(args.file)
    try:
        validate_program(program)
    except ProgramError as exc:
        first = str(exc).splitlines()
        detail = first[1].strip(" -") if len(first) > 1 else first[0]
        raise ProgramError(f"{args.file}: {first[0]} first: {detail}") from None
    for line in summarize(program):
        print(line)
    print("valid     yes")
    return 0
