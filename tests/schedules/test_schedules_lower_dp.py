"""Data-parallel passes: DDP buckets, parameter server, ZeRO-1/2 grad sync, ZeRO-3 gathers with prefetch."""

from __future__ import annotations

import dataclasses
from itertools import pairwise

import pytest
from schedule_helpers import TINY, replay_peaks

from simgrid.ir.ops import Alloc, Collective, Compute, Free, Wait
from simgrid.layout.mesh import Mesh
from simgrid.layout.spec import Layout
from simgrid.model import block_params_on_rank
from simgrid.schedules import build_program
from simgrid.schedules.buckets import grad_buckets


def _ops(layout: Layout, rank: int = 0, granularity: str = "block") -> tuple:
    return build_program(TINY, layout, granularity=granularity).ranks[rank]  # type: ignore[arg-type]


def _colls(ops: tuple, purpose: str) -> list[tuple[int, Collective]]:
    return [(i, op) for i, op in enumerate(ops) if isinstance(op, Collective) and op.purpose == purpose]


def _opt_index(ops: tuple) -> int:
    return next(i for i, op in enumerate(ops) if isinstance(op, Compute) and op.kind == "OPT")


def test_ddp_all_reduces_each_bucket_once_during_the_last_microbatch_backward() -> None:
    """One ALL_REDUCE per bucket, right after the backward op of the bucket's first block on the last
    micro-batch, while later blocks' backward still runs; WAITs before the optimizer step."""
    layout = Layout(dp=2, global_batch_size=6, bucket_size_MB=0.02)
    ops = _ops(layout)
    buckets = grad_buckets(TINY, layout, 0)
    assert len(buckets) >= 3
    found = _colls(ops, "dp-grad")
    assert [op.label for _, op in found] == [f"s0:bucket{b.index}" for b in buckets]
    assert [op.bytes for _, op in found] == [b.bytes for b in buckets]
    for (index, op), bucket in zip(found, buckets, strict=True):
        producer = ops[index - 1]
        assert isinstance(producer, Compute) and producer.kind == "B" and producer.microbatch == 2
        assert producer.block_start == min(bucket.blocks)
        assert op.group == "dp/pp0-tp0"
    last_backward = max(i for i, op in enumerate(ops) if isinstance(op, Compute) and op.kind == "B")
    assert found[0][0] < last_backward  # overlaps the remaining backward
    opt = _opt_index(ops)
    waits = [i for i, op in enumerate(ops) if isinstance(op, Wait) and op.handle.startswith("dp-grad")]
    assert len(waits) == len(buckets) and max(waits) < opt


def test_ddp_with_split_backward_issues_after_the_weight_gradient() -> None:
    """ZB-H1: weight gradients come from W, so the bucket all-reduce follows a W op."""
    layout = Layout(dp=2, pp=2, schedule="zb-h1", global_batch_size=4)
    ops = _ops(layout, rank=0)
    for index, _ in _colls(ops, "dp-grad"):
        assert isinstance(ops[index - 1], Compute) and ops[index - 1].kind == "W"


def test_parameter_server_reduces_to_the_first_rank_which_alone_steps_and_broadcasts() -> None:
    """PS: REDUCE to dp rank 0, the server runs OPT and keeps optimizer states, then BROADCASTs."""
    layout = Layout(dp=3, tp=2, dp_mode="parameter-server", global_batch_size=3)
    program = build_program(TINY, layout)
    mesh = Mesh(layout)
    for rank, ops in enumerate(program.ranks):
        server = mesh.dp_group(rank)[0]
        reduces = _colls(ops, "ps-reduce")
        casts = _colls(ops, "ps-broadcast")
        assert reduces and casts and {op.root for _, op in reduces + casts} == {server}
        has_opt = any(isinstance(op, Compute) and op.kind == "OPT" for op in ops)
        holds_states = any(isinstance(op, Alloc) and op.category == "optimizer" for op in ops)
        assert has_opt == holds_states == (rank == server)
        if has_opt:
            assert max(i for i, _ in reduces) < _opt_index(ops) < min(i for i, _ in casts)


def test_zero1_reduce_scatters_buckets_and_gathers_parameters_after_the_step() -> None:
    """ZeRO-1: REDUCE_SCATTER (zero-grad) per bucket before OPT, ALL_GATHER (zero-param) per bucket after."""
    layout = Layout(dp=4, zero=1, global_batch_size=4, bucket_size_MB=0.02)
    ops = _ops(layout)
    buckets = grad_buckets(TINY, layout, 0)
    scatters, gathers = _colls(ops, "zero-grad"), _colls(ops, "zero-param")
    assert [op.kind for _, op in scatters] == ["reduce_scatter"] * len(buckets)
    assert [op.kind for _, op in gathers] == ["all_gather"] * len(buckets)
    opt = _opt_index(ops)
    assert max(i for i, _ in scatters) < opt < min(i for i, _ in gathers)
    params = [sum(block_params_on_rank(TINY, layout, b) for b in bucket.blocks) * 2 for bucket in buckets]
    assert [op.bytes for _, op in gathers] == params


def test_zero2_reduce_scatters_every_microbatch_and_lowers_the_gradient_peak() -> None:
    """ZeRO-2: each micro-batch's backward reduce-scatters each bucket and frees its full-size buffer, so
    the peak of gradient-holding memory (grads + bucket buffers) is below ZeRO-1's full gradients."""
    base = dict(dp=4, global_batch_size=12, bucket_size_MB=0.02)
    ops2 = _ops(Layout(zero=2, **base))
    buckets = grad_buckets(TINY, Layout(zero=2, **base), 0)
    assert len(_colls(ops2, "zero-grad")) == 3 * len(buckets)
    for _, op in _colls(ops2, "zero-grad"):
        name = "zero2-bucket:" + op.handle.split(":", 1)[1]
        assert Free(name=name) in ops2
    peak2 = replay_peaks(ops2)
    peak1 = replay_peaks(_ops(Layout(zero=1, **base)))
    assert peak2["grads"] + peak2["comm"] < peak1["grads"]


def test_unoverlapped_grad_sync_comes_after_the_last_backward() -> None:
    """overlap_grad_reduce=False issues every DDP all-reduce after the rank's last backward compute op."""
    from simgrid.ir.ops import Collective, Compute
    from simgrid.layout import Layout
    from simgrid.model import get_model
    from simgrid.schedules import build_program

    model = get_model("tiny-gpt")
    for overlap in (True, False):
        program = build_program(model, Layout(dp=2, pp=2, global_batch_size=8, bucket_size_MB=0.01,
                                              overlap_grad_reduce=overlap))
        ops = program.ops(0)
        last_bwd = max(i for i, op in enumerate(ops) if isinstance(op, Compute) and op.kind in ("B", "W"))
        syncs = [i for i, op in enumerate(ops) if isinstance(op, Collective) and op.purpose == "dp-grad"]
        assert len(syncs) > 1
        assert (min(syncs) > last_bwd) is (not overlap)


def test_fp32_grads_double_every_ddp_all_reduce_and_zero1_reduce_scatter_but_not_the_gathers() -> None:
    """``reduce_dtype = "fp32"`` (Megatron's fp32 main_grad) with Megatron's buckets (a parameter-count cap, so
    the same buckets): each DP all-reduce (ZeRO 0) and reduce-scatter (ZeRO 1) moves twice the bf16 bytes, the
    ZeRO-1 parameter all-gathers stay 16-bit."""
    for zero, purpose in ((0, "dp-grad"), (1, "zero-grad")):
        base = dict(dp=4, zero=zero, global_batch_size=4, bucket_policy="megatron")
        plain = _ops(Layout(**base))  # type: ignore[arg-type]
        fp32 = _ops(Layout(**base, reduce_dtype="fp32"))  # type: ignore[arg-type]
        assert [op.label for _, op in _colls(fp32, purpose)] == [op.label for _, op in _colls(plain, purpose)]
        assert [op.bytes for _, op in _colls(fp32, purpose)] == [2 * op.bytes for _, op in _colls(plain, purpose)]
        assert _colls(fp32, purpose)
        assert [op.bytes for _, op in _colls(fp32, "zero-param")] == [op.bytes for _, op in _colls(plain, "zero-param")]


def test_fp32_grads_under_zero2_reduce_scatter_four_bytes_per_gradient() -> None:
    """ZeRO-2 with fp32 gradients: every per-micro-batch reduce-scatter moves the bucket's parameters x 4 bytes."""
    layout = Layout(dp=4, zero=2, global_batch_size=8, bucket_size_MB=1e6, reduce_dtype="fp32")
    scatters = _colls(_ops(layout), "zero-grad")
    params = sum(block_params_on_rank(TINY, layout, b) for b in range(2 * TINY.num_layers + 2))
    assert [op.bytes for _, op in scatters] == [4 * params] * 2  # one bucket, two micro-batches


STAGE_SPLIT = Layout(dp=16, zero=1, global_batch_size=48, recompute="full", bucket_size_MB=0.02)
"""Two DGX nodes of ZeRO-1 with full recompute and small buckets: several buckets per stage."""


def test_stage_granularity_cuts_the_last_backward_at_bucket_edges_and_issues_each_bucket_inside_it() -> None:
    """At stage granularity the last micro-batch's recompute and backward are cut at bucket edges and
    interleaved (R then B per piece, last blocks first); each bucket's reduce-scatter follows the B piece
    that completes it, so all but the last overlap later pieces. Earlier micro-batches keep one op each."""
    ops = _ops(STAGE_SPLIT, granularity="stage")
    buckets = grad_buckets(TINY, STAGE_SPLIT, 0)
    assert len(buckets) >= 3
    last = STAGE_SPLIT.num_microbatches - 1
    pieces = [op for op in ops if isinstance(op, Compute) and op.kind in ("R", "B") and op.microbatch == last]
    backward = [op for op in pieces if op.kind == "B"]
    assert [op.block_start for op in backward] == [min(b.blocks) for b in buckets]
    for prev, op in pairwise(pieces):
        if op.kind == "B" and prev.kind == "R":
            assert (prev.block_start, prev.block_end) == (op.block_start, op.block_end)
    found = _colls(ops, "zero-grad")
    assert [op.label for _, op in found] == [f"s0:bucket{b.index}" for b in buckets]
    for index, _ in found:
        producer = ops[index - 1]
        assert isinstance(producer, Compute) and producer.kind == "B" and producer.microbatch == last
    final_backward = max(i for i, op in enumerate(ops) if isinstance(op, Compute) and op.kind == "B")
    assert found[0][0] < final_backward
    assert sum(1 for op in ops if isinstance(op, Compute) and op.kind == "B" and op.microbatch == 0) == 1


@pytest.mark.parametrize("kind", ["R", "B"])
def test_stage_granularity_cut_keeps_the_work_of_the_last_backward(kind: str) -> None:
    """The cut pieces sum to the stage op's FLOPs and HBM bytes (nothing lost or counted twice)."""
    def totals(granularity: str) -> tuple[float, float]:
        ops = [op for op in _ops(STAGE_SPLIT, granularity=granularity) if isinstance(op, Compute) and op.kind == kind]
        return sum(op.flops for op in ops), sum(op.hbm_bytes for op in ops)

    stage, block = totals("stage"), totals("block")
    assert stage[0] == pytest.approx(block[0], rel=1e-12)
    assert stage[1] == pytest.approx(block[1], rel=1e-12)


def test_stage_and_block_granularity_predict_the_same_step_with_overlapped_grad_sync() -> None:
    """The granularity is a speed knob, not a model change: with the backward cut at bucket edges the
    simulated step and exposed data-parallel time agree with block granularity's. (Without recompute: a
    stage-wide R op also counts the embedding's launches, which block granularity skips, a few microseconds.)"""
    from simgrid.simulation import simulate

    layout = dataclasses.replace(STAGE_SPLIT, recompute="none")
    stage = simulate(TINY, "dgx-a100-hdr", layout, granularity="stage").metrics
    block = simulate(TINY, "dgx-a100-hdr", layout, granularity="block").metrics
    assert stage.exposed_comm_s["dp"] > 0
    assert stage.step_time_s == pytest.approx(block.step_time_s, rel=1e-6)
    assert stage.exposed_comm_s["dp"] == pytest.approx(block.exposed_comm_s["dp"], rel=1e-6)


# Megatron-LM's delay_grad_reduce under the interleaved schedule (data_parallel.sync_after_chunk_backwards).
WIDE = dataclasses.replace(TINY, name="wide-6l", num_layers=6, hidden_size=2048, num_heads=16, vocab_size=32000)
"""Six layers of 50M parameters: a layer alone fills Megatron's 40M-parameter bucket, so the first pipeline rank's
first chunk (embedding + one layer) holds several buckets."""
MEGATRON_VPP = dict(dp=2, zero=1, pp=2, vpp=3, schedule="interleaved-1f1b", global_batch_size=8,
                    bucket_policy="megatron")


@pytest.mark.parametrize("pp_rank", [0, 1])
def test_megatron_interleaved_starts_a_chunks_buckets_together_pp_rank_backwards_after_its_last(pp_rank: int) -> None:
    """Megatron-LM f2e5db4 (delay_grad_reduce on by default): every bucket of model chunk c is started at once,
    after the backward pp_rank iterations after the chunk's last backward, or after the rank's last backward;
    no bucket starts inside a backward (the schedule keeps the hooks in no_sync)."""
    from schedule_helpers import context

    from simgrid.schedules.build import build_roles

    ctx = context(model=WIDE, **MEGATRON_VPP)
    role = build_roles(ctx)[pp_rank]
    backwards = [s for s in role if s.action is not None and s.action.kind == "B"]
    if pp_rank == 0:
        assert len(ctx.buckets(ctx.stages_of(0)[0])) >= 2
    for stage in ctx.stages_of(pp_rank):
        last = max(i for i, s in enumerate(backwards) if s.action.stage == stage)
        step = backwards[min(last + pp_rank, len(backwards) - 1)]
        handles = [op.handle for op in step.ops if isinstance(op, Collective) and op.purpose == "zero-grad"]
        assert [f"zero-grad:s{stage}:bucket{b.index}" for b in ctx.buckets(stage)] == [
            h for h in handles if h.startswith(f"zero-grad:s{stage}:")]
        computes = [i for i, op in enumerate(step.ops) if isinstance(op, Compute)]
        starts = [i for i, op in enumerate(step.ops) if isinstance(op, Collective) and op.purpose == "zero-grad"]
        assert min(starts) > max(computes)  # after the whole backward, not bucket by bucket inside it


def test_megatron_without_interleaving_keeps_the_per_bucket_launch_inside_the_last_backward() -> None:
    """Plain 1F1B's first pipeline rank and no pipelining run the last backward outside no_sync: each bucket
    starts as its gradients complete, the first one before the rank's last backward op."""
    for settings in (dict(dp=2, zero=1, pp=2, schedule="1f1b", global_batch_size=8, bucket_policy="megatron"),
                     dict(dp=2, zero=1, global_batch_size=4, bucket_policy="megatron")):
        ops = build_program(WIDE, Layout(**settings)).ranks[0]  # type: ignore[arg-type]
        starts = [i for i, _ in _colls(ops, "zero-grad")]
        assert len(starts) >= 2
        last_backward = max(i for i, op in enumerate(ops) if isinstance(op, Compute) and op.kind == "B")
        assert min(starts) < last_backward


def test_megatron_interleaved_program_valid_and_every_bucket_synced_once() -> None:
    """The delayed launch keeps each chunk's buckets exactly once per rank, each waited for before the optimizer."""
    program = build_program(WIDE, Layout(**MEGATRON_VPP))  # type: ignore[arg-type]
    from simgrid.ir.validate import validate_program

    validate_program(program)
    for rank in (0, 2):  # pipeline ranks 0 and 1 of data-parallel rank 0
        ops = program.ranks[rank]
        labels = [op.label for _, op in _colls(ops, "zero-grad")]
        assert len(labels) == len(set(labels)) > 0
        opt = _opt_index(ops)
        waited = {op.handle for op in ops[:opt] if isinstance(op, Wait)}
        assert {f"zero-grad:{label}" for label in labels} <= waited
