"""TE tensor-parallel overlap pass: GEMM chunks, ring-exchange steps, pipelined and bulk collectives, and the
totals (FLOPs, bytes) the chunking must keep."""

from __future__ import annotations

import pytest
from schedule_helpers import TINY, context, flat, tp_ops_of

from simgrid.ir.dryrun import dry_run
from simgrid.ir.ops import Alloc, Collective, Compute, Op, Wait
from simgrid.ir.validate import validate_program
from simgrid.layout.mesh import Mesh
from simgrid.layout.spec import Layout
from simgrid.model import get_model
from simgrid.schedules import build_program
from simgrid.schedules.lower import tp_async
from simgrid.schedules.lower.compute import add_recompute, compute_steps
from simgrid.schedules.lower.instantiate import MicrobatchTemplate
from simgrid.schedules.lower.tensor_parallel import add_tensor_parallel, tp_collectives
from simgrid.schedules.lower.tp_async import add_te_overlapped_tensor_parallel, te_overlapped_ops
from simgrid.schedules.lower.tp_overlap import (
    PIPELINE_SPLITS,
    UB_STREAMS,
    _split,
)

SP = {"sequence_parallel": True}


def _role(granularity: str = "block", overlap: bool = True, **layout: object) -> list[Op]:
    ctx = context(granularity, **SP, tp_comm_overlap=overlap, **layout)  # type: ignore[arg-type]
    role = add_recompute(ctx, compute_steps(ctx, 0))
    return flat((add_te_overlapped_tensor_parallel if overlap else add_tensor_parallel)(ctx, role, 0))


_between = tp_ops_of


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


_STAMPED_LAYOUTS = [
    ("block", None, {"tp": 2, "pp": 2, "global_batch_size": 8}),
    ("stage", None, {"tp": 4, "pp": 2, "global_batch_size": 8, "recompute": "full"}),
    ("block", None, {"tp": 2, "pp": 2, "schedule": "zb-h1", "global_batch_size": 8}),
    ("block", None, {"tp": 2, "pp": 2, "vpp": 2, "schedule": "interleaved-1f1b", "global_batch_size": 16}),
    ("block", "tiny-moe", {"tp": 2, "pp": 2, "global_batch_size": 8}),
]


@pytest.mark.parametrize(("granularity", "model", "layout"), _STAMPED_LAYOUTS)
def test_stamped_ops_equal_ops_built_for_each_microbatch(
    granularity: str, model: str | None, layout: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pass builds each (kind, stage, chunk, block range) once and stamps it for the other micro-batches;
    every pipeline rank's ops equal those of building each compute op on its own (te_overlapped_ops per op,
    tp_collectives around the ones that do not overlap), and far fewer ops are built than stamped."""
    ctx = context(granularity, get_model(model) if model else None, **SP, tp_comm_overlap=True, **layout)
    built: list[Compute] = []

    def counted(c: object, op: Compute, group: str) -> list[Op] | None:
        built.append(op)
        return te_overlapped_ops(c, op, group)  # type: ignore[arg-type]

    monkeypatch.setattr(tp_async, "te_overlapped_ops", counted)
    for pp_rank in range(ctx.layout.pp):
        group = Mesh.tp_group_name(ctx.coord(pp_rank))
        expected: list[Op] = []
        for op in flat(add_recompute(ctx, compute_steps(ctx, pp_rank))):
            whole = te_overlapped_ops(ctx, op, group) if isinstance(op, Compute) else [op]
            if whole is None:
                before, after = tp_collectives(ctx, op, group)  # type: ignore[arg-type]
                whole = [*before, op, *after]
            expected += whole
        built.clear()
        role = add_te_overlapped_tensor_parallel(ctx, add_recompute(ctx, compute_steps(ctx, pp_rank)), pp_rank)
        got = flat(role)
        assert got == expected
        assert [type(o) for o in got] == [type(o) for o in expected]
        microbatches = {o.microbatch for o in got if isinstance(o, Compute)}
        assert len(microbatches) == ctx.layout.num_microbatches
        assert 0 < len(built) <= len(got) / len(microbatches)


@pytest.mark.parametrize(
    "layout",
    [
        {"pp": 2, "dp": 2, "global_batch_size": 8, "zero": 1, "recompute": "full"},
        {"pp": 2, "vpp": 2, "schedule": "zbv", "global_batch_size": 8},
        {"pp": 2, "vpp": 2, "schedule": "dualpipev", "global_batch_size": 8},
        {"pp": 2, "vpp": 2, "schedule": "interleaved-zb", "global_batch_size": 8},
        {"cp": 2, "global_batch_size": 4},
    ],
)
def test_whole_programs_equal_with_and_without_templates(
    layout: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An independent route through the whole build: with templates refused (every micro-batch's ops built
    as before the templates existed) the program of every rank is the same, for 1F1B with ZeRO-1 and full
    recompute, the V schedules, a split-backward interleaved schedule and context parallelism."""
    lay = Layout(sequence_parallel=True, tp_comm_overlap=True, tp=2, **layout)  # type: ignore[arg-type]
    stamped = build_program(TINY, lay, granularity="block")
    monkeypatch.setattr(MicrobatchTemplate, "of", classmethod(lambda cls, ops, microbatch: None))
    rebuilt = build_program(TINY, lay, granularity="block")
    assert stamped.world_size == rebuilt.world_size == lay.world_size
    for rank in range(stamped.world_size):
        assert stamped.ops(rank) == rebuilt.ops(rank)


def test_template_patches_microbatch_and_the_handle_part_naming_it() -> None:
    """Stamping micro-batch 12 from a template of micro-batch 10: the compute op's micro-batch and the
    ``:m10:`` of each handle change, nothing else (hand-written expected handles)."""
    comp = Compute(kind="F", stage=1, microbatch=10, chunk=0, block_start=3, block_end=4, flops=8.0,
                   hbm_bytes=2.0, gemms=((4, 4, 4, 1),))
    coll = Collective(kind="ring_exchange", group="tp-g", bytes=64, purpose="tp", handle="tp:s1:m10:F:b3:attn3:0",
                      count=2, label="b3:fwd")
    template = MicrobatchTemplate.of([coll, comp, Wait(handle=coll.handle)], 10)
    assert template is not None
    out = template.stamp(12)
    assert out[0] == Collective(kind="ring_exchange", group="tp-g", bytes=64, purpose="tp",
                                handle="tp:s1:m12:F:b3:attn3:0", count=2, label="b3:fwd")
    assert out[1] == Compute(kind="F", stage=1, microbatch=12, chunk=0, block_start=3, block_end=4, flops=8.0,
                             hbm_bytes=2.0, gemms=((4, 4, 4, 1),))
    assert out[2] == Wait(handle="tp:s1:m12:F:b3:attn3:0")
    assert template.stamp(7)[2] == Wait(handle="tp:s1:m7:F:b3:attn3:0")
    assert template.stamp(10) == [coll, comp, Wait(handle=coll.handle)]


@pytest.mark.parametrize(
    "op",
    [
        Compute(kind="F", stage=0, microbatch=3, chunk=0, block_start=1, block_end=2, flops=1.0, hbm_bytes=0.0),
        Wait(handle="tp:s0:F:b1:0"),
        Wait(handle="tp:s0:m2:F:b1:m2:0"),
        Alloc(name="act:m2", bytes=8, category="activations"),
    ],
)
def test_template_refuses_ops_it_cannot_stamp(op: Op) -> None:
    """A compute op of another micro-batch, a handle without (or with two) ``:m2:``, an op without a handle:
    no template, so the caller builds every micro-batch itself."""
    assert MicrobatchTemplate.of([op], 2) is None


def test_selective_op_backward_does_not_regather_what_the_recompute_gathered() -> None:
    """With per-op recompute the input re-gather is issued before the R op (tensor_parallel); the overlapped
    backward then runs its last input-gradient GEMM without a bulk all-gather beside it, so each layer's
    backward gathers nothing but its output gradient (by ring exchange)."""
    ops = _role(tp=2, recompute="selective-op", flash_attention=True)
    for block in range(1, 2 * TINY.num_layers + 1):
        backward = _between(ops, "B", block)
        assert not [o for o in backward if isinstance(o, Collective) and o.kind == "all_gather"]
        recompute = next(i for i, o in enumerate(ops) if isinstance(o, Compute) and o.kind == "R"
                         and o.block_start == block and o.microbatch == 0)
        assert isinstance(ops[recompute - 2], Collective) and ops[recompute - 2].kind == "all_gather"  # type: ignore[union-attr]
    plain = _role(tp=2, recompute="none", flash_attention=True)
    assert any(isinstance(o, Collective) and o.kind == "all_gather" for o in _between(plain, "B", 1))


@pytest.mark.parametrize("tp", [2, 4])
def test_chunk_gemms_run_on_te_streams_and_collectives_on_userbuffers(tp: int) -> None:
    """TE issues the chunk GEMMs round-robin on min(3, splits) streams (comm_gemm_overlap.h ``_stream_compute``);
    under one hardware queue the ring-exchange chunks still run together (``gemm_streams = min(3, tp)``: only
    the receive is waited for between them), while a 16-bit pipelined reduce-scatter's chunks run one at a time
    (1: the reduce-scatter's wait for chunk i is issued before chunk i + 1); a bulk GEMM and the ops between stay
    alone (1). Every collective the pass issues is a userbuffers kernel; the embedding's and head's plain
    collectives stay NCCL."""
    ops = _role(tp=tp)
    tokens = TINY.seq_length
    piped = [o for o in _between(ops, "F", 1) if isinstance(o, Compute) and o.gemms
             and o.gemms[0][0] == tokens // PIPELINE_SPLITS][-PIPELINE_SPLITS:]  # the projection's chunks
    assert len(piped) == PIPELINE_SPLITS and {o.gemm_streams for o in piped} == {1}
    for kind, block in (("F", 1), ("B", 2)):
        between = _between(ops, kind, block)
        ring = [o for o in between if isinstance(o, Compute) and o.gemms and o.gemms[0][0] == tokens // tp
                and not any(o is p for p in piped)]
        assert ring and {o.gemm_streams for o in ring} == {min(UB_STREAMS, tp)}
        assert all(o.kernel == "userbuffers" for o in between if isinstance(o, Collective))
    bulk = [o for o in _between(ops, "B", 2) if isinstance(o, Compute)][-1]  # beside the bulk reduce-scatter
    assert bulk.gemm_streams == 1
    plain = _role(tp=tp, overlap=False)
    assert all(o.kernel == "nccl" for o in plain if isinstance(o, Collective))


def test_fp8_pipelined_chunks_run_two_at_a_time() -> None:
    """An fp8 pipelined reduce-scatter takes TE's ``gemm_overlap = True`` loop (``fp8_gemm``), which issues chunk
    i + 1 before the wait for chunk i: two chunks in flight under one hardware queue; the fp8 ring-exchange chunks
    keep min(3, tp), the same loop as in 16 bits."""
    tp, tokens = 4, TINY.seq_length
    between = _between(_role(tp=tp, fp8_recipe="delayed"), "F", 1)
    piped = [o for o in between if isinstance(o, Compute) and o.fp8_gemms
             and o.fp8_gemms[0][0] == tokens // PIPELINE_SPLITS][-PIPELINE_SPLITS:]
    assert len(piped) == PIPELINE_SPLITS and {o.gemm_streams for o in piped} == {2}
    ring = [o for o in between if isinstance(o, Compute) and o.fp8_gemms and o.fp8_gemms[0][0] == tokens // tp
            and not any(o is p for p in piped)]
    assert ring and {o.gemm_streams for o in ring} == {min(UB_STREAMS, tp)}
