"""Transformer Engine's extra memory-bound kernels under fp8 autocast (``Layout.fp8_recipe``), per sub-block.

Megatron-Core's dense transformer layer runs QKV and fc1 as TE ``LayerNormLinear`` (column-parallel) and the
attention output projection and fc2 as TE ``Linear`` (row-parallel) (:func:`simgrid.model.gemms.fp8_gemm_shapes`).
Their fp8 GEMMs need fp8 operands, made by casts the 16-bit path does not run. Read from TE v1.11 (what NeMo
24.07-24.12 / Megatron-Core r0.8-0.10 shipped; ``transformer_engine/pytorch/module/``), bytes per element with
``d`` the 16-bit width (each kernel reads and writes once):

forward
  LayerNormLinear: the norm writes its output in fp8 (``ln_out_dtype = torch.uint8``, layernorm_linear.py
      lines 125 and 137-143): ``1 - d`` per norm output element against the 16-bit norm (a saving)
  Linear: without sequence parallelism ``fp8_cast_transpose_fused`` (read d, write the fp8 copy and its
      transpose: d + 2), with it ``cast_to_fp8`` (d + 1) (linear.py lines 112-134); one launch
  weights: each linear's weight is cast to fp8 with its transpose cache (read d, write 2: d + 2 per parameter)
      once per step: Megatron-Core passes ``is_first_microbatch`` (megatron/core/extensions/transformer_engine.py
      lines 198-202 at core_r0.9.0, set by schedules.py lines 254-255) and TE updates its cached ``weight``
      workspace only then (linear.py ``update_workspace = is_first_microbatch is None or is_first_microbatch``;
      base.py ``get_fp8_workspace``). Priced here as a 1/m share of each micro-batch's forward
backward
  LayerNormLinear: ``tex.fp8_transpose`` of the (gathered) fp8 ln_out for the weight gradient (2, over all
      tokens; layernorm_linear.py line 591)
  Linear under sequence parallelism: ``tex.fp8_transpose`` of the saved fp8 input (2; linear.py lines 518-523)
  output gradient of every linear: ``fp8_cast_transpose(_bgrad)_fused`` (d + 2) without a gather; for the
      row-parallel Linear under sequence parallelism ``cast_to_fp8`` of the shard (d + 1), an fp8 all-gather,
      then ``fp8_transpose`` of the gathered tensor (2) (module/base.py ``grad_output_preprocess`` lines 775-830)

``current`` (Float8CurrentScaling, TE 2.x: transformer_engine/pytorch/csrc/extensions/cast.cpp lines 55-64 at
v2.3) runs ``nvte_compute_amax`` over each tensor before its cast (one more read, d) and
``nvte_compute_scale_from_amax`` (one tiny launch): two launches more per quantized tensor. Its norm cannot emit
fp8 directly (normalization.cpp lines 111-126 at v2.3: ``force_unfused_kernel`` except for delayed scaling), so
the norm writes 16-bit and a separate amax pass and cast follow (2d + 1, three launches).

Left out: the delayed recipe's amax-history reduction (one all-reduce of a few KB per fp8_autocast exit:
latency-bound tens of microseconds per micro-batch), current scaling's per-tensor amax all-reduce over the
tensor-parallel group for gathered inputs, and the bias-gradient column sums the fused cast-transpose absorbs.
A MoE layer's MLP sub-block is :func:`fp8_moe_traffic` (TE ``GroupedLinear`` experts, padding copies, shared
expert through the same linear-pair rule as the dense layers).
"""

from __future__ import annotations

from typing import NamedTuple

from simgrid.layout.spec import Layout
from simgrid.model.blocks import local_q_heads, local_seq_length
from simgrid.model.moe import fc1_width, moe_spec, padded_tokens_per_local_expert
from simgrid.model.params import mlp_in_width, qkv_width
from simgrid.model.spec import ModelSpec

FP8_BYTES = 1
"""Bytes of one fp8 element (E4M3 or E5M2)."""
TRANSPOSE_BYTES = 2 * FP8_BYTES
"""``fp8_transpose``: read one fp8 element, write one."""


class FP8Traffic(NamedTuple):
    """Extra (negative: saved) HBM bytes and launches of one sub-block's fp8 casts, for one micro-batch."""

    fwd_bytes: int
    bwd_bytes: int
    fwd_kernels: int
    bwd_kernels: int
    weight_fwd_bytes: int
    """Of ``fwd_bytes``, the weights' once-per-step casts (a 1/m share; a recompute does not redo them)."""
    weight_fwd_kernels: int
    """Of ``fwd_kernels``, those casts' launches (their 1/m share, rounded up)."""


NO_FP8 = FP8Traffic(0, 0, 0, 0, 0, 0)


FP8_WEIGHT_CACHE_BYTES = 2 * FP8_BYTES
"""Bytes per parameter of a TE linear's cached fp8 weight workspace: the fp8 copy and its transpose cache
(``Float8Tensor(data=..., data_transpose=...)`` in base.py ``get_fp8_workspace``, kept under ``cache_name
= "weight"`` across the step's micro-batches)."""


def fp8_weight_cache_bytes(layout: Layout) -> int:
    """Bytes per TE-linear weight parameter Transformer Engine keeps beside the parameter: the fp8 workspace and its
    transpose (:data:`FP8_WEIGHT_CACHE_BYTES`), or with ``fp8_params`` the ``Float8Tensor``'s transpose cache only
    (TE v1.6rc1 float8_tensor.py ``transpose_2d(cache=True)``, lines 466-509; the fp8 data is the parameter)."""
    return FP8_BYTES if layout.fp8_params else FP8_WEIGHT_CACHE_BYTES


def _widths(model: ModelSpec, layout: Layout, kind: str) -> tuple[int, int]:
    """(column-parallel linear's output width, row-parallel linear's input width) on one tp rank."""
    tp = layout.tp
    if kind == "attn":
        return qkv_width(model, tp), local_q_heads(model, tp) * model.head_dim
    return mlp_in_width(model, tp), model.ffn_size // tp


def fp8_weight_params(model: ModelSpec, layout: Layout, kind: str) -> int:
    """Parameters of a dense sub-block's two TE linears on one tp rank (0 outside attn/mlp or without fp8)."""
    if layout.fp8_recipe == "none" or kind not in ("attn", "mlp"):
        return 0
    column_out, row_in = _widths(model, layout, kind)
    return model.hidden_size * (column_out + row_in)


def fp8_traffic(model: ModelSpec, layout: Layout, kind: str) -> FP8Traffic:
    """The fp8 casts of a dense ``attn`` or ``mlp`` sub-block (module docstring); zero without fp8."""
    if layout.fp8_recipe == "none" or kind not in ("attn", "mlp"):
        return NO_FP8
    column_out, row_in = _widths(model, layout, kind)
    return _linear_pair(model, layout, column_out, row_in, fp8_weight_params(model, layout, kind), norm_fused=True,
                        fp8_weights=layout.fp8_params)


def _linear_pair(model: ModelSpec, layout: Layout, column_out: int, row_in: int, weights: int, *,
                 norm_fused: bool, fp8_weights: bool = False) -> FP8Traffic:
    """A column-parallel TE linear (``column_out`` wide on this rank) then a row-parallel one (``row_in`` wide
    input), both over the micro-batch's tokens, with ``weights`` parameters cast once per step.
    ``norm_fused``: the column linear is a ``LayerNormLinear`` (its norm emits fp8); else a ``Linear`` that
    casts the 16-bit norm output itself (a MoE layer's shared expert, gpt_layer_specs.py lines 264-267 at
    core_r0.10.0: ``TEColumnParallelLinear`` behind a separate ``TENorm``, line 102).
    ``fp8_weights``: the weights are ``Float8Tensor`` parameters (``Layout.fp8_params``), not cast in the forward;
    their transpose caches, invalidated by the optimizer's parameter copy, are refilled once per step (2 bytes per
    parameter, one launch per weight): in the first backward at TE v1.6rc1 (linear.py lines 362-366,
    ``weight.transpose_2d(cache=True)``), in the first forward at v1.11 (linear.py lines 964-972, ``fill_cache=True``);
    priced as the forward's 1/m share either way."""
    d, tp, h = layout.param_bytes, layout.tp, model.hidden_size
    current = layout.fp8_recipe == "current"
    amax = d if current else 0  # current scaling's extra read of every quantized 16-bit tensor
    amax_k = 2 if current else 0  # its amax and scale launches
    sp = layout.sequence_parallel and tp > 1  # TE's Linear: sequence_parallel only with tp > 1 (linear.py line 765)
    tokens = layout.micro_batch_size * local_seq_length(model, layout.cp)
    full = tokens * h
    shard = full // tp if sp else full
    grad_col, x_row = tokens * column_out, tokens * row_in
    if norm_fused:
        # LayerNormLinear forward: fp8 norm output (delayed) or 16-bit norm + amax + cast (current); its
        # backward transposes the (gathered) fp8 ln_out for the weight gradient.
        fwd = (2 * d + 1) * shard if current else (FP8_BYTES - d) * shard
        fwd_k = 3 if current else 0
        bwd, bwd_k = TRANSPOSE_BYTES * full, 1
    else:
        # Linear forward input cast, as the row-parallel one below; the backward transposes the gathered input
        # under sequence parallelism (the cast-transpose wrote it in the forward otherwise).
        fwd, fwd_k = (d + (1 if sp else 2) + amax) * shard, 1 + amax_k
        bwd, bwd_k = (TRANSPOSE_BYTES * full, 1) if sp else (0, 0)
    # Linear forward input cast (with its transpose unless sequence parallel).
    fwd += (d + (1 if sp else 2) + amax) * x_row
    fwd_k += 1 + amax_k
    # Backward: transposes for the weight gradients, the output-gradient casts.
    bwd += (d + 2 + amax) * grad_col
    bwd_k += 1 + amax_k
    if sp:
        bwd += TRANSPOSE_BYTES * x_row + (d + 1 + amax) * shard + TRANSPOSE_BYTES * full
        bwd_k += 1 + 2 + amax_k
    else:
        bwd += (d + 2 + amax) * full
        bwd_k += 1 + amax_k
    m = layout.num_microbatches
    if fp8_weights:  # Float8Tensor weights: only their transpose caches are refilled, once per step
        weight_bytes, weight_k = TRANSPOSE_BYTES * weights // m, -(-2 // m)
    else:
        weight_bytes = (d + 2 + amax) * weights // m
        weight_k = -(-2 * (1 + amax_k) // m)  # at least one launch per micro-batch while any is left
    return FP8Traffic(fwd + weight_bytes, bwd, fwd_k + weight_k, bwd_k, weight_bytes, weight_k)


# -- MoE sub-blocks -----------------------------------------------------------------------------------------
def fp8_moe_weight_params(model: ModelSpec, layout: Layout) -> int:
    """Parameters of a MoE sub-block's TE linears on one rank: the ``E / ep`` local experts' fc1 and fc2 weights
    (each split ``1/etp``) and the shared expert's two linears (split over tp); 0 without fp8. The router and
    gate are not TE modules (no fp8 copy)."""
    if layout.fp8_recipe == "none":
        return 0
    return _routed_weights(model, layout) + _shared_weights(model, layout)


def _routed_weights(model: ModelSpec, layout: Layout) -> int:
    """Parameters of the ``E / ep`` local experts' fc1 and fc2 weights on one rank (each split ``1/etp``)."""
    moe = moe_spec(model)
    n1 = fc1_width(model, moe.expert_ffn_hidden_size) // layout.expert_tp
    return moe.num_experts // layout.ep * model.hidden_size * (n1 + moe.expert_ffn_hidden_size // layout.expert_tp)


def _shared_weights(model: ModelSpec, layout: Layout) -> int:
    """Parameters of the shared expert's two linears on one tp rank (0 without a shared expert)."""
    f_s = moe_spec(model).shared_expert_ffn_hidden_size
    return model.hidden_size * (fc1_width(model, f_s) // layout.tp + f_s // layout.tp)


def fp8_moe_traffic(model: ModelSpec, layout: Layout) -> FP8Traffic:
    """The fp8 casts of a MoE sub-block (zero without fp8), read from TE v1.11's ``GroupedLinear``
    (transformer_engine/pytorch/module/grouped_linear.py) and Megatron-Core core_r0.10.0's ``TEGroupedMLP``.

    Routed experts, over the ``R = (E / ep) m_pad`` rows of the grouped GEMMs (tokens per local expert padded
    to 16, :func:`simgrid.model.moe.padded_tokens_per_local_expert`):
    forward: ``Fp8Padding`` copies the permuted tokens into the padded buffer (read + write ``R h d``, one
    launch: ``multi_padding_fused``, fp8_padding.py line 39) and ``Fp8Unpadding`` copies fc2's output back
    (``torch.cat``, one launch); each grouped linear casts its input with the transpose its weight gradient
    needs in one ``fp8_multi_cast_transpose_fused`` over all local experts (``d + 2``; line 104: TE's
    GroupedLinear is never sequence-parallel there, Megatron passes tp_size 1 for explicit expert
    communication, so line 98's condition holds). Backward: the padding copies' gradients (the same bytes,
    two launches) and each grouped linear's output gradient ``fp8_multi_cast_transpose_fused`` (``d + 2``;
    line 315), or with biases one ``fp8_cast_transpose_bgrad_fused`` per expert (line 300). The saved inputs
    are those transposes, so no backward transpose. Weights: every local expert's fc1 and fc2 weight is cast
    with its transpose into a cached workspace once per step (``cache_name=f"weight{i}"``, lines 739-746),
    ``d + 2`` per parameter, charged as a 1/m share of each forward like the dense linears'.
    Shared expert: the dense pair of TE linears (:func:`_linear_pair`, its fc1 a ``Linear`` behind a 16-bit norm).
    The router, its softmax/top-k, the permutation and the all-to-alls stay 16-bit (no fp8 path in router.py
    or token_dispatcher.py at core_r0.10.0). ``current`` scaling adds an amax read and two launches per
    quantized tensor, as for the dense linears (a grouped cast counted as one tensor: an approximation).
    """
    if layout.fp8_recipe == "none":
        return NO_FP8
    moe, h, d = moe_spec(model), model.hidden_size, layout.param_bytes
    current = layout.fp8_recipe == "current"
    amax, amax_k = (d, 2) if current else (0, 0)
    local = moe.num_experts // layout.ep
    rows = local * padded_tokens_per_local_expert(model, layout)
    n1 = fc1_width(model, moe.expert_ffn_hidden_size) // layout.expert_tp
    f_l = moe.expert_ffn_hidden_size // layout.expert_tp
    pad = 2 * 2 * d * rows * h  # pad before fc1, unpad after fc2: read + write each
    cast = d + 2 + amax
    fwd = pad + cast * rows * (h + f_l)  # fc1 input, fc2 input (the activation's output)
    bwd = pad + cast * rows * (h + n1)  # fc2 output gradient, fc1 output gradient
    fwd_k, bwd_k = 2 + 2 * (1 + amax_k), 2 + (2 * local if model.bias else 2) * (1 + amax_k)
    m = layout.num_microbatches
    weight_bytes = cast * _routed_weights(model, layout) // m
    weight_k = -(-2 * local * (1 + amax_k) // m)  # one cast per expert weight, spread over the step
    out = FP8Traffic(fwd + weight_bytes, bwd, fwd_k + weight_k, bwd_k, weight_bytes, weight_k)
    if moe.shared_expert_ffn_hidden_size:
        f_s = moe.shared_expert_ffn_hidden_size
        shared = _linear_pair(model, layout, fc1_width(model, f_s) // layout.tp, f_s // layout.tp,
                              _shared_weights(model, layout), norm_fused=False)
        out = FP8Traffic(*(a + b for a, b in zip(out, shared, strict=True)))
    return out
