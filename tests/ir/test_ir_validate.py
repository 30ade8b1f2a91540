"""validate_program: sound programs pass; each kind of malformed program is caught and explained."""

from __future__ import annotations

import dataclasses

import pytest
from ir_programs import c, gpipe_two_stages, hybrid_tp_pp, one_f_one_b_two_stages, program, recv, send, wait

from simgrid.errors import ProgramError
from simgrid.ir import Program, format_op, parse_op, validate_program
from simgrid.ir.validate import MAX_PROBLEMS


def _replace(p: Program, rank: int, index: int, line: str | None) -> Program:
    """A copy of ``p`` with one op replaced by ``line`` (or removed when ``None``)."""
    ops = list(p.ranks[rank])
    if line is None:
        del ops[index]
    else:
        ops[index] = parse_op(line)
    ranks = list(p.ranks)
    ranks[rank] = tuple(ops)
    return dataclasses.replace(p, ranks=tuple(ranks))


@pytest.mark.parametrize("build", [gpipe_two_stages, one_f_one_b_two_stages, hybrid_tp_pp])
def test_sound_programs_pass(build: object) -> None:
    """The hand-built programs break no rule."""
    validate_program(build())  # type: ignore[operator]


def test_unmatched_send_is_reported_with_rank_index_and_text() -> None:
    """A SEND whose RECV is missing names the sender's rank, op index, op text and the missing side."""
    p = _replace(gpipe_two_stages(), 1, 3, None)  # rank 1 drops its RECV of F1 ...
    p = _replace(p, 1, 3, "WAIT handle=rF0x")  # ... and the WAIT on it now names nothing
    with pytest.raises(ProgramError) as info:
        validate_program(p)
    text = str(info.value)
    assert "rank 0 op 3 `SEND peer=1 bytes=8 key=0>1:F:1 handle=sF1`: no matching RECV on rank 1" in text
    assert "rank 1 op 3 `WAIT handle=rF0x`: waits on handle 'rF0x', which no earlier op on rank 1 issued" in text
    assert text.startswith("program failed validation with 2 problem(s):")


def test_unmatched_recv_is_reported() -> None:
    """A RECV without a SEND on its peer is reported on the receiving rank."""
    p = program([[recv(1, "1>0:B:0", "r"), wait("r")], []])
    with pytest.raises(ProgramError, match=r"rank 0 op 0 `RECV .*`: no matching SEND on rank 1 \(peer=0, key 1>0:B:0\)"):
        validate_program(p)


def test_mismatched_bytes() -> None:
    """Send and receive of one key must agree on the payload size."""
    p = _replace(gpipe_two_stages(), 1, 0, "RECV peer=0 bytes=16 key=0>1:F:0 handle=rF0")
    with pytest.raises(ProgramError, match=r"sends 8 bytes but the matching RECV on rank 1 op 0 expects 16"):
        validate_program(p)


def test_crossed_per_peer_order() -> None:
    """Two ranks that meet their transfers in different orders are reported with both ops on each side."""
    r0 = [c("F", 0, 0), send(1, "0>1:F:0", "s0"), c("F", 0, 1), send(1, "0>1:F:1", "s1"), wait("s0"), wait("s1")]
    r1 = [recv(0, "0>1:F:1", "r1"), recv(0, "0>1:F:0", "r0"), wait("r0"), c("F", 1, 0), wait("r1"), c("F", 1, 1)]
    with pytest.raises(ProgramError) as info:
        validate_program(program([r0, r1]))
    text = str(info.value)
    assert "ranks 0 and 1 meet their transfers in different orders" in text
    assert "on rank 0 op 1 `SEND peer=1 bytes=8 key=0>1:F:0 handle=s0` comes before op 3" in text
    assert "(op 0 `RECV peer=0 bytes=8 key=0>1:F:1 handle=r1` before op 1" in text


def test_crossed_order_across_directions() -> None:
    """The order rule spans both directions (they share one stream): RECV-then-SEND on both ranks crosses."""
    r0 = [recv(1, "1>0:B:0", "r"), wait("r"), send(1, "0>1:F:0", "s"), wait("s")]
    r1 = [recv(0, "0>1:F:0", "r"), wait("r"), send(0, "1>0:B:0", "s"), wait("s")]
    with pytest.raises(ProgramError, match=r"ranks 0 and 1 meet their transfers in different orders"):
        validate_program(program([r0, r1]))


def test_collective_sequence_divergence_shows_both_ranks_ops() -> None:
    """Members issuing a group's collectives with different sizes: the first divergence, both ops shown."""
    p = hybrid_tp_pp()
    p = _replace(p, 3, 7, "ALL_REDUCE group=tp/pp1-dp0 bytes=128 purpose=tp handle=arB label=bwd")
    with pytest.raises(ProgramError) as info:
        validate_program(p)
    text = str(info.value)
    assert "group 'tp/pp1-dp0': collective #1 differs between members: rank 2 op 7" in text
    assert "vs rank 3 op 7 `ALL_REDUCE group=tp/pp1-dp0 bytes=128 purpose=tp handle=arB label=bwd`" in text


def test_collective_missing_on_one_member() -> None:
    """A member that issues fewer collectives on a group is reported with the op that has no counterpart."""
    p = _replace(hybrid_tp_pp(), 1, 8, "BARRIER group=world bytes=0 purpose=sync handle=arB")
    with pytest.raises(ProgramError) as info:
        validate_program(p)
    text = str(info.value)
    assert "group 'tp/pp0-dp0': rank 0 issues 2 collectives on it but rank 1 only 1; rank 0 op 8" in text
    assert "group 'world': rank 1 issues 1 collectives on it but rank 0 only 0" in text


def test_missing_group_and_non_member() -> None:
    """Collectives on a group that does not exist, or that excludes the issuing rank, are refused."""
    p = _replace(hybrid_tp_pp(), 0, 2, "ALL_REDUCE group=tp/nowhere bytes=64 purpose=tp handle=arF")
    p = _replace(p, 2, 4, "ALL_REDUCE group=tp/pp0-dp0 bytes=64 purpose=tp handle=arF label=fwd")
    with pytest.raises(ProgramError) as info:
        validate_program(p)
    text = str(info.value)
    assert "rank 0 op 2 `ALL_REDUCE group=tp/nowhere bytes=64 purpose=tp handle=arF`: group 'tp/nowhere' is not" in text
    assert "rank 2 op 4 `ALL_REDUCE group=tp/pp0-dp0 bytes=64 purpose=tp handle=arF label=fwd`: rank 2 is not a member" in text


def test_groups_must_name_existing_ranks() -> None:
    """A group listing a rank outside the world is reported."""
    with pytest.raises(ProgramError, match=r"group 'g' lists rank\(s\) \[5\] outside the world of 2 ranks"):
        validate_program(program([[], []], {"g": (0, 5)}))


def test_root_rules() -> None:
    """broadcast/reduce need a root in the group; other kinds take none."""
    ops = [
        "BROADCAST group=g bytes=4 purpose=ps-broadcast handle=a",
        "REDUCE group=g bytes=4 purpose=ps-reduce handle=b root=3",
        "ALL_GATHER group=g bytes=4 purpose=zero-param handle=c root=0",
    ]
    with pytest.raises(ProgramError) as info:
        validate_program(program([ops], {"g": (0,)}))
    text = str(info.value)
    assert "broadcast needs a root rank" in text
    assert "root 3 is not a member of group 'g'" in text
    assert "all_gather takes no root; drop root=0" in text


def test_wait_rules() -> None:
    """WAIT on an unknown handle, on a handle issued later, and twice on one handle are all reported."""
    ops = [wait("later"), "BARRIER group=g bytes=0 purpose=sync handle=later", wait("later"), wait("later")]
    with pytest.raises(ProgramError) as info:
        validate_program(program([ops], {"g": (0,)}))
    text = str(info.value)
    assert "rank 0 op 0 `WAIT handle=later`: waits on handle 'later', which no earlier op" in text
    assert "rank 0 op 3 `WAIT handle=later`: handle 'later' was already waited on by op 2" in text


def test_duplicate_handles() -> None:
    """Handles are unique within a rank."""
    ops = ["BARRIER group=g bytes=0 purpose=sync handle=h", "BARRIER group=g bytes=0 purpose=sync handle=h"]
    with pytest.raises(ProgramError, match=r"rank 0 op 1 .*handle 'h' already used by op 0"):
        validate_program(program([ops], {"g": (0,)}))


def test_memory_rules_double_free_and_double_alloc() -> None:
    """FREE must match a live ALLOC; a live name cannot be allocated again."""
    ops = [
        "ALLOC name=a bytes=4 category=grads", "ALLOC name=a bytes=4 category=grads", "FREE name=a",
        "FREE name=a", "FREE name=ghost",
    ]  # fmt: skip
    with pytest.raises(ProgramError) as info:
        validate_program(program([ops]))
    text = str(info.value)
    assert "rank 0 op 1 `ALLOC name=a bytes=4 category=grads`: buffer 'a' is still live (allocated by op 0)" in text
    assert "rank 0 op 3 `FREE name=a`: frees 'a', which is not live on rank 0" in text
    assert "rank 0 op 4 `FREE name=ghost`: frees 'ghost'" in text


def test_compute_sanity() -> None:
    """Empty block ranges, negative or non-finite costs and indices past the model/layout are reported."""
    p = hybrid_tp_pp()  # tiny model: 6 sub-blocks, layout: 2 stages, 1 micro-batch
    bad = [
        "F stage=0 mb=0 chunk=0 blocks=3:3 flops=1.0 hbm=0.0",
        "F stage=0 mb=0 chunk=0 blocks=0:1 flops=-1.0 hbm=inf",
        "B stage=2 mb=1 chunk=0 blocks=5:7 flops=1.0 hbm=0.0",
        "F stage=0 mb=0 chunk=0 blocks=1:2 flops=1.0 hbm=0.0 attn=2.0",
        "F stage=0 mb=0 chunk=0 blocks=1:2 flops=100.0 hbm=0.0 gemms=2x2x2x1",
        "W stage=0 mb=0 chunk=0 blocks=1:2 flops=16.0 hbm=0.0 accgemms=2x2x2x1 acc=3",
        "W stage=0 mb=0 chunk=0 blocks=1:2 flops=32.0 hbm=0.0 gemms=2x2x2x1 accgemms=2x2x2x1 acc=2",
        "W stage=0 mb=0 chunk=0 blocks=1:2 flops=16.0 hbm=0.0 gemms=2x2x2x1 acc=2",
        "F stage=0 mb=0 chunk=0 blocks=1:2 flops=16.0 hbm=0.0 gemms=2x2x2x1 streams=0",
    ]
    ops = [parse_op(x.replace("hbm=inf", "hbm=0.0")) for x in bad]
    ops[1] = dataclasses.replace(ops[1], hbm_bytes=float("inf"))  # the text form refuses inf; Python does not
    ranks = [tuple(ops)] + [p.ranks[r] for r in range(1, 4)]
    with pytest.raises(ProgramError) as info:
        validate_program(dataclasses.replace(p, ranks=tuple(ranks)))
    text = str(info.value)
    assert "block range 3:3 is empty; need start < end" in text
    assert "flops = -1.0 must be a finite number >= 0" in text and "hbm = inf must be a finite number" in text
    assert "block_end = 7 is past the model's 6 sub-blocks" in text
    assert "stage 2 is past the layout's 2 stages" in text and "mb 1 is past the layout's 1 micro-batches" in text
    assert "attn = 2.0 exceeds flops = 1.0" in text
    assert "gemms add up to 16.0 FLOPs but flops - attn = 100.0" in text
    assert "acc = 3: accgemms accumulate into a 16-bit (acc=2) or fp32 (acc=4) buffer" in text
    assert "acc = 2 without accgemms" in text
    assert "streams = 0: GEMM kernels in flight together must be >= 1" in text
    assert "gemms add up to 32.0" not in text  # gemms + accgemms add up: no complaint


def test_fp8_gemm_lists() -> None:
    """fp8 GEMMs count toward the op's FLOPs with the others, fp8accgemms take acc= like accgemms, and a host
    op cannot list fp8 GEMMs."""
    p = hybrid_tp_pp()
    bad = [
        "F stage=0 mb=0 chunk=0 blocks=1:2 flops=100.0 hbm=0.0 gemms=2x2x2x1 fp8gemms=2x2x2x1",
        "W stage=0 mb=0 chunk=0 blocks=1:2 flops=16.0 hbm=0.0 fp8accgemms=2x2x2x1",
        "W stage=0 mb=0 chunk=0 blocks=1:2 flops=32.0 hbm=0.0 gemms=2x2x2x1 fp8accgemms=2x2x2x1 acc=4",
        "OPT stage=-1 mb=-1 chunk=0 blocks=0:1 flops=16.0 hbm=0.0 fp8gemms=2x2x2x1 device=cpu",
    ]
    ranks = [tuple(parse_op(x) for x in bad)] + [p.ranks[r] for r in range(1, 4)]
    with pytest.raises(ProgramError) as info:
        validate_program(dataclasses.replace(p, ranks=tuple(ranks)))
    text = str(info.value)
    assert "gemms add up to 32.0 FLOPs but flops - attn = 100.0" in text
    assert "acc = 0: accgemms accumulate into a 16-bit (acc=2) or fp32 (acc=4) buffer (fp8accgemms too)" in text
    assert "fp8gemms on a device = cpu op" in text
    assert "op 2 `W" not in text  # 16-bit + fp8 accumulating GEMMs add up, acc=4 given: sound


def test_peers_must_be_other_valid_ranks() -> None:
    """A transfer to itself or to a rank outside the world is refused."""
    ops = [send(0, "0>1:F:0", "a"), recv(7, "0>1:F:0", "b")]
    with pytest.raises(ProgramError) as info:
        validate_program(program([ops]))
    text = str(info.value)
    assert "peer is the issuing rank itself" in text
    assert "peer 7 is not a rank (world has 1 ranks)" in text


def test_problem_list_is_capped() -> None:
    """Hundreds of problems are listed up to the cap and counted after it."""
    ops = [wait(f"h{i}") for i in range(MAX_PROBLEMS + 7)]
    with pytest.raises(ProgramError) as info:
        validate_program(program([ops]))
    text = str(info.value)
    assert text.startswith(f"program failed validation with {MAX_PROBLEMS + 7} problem(s):")
    assert text.count("\n  - ") == MAX_PROBLEMS
    assert text.endswith("... and 7 more")
    assert format_op(parse_op("WAIT handle=h0")) in text
