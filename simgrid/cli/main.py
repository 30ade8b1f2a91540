"""The ``simgrid`` command: one sub-command per module ``simgrid.cli.cmd_*``.

Start-up is kept short (``simgrid --help`` and ``simgrid profiles`` in well under 0.3 s): only the module
of the sub-command being run is imported; the others appear in ``--help`` from :data:`COMMANDS`, so
matplotlib, pandas and the simulator load only for the commands that use them
(``python benchmarks/startup_speed.py`` measures it; ``tests/cli/test_cli_lazy.py`` checks the table
against what each module registers).
"""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Sequence
from typing import TextIO

from simgrid import __version__
from simgrid.cli.common import Parser
from simgrid.errors import SimgridError

#: Sub-command -> (module in ``simgrid.cli`` that registers it, its one-line help), in ``--help`` order.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("cmd_demo", "simulate the built-in default (gpt3-175b on 1024 A100) and write a Gantt PNG and a trace"),
    "simulate": ("cmd_simulate", "simulate one training step and report step time, MFU, bubble, communication and "
                                 "memory"),
    "sweep": ("cmd_sweep", "search layouts (dp, tp, pp, vpp, ZeRO, micro-batch, schedule, recompute) for the fastest"),
    "memory": ("cmd_memory", "memory per GPU of a layout (model states, activations, buffers) and whether it fits"),
    "serve": ("cmd_serve", "simulate LLM serving under load (TTFT, TPOT, throughput per GPU, KV cache) or find the "
                           "best layout"),
    "schedule": ("cmd_schedule", "show a pipeline schedule's compute order per rank (with its bubbles)"),
    "program": ("cmd_program", "lower a model and layout into a full schedule IR program (JSON)"),
    "validate-program": ("cmd_program", "validate a program file and print a summary (ranks, ops, groups, dry-run "
                                        "makespan)"),
    "plot": ("cmd_plot", "draw a saved trace (gantt, memory) or sweep CSV (ranking, heatmap)"),
    "profiles": ("cmd_profiles", "list hardware profiles (GPUs, nodes, clusters)"),
    "models": ("cmd_models", "list model presets"),
}

#: Sub-command modules, in the order ``--help`` lists their commands; each defines ``register(subparsers)``.
COMMAND_MODULES: tuple[str, ...] = tuple(dict.fromkeys(module for module, _ in COMMANDS.values()))


def build_parser(command: str | None = None, *, lazy: bool = False) -> Parser:
    """The argument parser; with ``lazy``, only ``command``'s module is imported and registered, the other
    commands are listed from :data:`COMMANDS`."""
    parser = Parser(
        prog="simgrid",
        description="Predict step time, MFU, communication and memory of distributed LLM training.",
        epilog="example: simgrid simulate --model gpt3-175b --cluster dgx-a100-hdr --gpus 1024 "
        "--tp 8 --pp 8 --mbs 1 --gbs 1536",
    )
    parser.add_argument("--version", action="version", version=f"simgrid {__version__}")
    # Sub-parsers are Parser too: no abbreviated options anywhere (--gpu must not mean --gpus).
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    wanted = COMMANDS[command][0] if command in COMMANDS else None
    registered: set[str] = set()
    for name, (module_name, help_text) in COMMANDS.items():
        if lazy and module_name != wanted:
            subparsers.add_parser(name, help=help_text)  # listed in --help; never parsed in this run
            continue
        if module_name in registered:
            continue
        registered.add(module_name)
        try:
            module = importlib.import_module(f"simgrid.cli.{module_name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"simgrid.cli.{module_name}":
                raise
            continue
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: parse, dispatch, and turn project errors into one line on stderr (exit 2)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in args_list if not a.startswith("-")), None)
    parser = build_parser(command, lazy=True)
    args = parser.parse_args(args_list)
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
