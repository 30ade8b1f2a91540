"""Tensor-parallel pass: Megatron 1-D collectives around compute ops, each waited at once."""

from __future__ import annotations

from collections import Counter

from schedule_helpers import TINY, context, flat

from simgrid.ir.ops import Collective, Compute, Wait
from simgrid.schedules.lower.compute import add_recompute, compute_steps
from simgrid.schedules.lower.tensor_parallel import add_tensor_parallel


def _tp_role(granularity: str = "block", **layout: object) -> list:
    ctx = context(granularity, **layout)
    return flat(add_tensor_parallel(ctx, add_recompute(ctx, compute_steps(ctx, 0)), 0))


def _layer_collectives(ops: list, kind: str) -> Counter:
    """Collectives right around the compute ops of transformer blocks (1..8), per (compute kind, coll kind)."""
    found: Counter = Counter()
    current = None
    for op in ops:
        if isinstance(op, Compute):
            current = op
        if isinstance(op, Collective):
            owner = current if current is not None and op.handle.endswith(
                tuple(f"b{current.block_start}:after{i}" for i in range(4))) else None
            nxt = None
            if owner is None:  # a "before" collective belongs to the next compute op
                idx = ops.index(op)
                nxt = next(o for o in ops[idx:] if isinstance(o, Compute))
            block_op = owner or nxt
            if 1 <= block_op.block_start <= 2 * TINY.num_layers:
                found[(block_op.kind, op.kind)] += 1
    return found


def test_two_all_reduces_forward_and_two_backward_per_layer() -> None:
    """Megatron (Shoeybi et al. 2019, fig. 3): g after attention and MLP forward, f in their backward."""
    ops = _tp_role(tp=2)
    counts = _layer_collectives(ops, "all_reduce")
    assert counts == {("F", "all_reduce"): 2 * TINY.num_layers, ("B", "all_reduce"): 2 * TINY.num_layers}


def test_every_tp_collective_is_followed_by_its_wait_on_the_tp_group() -> None:
    """Megatron's TP communication is synchronous: WAIT right after; group tp/pp0-dp0, purpose tp."""
    ops = _tp_role(tp=2)
    for index, op in enumerate(ops):
        if isinstance(op, Collective):
            assert ops[index + 1] == Wait(handle=op.handle)
            assert (op.group, op.purpose) == ("tp/pp0-dp0", "tp")
            assert op.label.startswith("b") and op.label.endswith((":fwd", ":bwd"))


def test_sequence_parallel_swaps_all_reduce_for_gather_and_scatter() -> None:
    """Korthikanti et al. 2022 fig. 5: all-gather before, reduce-scatter after; no layer all-reduce."""
    ops = _tp_role(tp=2, sequence_parallel=True)
    counts = _layer_collectives(ops, "")
    layers = TINY.num_layers
    assert counts[("F", "all_gather")] == 2 * layers
    assert counts[("F", "reduce_scatter")] == 2 * layers
    assert counts[("B", "reduce_scatter")] == 2 * layers
    assert not [k for k in counts if k[1] == "all_reduce"]


def test_weight_gradient_pass_has_no_tp_communication() -> None:
    """W ops (split backward) need no collective: weight gradients are local to the tp shard."""
    ctx = context(tp=2, pp=2, schedule="zb-h1", global_batch_size=2)
    ops = flat(add_tensor_parallel(ctx, compute_steps(ctx, 1), 1))
    owners = []
    for index, op in enumerate(ops):
        if isinstance(op, Collective):
            before = next((o for o in reversed(ops[:index]) if isinstance(o, Compute)), None)
            after = next(o for o in ops[index:] if isinstance(o, Compute))
            owners.append(before.kind if op.handle.split(":")[-1].startswith("after") else after.kind)
    assert owners and "W" not in owners
    assert set(owners) == {"F", "I"}


def test_full_recompute_repeats_the_forward_collectives() -> None:
    """Full recompute reruns the layer forward, communication included (label ...:recompute)."""
    ops = _tp_role(tp=2, recompute="full")
    labels = Counter(op.label.split(":")[1] for op in ops if isinstance(op, Collective))
    assert labels["recompute"] == 2 * TINY.num_layers


def test_stage_granularity_folds_collectives_with_count_and_total_bytes() -> None:
    """One collective per (position, kind) per stage op; counts and bytes add up to the block-level ones."""
    block_ops = [op for op in _tp_role(tp=2) if isinstance(op, Collective)]
    stage_ops = [op for op in _tp_role("stage", tp=2) if isinstance(op, Collective)]
    assert sum(op.count for op in stage_ops) == len(block_ops)
    assert sum(op.bytes for op in stage_ops) == sum(op.bytes for op in block_ops)
    assert {op.label for op in stage_ops} <= {"s0:fwd", "s0:bwd"}


def test_tp_one_adds_nothing() -> None:
    """Without tensor parallelism there is nothing to communicate."""
    assert not [op for op in _tp_role() if isinstance(op, Collective)]


def test_selective_op_recompute_waits_for_the_input_regather_its_linears_read() -> None:
    """torchtitan's per-op checkpointing does not save the sequence-parallel all-gather before wq..wv / w1, w3,
    so the recompute gathers the shard again before it reruns wk / w3, and the backward reuses it: each
    transformer sub-block's input re-gather is waited before its R op (it used to come after R, before B), its
    B op keeps only the output-gradient gather, and no gather is lost or added (without recompute the same
    gathers all come before B)."""
    per_op = _tp_role(tp=2, sequence_parallel=True, recompute="selective-op", flash_attention=True)
    for i, op in enumerate(per_op):
        if isinstance(op, Compute) and op.kind in ("R", "B") and 1 <= op.block_start <= 2 * TINY.num_layers:
            gathers = []
            for prev in reversed(per_op[:i]):
                if isinstance(prev, Compute):
                    break
                if isinstance(prev, Collective) and f":{op.kind}:b{op.block_start}:before" in prev.handle:
                    gathers.append(prev)
            assert [g.kind for g in gathers] == ["all_gather"], (op, gathers)
            assert isinstance(per_op[i - 1], Wait) and per_op[i - 1].handle == gathers[0].handle
            assert gathers[0].label == f"b{op.block_start}:" + ("recompute" if op.kind == "R" else "bwd")
    no_recompute = _tp_role(tp=2, sequence_parallel=True, recompute="none", flash_attention=True)

    def gathered(ops: list) -> tuple[int, int]:
        found = [o for o in ops if isinstance(o, Collective) and o.kind == "all_gather"]
        return len(found), sum(o.bytes for o in found)

    assert gathered(per_op) == gathered(no_recompute)


def test_selective_op_regathers_at_stage_granularity_too() -> None:
    """A stage-wide R op gathers every recomputed sub-block's input first (one folded call, count = 2 per
    layer); the head, which is not recomputed, keeps its re-gather before the backward."""
    ops = _tp_role("stage", tp=2, sequence_parallel=True, recompute="selective-op", flash_attention=True)
    recompute = next(i for i, op in enumerate(ops) if isinstance(op, Compute) and op.kind == "R")
    gather = ops[recompute - 2]
    assert isinstance(gather, Collective) and gather.kind == "all_gather" and gather.count == 2 * TINY.num_layers


def _per_layer(ops: list, layer: int) -> Counter:
    """(compute kind, sub-block, collective kind) counts of one transformer layer's TP collectives (block
    granularity; the handle names the compute op: tp:s0:m0:KIND:bBLOCK:...)."""
    attn, mlp = 2 * layer + 1, 2 * layer + 2
    found: Counter = Counter()
    for op in ops:
        if isinstance(op, Collective):
            kind, block = op.handle.split(":")[3], int(op.handle.split(":")[4][1:])
            if block in (attn, mlp):
                found[(kind, "attn" if block == attn else "mlp", op.kind)] += 1
    return found


def test_dtensor_full_recompute_neither_regathers_nor_reruns_the_layer_last_reduce_scatter() -> None:
    """torchtitan's full AC over DTensor TP (820504e; counted on torch 2.13, eager and compiled): the recompute
    gathers each sub-block's input and reruns the attention's reduce-scatter, but stops before the MLP's (its
    output is the block's, which no gradient needs); the backward gathers the output gradient and
    reduce-scatters the input gradient, with no input re-gather (the mm saved the gathered tensor, which the
    recompute brings back). 11 collectives per layer."""
    ops = _tp_role(tp=2, sequence_parallel=True, recompute="full", tp_impl="dtensor",
                   checkpoint_impl="non-reentrant")
    for layer in range(TINY.num_layers):
        assert _per_layer(ops, layer) == {
            ("F", "attn", "all_gather"): 1, ("F", "attn", "reduce_scatter"): 1,
            ("F", "mlp", "all_gather"): 1, ("F", "mlp", "reduce_scatter"): 1,
            ("R", "attn", "all_gather"): 1, ("R", "attn", "reduce_scatter"): 1,
            ("R", "mlp", "all_gather"): 1,
            ("B", "attn", "all_gather"): 1, ("B", "attn", "reduce_scatter"): 1,
            ("B", "mlp", "all_gather"): 1, ("B", "mlp", "reduce_scatter"): 1,
        }
    backward_gathers = [op.label for op in ops if isinstance(op, Collective) and ":B:" in op.handle
                        and op.kind == "all_gather" and 1 <= int(op.handle.split(":")[4][1:]) <= 2 * TINY.num_layers]
    assert len(backward_gathers) == 2 * TINY.num_layers


def test_megatron_full_recompute_keeps_the_regather_and_every_rerun_collective() -> None:
    """Megatron's reentrant checkpoint reruns the whole layer forward and its linear saves only the shard, so
    tp_impl megatron keeps 14 collectives per layer (2 + 2 forward, 2 + 2 recompute, 3 + 3 backward)."""
    ops = _tp_role(tp=2, sequence_parallel=True, recompute="full")
    for layer in range(TINY.num_layers):
        counts = _per_layer(ops, layer)
        assert sum(counts.values()) == 14
        assert counts[("R", "mlp", "reduce_scatter")] == 1 and counts[("B", "mlp", "all_gather")] == 2


def test_recompute_reruns_the_output_collective_unless_early_stop_skips_its_gemm() -> None:
    """The recompute's output reduce-scatter follows the checkpoint: a reentrant one (DTensor or Megatron) reruns
    both sub-blocks' (DTensor then has 12 per layer: no backward re-gather), a non-reentrant one over Megatron's
    layout only the attention's (13), and per-module wrapping neither."""
    def recompute_scatters(**layout: object) -> tuple[int, int]:
        found = _per_layer(_tp_role(tp=2, sequence_parallel=True, recompute="full", **layout), 0)
        return found[("R", "attn", "reduce_scatter")], found[("R", "mlp", "reduce_scatter")]
    assert recompute_scatters(tp_impl="dtensor") == (1, 1)
    assert sum(_per_layer(_tp_role(tp=2, sequence_parallel=True, recompute="full", tp_impl="dtensor"), 0).values()) == 12
    assert recompute_scatters() == (1, 1)
    assert recompute_scatters(checkpoint_impl="non-reentrant") == (1, 0)
    assert recompute_scatters(checkpoint_impl="non-reentrant-modules") == (0, 0)
    assert recompute_scatters(checkpoint_impl="non-reentrant-modules", tp_impl="dtensor") == (0, 0)


def test_dtensor_without_full_recompute_is_unchanged() -> None:
    """The dtensor drop applies to recompute 'full' only: with no recompute the same collectives as Megatron's."""
    def collectives(**layout: object) -> list:
        return [(op.kind, op.handle, op.bytes) for op in _tp_role(tp=2, sequence_parallel=True, **layout)
                if isinstance(op, Collective)]
    assert collectives(tp_impl="dtensor") == collectives()


def test_dtensor_full_recompute_folds_the_same_collectives_at_stage_granularity() -> None:
    """A stage-wide op folds exactly the block-level collectives: same count and bytes per compute kind."""
    def per_kind(granularity: str) -> Counter:
        found: Counter = Counter()
        for op in _tp_role(granularity, tp=2, sequence_parallel=True, recompute="full", tp_impl="dtensor",
                           checkpoint_impl="non-reentrant"):
            if isinstance(op, Collective):
                found[(op.handle.split(":")[3], op.kind)] += op.count
                found[(op.handle.split(":")[3], op.kind, "bytes")] += op.bytes
        return found
    assert per_kind("stage") == per_kind("block")
