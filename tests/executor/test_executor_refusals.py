"""Layouts the executor cannot run are refused before any process starts, with the reason and the way out."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from executor.runner import validate_or_raise
from simgrid.errors import ProgramError
from simgrid.layout import Layout
from simgrid.model import get_model
from simgrid.schedules import build_program


def test_context_parallel_programs_are_refused_before_launch() -> None:
    """cp = 2 is simulated, not executed: validation names cp and says to use cp = 1 or the simulator."""
    program = build_program(get_model("tiny-gpt"), Layout(cp=2, dp=1))
    with pytest.raises(ProgramError, match=r"context parallelism \(cp = 2\) is simulated but not executed"):
        validate_or_raise(program)
