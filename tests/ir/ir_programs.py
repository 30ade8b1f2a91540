"""Hand-built programs shared by the IR tests, written in the op text form so they read like a listing.

Each builder documents the hand count its tests rely on; nothing here calls the schedule generators.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from simgrid.ir import Program, parse_op
from simgrid.layout.spec import Layout
from simgrid.model.spec import ModelSpec


def c(kind: str, stage: int, mb: int) -> str:
    """A unit compute op of one sub-block (stage s covers block s)."""
    return f"{kind} stage={stage} mb={mb} chunk=0 blocks={stage}:{stage + 1} flops=1.0 hbm=0.0"


def send(peer: int, key: str, handle: str) -> str:
    """A SEND of 8 bytes."""
    return f"SEND peer={peer} bytes=8 key={key} handle={handle}"


def recv(peer: int, key: str, handle: str) -> str:
    """A RECV of 8 bytes."""
    return f"RECV peer={peer} bytes=8 key={key} handle={handle}"


def wait(handle: str) -> str:
    """A WAIT."""
    return f"WAIT handle={handle}"


def program(
    ranks: Sequence[Sequence[str]],
    groups: Mapping[str, tuple[int, ...]] | None = None,
    **kwargs: object,
) -> Program:
    """A program from per-rank op text lines."""
    return Program(ranks=[[parse_op(line) for line in lines] for lines in ranks], groups=groups or {}, **kwargs)  # type: ignore[arg-type]


def gpipe_two_stages() -> Program:
    """GPipe, p = 2 stages, m = 2 micro-batches, unit F and B.

    Hand count: rank 0 F0 0-1, F1 1-2; rank 1 F0 1-2, F1 2-3, B0 3-4, B1 4-5; rank 0 B0 4-5, B1 5-6.
    Makespan 6 = 2 (m + p - 1); each rank busy 4, idle 2: bubble 1/3 = (p-1)/(m+p-1).
    """
    r0 = [
        c("F", 0, 0), send(1, "0>1:F:0", "sF0"),
        c("F", 0, 1), send(1, "0>1:F:1", "sF1"),
        recv(1, "1>0:B:0", "rB0"), wait("rB0"), c("B", 0, 0),
        recv(1, "1>0:B:1", "rB1"), wait("rB1"), c("B", 0, 1),
        wait("sF0"), wait("sF1"),
    ]  # fmt: skip
    r1 = [
        recv(0, "0>1:F:0", "rF0"), wait("rF0"), c("F", 1, 0),
        recv(0, "0>1:F:1", "rF1"), wait("rF1"), c("F", 1, 1),
        c("B", 1, 0), send(0, "1>0:B:0", "sB0"),
        c("B", 1, 1), send(0, "1>0:B:1", "sB1"),
        wait("sB0"), wait("sB1"),
    ]  # fmt: skip
    return program([r0, r1], meta={"schedule": "gpipe", "generator": "tests/ir/ir_programs.py"})


def one_f_one_b_two_stages() -> Program:
    """1F1B, p = 2, m = 3, unit F and B; rank 1 posts RECV F(k+1) before its B(k) so both ranks meet
    their transfers in the same order (SF0 SF1 RB0 SF2 RB1 RB2 on rank 0).

    Hand count: rank 0 F0 0-1, F1 1-2, B0 3-4, F2 4-5, B1 5-6, B2 7-8;
    rank 1 F0 1-2, B0 2-3, F1 3-4, B1 4-5, F2 5-6, B2 6-7. Makespan 8 = 2 (m + p - 1); bubble 2/8.
    """
    r0 = [
        c("F", 0, 0), send(1, "0>1:F:0", "sF0"),
        c("F", 0, 1), send(1, "0>1:F:1", "sF1"),
        recv(1, "1>0:B:0", "rB0"), wait("rB0"), c("B", 0, 0),
        c("F", 0, 2), send(1, "0>1:F:2", "sF2"),
        recv(1, "1>0:B:1", "rB1"), wait("rB1"), c("B", 0, 1),
        recv(1, "1>0:B:2", "rB2"), wait("rB2"), c("B", 0, 2),
        wait("sF0"), wait("sF1"), wait("sF2"),
    ]  # fmt: skip
    r1 = [
        recv(0, "0>1:F:0", "rF0"), wait("rF0"), c("F", 1, 0),
        recv(0, "0>1:F:1", "rF1"), c("B", 1, 0), send(0, "1>0:B:0", "sB0"),
        wait("rF1"), c("F", 1, 1),
        recv(0, "0>1:F:2", "rF2"), c("B", 1, 1), send(0, "1>0:B:1", "sB1"),
        wait("rF2"), c("F", 1, 2),
        c("B", 1, 2), send(0, "1>0:B:2", "sB2"),
        wait("sB0"), wait("sB1"), wait("sB2"),
    ]  # fmt: skip
    return program([r0, r1], meta={"schedule": "1f1b"})


TINY_MODEL = ModelSpec(name="tiny", num_layers=2, hidden_size=8, num_heads=2, vocab_size=16, seq_length=4)
"""A model small enough to write programs for by hand (6 sub-blocks)."""


def hybrid_tp_pp() -> Program:
    """pp = 2, tp = 2, dp = 1, m = 1, with a tensor-parallel all-reduce per forward and backward.

    Ranks (tp fastest): 0 = (pp0, tp0), 1 = (pp0, tp1), 2 = (pp1, tp0), 3 = (pp1, tp1). Each tp rank sends
    to the tp rank of the same index on the next stage. Layer blocks: stage 0 owns blocks 0:3, stage 1 3:6.
    """
    layout = Layout(pp=2, tp=2, micro_batch_size=1, global_batch_size=1, schedule="gpipe")
    from simgrid.layout.mesh import Mesh

    groups = Mesh(layout).groups()
    lines: list[list[str]] = []
    for rank in range(4):
        pp = rank // 2
        group = f"tp/pp{pp}-dp0"
        blocks = "0:3" if pp == 0 else "3:6"
        fwd = f"F stage={pp} mb=0 chunk=0 blocks={blocks} flops=2.0 hbm=1.0 gemm=4x8x8 kernels=3"
        bwd = f"B stage={pp} mb=0 chunk=0 blocks={blocks} flops=4.0 hbm=2.0"
        ar_f = f"ALL_REDUCE group={group} bytes=64 purpose=tp handle=arF label=fwd"
        ar_b = f"ALL_REDUCE group={group} bytes=64 purpose=tp handle=arB label=bwd"
        peer = rank + 2 if pp == 0 else rank - 2
        if pp == 0:
            ops = [
                "ALLOC name=act bytes=32 category=activations", fwd, ar_f, wait("arF"),
                send(peer, "0>1:F:0", "sF"), recv(peer, "1>0:B:0", "rB"), wait("rB"),
                bwd, ar_b, wait("arB"), "FREE name=act", wait("sF"),
            ]  # fmt: skip
        else:
            ops = [
                recv(peer, "0>1:F:0", "rF"), wait("rF"), "ALLOC name=act bytes=32 category=activations",
                fwd, ar_f, wait("arF"), bwd, ar_b, wait("arB"), "FREE name=act",
                send(peer, "1>0:B:0", "sB"), wait("sB"),
            ]  # fmt: skip
        lines.append(ops)
    return program(lines, groups, model=TINY_MODEL, layout=layout, meta={"schedule": "gpipe", "mb": 1})
