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
MoE models are refused under fp8 (:func:`simgrid.layout.check_fp8_model`): their sub-blocks list no GEMMs, so
expert GEMMs would stay at the 16-bit rate with none of TE GroupedLinear's casts; no MoE case reaches this module.
"""

from __future__ import annotations

from typing import NamedTuple

from simgrid.layout.spec import Layout
from simgrid.model.blocks import local_q_heads, local_seq_length
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
    d, tp, h = layout.param_bytes, layout.tp, model.hidden_size
    current = layout.fp8_recipe == "current"
    amax = d if current else 0  # current scaling's extra read of every quantized 16-bit tensor
    amax_k = 2 if current else 0  # its amax and scale launches
    sp = layout.sequence_parallel and tp > 1  # TE's Linear: sequence_parallel only with tp > 1 (linear.py line 765)
    tokens = layout.micro_batch_size * local_seq_length(model, layout.cp)
    full = tokens * h
    shard = full // tp if sp else full
    column_out, row_in = _widths(model, layout, kind)
    grad_col, x_row = tokens * column_out, tokens * row_in
    # LayerNormLinear forward: fp8 norm output (delayed) or 16-bit norm + amax + cast (current).
    fwd = (2 * d + 1) * shard if current else (FP8_BYTES - d) * shard
    fwd_k = 3 if current else 0
    # Linear forward input cast (with its transpose unless sequence parallel).
    fwd += (d + (1 if sp else 2) + amax) * x_row
    fwd_k += 1 + amax_k
    # Backward: transposes for the weight gradients, the output-gradient casts.
    bwd = TRANSPOSE_BYTES * full + (d + 2 + amax) * grad_col
    bwd_k = 1 + 1 + amax_k
    if sp:
        bwd += TRANSPOSE_BYTES * x_row + (d + 1 + amax) * shard + TRANSPOSE_BYTES * full
        bwd_k += 1 + 2 + amax_k
    else:
        bwd += (d + 2 + amax) * full
        bwd_k += 1 + amax_k
    weights = fp8_weight_params(model, layout, kind)
    m = layout.num_microbatches
    weight_bytes = (d + 2 + amax) * weights // m
    weight_k = -(-2 * (1 + amax_k) // m)  # at least one launch per micro-batch while any is left
    return FP8Traffic(fwd + weight_bytes, bwd, fwd_k + weight_k, bwd_k, weight_bytes, weight_k)
