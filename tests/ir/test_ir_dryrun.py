"""Dependency-only dry run: hand-counted timings, textbook bubbles, deadlock grids, and speed."""

from __future__ import annotations

import time
from fractions import Fraction

import pytest
from ir_programs import c, gpipe_two_stages, hybrid_tp_pp, one_f_one_b_two_stages, program, recv, send, wait

from simgrid.errors import ProgramError
from simgrid.ir import (
    Compute,
    DryRunResult,
    Program,
    action_cost,
    cost_by_kind,
    dry_run,
    unit_cost,
    validate_program,
)


def _compute_spans(p: Program, r: DryRunResult, rank: int) -> list[tuple[str, float, float]]:
    return [
        (f"{op.stage}{op.kind}{op.microbatch}", r.starts[rank][i], r.ends[rank][i])
        for i, op in enumerate(p.ranks[rank])
        if isinstance(op, Compute)
    ]


def test_two_stage_gpipe_matches_hand_count() -> None:
    """GPipe p=2, m=2, unit costs: the hand-counted timeline of ir_programs.gpipe_two_stages."""
    p = gpipe_two_stages()
    r = dry_run(p)
    assert _compute_spans(p, r, 0) == [("0F0", 0, 1), ("0F1", 1, 2), ("0B0", 4, 5), ("0B1", 5, 6)]
    assert _compute_spans(p, r, 1) == [("1F0", 1, 2), ("1F1", 2, 3), ("1B0", 3, 4), ("1B1", 4, 5)]
    assert r.makespan == 6
    assert r.busy == (4, 4) and r.idle == (2, 2)
    assert r.bubble_fraction == pytest.approx(1 / 3)


def test_two_stage_1f1b_matches_hand_count() -> None:
    """1F1B p=2, m=3, unit costs: the hand-counted timeline of ir_programs.one_f_one_b_two_stages."""
    p = one_f_one_b_two_stages()
    r = dry_run(p)
    assert _compute_spans(p, r, 0) == [
        ("0F0", 0, 1), ("0F1", 1, 2), ("0B0", 3, 4), ("0F2", 4, 5), ("0B1", 5, 6), ("0B2", 7, 8),
    ]  # fmt: skip
    assert _compute_spans(p, r, 1) == [
        ("1F0", 1, 2), ("1B0", 2, 3), ("1F1", 3, 4), ("1B1", 4, 5), ("1F2", 5, 6), ("1B2", 6, 7),
    ]  # fmt: skip
    assert r.makespan == 8
    assert r.bubble_fraction == pytest.approx(1 / 4)


def test_send_and_recv_complete_together_at_the_later_side() -> None:
    """Rendezvous: the SEND (ready at 1) and RECV (ready at 2, after its rank's compute) both end at 2."""
    p = gpipe_two_stages()
    r = dry_run(p)
    send_f1, recv_f1 = 3, 3  # rank 0 op 3 sends F1, rank 1 op 3 receives it
    assert r.ends[0][send_f1] == r.ends[1][recv_f1] == 2


def _gpipe(p: int, m: int) -> Program:
    """GPipe over p ranks: forwards, then backwards, receives right before use, send waits at the end."""
    ranks = []
    for s in range(p):
        ops: list[str] = []
        sends: list[str] = []
        for mb in range(m):
            if s > 0:
                ops += [recv(s - 1, f"{s - 1}>{s}:F:{mb}", f"rF{mb}"), wait(f"rF{mb}")]
            ops.append(c("F", s, mb))
            if s < p - 1:
                ops.append(send(s + 1, f"{s}>{s + 1}:F:{mb}", f"sF{mb}"))
                sends.append(f"sF{mb}")
        for mb in range(m):
            if s < p - 1:
                ops += [recv(s + 1, f"{s + 1}>{s}:B:{mb}", f"rB{mb}"), wait(f"rB{mb}")]
            ops.append(c("B", s, mb))
            if s > 0:
                ops.append(send(s - 1, f"{s}>{s - 1}:B:{mb}", f"sB{mb}"))
                sends.append(f"sB{mb}")
        ranks.append(ops + [wait(h) for h in sends])
    return program(ranks)


@pytest.mark.parametrize(("p", "m"), [(2, 1), (3, 4), (4, 8), (8, 3)])
@pytest.mark.parametrize("backward_units", [1, 2])
def test_gpipe_bubble_is_textbook(p: int, m: int, backward_units: int) -> None:
    """Unit-time GPipe idles (p-1)/(m+p-1) of the time (Huang et al. 2019), with B = F or B = 2F."""
    prog = _gpipe(p, m)
    validate_program(prog)
    r = dry_run(prog, cost_by_kind({"F": 1, "B": backward_units}))
    assert r.makespan == (1 + backward_units) * (m + p - 1)
    idle = Fraction(sum(r.idle)) / (p * Fraction(r.makespan))
    assert idle == Fraction(p - 1, m + p - 1)


def test_action_cost_spreads_one_unit_over_an_actions_layer_ops() -> None:
    """action_cost gives a whole action units[kind], split evenly over its distinct block ranges."""
    f = "F stage=0 mb=0 chunk=0 blocks={} flops=1.0 hbm=0.0"
    ops = [f.format("0:1"), f.format("1:2"), f.format("2:4"), "R stage=0 mb=0 chunk=0 blocks=0:4 flops=1.0 hbm=0.0",
           "B stage=0 mb=0 chunk=0 blocks=0:4 flops=1.0 hbm=0.0"]  # fmt: skip
    p = program([ops, ops])  # a second (e.g. tensor-parallel) copy does not change the split
    cost = action_cost(p, {"F": 1, "B": 2})
    assert [cost(op) for op in p.ranks[0]] == [pytest.approx(1 / 3)] * 3 + [0.0, 2.0]
    assert dry_run(p, cost).makespan == pytest.approx(3)


def test_collective_completes_when_the_last_member_is_ready() -> None:
    """An all-reduce ends when the slowest member reaches it; a WAIT holds the faster rank until then."""
    ar = "ALL_REDUCE group=g bytes=8 purpose=dp-grad handle=ar"
    p = program([[c("F", 0, 0), c("F", 0, 1), c("F", 0, 2), ar, wait("ar")], [c("F", 0, 0), ar, wait("ar"), c("B", 0, 0)]],
                {"g": (0, 1)})  # fmt: skip
    r = dry_run(p)
    assert r.ends[0][3] == r.ends[1][1] == 3
    assert r.starts[1][3] == 3  # rank 1's B waited for the all-reduce
    assert r.makespan == 4


def test_comm_costs_and_stream_order() -> None:
    """With comm costs, ops on one stream run back to back; a later compute op waits only via WAIT."""
    ar1 = "ALL_REDUCE group=g bytes=8 purpose=tp handle=a"
    ar2 = "ALL_REDUCE group=g bytes=8 purpose=tp handle=b"
    p = program([[c("F", 0, 0), ar1, ar2, c("F", 0, 1), wait("b"), c("B", 0, 0)]], {"g": (0,)})

    def cost(op: object) -> float:
        return 1.0 if isinstance(op, Compute) else 5.0

    r = dry_run(p, cost)
    assert (r.starts[0][1], r.ends[0][1]) == (1, 6)
    assert (r.starts[0][2], r.ends[0][2]) == (6, 11)  # same stream: after the first all-reduce
    assert (r.starts[0][3], r.ends[0][3]) == (1, 2)  # compute overlaps the communication
    assert (r.starts[0][5], r.ends[0][5]) == (11, 12)
    assert r.busy == (3,)


def test_offloaded_optimizer_uses_host_stream_and_transfers() -> None:
    """D2H, CPU optimizer step and H2D chain through waits; the host step does not count as GPU busy."""
    ops = [
        c("B", 0, 0), "D2H bytes=8 handle=down label=grads", wait("down"),
        "OPT stage=-1 mb=-1 chunk=0 blocks=0:1 flops=1.0 hbm=0.0 device=cpu",
        "H2D bytes=8 handle=up label=params", wait("up"),
    ]  # fmt: skip

    def cost(op: object) -> float:
        return 2.0 if not isinstance(op, Compute) and "Transfer" in type(op).__name__ else unit_cost(op)  # type: ignore[arg-type]

    r = dry_run(program([ops]), cost)
    assert [r.ends[0][i] for i in range(6)] == [1, 3, 3, 4, 6, 6]
    assert r.busy == (1,) and r.makespan == 6


def test_hybrid_program_runs() -> None:
    """Tensor-parallel all-reduces and pipeline transfers together: 2 stages of F then B, 4 time units."""
    r = dry_run(hybrid_tp_pp())
    assert r.makespan == 4
    assert r.bubble_fraction == pytest.approx(0.5)


# -- deadlocks ---------------------------------------------------------------------------------------
def test_recv_first_on_both_ranks_deadlocks_with_grid() -> None:
    """Both ranks RECV, WAIT, then SEND: no progress; the grid marks each WAIT with >> and its RECV with *."""
    r0 = [c("F", 0, 0), recv(1, "1>0:B:0", "r"), wait("r"), send(1, "0>1:F:0", "s"), wait("s")]
    r1 = [c("F", 1, 0), recv(0, "0>1:F:0", "r"), wait("r"), send(0, "1>0:B:0", "s"), wait("s")]
    with pytest.raises(ProgramError) as info:
        dry_run(program([r0, r1]))
    text = str(info.value)
    assert text.startswith("dry run: deadlock: no rank can make progress; 2 of 2 rank(s) are stuck")
    assert (
        "rank 0 is stuck at op 2 `WAIT handle=r`, waiting for op 1 `RECV peer=1 bytes=8 key=1>0:B:0 handle=r`: "
        "rank 1 has not issued the matching SEND (it is stuck at op 2)"
    ) in text
    grid = text[text.index("step x rank grid") :].splitlines()
    assert grid[1].split() == ["rank", "0", "rank", "1"]
    assert grid[2].split() == ["step", "0", "0F0[0:1]", "1F0[1:2]"]
    assert grid[3].split() == ["step", "1", "*", "RECV<1", "1>0:B:0", "*", "RECV<0", "0>1:F:0"]
    assert grid[4].split() == ["step", "2", ">>", "WAIT", "r", ">>", "WAIT", "r"]


def test_collective_deadlock_names_missing_members() -> None:
    """Rank 0 waits in an all-reduce that rank 1 only reaches after a receive rank 0 never sends."""
    ar = "ALL_REDUCE group=g bytes=8 purpose=dp-grad handle=ar"
    r0 = [ar, wait("ar"), send(1, "0>1:F:0", "s"), wait("s")]
    r1 = [recv(0, "0>1:F:0", "r"), wait("r"), ar, wait("ar")]
    with pytest.raises(ProgramError) as info:
        dry_run(program([r0, r1], {"g": (0, 1)}))
    text = str(info.value)
    assert "collective #0 on group 'g' still needs rank(s) 1 to reach it" in text
    assert "rank 0 has not issued the matching SEND (it is stuck at op 1)" in text


def test_queued_behind_explains_stream_order() -> None:
    """A crossed per-peer order deadlocks; the report says which op the stuck one is queued behind."""
    r0 = [send(1, "0>1:F:0", "s0"), send(1, "0>1:F:1", "s1"), wait("s0"), wait("s1")]
    r1 = [recv(0, "0>1:F:1", "r1"), recv(0, "0>1:F:0", "r0"), wait("r0"), wait("r1")]
    with pytest.raises(ProgramError) as info:
        dry_run(program([r0, r1]))
    text = str(info.value)
    assert "rank 1 is stuck at op 2 `WAIT handle=r0`" in text
    assert "it is queued on stream p2p:0 behind op 0 `RECV peer=0 bytes=8 key=0>1:F:1 handle=r1`" in text


def test_unmatched_transfer_without_wait_is_reported() -> None:
    """All ranks finish issuing, but a SEND nobody receives never completes: reported, not ignored."""
    with pytest.raises(ProgramError) as info:
        dry_run(program([[send(1, "0>1:F:0", "s")], [c("F", 1, 0)]]))
    text = str(info.value)
    assert "every rank issued all its ops but 1 communication op(s) never complete" in text
    assert "rank 0 op 0 `SEND peer=1 bytes=8 key=0>1:F:0 handle=s`: rank 1 has not issued the matching RECV" in text
    assert " * SEND>1 0>1:F:0" in text


def test_big_deadlock_grid_is_truncated() -> None:
    """A 20-rank ring deadlock after 500 compute ops: 8 ranks (the stuck ones and their partners), the rows
    around the marks, and 16 explanations."""
    world = 20
    ranks = []
    for r in range(world):
        prev, nxt = (r - 1) % world, (r + 1) % world
        ranks.append(
            [c("F", 0, i) for i in range(500)]
            + [recv(prev, f"{prev}>{r}:F:0", "r"), wait("r"), send(nxt, f"{r}>{nxt}:F:0", "s"), wait("s")]
        )
    with pytest.raises(ProgramError) as info:
        dry_run(program(ranks))
    text = str(info.value)
    grid = text[text.index("step x rank grid") :].splitlines()
    assert "showing ranks 0, 1, 2, 3, 4, 5, 6, 19 of 20" in grid[0]  # rank 0 waits on rank 19
    assert [row.split()[:2] for row in grid[2:9]] == [
        ["..."], ["step", "497"], ["step", "498"], ["step", "499"], ["step", "500"], ["step", "501"], ["step", "502"],
    ]  # fmt: skip
    assert grid[6].split()[:4] == ["step", "500", "*", "RECV<19"]  # ops 0-499 are the 500 forwards
    assert grid[7].split()[:4] == ["step", "501", ">>", "WAIT"]
    assert grid[9].strip() == "..."
    assert "  ... and 4 more stuck rank(s)" in text
    assert len(text.splitlines()) < 40


def test_dry_run_handles_a_hundred_thousand_ops_quickly() -> None:
    """GPipe over 8 ranks with 64 micro-batches split into 100 layer ops each (~1.1e5 ops) runs in seconds."""
    p, m, layers = 8, 64, 100
    base = _gpipe(p, m)
    ranks = []
    for ops in base.ranks:
        expanded = []
        for op in ops:
            expanded += [op] * layers if isinstance(op, Compute) else [op]
        ranks.append(expanded)
    prog = Program(ranks=ranks)
    assert prog.num_ops > 100_000
    began = time.perf_counter()
    r = dry_run(prog)
    elapsed = time.perf_counter() - began
    assert r.makespan == 2 * layers * (m + p - 1)
    assert elapsed < 5.0, f"dry run of {prog.num_ops} ops took {elapsed:.2f} s"
