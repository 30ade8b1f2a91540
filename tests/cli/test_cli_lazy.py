"""Lazy start-up of the ``simgrid`` command: only the invoked sub-command's module is imported.

``simgrid --help`` lists every command from ``simgrid.cli.main.COMMANDS``; the table must say what the
modules themselves register, and the light commands must not pull in matplotlib, pandas or SimPy (the
start-up time is printed by ``benchmarks/startup_speed.py``).
"""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from simgrid.cli.main import COMMAND_MODULES, COMMANDS, build_parser, main


def _commands(parser: argparse.ArgumentParser) -> dict[str, str | None]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {choice.dest: choice.help for choice in action._choices_actions}


def test_command_table_matches_what_the_modules_register() -> None:
    """Every module's commands, with their help, in the table's order (a new command needs a table entry)."""
    assert _commands(build_parser()) == {name: help_text for name, (_, help_text) in COMMANDS.items()}
    assert _commands(build_parser("plot", lazy=True)) == _commands(build_parser())
    assert set(COMMAND_MODULES) == {module for module, _ in COMMANDS.values()}


@pytest.mark.parametrize("argv", [["--help"], ["profiles"], ["models"]])
def test_light_commands_do_not_import_plotting_tables_or_the_simulator(argv: list[str]) -> None:
    """A fresh interpreter running the command has not imported matplotlib, pandas or SimPy."""
    probe = ("import sys\nfrom simgrid.cli.main import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n"
             "    pass\nprint(sorted(m for m in ('matplotlib', 'pandas', 'simpy') if m in sys.modules), file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, timeout=60, check=False)
    assert out.stderr.strip().splitlines()[-1] == "[]", out.stderr


def test_a_typo_in_the_command_is_argparse_s_usual_error(capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown command still lists the valid ones (they are registered as names even when lazy)."""
    with pytest.raises(SystemExit) as info:
        main(["simulat"])
    assert info.value.code == 2
    assert "invalid choice: 'simulat'" in capsys.readouterr().err
