"""Pass: Megatron-LM's asynchronous tensor-parallel gradient communication in the backward
(``Layout.tp_async_grad_comm``).

Megatron-LM's column-parallel linear (``LinearWithGradAccumulationAndAsyncCommunication`` in
``megatron/mpu/layers.py``; ``ColumnParallelLinearWithAsyncAllreduce`` when it first landed, merge 6e1bde1e0f,
2021-09-02, "allreduce overlap with wgrad gemm") does not wait for the collective on its input gradient: its
backward computes the input gradient, *issues* the all-reduce (with sequence parallelism: the reduce-scatter)
of it with ``async_op=True``, computes the weight-gradient GEMM, and only then waits. With sequence
parallelism the same backward also issues the all-gather of its saved sequence shard (the weight gradient
needs the whole input) before the input-gradient GEMM and waits for it after that GEMM (sequence-parallel
merge d898a8991d, 2022-05-25, lines 240-310 of ``megatron/mpu/layers.py``). Megatron requires
``CUDA_DEVICE_MAX_CONNECTIONS=1`` (``megatron/arguments.py`` since bdd9731288, 2022-10-14; before it a 3 us
dummy kernel) so the communication kernel is queued ahead of the GEMM it runs beside; in the IR the order of
the ops gives the same: the collective is issued before the GEMM.

What it covers, per sub-block's backward, which Megatron runs in reverse of the forward:

* the row-parallel linear (attention ``dense``, MLP ``dense_4h_to_h``) goes through the same function with
  ``async_grad_allreduce = sequence_parallel = None``: its backward collective (the output-gradient
  all-gather under sequence parallelism) stays synchronous, before the sub-block's backward;
* the column-parallel linear (``query_key_value``, ``dense_h_to_4h``) and, in the 2022 code, the vocabulary
  head (``parallel_lm_logits``): the input-gradient all-reduce / reduce-scatter runs beside that linear's
  weight-gradient GEMM and is waited after it; under sequence parallelism the input re-gather runs beside
  that linear's input-gradient GEMM and is waited before the weight-gradient GEMM.

In the IR a covered sub-block's B op becomes three compute ops: the rest of its backward (the row-parallel
linear's GEMMs, the attention core, the element-wise kernels with all of the op's memory traffic and
launches but two), the column linear's input-gradient GEMM and its weight-gradient GEMM (the last entries of
:class:`~simgrid.model.gemms.BlockGemms` ``bwd_input`` and ``bwd_weight``). The compute cost is additive
(:func:`simgrid.costs.compute_time_s`), so the three cost what the one did; what changes is that the
collectives now fly while a GEMM runs, which the engine times itself, GEMM slowed by the collective's
``comm_compute_slowdown`` (:mod:`simgrid.engine.overlap`). Simplification: the layer norm's backward, which
Megatron runs after the input-gradient collective's wait, is counted in the first compute op, as
:mod:`.tp_overlap` does.

An I op (zero-bubble split backward) has no weight-gradient GEMM beside it: its re-gather still runs beside
the input-gradient GEMM, its input-gradient collective is issued and waited at once. W, F and recompute ops
keep their collectives as :mod:`.tensor_parallel` places them (the forward's all-reduce / reduce-scatter is
synchronous in Megatron-LM). The embedding and MoE sub-blocks are not covered. Under ``tp == 1`` the field is a
no-op, as in Megatron-LM (``... and world_size > 1``).

Under ``tp_comm_overlap`` (:mod:`.tp_overlap`) Transformer Engine's userbuffers cover the transformer layers only;
Megatron-Core's output layer stays its own ``ColumnParallelLinear`` (megatron/core/models/gpt/gpt_model.py line 118
at Megatron-LM f2e5db4), whose backward is the same ``LinearWithGradAccumulationAndAsyncCommunication`` (core/
tensor_parallel/layers.py lines 441-485: re-gather beside the input-gradient GEMM, ``async_op=True`` input-gradient
all-reduce / reduce-scatter beside the weight-gradient GEMM; ``allreduce_dgrad = world_size > 1 and not
sequence_parallel``, line 805). :func:`add_te_overlapped_tensor_parallel` therefore gives the head this module's
placement and the layers :mod:`.tp_overlap`'s.
"""

from __future__ import annotations

from simgrid.ir.ops import Compute, Op
from simgrid.model.blocks import block_kind
from simgrid.model.moe import is_moe_block
from simgrid.schedules.lower.compute import _block_numbers, compute_op
from simgrid.schedules.lower.context import LoweringContext, Role
from simgrid.schedules.lower.tensor_parallel import (
    REGATHER,
    block_collectives,
    regathered_by_recompute,
)
from simgrid.schedules.lower.tp_overlap import _Builder, _flops, add_replaced_tensor_parallel, overlapped_ops

_COVERED = ("attn", "mlp", "head")
"""Sub-blocks whose last linear in the backward is column-parallel (QKV, FC1, the vocabulary head)."""

_INPUT_GRAD = "input-grad"


def _covered(ctx: LoweringContext, block: int) -> bool:
    kind, _ = block_kind(ctx.model, block)
    c = ctx.cost(block)
    return (kind in _COVERED and not is_moe_block(ctx.model, block)
            and bool(c.bwd_input_gemms) and bool(c.bwd_weight_gemms))


def _async_backward(ctx: LoweringContext, op: Compute, group: str, block: int, layers: int) -> list[Op]:
    """The backward ops of ``layers`` equal sub-blocks like ``block`` with the column-parallel linear's
    collectives beside its GEMMs (module docstring)."""
    c = ctx.cost(block)
    kind_name, _ = block_kind(ctx.model, block)
    flops, hbm, kernels, fused, lists = _block_numbers(c, op.kind)
    prefix = f"tp:s{op.stage}:m{op.microbatch}:{op.kind}:b{op.block_start}:{kind_name}{block}:a"
    label = (f"b{op.block_start}" if ctx.granularity == "block" else f"s{op.stage}") + ":bwd"
    b = _Builder(ctx, op, group, prefix, label, layers, c.fp8_gemm_shapes)
    inputs = lists[0]
    weights = lists[1] if op.kind == "B" else ()
    dgrad = inputs[-1]
    wgrad = weights[-1] if weights else None
    regather = input_grad = None
    skip_regather = regathered_by_recompute(ctx, block)
    for coll in c.tp_comm:
        if coll.phase != "bwd":
            continue
        if coll.label == REGATHER:
            regather = None if skip_regather else coll
        elif coll.label == _INPUT_GRAD:
            input_grad = coll
        else:  # the row-parallel linear's output-gradient all-gather: synchronous, before the backward
            b.wait(b.issue(coll.kind, coll.bytes))
    column = (dgrad,) if wgrad is None else (dgrad, wgrad)
    shape = c.attention_shape if fused > 0 else (0, 0, 0)
    b.compute(max(0.0, flops - _flops(column)), hbm, kernels - len(column), inputs[:-1], fused, shape,
              accumulate=weights[:-1])
    handle = b.issue(regather.kind, regather.bytes) if regather is not None else None
    b.gemm(dgrad)
    if handle is not None:
        b.wait(handle)
    handle = b.issue(input_grad.kind, input_grad.bytes) if input_grad is not None else None
    if wgrad is not None:
        b.gemm(wgrad, weight=True)
    if handle is not None:
        b.wait(handle)
    return b.ops


def async_ops(ctx: LoweringContext, op: Compute, group: str) -> list[Op] | None:
    """``op`` with its covered blocks' backward collectives beside their GEMMs, or None when ``op`` is not a
    backward (B or I) or holds no covered block: the caller then wraps it synchronously. Blocks that are not
    covered keep :func:`.tensor_parallel.block_collectives`' placement; at ``stage`` granularity a run of
    covered transformer sub-blocks whose costs are equal per kind folds into one sequence per kind
    (``count`` = layers), as :mod:`.tp_overlap` folds them."""
    if op.kind not in ("B", "I"):
        return None
    blocks = list(range(op.block_start, op.block_end))
    if not any(_covered(ctx, b) for b in blocks):
        return None
    # Maximal runs of blocks: covered layers (attn/mlp), the covered head, or uncovered blocks.
    runs: list[tuple[str, list[int]]] = []
    for block in blocks:
        kind = block_kind(ctx.model, block)[0]
        cls = ("head" if kind == "head" else "layers") if _covered(ctx, block) else "plain"
        if runs and runs[-1][0] == cls:
            runs[-1][1].append(block)
        else:
            runs.append((cls, [block]))
    segments: list[list[Op]] = []
    for cls, members in runs:
        if cls == "plain":
            part = compute_op(ctx, op.kind, op.stage, op.microbatch, members[0], members[-1] + 1)
            before, after = block_collectives(ctx, part, group)
            segments.append([*before, part, *after])
            continue
        by_kind: dict[str, list[int]] = {}
        for block in members:
            by_kind.setdefault(block_kind(ctx.model, block)[0], []).append(block)
        folds = all(ctx.cost(m) == ctx.cost(ms[0]) for ms in by_kind.values() for m in ms)
        if ctx.granularity == "stage" and folds:
            segments += [_async_backward(ctx, op, group, ms[0], len(ms)) for ms in by_kind.values()]
        else:
            segments += [_async_backward(ctx, op, group, block, 1) for block in members]
    segments.reverse()  # a backward runs its blocks last to first
    return [o for segment in segments for o in segment]


def add_async_tensor_parallel(ctx: LoweringContext, role: Role, pp_rank: int) -> Role:
    """The tensor-parallel pass with ``tp_async_grad_comm``: every backward op with a covered block becomes
    :func:`async_ops`; the other compute ops are wrapped as :func:`.tensor_parallel.add_tensor_parallel`
    wraps them (the ops are built once per block range and stamped per micro-batch,
    :func:`.tp_overlap.add_replaced_tensor_parallel`)."""
    return add_replaced_tensor_parallel(ctx, role, pp_rank, async_ops)


def te_overlapped_ops(ctx: LoweringContext, op: Compute, group: str) -> list[Op] | None:
    """:func:`.tp_overlap.overlapped_ops` with the vocabulary head's backward collectives beside its GEMMs
    (:func:`async_ops`; module docstring); an op that holds the head and no transformer layer gets
    :func:`async_ops` alone."""
    ops = overlapped_ops(ctx, op, group, head_ops=async_ops)
    if ops is None and not any(block_kind(ctx.model, b)[0] in ("attn", "mlp")
                               for b in range(op.block_start, op.block_end)):
        return async_ops(ctx, op, group)
    return ops


def add_te_overlapped_tensor_parallel(ctx: LoweringContext, role: Role, pp_rank: int) -> Role:
    """The tensor-parallel pass with ``tp_comm_overlap``: :func:`te_overlapped_ops` for every compute op that has
    one, the others wrapped as :func:`.tensor_parallel.add_tensor_parallel` wraps them."""
    return add_replaced_tensor_parallel(ctx, role, pp_rank, te_overlapped_ops)
