"""Compute-only programs (export of a pipeline order) and the fast op copy used for rank instantiation."""

from __future__ import annotations

import dataclasses

from simgrid.ir.ops import Collective, Compute, P2PKey, Send
from simgrid.ir.torch_csv import compute_actions
from simgrid.ir.validate import validate_program
from simgrid.schedules.compute_only import compute_only_program
from simgrid.schedules.lower.instantiate import replaced
from simgrid.schedules.pipeline import pipeline_order


def test_compute_only_program_holds_the_order_per_pipeline_rank() -> None:
    """One op list per pipeline rank whose actions are the order's; chunks follow the V placement."""
    program = compute_only_program("zbv", 2, 3, 2)
    validate_program(program)
    assert compute_actions(program) == pipeline_order("zbv", 2, 3, 2)
    chunks = {(op.stage, op.chunk) for ops in program.ranks for op in ops if isinstance(op, Compute)}
    assert chunks == {(0, 0), (1, 0), (2, 1), (3, 1)}
    assert program.layout is not None and program.layout.schedule == "zbv"


def test_compute_only_program_without_a_valid_layout_keeps_none() -> None:
    """1F1B on one rank is a valid order the Layout rules refuse (pp = 1 needs 'none'): no layout."""
    program = compute_only_program("1f1b", 1, 2)
    assert program.layout is None and program.world_size == 1


def test_replaced_equals_dataclasses_replace() -> None:
    """The fast copy used per rank gives the same value as dataclasses.replace, and a new object."""
    send = Send(peer=1, bytes=8, key=P2PKey(src_stage=0, dst_stage=1, microbatch=2, direction="F"), handle="s")
    assert replaced(send, peer=5) == dataclasses.replace(send, peer=5)
    coll = Collective(kind="reduce", group="dp/pp0-tp0", bytes=4, purpose="ps-reduce", handle="h", root=0)
    copy = replaced(coll, group="dp/pp0-tp1", root=1)
    assert copy == dataclasses.replace(coll, group="dp/pp0-tp1", root=1) and copy is not coll
    assert coll.group == "dp/pp0-tp0"
