"""DTensor TP copies: torchtitan's [b, s, h] sequence sharding adds a chunk + cat copy of the whole tensor to
every sequence-parallel all-gather and reduce-scatter, on the compute op they sit next to."""

from __future__ import annotations

from schedule_helpers import TINY, context, flat

from simgrid.ir.ops import Collective, Compute
from simgrid.schedules.lower.compute import add_recompute, compute_steps
from simgrid.schedules.lower.tensor_parallel import add_tensor_parallel

MBS = 2
ACTIVATION = MBS * TINY.seq_length * TINY.hidden_size * 2
"""One micro-batch's [b, s, h] bf16 activation of tiny-gpt: the tensor each copy reads and writes."""


def _computes(granularity: str = "block", **layout: object) -> list[Compute]:
    ctx = context(granularity, micro_batch_size=MBS, **layout)
    ops = flat(add_tensor_parallel(ctx, add_recompute(ctx, compute_steps(ctx, 0)), 0))
    return [op for op in ops if isinstance(op, Compute)]


def _extra(**layout: object) -> dict[tuple[str, int, int], tuple[float, int]]:
    """(hbm bytes, kernels) dtensor adds over megatron, per (kind, micro-batch, first block) compute op."""
    base = _computes(**layout)
    dt = _computes(tp_impl="dtensor", **layout)
    assert len(base) == len(dt)
    return {(a.kind, a.microbatch, a.block_start): (b.hbm_bytes - a.hbm_bytes, b.kernels - a.kernels)
            for a, b in zip(base, dt, strict=True)}


def test_megatron_layout_has_no_copies_and_dtensor_keeps_the_collectives() -> None:
    """Megatron's [s, b, h] gathers on dim 0: tp_impl megatron (the default) adds nothing; dtensor issues the
    same collectives in the same order."""
    ctx = context(micro_batch_size=MBS, tp=2, sequence_parallel=True)
    assert ctx.layout.tp_impl == "megatron"
    ctx_dt = context(micro_batch_size=MBS, tp=2, sequence_parallel=True, tp_impl="dtensor")
    colls = [[op for op in flat(add_tensor_parallel(c, compute_steps(c, 0), 0)) if isinstance(op, Collective)]
             for c in (ctx, ctx_dt)]
    assert colls[0] == colls[1] and colls[0]


def test_each_layer_forward_and_backward_carry_two_copies_of_the_whole_activation() -> None:
    """Attention and MLP forward: the input all-gather's copy and the output reduce-scatter's; backward: the
    output-grad all-gather's, the input re-gather's and the input-grad reduce-scatter's (no recompute), each
    reading and writing the full b*s*h tensor once, one kernel each."""
    extra = _extra(tp=2, sequence_parallel=True)
    for block in range(1, 2 * TINY.num_layers + 1):
        assert extra[("F", 0, block)] == (2 * 2 * ACTIVATION, 2)
        assert extra[("B", 0, block)] == (3 * 2 * ACTIVATION, 3)


def test_embedding_and_head_copies_but_no_copy_for_the_loss_all_reduces() -> None:
    """The embedding's Partial -> Shard(1) reduce-scatter and the head's Shard(1) -> Replicate gather copy; the
    vocab-parallel loss all-reduces move no sequence shard and copy nothing."""
    extra = _extra(tp=2, sequence_parallel=True)
    head = 2 * TINY.num_layers + 1
    assert extra[("F", 0, 0)] == (2 * ACTIVATION, 1)
    assert extra[("F", 0, head)] == (2 * ACTIVATION, 1)


def test_selective_op_recompute_reruns_the_regather_copy() -> None:
    """torchtitan's per-op SAC saves reduce_scatter_tensor but not all_gather_into_tensor (parallelize_llama.py
    _save_list at 820504e): the recompute re-gathers (and copies) each sub-block's input once, and the backward
    keeps the output-grad gather's and the input-grad scatter's copies."""
    extra = _extra(tp=2, sequence_parallel=True, recompute="selective-op", flash_attention=True)
    recomputed = [key for key in extra if key[0] == "R"]
    assert recomputed
    for key in recomputed:
        assert extra[key] == (2 * ACTIVATION, 1)
        assert extra[("B", key[1], key[2])] == (2 * 2 * ACTIVATION, 2)


def test_no_copies_without_sequence_parallel_or_tp() -> None:
    """Without sequence parallelism the TP collectives are all-reduces (no re-layout); tp 1 has none."""
    assert set(_extra(tp=2).values()) == {(0, 0)}
    assert set(_extra().values()) == {(0, 0)}


def test_stage_granularity_folds_the_same_copies() -> None:
    """A stage-wide op carries the copies of all its blocks' collectives: the same total as block granularity."""
    def total(granularity: str) -> tuple[float, int]:
        ops = _computes(granularity, tp=2, sequence_parallel=True, tp_impl="dtensor")
        base = _computes(granularity, tp=2, sequence_parallel=True)
        return (sum(b.hbm_bytes - a.hbm_bytes for a, b in zip(base, ops, strict=True)),
                sum(b.kernels - a.kernels for a, b in zip(base, ops, strict=True)))
    assert total("stage") == total("block")
    assert total("block")[1] > 0


def test_full_recompute_copies_follow_the_collectives_that_run() -> None:
    """Full AC over DTensor TP: the recompute copies the attention's gather and scatter and the MLP's gather
    (the MLP's output reduce-scatter is not rerun); each backward copies the output-grad gather and the
    input-grad scatter only (no input re-gather). torchtitan's checkpoint is non-reentrant."""
    extra = _extra(tp=2, sequence_parallel=True, recompute="full", checkpoint_impl="non-reentrant")
    for block in range(1, 2 * TINY.num_layers + 1):
        attention = block % 2 == 1
        assert extra[("R", 0, block)] == ((2 if attention else 1) * 2 * ACTIVATION, 2 if attention else 1)
        assert extra[("B", 0, block)] == (2 * 2 * ACTIVATION, 2)
