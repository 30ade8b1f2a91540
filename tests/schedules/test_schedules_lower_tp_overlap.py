"""TE tensor-parallel overlap pass: GEMM chunks, ring-exchange steps, pipelined and bulk collectives, and the
totals (FLOPs, bytes) the chunking must keep."""

from __future__ import annotations

import pytest
from schedule_helpers import TINY, context, flat

from simgrid.ir.dryrun import dry_run
from simgrid.ir.ops import Collective, Compute, Op, Wait
from simgrid.ir.validate import validate_program
from simgrid.layout.spec import Layout
from simgrid.schedules import build_program
from simgrid.schedules.lower.compute import add_recompute, compute_steps
from simgrid.schedules.lower.tensor_parallel import add_tensor_parallel
from simgrid.schedules.lower.tp_overlap import PIPELINE_SPLITS, _split, add_overlapped_tensor_parallel

SP = {"sequence_parallel": True}


def _role(granularity: str = "block", overlap: bool = True, **layout: object) -> list[Op]:
    ctx = context(granularity, **SP, tp_comm_overlap=overlap, **layout)  # type: ignore[arg-type]
    role = add_recompute(ctx, compute_steps(ctx, 0))
    return flat((add_overlapped_tensor_parallel if overlap else add_tensor_parallel)(ctx, role, 0))


def _between(ops: list[Op], kind: str, block: int, microbatch: int = 0) -> list[Op]:
    """The ops of the compute op (kind, block, micro-batch) at block granularity: its chunks and the
    collectives and waits whose handles name it, from the first to the last."""
    tag = f":m{microbatch}:{kind}:b{block}:"

    def mine(o: Op) -> bool:
        if isinstance(o, Compute):
            return o.kind == kind and o.block_start == block and o.microbatch == microbatch
        return isinstance(o, (Collective, Wait)) and o.handle.startswith("tp:") and tag in o.handle

    idx = [i for i, o in enumerate(ops) if mine(o)]
    return [o for o in ops[idx[0]:idx[-1] + 1] if mine(o)]


def _totals(ops: list[Op], kind: str) -> tuple[float, float, dict[str, float]]:
    comp = [o for o in ops if isinstance(o, Compute) and o.kind == kind and o.microbatch == 0]
    colls: dict[str, float] = {}
    for o in ops:
        if isinstance(o, Collective) and o.purpose == "tp" and f":m0:{kind}:" in o.handle:
            colls[o.kind] = colls.get(o.kind, 0.0) + o.bytes
    return sum(o.flops for o in comp), sum(o.hbm_bytes for o in comp), colls


def test_split_is_contiguous_and_exact() -> None:
    """Chunks add up to the rows, differ by at most one, and empty chunks are dropped."""
    assert _split(4096, 8) == [512] * 8
    assert _split(10, 4) == [3, 3, 2, 2]
    assert _split(2, 4) == [1, 1]


def test_attention_forward_is_a_ring_gathered_qkv_then_a_pipelined_projection() -> None:
    """TE's defaults (initialize_ub): qkv_fprop ring exchange in tp chunks, tp - 1 steps each waited before
    the next chunk; proj_fprop pipelined in 4 chunks, each followed by its reduce-scatter, waited at the end."""
    tp = 2
    ops = _between(_role(tp=tp), "F", 1)
    kinds = [type(o).__name__ if not isinstance(o, Collective) else o.kind for o in ops]
    assert kinds[:4] == ["ring_exchange", "Compute", "Wait", "Compute"]
    rs = [o for o in ops if isinstance(o, Collective) and o.kind == "reduce_scatter"]
    assert len(rs) == PIPELINE_SPLITS
    assert kinds[-PIPELINE_SPLITS:] == ["Wait"] * PIPELINE_SPLITS
    tokens = TINY.seq_length  # micro-batch 1
    chunks = [o for o in ops if isinstance(o, Compute) and o.gemms and o.gemms[0][0] == tokens // tp]
    assert len(chunks) == tp  # the QKV GEMM in tp chunks of tokens / tp rows
    ring = [o for o in ops if isinstance(o, Collective) and o.kind == "ring_exchange"]
    activation = tokens * TINY.hidden_size * 2  # bf16 b s h
    assert [o.bytes for o in ring] == [activation // tp] * (tp - 1)
    assert sum(o.bytes for o in rs) == activation


def test_backward_has_ring_gather_then_bulk_gather_and_bulk_scatter() -> None:
    """B of a transformer sub-block: output-grad ring exchange beside the first input-gradient GEMM, then the
    input re-gather beside the last input-gradient GEMM and the input-gradient reduce-scatter beside the
    last weight-gradient GEMM (TE's bulk qkv_dgrad / qkv_wgrad)."""
    ops = _between(_role(tp=4), "B", 2)
    colls = [o.kind for o in ops if isinstance(o, Collective)]
    assert colls == ["ring_exchange"] * 3 + ["all_gather", "reduce_scatter"]
    tail = ops[-6:]
    assert isinstance(tail[0], Collective) and tail[0].kind == "all_gather"
    assert isinstance(tail[1], Compute) and isinstance(tail[2], Wait)
    assert isinstance(tail[3], Collective) and tail[3].kind == "reduce_scatter"
    assert isinstance(tail[4], Compute) and isinstance(tail[5], Wait)


@pytest.mark.parametrize("kind", ["F", "B"])
@pytest.mark.parametrize("granularity", ["block", "stage"])
def test_overlap_keeps_flops_bytes_and_the_data_moved(kind: str, granularity: str) -> None:
    """Chunking moves work around, never adds or drops it: a step's FLOPs and memory bytes are those without
    overlap; the reduce-scatters and re-gathers move the same bytes; the ring exchange moves (tp-1)/tp of
    the all-gathered tensor per rank, which is what a ring all-gather of it moves."""
    tp = 4
    plain = _totals(_role(granularity, overlap=False, tp=tp), kind)
    over = _totals(_role(granularity, overlap=True, tp=tp), kind)
    assert over[0] == pytest.approx(plain[0])
    assert over[1] == pytest.approx(plain[1])
    gathered = over[2].get("ring_exchange", 0.0) * tp / (tp - 1) + over[2].get("all_gather", 0.0)
    assert gathered == pytest.approx(plain[2]["all_gather"])
    assert over[2]["reduce_scatter"] == pytest.approx(plain[2]["reduce_scatter"])


def test_stage_granularity_folds_layers_into_counts() -> None:
    """At stage granularity one chunk op stands for the same chunk of every layer (GEMM count = layers) and
    each ring step's collective has count = layers."""
    ops = _role("stage", tp=2)
    ring = [o for o in ops if isinstance(o, Collective) and o.kind == "ring_exchange"]
    assert ring and all(o.count == TINY.num_layers for o in ring)
    chunks = [o for o in ops if isinstance(o, Compute) and o.kind == "F" and o.gemms and len(o.gemms) == 1
              and o.hbm_bytes == 0]
    assert chunks and all(o.gemms[0][3] == TINY.num_layers for o in chunks)


def test_embedding_and_head_keep_their_plain_collectives() -> None:
    """Only TE's layers overlap: the embedding's and the head's collectives stay issued and waited whole."""
    ops = _role(tp=2)
    embed = _between(ops, "F", 0)
    assert [o.kind for o in embed if isinstance(o, Collective)] == ["reduce_scatter"]
    head = 2 * TINY.num_layers + 1
    assert all(o.kind != "ring_exchange" for o in _between(ops, "F", head) if isinstance(o, Collective))


def test_split_backward_overlaps_the_gathers_and_exposes_the_scatter() -> None:
    """I (zero-bubble split) has no weight-gradient GEMM to hide the input-gradient reduce-scatter: it is
    issued and waited at once; W gets no collectives."""
    ops = _role(tp=2, pp=2, schedule="zb-h1", global_batch_size=4)
    i_ops = _between(ops, "I", next(o for o in ops if isinstance(o, Compute) and o.kind == "I").block_start)
    assert isinstance(i_ops[-2], Collective) and i_ops[-2].kind == "reduce_scatter" and isinstance(i_ops[-1], Wait)
    assert all(not isinstance(o, Collective) for o in _between(ops, "W", 3))


@pytest.mark.parametrize(
    ("granularity", "layout"),
    [
        ("block", {"tp": 2}),
        ("stage", {"tp": 4, "pp": 2, "global_batch_size": 4}),
        ("block", {"tp": 2, "recompute": "full"}),
        ("block", {"tp": 2, "recompute": "selective"}),
        ("block", {"tp": 2, "pp": 2, "schedule": "zb-h1", "global_batch_size": 4}),
        ("block", {"tp": 2, "cp": 2}),
        ("stage", {"tp": 2, "dp": 2, "zero": 1}),
    ],
)
def test_programs_with_overlap_validate_and_run_dry(granularity: str, layout: dict[str, object]) -> None:
    """Whole programs with the overlap pass: every collective matched over its group, no deadlock."""
    program = build_program(TINY, Layout(**SP, tp_comm_overlap=True, **layout),  # type: ignore[arg-type]
                            granularity=granularity)  # type: ignore[arg-type]
    validate_program(program)
    dry_run(program)
    assert any(isinstance(o, Collective) and o.kind == "ring_exchange" for o in program.ranks[0])
