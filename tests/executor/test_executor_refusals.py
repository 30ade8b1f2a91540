"""Layouts the executor once refused now pass validation and reach the launch (real runs are in
``test_executor_numerics.py``)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from executor import runner
from executor.launch import LaunchConfig
from executor.runner import Job, run_programs, validate_or_raise
from simgrid.errors import LayoutError
from simgrid.layout import Layout
from simgrid.model import get_model
from simgrid.schedules import build_program


@pytest.mark.torch
def test_context_parallel_programs_are_no_longer_refused_before_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """cp = 2 (alone and with tp = 2) validates and run_programs goes on to launch its ranks (stubbed here;
    the gloo runs that match the reference are ``test_*_context_parallel_*`` in test_executor_numerics.py)."""
    launched: list[int] = []

    def fake_spawn(worker: object, payload: list[object], config: LaunchConfig) -> list[list[object]]:
        launched.append(config.world_size)
        raise RuntimeError("launch reached")

    monkeypatch.setattr(runner, "spawn_world", fake_spawn)
    for layout in (Layout(cp=2, dp=1), Layout(cp=2, tp=2, dp=1)):
        program = build_program(get_model("tiny-gpt"), layout)
        validate_or_raise(program)
        with pytest.raises(RuntimeError, match="launch reached"):
            run_programs([Job(program=program)])
    assert launched == [2, 4]


@pytest.mark.torch
def test_selective_op_recompute_is_refused_before_launch() -> None:
    """The executor recomputes whole blocks and has no per-op saved-tensor policy: recompute 'selective-op'
    is refused with one line naming the setting and the fix, before any rank launches."""
    program = build_program(get_model("tiny-gpt"), Layout(dp=1, recompute="selective-op", flash_attention=True))
    with pytest.raises(LayoutError, match=r"executor: recompute 'selective-op'.*not implemented; run recompute 'full'"):
        validate_or_raise(program)
