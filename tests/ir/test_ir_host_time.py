"""Compute.host_s (host issue time of a GPU op): text and JSON round trips, old lines without it, validation."""

from __future__ import annotations

import dataclasses
import re

import pytest

from simgrid.errors import ProgramError
from simgrid.ir import Compute, Program, format_op, parse_op
from simgrid.ir.jsonio import program_from_json, program_to_json
from simgrid.ir.validate import validate_program

_OPT = Compute(kind="OPT", stage=-1, microbatch=-1, chunk=0, block_start=0, block_end=4, flops=14.0,
               hbm_bytes=460.0, host_s=0.117)


def test_host_time_is_written_only_when_set_and_round_trips() -> None:
    """``host=`` appears for a nonzero host time and parses back to the same op; the default is not written."""
    text = format_op(_OPT)
    assert "host=0.117" in text
    assert parse_op(text) == _OPT
    plain = dataclasses.replace(_OPT, host_s=0.0)
    assert "host=" not in format_op(plain)


def test_a_line_written_before_the_field_loads_with_no_host_time() -> None:
    """Program files older than the field (no ``host=``) still load: host_s defaults to 0."""
    op = parse_op("OPT stage=-1 mb=-1 chunk=0 blocks=0:4 flops=14.0 hbm=460.0")
    assert isinstance(op, Compute) and op.host_s == 0.0


def test_program_json_round_trip_keeps_the_host_time() -> None:
    """A whole program with a host-bound optimizer op survives program_to_json / program_from_json."""
    program = Program(groups={}, ranks=((_OPT,),))
    back = program_from_json(program_to_json(program))
    assert back.ranks[0][0] == _OPT


@pytest.mark.parametrize(("op", "message"), [
    (dataclasses.replace(_OPT, host_s=-1.0), "host = -1.0 must be a finite number >= 0"),
    (dataclasses.replace(_OPT, device="cpu"), "host issue time is for GPU ops"),
])
def test_validation_rejects_negative_host_time_and_host_time_on_a_host_op(op: Compute, message: str) -> None:
    """Negative host time, or host time on an op that itself runs on the host, is a named validation problem."""
    with pytest.raises(ProgramError, match=re.escape(message)):
        validate_program(Program(groups={}, ranks=((op,),)))
