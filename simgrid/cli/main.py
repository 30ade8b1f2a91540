"""The ``simgrid`` command: one sub-command per module ``simgrid.cli.cmd_*``."""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Sequence
from typing import TextIO

from simgrid import __version__
from simgrid.cli.common import Parser
from simgrid.errors import SimgridError

#: Sub-command modules in the order ``--help`` lists them; each defines ``register(subparsers)``.
COMMAND_MODULES = (
    "cmd_demo",
    "cmd_simulate",
    "cmd_sweep",
    "cmd_memory",
    "cmd_serve",
    "cmd_schedule",
    "cmd_program",
    "cmd_plot",
    "cmd_profiles",
    "cmd_models",
)


def build_parser() -> Parser:
    """The full argument parser with every sub-command registered."""
    parser = Parser(
        prog="simgrid",
        description="Predict step time, MFU, communication and memory of distributed LLM training.",
        epilog="example: simgrid simulate --model gpt3-175b --cluster dgx-a100-hdr --gpus 1024 "
        "--tp 8 --pp 8 --mbs 1 --gbs 1536",
    )
    parser.add_argument("--version", action="version", version=f"simgrid {__version__}")
    # Sub-parsers are Parser too: no abbreviated options anywhere (--gpu must not mean --gpus).
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"simgrid.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"simgrid.cli.{name}":
                raise
            continue
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: parse, dispatch, and turn project errors into one line on stderr (exit 2)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("default")  # each distinct warning once
            warnings.showwarning = _one_line_warning
            return int(args.func(args) or 0)
    except SimgridError as exc:
        print(f"simgrid {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("simgrid: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


def _one_line_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                      file: TextIO | None = None, line: str | None = None) -> None:
    """Warnings (e.g. a skipped file on the profile search path) as one line, without source lines."""
    print(f"simgrid: warning: {message}", file=sys.stderr)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
