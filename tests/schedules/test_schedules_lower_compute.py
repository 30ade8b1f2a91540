"""Compute pass (F/B/I/W ops costed from block_cost) and recompute pass."""

from __future__ import annotations

import dataclasses

import pytest
from schedule_helpers import TINY, context, flat

from simgrid.errors import ScheduleError
from simgrid.ir.ops import Compute
from simgrid.ir.validate import validate_program
from simgrid.layout.spec import Layout
from simgrid.model import block_cost
from simgrid.schedules import build_program
from simgrid.schedules.lower.compute import add_recompute, compute_steps
from simgrid.schedules.lower.context import LoweringContext


def _computes(role: list) -> list[Compute]:
    return [op for op in flat(role) if isinstance(op, Compute)]


def test_block_granularity_has_one_op_per_sub_block_forward_then_reverse_backward() -> None:
    """pp = 2 on 4 layers: stage 0 = embed + layers 0-1 (blocks 0..4); backward walks them in reverse."""
    ctx = context(pp=2, global_batch_size=2)
    role = compute_steps(ctx, 0)
    first_f = [op for op in _computes(role) if op.kind == "F" and op.microbatch == 0]
    assert [(op.block_start, op.block_end) for op in first_f] == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]
    first_b = [op for op in _computes(role) if op.kind == "B" and op.microbatch == 0]
    assert [op.block_start for op in first_b] == [4, 3, 2, 1, 0]
    assert role[0].action is None and role[-1].action is None


def test_costs_come_from_block_cost_and_b_is_i_plus_w() -> None:
    """F uses the forward figures; B the backward ones with I + W FLOPs (TP split already applied)."""
    ctx = context(tp=2)
    ops = _computes(compute_steps(ctx, 0))
    cost = block_cost(TINY, ctx.layout, 3)
    f = next(op for op in ops if op.kind == "F" and op.block_start == 3)
    b = next(op for op in ops if op.kind == "B" and op.block_start == 3)
    assert (f.flops, f.hbm_bytes, f.kernels, f.gemm_mnk) == (
        cost.fwd_flops, cost.fwd_hbm_bytes, cost.fwd_kernels, cost.gemm_mnk)
    assert b.flops == cost.bwd_input_flops + cost.bwd_weight_flops
    assert (b.hbm_bytes, b.kernels) == (cost.bwd_hbm_bytes, cost.bwd_kernels)


def test_split_backward_shares_flops_exactly_between_i_and_w() -> None:
    """ZB-H1: I carries the input-grad FLOPs, W the weight-grad FLOPs; their bytes add up to B's."""
    ctx = context(pp=2, schedule="zb-h1", global_batch_size=2)
    ops = _computes(compute_steps(ctx, 1))
    cost = block_cost(TINY, ctx.layout, 7)
    i = next(op for op in ops if op.kind == "I" and op.block_start == 7)
    w = next(op for op in ops if op.kind == "W" and op.block_start == 7)
    assert (i.flops, w.flops) == (cost.bwd_input_flops, cost.bwd_weight_flops)
    assert i.hbm_bytes + w.hbm_bytes == pytest.approx(cost.bwd_hbm_bytes)


def test_stage_granularity_sums_the_stage_and_keeps_the_largest_gemm() -> None:
    """One op per (stage, micro-batch, kind) with FLOPs summed over the stage's blocks."""
    ctx = context("stage", pp=2, global_batch_size=2)
    ops = _computes(compute_steps(ctx, 1))
    assert len(ops) == 2 * 2
    f = ops[0]
    assert (f.block_start, f.block_end) == (5, 10)
    costs = [block_cost(TINY, ctx.layout, b) for b in range(5, 10)]
    assert f.flops == pytest.approx(sum(c.fwd_flops for c in costs))
    assert f.gemm_mnk == max(costs, key=lambda c: c.fwd_flops).gemm_mnk


def test_chunk_is_the_local_model_chunk() -> None:
    """Interleaved pp = 2, vpp = 2: stage 3 is rank 1's chunk 1."""
    ctx = context(pp=2, vpp=2, schedule="interleaved-1f1b", global_batch_size=2)
    assert {(op.stage, op.chunk) for op in _computes(compute_steps(ctx, 1))} == {(1, 0), (3, 1)}


def test_full_recompute_puts_an_r_before_every_transformer_backward() -> None:
    """Full recompute reruns each layer sub-block's forward right before its backward; not embed/head."""
    ctx = context(recompute="full")
    ops = _computes(add_recompute(ctx, compute_steps(ctx, 0)))
    for index, op in enumerate(ops):
        if op.kind == "B":
            before = ops[index - 1]
            transformer = 1 <= op.block_start <= 8
            assert (before.kind == "R" and before.block_start == op.block_start) == transformer
    r = next(op for op in ops if op.kind == "R")
    assert r.flops == block_cost(TINY, ctx.layout, r.block_start).fwd_flops


def test_selective_recompute_reruns_only_the_attention_core() -> None:
    """Selective recompute: R only for attention blocks (odd 1..7), with the attention-core FLOPs."""
    ctx = context(recompute="selective")
    ops = _computes(add_recompute(ctx, compute_steps(ctx, 0)))
    recomputed = sorted({op.block_start for op in ops if op.kind == "R"})
    assert recomputed == [1, 3, 5, 7]
    s, h = TINY.seq_length, TINY.hidden_size
    r = next(op for op in ops if op.kind == "R")
    assert r.flops == 4 * s * s * h  # Q K^T and P V: 2 * 2 s^2 h for one sequence (Megatron eq. 3 term)


def test_no_recompute_adds_nothing() -> None:
    """recompute = none leaves the role untouched."""
    ctx = context()
    assert not [op for op in _computes(add_recompute(ctx, compute_steps(ctx, 0))) if op.kind == "R"]


def test_unknown_granularity_is_rejected() -> None:
    """Only 'block' and 'stage' exist."""
    with pytest.raises(ScheduleError, match="granularity = 'layer' is not one of block, stage"):
        LoweringContext(model=TINY, layout=context().layout, granularity="layer")  # type: ignore[arg-type]


def test_flash_attention_ops_carry_the_fused_core_flops() -> None:
    """tiny-gpt (s 32, 4 heads of 16) on tp 2: the fused core is 4 b s^2 (heads / tp) head_dim forward FLOPs
    in the attention F op, 2.5 times that in its I op (the backward recomputes Q K^T), none in W or the MLP;
    full recompute's R reruns the forward core."""
    core = 4 * 1 * 32**2 * (4 // 2) * 16
    ctx = context(tp=2, pp=2, schedule="zb-h1", global_batch_size=2, flash_attention=True, recompute="full")
    ops = _computes(add_recompute(ctx, compute_steps(ctx, 0)))
    by_kind = {kind: next(op for op in ops if op.kind == kind and op.block_start == 1) for kind in "FIWR"}
    assert by_kind["F"].attention_flops == core
    assert by_kind["I"].attention_flops == 2.5 * core
    assert by_kind["W"].attention_flops == 0.0
    assert by_kind["R"].attention_flops == core
    assert all(op.attention_flops == 0.0 for op in ops if op.block_start == 2)  # block 2: layer 0's MLP


def test_unfused_attention_ops_carry_no_fused_flops() -> None:
    """Without flash attention the core's batched GEMMs stay GEMM work: attention_flops is 0 everywhere."""
    ctx = context(tp=2, global_batch_size=2)
    assert all(op.attention_flops == 0.0 for op in _computes(compute_steps(ctx, 0)))


def test_stage_granularity_sums_the_fused_core_flops() -> None:
    """One op per stage: its fused FLOPs are the sum over the stage's attention blocks (2 layers here)."""
    core = 4 * 1 * 32**2 * 4 * 16
    ctx = context("stage", pp=2, global_batch_size=2, flash_attention=True)
    f = next(op for op in _computes(compute_steps(ctx, 0)) if op.kind == "F")
    assert f.attention_flops == 2 * core



def test_selective_op_recompute_puts_an_r_before_every_layer_backward_with_the_rerun_linears() -> None:
    """Per-op checkpointing reruns part of every attention and MLP sub-block: one R before each of their
    backwards (not the embedding or head), whose FLOPs are the rerun linears': tiny-gpt has biases (addmm, never
    saved), so every linear of the sub-block, 2 T (3h h + h h) for attention, 2 T (h 4h + 4h h) for the MLP."""
    ctx = context(recompute="selective-op", flash_attention=True)
    ops = _computes(add_recompute(ctx, compute_steps(ctx, 0)))
    recomputed = sorted(op.block_start for op in ops if op.kind == "R")
    assert recomputed == list(range(1, 9))
    t, h = TINY.seq_length, TINY.hidden_size
    by_block = {op.block_start: op for op in ops if op.kind == "R"}
    assert by_block[1].flops == 2 * t * (3 * h * h + h * h)
    assert by_block[2].flops == 2 * t * (h * 4 * h + 4 * h * h)


@pytest.mark.parametrize("recompute", ["full", "selective"])
def test_stage_and_block_granularity_agree_under_recompute(recompute: str) -> None:
    """A stage-wide R op reruns only the blocks that recompute anything, as block granularity does (which
    puts no R before the embedding's or the head's backward): the step time is the same both ways. Before,
    the stage R also launched a kernel for each block with no recompute FLOPs (24 us per step apart here)."""
    from simgrid import simulate
    from simgrid.hardware import load_cluster
    from simgrid.layout import Layout

    layout = Layout(dp=1, global_batch_size=3, recompute=recompute)
    cluster = load_cluster("dgx-a100-hdr", gpus=layout.world_size)
    stage = simulate(TINY, cluster, layout, granularity="stage").metrics.step_time_s
    block = simulate(TINY, cluster, layout, granularity="block").metrics.step_time_s
    assert stage == pytest.approx(block, rel=1e-9)


# -- gradient accumulation fusion: W GEMMs go to accumulate_gemms, in every pass that builds compute ops -------
_FUSION_LAYOUTS = [
    ("block", {}),
    ("stage", {"pp": 2, "global_batch_size": 4}),
    ("block", {"pp": 2, "schedule": "zb-h1", "global_batch_size": 4}),  # split backward: separate W ops
    ("block", {"tp": 2, "sequence_parallel": True, "tp_comm_overlap": True}),  # TE chunked overlap pass
    ("stage", {"tp": 2, "sequence_parallel": True, "tp_comm_overlap": True}),
    ("block", {"tp": 2, "sequence_parallel": True, "tp_async_grad_comm": True}),  # async TP backward pass
    ("block", {"tp": 2, "dp": 2, "zero": 1, "recompute": "full"}),
]


def _gemm_flops(gemms: tuple[tuple[int, int, int, int], ...]) -> float:
    return sum(2.0 * m * n * k * c for m, n, k, c in gemms)


@pytest.mark.parametrize(("granularity", "layout"), _FUSION_LAYOUTS)
def test_fusion_moves_exactly_the_weight_gradient_gemms_into_accumulate_gemms(
        granularity: str, layout: dict[str, object]) -> None:
    """Under fusion (fp16: 2-byte main_grad) only B and W ops accumulate, the accumulating FLOPs are the
    backward's weight-gradient FLOPs (summed from block_cost), every op keeps its FLOPs, and the program validates;
    without fusion nothing accumulates."""
    fused_layout = Layout(precision="fp16", grad_accumulation_fusion=True, **layout)  # type: ignore[arg-type]
    plain_layout = dataclasses.replace(fused_layout, grad_accumulation_fusion=False)
    fused = build_program(TINY, fused_layout, granularity=granularity)  # type: ignore[arg-type]
    plain = build_program(TINY, plain_layout, granularity=granularity)  # type: ignore[arg-type]
    validate_program(fused)
    ops = [o for o in fused.ranks[0] if isinstance(o, Compute) and o.device == "gpu"]
    assert all(not o.accumulate_gemms and o.accumulate_bytes == 0 for o in ops if o.kind not in ("B", "W"))
    assert all(o.accumulate_bytes == 2 for o in ops if o.accumulate_gemms)
    blocks = {b for o in ops if o.kind == "F" for b in range(o.block_start, o.block_end)}  # rank 0's sub-blocks
    expected = fused_layout.num_microbatches * sum(block_cost(TINY, fused_layout, b).bwd_weight_flops for b in blocks)
    got = sum(_gemm_flops(o.accumulate_gemms) for o in ops)
    assert expected > 0 and got == pytest.approx(expected)
    before = [o for o in plain.ranks[0] if isinstance(o, Compute) and o.device == "gpu"]
    assert not any(o.accumulate_gemms for o in before)
    assert sum(o.flops for o in ops) == pytest.approx(sum(o.flops for o in before))
    assert sum(_gemm_flops(o.gemms + o.accumulate_gemms) for o in ops) == pytest.approx(
        sum(_gemm_flops(o.gemms) for o in before))


def test_fsdp2_programs_accumulate_nothing() -> None:
    """FSDP2 (zero 3): autograd writes fresh gradients; no op accumulates into a buffer."""
    program = build_program(TINY, Layout(dp=2, zero=3, zero_impl="fsdp2", reduce_dtype="fp32", global_batch_size=4))
    assert not any(isinstance(o, Compute) and (o.accumulate_gemms or o.accumulate_bytes) for o in program.ranks[0])


# -- fp8: the TE linears' GEMMs go to fp8_gemms / fp8_accumulate_gemms, in every pass that builds compute ops -----
def _fp8_flops_expected(layout: Layout, op: Compute) -> float:
    """FLOPs of the op's blocks' GEMMs whose shapes the block cost marks fp8, by compute kind."""
    total = 0.0
    for block in range(op.block_start, op.block_end):
        c = block_cost(TINY, layout, block)
        lists = {"F": c.fwd_gemms, "R": c.recompute_gemms, "B": c.bwd_input_gemms + c.bwd_weight_gemms,
                 "I": c.bwd_input_gemms, "W": c.bwd_weight_gemms}[op.kind]
        total += _gemm_flops(tuple(g for g in lists if g[:3] in c.fp8_gemm_shapes))
    return total


@pytest.mark.parametrize(("granularity", "layout"), _FUSION_LAYOUTS)
def test_fp8_moves_exactly_the_te_linear_gemms_into_the_fp8_lists(granularity: str, layout: dict[str, object]) -> None:
    """Every op's fp8 GEMM FLOPs are its blocks' TE-linear GEMM FLOPs (the unfused core and the head stay 16-bit),
    every op keeps its FLOPs and its whole GEMM list, accumulation (gradient fusion) is kept apart from the rest,
    and the program validates."""
    fp8_layout = Layout(fp8_recipe="delayed", grad_accumulation_fusion=True, **layout)  # type: ignore[arg-type]
    plain_layout = dataclasses.replace(fp8_layout, fp8_recipe="none")
    fp8 = build_program(TINY, fp8_layout, granularity=granularity)  # type: ignore[arg-type]
    plain = build_program(TINY, plain_layout, granularity=granularity)  # type: ignore[arg-type]
    validate_program(fp8)
    ops = [o for o in fp8.ranks[0] if isinstance(o, Compute) and o.device == "gpu"]
    before = [o for o in plain.ranks[0] if isinstance(o, Compute) and o.device == "gpu"]
    got = sum(_gemm_flops(o.fp8_gemms + o.fp8_accumulate_gemms) for o in ops)
    parents = {(o.kind, o.microbatch, o.block_start, o.block_end): o for o in before if o.kind != "OPT"}
    expected = sum(_fp8_flops_expected(fp8_layout, o) for o in parents.values())
    assert got > 0 and got == pytest.approx(expected)
    assert all(not o.fp8_accumulate_gemms for o in ops if o.kind not in ("B", "W"))
    assert any(o.fp8_accumulate_gemms for o in ops) and any(o.gemms for o in ops)  # the head's and the core's
    all_gemms = [o.gemms + o.accumulate_gemms + o.fp8_gemms + o.fp8_accumulate_gemms for o in ops]
    assert sum(map(_gemm_flops, all_gemms)) == pytest.approx(sum(_gemm_flops(o.gemms + o.accumulate_gemms)
                                                                 for o in before))
    assert sum(o.flops for o in ops) == pytest.approx(sum(o.flops for o in before))
    assert not any(o.fp8_gemms or o.fp8_accumulate_gemms for o in before)


@pytest.mark.parametrize("granularity", ["block", "stage"])
def test_fp8_moe_expert_gemms_are_fp8_and_the_router_stays_16_bit(granularity: str) -> None:
    """tiny-moe under fp8, ep 2: every forward op holding a MoE sub-block lists its routed and shared experts'
    GEMMs in ``fp8_gemms`` and its router GEMM (T_r x E x h) in ``gemms``; FLOPs and GEMM FLOPs are kept apart
    exactly as the block costs say, and the program validates."""
    from simgrid.model import get_model
    from simgrid.model.moe import is_moe_block

    model = get_model("tiny-moe")
    layout = Layout(dp=2, ep=2, micro_batch_size=2, global_batch_size=4, fp8_recipe="delayed")
    program = build_program(model, layout, granularity=granularity)  # type: ignore[arg-type]
    validate_program(program)
    router = (2 * model.seq_length, model.moe.num_experts, model.hidden_size)  # type: ignore[union-attr]
    moe_ops = [o for o in program.ranks[0] if isinstance(o, Compute) and o.kind == "F"
               and any(is_moe_block(model, b) for b in range(o.block_start, o.block_end))]
    assert moe_ops
    for op in moe_ops:
        experts = {g[:3] for b in range(op.block_start, op.block_end) if is_moe_block(model, b)
                   for g in block_cost(model, layout, b).fwd_gemms} - {router}
        assert experts <= {g[:3] for g in op.fp8_gemms}
        assert router in {g[:3] for g in op.gemms} and router not in {g[:3] for g in op.fp8_gemms}
        expected = sum(_gemm_flops(tuple(g for g in block_cost(model, layout, b).fwd_gemms
                                         if g[:3] in block_cost(model, layout, b).fp8_gemm_shapes))
                       for b in range(op.block_start, op.block_end))
        assert _gemm_flops(op.fp8_gemms) == pytest.approx(expected)
