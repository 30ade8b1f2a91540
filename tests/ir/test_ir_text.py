"""Text form of IR ops: exact round trips for every op type and field, readable output, clear errors."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from ir_strategies import any_op, computes

from simgrid.errors import ProgramError
from simgrid.ir import (
    Alloc,
    Collective,
    Compute,
    Free,
    P2PKey,
    Recv,
    Send,
    Transfer,
    Wait,
    format_op,
    parse_op,
    stream_of,
)


@given(any_op)
def test_parse_inverts_format_for_every_op_and_field(op: object) -> None:
    """parse_op(format_op(op)) == op for random values of every field of every op type."""
    text = format_op(op)  # type: ignore[arg-type]
    assert "\n" not in text
    back = parse_op(text)
    assert back == op
    assert type(back) is type(op)


@given(computes)
def test_number_fields_keep_their_int_or_float_type(op: Compute) -> None:
    """flops/hbm written from an int come back as int, from a float as float (repr round trip)."""
    back = parse_op(format_op(op))
    assert isinstance(back, Compute)
    assert type(back.flops) is type(op.flops)
    assert type(back.hbm_bytes) is type(op.hbm_bytes)


def test_examples_read_as_documented() -> None:
    """The text form is the documented human-readable one, and omits fields left at their default."""
    f = Compute(
        kind="F", stage=1, microbatch=0, chunk=0, block_start=3, block_end=5, flops=123.0, hbm_bytes=4.5,
        gemm_mnk=(2048, 3072, 768), kernels=6,
    )
    assert format_op(f) == "F stage=1 mb=0 chunk=0 blocks=3:5 flops=123.0 hbm=4.5 gemm=2048x3072x768 kernels=6"
    s = Send(peer=1, bytes=1024, key=P2PKey(src_stage=0, dst_stage=1, microbatch=3, direction="F"), handle="sF0")
    assert format_op(s) == "SEND peer=1 bytes=1024 key=0>1:F:3 handle=sF0"
    ar = Collective(kind="all_reduce", group="tp/pp0-dp0", bytes=64, purpose="tp", handle="ar0", label="b3:fwd")
    assert format_op(ar) == "ALL_REDUCE group=tp/pp0-dp0 bytes=64 purpose=tp handle=ar0 label=b3:fwd"
    assert format_op(Wait(handle="ar0")) == "WAIT handle=ar0"
    assert format_op(Alloc(name="w", bytes=8, category="weights")) == "ALLOC name=w bytes=8 category=weights"
    assert format_op(Free(name="w")) == "FREE name=w"
    assert format_op(Transfer(direction="h2d", bytes=8, handle="p")) == "H2D bytes=8 handle=p"


def test_gemm_list_and_attention_shape_round_trip() -> None:
    """A compute op's GEMM list and fused-core shape are written compactly and read back equal."""
    f = Compute(kind="B", stage=0, microbatch=1, chunk=0, block_start=1, block_end=2, flops=2.0 * 4 * 5 * 6 * 3 + 7.0,
                hbm_bytes=0.0, attention_flops=7.0, gemms=((4, 5, 6, 3),), attention_shape=(2048, 4096, 128))
    line = format_op(f)
    assert "gemms=4x5x6x3" in line and "attnshape=2048x4096x128" in line
    assert parse_op(line) == f
    assert parse_op(format_op(dataclasses.replace(f, gemms=((4, 5, 6, 1), (1, 2, 3, 4))))).gemms == ((4, 5, 6, 1), (1, 2, 3, 4))
    with pytest.raises(ProgramError, match=r"MxNxKxCOUNT"):
        parse_op("F stage=0 mb=0 chunk=0 blocks=1:2 flops=1.0 hbm=0.0 gemms=4x5x6")


def test_accumulating_gemms_round_trip() -> None:
    """A weight-gradient op under gradient accumulation fusion: its accumulating GEMMs and main_grad width."""
    w = Compute(kind="W", stage=0, microbatch=0, chunk=0, block_start=1, block_end=2, flops=2.0 * 4 * 5 * 6,
                hbm_bytes=0.0, accumulate_gemms=((4, 5, 6, 1),), accumulate_bytes=4)
    line = format_op(w)
    assert "accgemms=4x5x6x1" in line and "acc=4" in line and " gemms=" not in line
    assert parse_op(line) == w


def test_fp8_gemm_lists_round_trip_and_are_left_out_when_empty() -> None:
    """fp8 GEMMs (Transformer Engine fp8 autocast) are written as fp8gemms= / fp8accgemms= only when the op has
    some, so program files written before them read back unchanged; a malformed list is a parse error."""
    b = Compute(kind="B", stage=0, microbatch=0, chunk=0, block_start=1, block_end=2, flops=2.0 * 4 * 5 * 6 * 3,
                hbm_bytes=0.0, gemms=((4, 5, 6, 1),), fp8_gemms=((4, 5, 6, 1),), fp8_accumulate_gemms=((4, 5, 6, 1),),
                accumulate_bytes=4)
    line = format_op(b)
    assert "fp8gemms=4x5x6x1" in line and "fp8accgemms=4x5x6x1" in line and parse_op(line) == b
    plain = dataclasses.replace(b, fp8_gemms=(), fp8_accumulate_gemms=(), accumulate_bytes=0)
    assert "fp8" not in format_op(plain)
    assert parse_op("F stage=0 mb=0 chunk=0 blocks=1:2 flops=240.0 hbm=0.0 gemms=4x5x6x1").fp8_gemms == ()
    with pytest.raises(ProgramError, match=r"fp8gemms='4x5' is not valid; expected .*MxNxKxCOUNT"):
        parse_op("F stage=0 mb=0 chunk=0 blocks=1:2 flops=1.0 hbm=0.0 fp8gemms=4x5")


def test_gemm_streams_and_userbuffers_kernel_round_trip() -> None:
    """A TE chunk GEMM in flight with two others (streams=3) and a userbuffers reduce-scatter (kernel=...);
    the defaults (1, nccl) are not written."""
    c = Compute(kind="F", stage=0, microbatch=0, chunk=0, block_start=1, block_end=2, flops=2.0 * 4 * 5 * 6,
                hbm_bytes=0.0, gemms=((4, 5, 6, 1),), gemm_streams=3)
    r = Collective(kind="reduce_scatter", group="tp0", bytes=8, purpose="tp", handle="h", kernel="userbuffers")
    assert "streams=3" in format_op(c) and parse_op(format_op(c)) == c
    assert "kernel=userbuffers" in format_op(r) and parse_op(format_op(r)) == r
    plain = dataclasses.replace(r, kernel="nccl")
    assert "kernel=" not in format_op(plain) and "streams=" not in format_op(dataclasses.replace(c, gemm_streams=1))


def test_a_grouped_transfer_round_trips_and_runs_on_its_direction_stream() -> None:
    """``grouped=true`` (an NCCL group's op) is written only when set; a grouped op has its own direction's stream
    to the peer, an ungrouped one shares ``p2p:<peer>`` with both directions."""
    key = P2PKey(src_stage=0, dst_stage=1, microbatch=2, direction="F")
    send = Send(peer=1, bytes=8, key=key, handle="s", grouped=True)
    recv = Recv(peer=1, bytes=8, key=key, handle="r", grouped=True)
    assert format_op(send) == "SEND peer=1 bytes=8 key=0>1:F:2 handle=s grouped=true"
    assert parse_op(format_op(send)) == send and parse_op(format_op(recv)) == recv
    assert (stream_of(send), stream_of(recv)) == ("p2p:1:send", "p2p:1:recv")
    plain = dataclasses.replace(send, grouped=False)
    assert "grouped" not in format_op(plain) and stream_of(plain) == stream_of(dataclasses.replace(recv, grouped=False))


def test_strings_with_spaces_are_json_quoted() -> None:
    """A label with a space is quoted so the line still splits into key=value tokens."""
    op = Collective(kind="barrier", group="world", bytes=0, purpose="sync", handle="b 0", label='say "hi"')
    text = format_op(op)
    assert text == 'BARRIER group=world bytes=0 purpose=sync handle="b 0" label="say \\"hi\\""'
    assert parse_op(text) == op


def test_whitespace_between_tokens_is_free() -> None:
    """Extra spaces and tabs between tokens do not matter when reading."""
    assert parse_op("  FREE \t name=x  ") == Free(name="x")


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ("", "empty op line"),
        ("JUMP x=1", r"unknown op 'JUMP'; expected one of F, B, I, W, R, OPT, SEND"),
        ("FREE name=a colour=red", r"unknown field 'colour' for FREE; expected name"),
        ("FREE name=a name=b", r"field 'name' given twice"),
        ("FREE", r"FREE is missing field\(s\) name"),
        ("ALLOC name=a bytes=1.5 category=weights", r"bytes='1.5' is not valid; expected an integer"),
        ("ALLOC name=a bytes=1 category=cats", r"category='cats' is not valid; expected one of weights"),
        ("SEND peer=1 bytes=1 key=0-1 handle=h", r"key='0-1' is not valid; expected SRC>DST:DIR:MB"),
        ("RECV peer=1 bytes=1 key=0>1:F:0 handle=h grouped=1", r"grouped='1' is not valid; expected true or false"),
        ("F stage=0 mb=0 chunk=0 blocks=3 flops=1 hbm=0", r"blocks='3' is not valid; expected START:END"),
        ("F stage=0 mb=0 chunk=0 blocks=0:1 flops=x hbm=0", r"flops='x' is not valid; expected a number"),
        ("WAIT handle", r"token 'handle' is not key=value"),
        ('WAIT handle="abc', r"unterminated or malformed quoted value"),
        ('WAIT handle=a"b', r"stray quote"),
        ('ALLOC name=a bytes="1" category=weights', r"field 'bytes' must be an integer, unquoted"),
    ],
)
def test_parse_errors_name_the_line_token_and_expectation(line: str, match: str) -> None:
    """Bad lines raise ProgramError quoting the line, the bad token and what was expected."""
    with pytest.raises(ProgramError, match=match):
        parse_op(line)


def test_parse_error_carries_the_location_prefix() -> None:
    """The caller's location (file, rank, op index) prefixes the message."""
    with pytest.raises(ProgramError, match=r"^f\.json: ranks\[3\]\[17\]: cannot parse op 'WAT handle=x'"):
        parse_op("WAT handle=x", "f.json: ranks[3][17]: ")


def test_format_rejects_wrongly_typed_fields() -> None:
    """An op built with a wrong field type cannot be written silently into something unreadable."""
    with pytest.raises(ProgramError, match=r"Alloc.bytes = 1.5 must be an integer"):
        format_op(Alloc(name="a", bytes=1.5, category="weights"))  # type: ignore[arg-type]
    with pytest.raises(ProgramError, match=r"unknown kind/direction 'ZAP'"):
        format_op(Compute(kind="ZAP", stage=0, microbatch=0, chunk=0, block_start=0, block_end=1,  # type: ignore[arg-type]
                          flops=0.0, hbm_bytes=0.0))


def test_an_unknown_collective_kernel_is_refused() -> None:
    """kernel= names what runs a collective: anything but nccl or userbuffers is a parse error naming both."""
    with pytest.raises(ProgramError, match=r"kernel='mpi' is not valid; expected one of nccl, userbuffers"):
        parse_op("REDUCE_SCATTER group=tp0 bytes=8 purpose=tp handle=h kernel=mpi")
