"""``simgrid demo``: the built-in default job (what the README's first command runs).

GPT-3 175B on 1024 A100-80GB GPUs (DGX A100 nodes, HDR InfiniBand) with Megatron-LM's layout from
Narayanan et al. SC'21 (tp 8 inside a node, pp 8, dp 16, micro-batch 1, global batch 1536, full
recompute), simulated and reported, with a Gantt chart and a Perfetto trace written to ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path
from typing import Any

from simgrid.errors import SimgridError

DEFAULT_ARGS = (
    "--model", "gpt3-175b", "--cluster", "dgx-a100-hdr", "--gpus", "1024",
    "--tp", "8", "--pp", "8", "--mbs", "1", "--gbs", "1536", "--recompute", "full",
)  # fmt: skip


def register(subparsers: Any) -> None:
    """Add the ``demo`` sub-command."""
    p = subparsers.add_parser(
        "demo",
        help="simulate the built-in default (gpt3-175b on 1024 A100) and write a Gantt PNG and a trace",
        description="Simulate the default job: " + " ".join(DEFAULT_ARGS) + ". Prints the report and "
        "writes OUT/gantt.png and OUT/trace.json (open the trace in https://ui.perfetto.dev).",
        epilog="example: simgrid demo --out out/",
    )
    p.add_argument("--out", default="out", help="folder for gantt.png and trace.json (default: out)")
    p.add_argument("--json", action="store_true", help="print the result as JSON instead of the report")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run ``simgrid simulate`` with the default arguments and outputs in ``--out``."""
    from simgrid.cli import cmd_simulate
    from simgrid.cli.common import Parser
    from simgrid.io import check_output_path, short_path

    out = Path(args.out)
    try:  # the folder itself is created, not its parents: a typo in a parent is an error
        out.mkdir()
        created = True
    except FileExistsError:
        created = False
    except (OSError, ValueError):
        check_output_path(out, flag="--out")  # says which part of the path is wrong
        raise SimgridError(f"--out {short_path(out)}: cannot create the folder") from None
    parser = Parser(prog="simgrid")
    cmd_simulate.register(parser.add_subparsers(parser_class=Parser))
    argv = ["simulate", *DEFAULT_ARGS, "--gantt", str(out / "gantt.png"), "--trace", str(out / "trace.json")]
    if args.json:
        argv.append("--json")
    try:
        return cmd_simulate.run(parser.parse_args(argv))
    except BaseException:
        if created:  # leave nothing behind: the folder is empty, the outputs are written atomically
            with contextlib.suppress(OSError):
                out.rmdir()
        raise
