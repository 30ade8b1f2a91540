"""ZeRO-1 parameter all-gather overlapped with the next step's forward (Megatron-Core --overlap-param-gather):
where the gathers and their waits sit, one in flight, bytes conserved, stage-granularity splitting; and under
Layout.fp8_params the 1-byte gathers of the Float8Tensor weights (apex, NeMo's bucket split)."""

from __future__ import annotations

import dataclasses
from itertools import pairwise

import pytest
from schedule_helpers import TINY

from simgrid.errors import LayoutError
from simgrid.ir.dryrun import dry_run
from simgrid.ir.ops import Collective, Compute, Wait
from simgrid.ir.validate import validate_program
from simgrid.layout.spec import Layout
from simgrid.model import get_model
from simgrid.schedules import build_program
from simgrid.schedules.buckets import apex_padded_params, grad_buckets
from simgrid.schedules.lower.context import LoweringContext
from simgrid.schedules.lower.param_gather import bucket_param_bytes, fp8_param_gather_bytes

BASE = Layout(dp=2, zero=1, global_batch_size=6, bucket_size_MB=0.02, overlap_param_gather=True)


def _ops(layout: Layout, rank: int = 0, granularity: str = "block") -> tuple:
    program = build_program(TINY, layout, granularity=granularity)  # type: ignore[arg-type]
    validate_program(program)
    dry_run(program)
    return program.ranks[rank]


def _gathers(ops: tuple) -> list[tuple[int, Collective]]:
    return [(i, op) for i, op in enumerate(ops) if isinstance(op, Collective) and op.purpose == "zero-param"]


def _first_compute(ops: tuple) -> int:
    return next(i for i, op in enumerate(ops) if isinstance(op, Compute))


def test_gathers_run_in_forward_order_each_waited_before_its_first_forward() -> None:
    """The forward-first bucket's gather is issued before any compute; every bucket's WAIT sits right before
    the micro-batch-0 forward op of the bucket's first block and is followed by the next bucket's gather."""
    ops = _ops(BASE)
    buckets = grad_buckets(TINY, BASE, 0)
    assert len(buckets) >= 3
    gathers = _gathers(ops)
    assert [op.label for _, op in gathers] == [f"s0:bucket{b.index}" for b in reversed(buckets)]
    assert gathers[0][0] < _first_compute(ops)
    for k, bucket in enumerate(reversed(buckets)):
        handle = gathers[k][1].handle
        wait = next(i for i, op in enumerate(ops) if isinstance(op, Wait) and op.handle == handle)
        after = wait + 1
        if k + 1 < len(buckets):
            assert ops[after] is gathers[k + 1][1]  # the next gather is issued once this one is done
            after += 1
        forward = ops[after]
        assert isinstance(forward, Compute) and forward.kind == "F" and forward.microbatch == 0
        assert forward.block_start == min(bucket.blocks)


def test_one_gather_in_flight_and_none_after_the_optimizer() -> None:
    """Each gather is issued only after the previous one was waited for; the optimizer step is followed by no
    parameter gather (the next step's forward gathers what it updated)."""
    ops = _ops(BASE)
    gathers = _gathers(ops)
    for (_, prev), (index, _) in pairwise(gathers):
        waited = next(i for i, op in enumerate(ops) if isinstance(op, Wait) and op.handle == prev.handle)
        assert waited < index
    opt = next(i for i, op in enumerate(ops) if isinstance(op, Compute) and op.kind == "OPT")
    assert max(i for i, _ in gathers) < opt


@pytest.mark.parametrize("granularity", ["block", "stage"])
@pytest.mark.parametrize("extra", [{}, {"pp": 2, "schedule": "1f1b", "global_batch_size": 8}, {"tp": 2, "sequence_parallel": True,
                                                                             "tp_comm_overlap": True}],
                         ids=["dp", "pp2", "tp2-overlap"])
def test_bytes_and_compute_are_conserved(granularity: str, extra: dict[str, object]) -> None:
    """With and without the overlap every rank gathers the same buckets with the same bytes, once each, and
    runs the same forward FLOPs (stage granularity only splits the first forward at bucket edges)."""
    on = dataclasses.replace(BASE, **extra)  # type: ignore[arg-type]
    off = dataclasses.replace(on, overlap_param_gather=False)
    ranks = range(on.world_size)
    for rank in ranks:
        with_ops, without = _ops(on, rank, granularity), _ops(off, rank, granularity)
        assert sorted((op.label, op.bytes) for _, op in _gathers(with_ops)) == \
            sorted((op.label, op.bytes) for _, op in _gathers(without))
        flops = [sum(op.flops for op in o if isinstance(op, Compute) and op.kind == "F")
                 for o in (with_ops, without)]
        assert flops[0] == pytest.approx(flops[1], rel=1e-12)


def test_stage_granularity_splits_only_the_first_forward_at_bucket_edges() -> None:
    """At stage granularity micro-batch 0's forward becomes one op per bucket range (each after its WAIT);
    the later micro-batches keep one forward op for the stage."""
    ops = _ops(BASE, granularity="stage")
    buckets = grad_buckets(TINY, BASE, 0)
    first = [op for op in ops if isinstance(op, Compute) and op.kind == "F" and op.microbatch == 0]
    assert [op.block_start for op in first] == sorted(min(b.blocks) for b in buckets)
    later = [op for op in ops if isinstance(op, Compute) and op.kind == "F" and op.microbatch == 1]
    assert len(later) == 1


def test_later_pipeline_rank_gathers_its_single_megatron_bucket_during_the_fill() -> None:
    """Megatron buckets with pp 2: pipeline rank 1 holds one bucket, gathered from the prologue and waited for
    only after the first activation arrives, so the gather runs through the pipeline fill."""
    layout = dataclasses.replace(BASE, pp=2, schedule="1f1b", global_batch_size=8,
                                 bucket_policy="megatron")
    program = build_program(TINY, layout)
    ops = program.ranks[program.groups["pp/dp0-tp0"][1]]
    gathers = _gathers(ops)
    assert len(gathers) == 1 and gathers[0][0] < _first_compute(ops)
    wait = next(i for i, op in enumerate(ops) if isinstance(op, Wait) and op.handle == gathers[0][1].handle)
    recv = next(i for i, op in enumerate(ops) if type(op).__name__ == "Recv")
    assert recv < wait < _first_compute(ops)


@pytest.mark.parametrize("fields", [{"zero": 0}, {"zero": 2}, {"overlap_grad_reduce": False}])
def test_overlap_param_gather_needs_zero1_with_overlapped_grad_reduce(fields: dict[str, object]) -> None:
    """Megatron-LM asserts the distributed optimizer and --overlap-grad-reduce for --overlap-param-gather."""
    with pytest.raises(LayoutError, match=r"overlap_param_gather .* needs zero = 1 with overlap_grad_reduce"):
        dataclasses.replace(BASE, **fields)  # type: ignore[arg-type]


# -- fp8 parameters (Layout.fp8_params: NeMo's Float8Tensor weights gathered as uint8 by apex) -------------------
FP8_APEX = Layout(dp=2, zero=1, zero_impl="apex", bucket_size_MB=0.01, overlap_param_gather=True,
                  fp8_recipe="delayed", fp8_params=True)
TINY_LAYER_FP8_WEIGHTS = 64 * (3 * 64 + 64) + 64 * (256 + 256)
"""tiny-gpt (h 64, ffn 256): QKV and attention-output weights, fc1 and fc2 weights of one layer (49152)."""
TINY_LAYER_REST = (3 * 64 + 64 + 256 + 64) + 2 * 2 * 64
"""Its biases (QKV, output, fc1, fc2) and two layer norms' weights and biases (832)."""


def _param_gathers(layout: Layout) -> dict[str, int]:
    program = build_program(TINY, layout)
    validate_program(program)
    dry_run(program)
    return {c.label: c.bytes for c in program.ranks[0] if isinstance(c, Collective) and c.purpose == "zero-param"}


def test_fp8_params_gather_each_layers_weights_in_one_byte() -> None:
    """With fp8 parameters a layer bucket holds only its four TE weights, padded to whole apex state buckets and
    gathered at 1 byte per element; the rank's first-layer bucket adds every other parameter (biases, norms, the
    tied embedding, the final norm) in bf16, padded on its own (NeMo make_parameter_bucket, init_params_bucket)."""
    fp8 = _param_gathers(FP8_APEX)
    bf16 = _param_gathers(dataclasses.replace(FP8_APEX, fp8_params=False))
    buckets = grad_buckets(TINY, FP8_APEX, 0)
    first = f"s0:bucket{buckets[-1].index}"
    assert sorted(fp8) == sorted(bf16) == sorted(f"s0:bucket{b.index}" for b in buckets)
    layer = apex_padded_params(TINY_LAYER_FP8_WEIGHTS, FP8_APEX)
    for label, size in fp8.items():
        if label != first:
            assert size == layer * 1, label
    embed = 256 * 64 + 32 * 64  # word and position embeddings (tied output layer)
    rest = 4 * TINY_LAYER_REST + embed + 2 * 64  # every layer's biases and norms, the embeddings, the final norm
    assert fp8[first] == layer + apex_padded_params(rest, FP8_APEX) * 2
    # each layer bucket moves about half its bf16 bytes (the same padding, 1 byte instead of 2)
    for label, size in fp8.items():
        if label != first:
            assert bf16[label] == apex_padded_params(TINY_LAYER_FP8_WEIGHTS + TINY_LAYER_REST, FP8_APEX) * 2
            assert 0.45 < size / bf16[label] <= 0.5


def test_fp8_params_gather_halves_a_gpt3_175b_layer_bucket() -> None:
    """GPT-3 175B as the MLPerf v4.1 rows run it (TP 4, PP 8, VP 6, DP 8, 200 MB buckets): a layer's bucket is
    5 state buckets either way, so its gather moves exactly half the bytes."""
    model = get_model("nemo-gpt3-175b")
    layout = Layout(dp=8, tp=4, pp=8, vpp=6, zero=1, zero_impl="apex", schedule="interleaved-1f1b",
                    sequence_parallel=True, global_batch_size=2048, micro_batch_size=2, bucket_size_MB=200,
                    overlap_param_gather=True, fp8_recipe="delayed", fp8_params=True)
    ctx = LoweringContext(model=model, layout=layout, granularity="stage")
    stage = ctx.stages_of(3)[1]  # a middle rank's second chunk: layer buckets only
    for bucket in ctx.buckets(stage):
        assert 2 * fp8_param_gather_bytes(ctx, 3, stage, bucket) == bucket_param_bytes(ctx, bucket)
