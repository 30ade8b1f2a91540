"""Step timing (executor/timing.py, executor/recorder.py): marks are read only when the step ends, so on CUDA
the host never waits for the GPU in the middle of a step. A timer that refuses to be read before
``resolve()`` stands in for CUDA events (which would synchronise), and a real step on gloo must not read one."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from executor.launch import LaunchConfig, spawn_world  # noqa: E402
from executor.recorder import StepRecorder  # noqa: E402
from executor.timing import HostTimer, make_timer  # noqa: E402
from simgrid.ir.jsonio import program_to_json  # noqa: E402
from simgrid.ir.ops import Compute, Wait  # noqa: E402
from simgrid.layout.spec import Layout  # noqa: E402
from simgrid.model.presets import get_model  # noqa: E402
from simgrid.schedules import build_program  # noqa: E402
from simgrid.trace import row_for_op  # noqa: E402

pytestmark = [pytest.mark.torch]


class StrictTimer(HostTimer):
    """Host marks that may only be read after :meth:`resolve`, as CUDA events should be."""

    def __init__(self) -> None:
        super().__init__()
        self.resolved = False
        self.resolves = 0

    def start_step(self) -> None:
        super().start_step()
        self.resolved = False

    def resolve(self) -> None:
        self.resolved = True
        self.resolves += 1

    def seconds(self, mark: Any) -> float:
        if not self.resolved:
            raise AssertionError("a timer mark was read before the step ended (a GPU sync per op)")
        return super().seconds(mark)


OPS = (Compute(kind="F", stage=0, microbatch=0, chunk=0, block_start=1, block_end=2, flops=1e6, hbm_bytes=1e5),
       Wait(handle="h"))


def test_rows_are_built_at_the_end_of_the_step_in_the_order_they_were_added() -> None:
    """Rows added during a step exist only after resolve_rows (one resolve), in order; a builder returning
    None (a WAIT too short to show) adds no row."""
    rec = StepRecorder(rank=0, ops=OPS, stage_of={1: 0}, device=torch.device("cpu"))
    timer = rec.timer = StrictTimer()
    timer.start_step()
    rec.row(OPS[0], timer.mark(), timer.mark(), "F op")
    rec.add_row(timer.mark(), timer.mark(), lambda s, e: None)
    rec.add_row(timer.mark(), timer.mark(), lambda s, e: row_for_op(0, OPS[1], s, e, text="wait"))
    assert rec.result.rows == []
    rec.resolve_rows()
    assert [r.op for r in rec.result.rows] == ["F op", "wait"] and timer.resolves == 1
    assert all(0 <= r.start_s <= r.end_s for r in rec.result.rows) and rec.unresolved == []


def test_cpu_devices_time_with_the_host_clock() -> None:
    """make_timer gives the host clock for a CPU device (CUDA events for a CUDA one, run on GPUs only)."""
    assert type(make_timer(torch.device("cpu"))) is HostTimer


def _strict_timer(device: torch.device) -> HostTimer:
    return StrictTimer()


@pytest.mark.slow
def test_a_real_step_never_reads_a_mark_before_it_ends() -> None:
    """Two tiny-gpt steps with tensor parallelism (collective WAITs, deferred segments) on gloo with the strict
    timer in both ranks complete with at least a row per compute op: no handler read a mark early."""
    program = build_program(get_model("tiny-gpt"), Layout(tp=2, global_batch_size=1, precision="fp32"))
    outputs = spawn_world(_strict_worker, program_to_json(program, indent=None), LaunchConfig(world_size=2))
    computes = [sum(isinstance(op, Compute) for op in ops) for ops in program.ranks]
    assert all(steps == 2 and rows >= c for (steps, rows), c in zip(outputs, computes, strict=True))


def _strict_worker(ctx: Any, text: str) -> tuple[int, int]:
    """Run two steps with StrictTimer in place of the device timer; (steps done, rows of the last step)."""
    import torch.distributed as dist

    from executor import recorder
    from executor.interpreter import RankInterpreter
    from executor.runner import _make_groups
    from simgrid.ir.jsonio import program_from_json

    recorder.make_timer = _strict_timer  # type: ignore[assignment]
    program = program_from_json(text, source="strict timer test")
    _make_groups(ctx, program)
    interp = RankInterpreter(ctx, program, backend=str(dist.get_backend()))
    rows = 0
    for step in range(2):
        dist.barrier()
        rows = len(interp.run_step(step).rows)
    return 2, rows
