"""FSDP2's memory-bound copies around its collectives: what each one moves, and where the lowering charges it.

Read from torch's FSDP2 (``torch/distributed/_composable/fsdp/`` until late 2024, then
``torch/distributed/fsdp/_fully_shard/``: ``_fsdp_collectives.py``, ``_fsdp_param_group.py``,
``_fsdp_param.py``), at the torch the dev rows ran (a 2024-04 nightly under torchtitan 528cab9; 1963fc8 of
2024-12-23 under 9dec370; 38410cf9 of 2025-06-14 under 820504e; NeMo AutoModel's 2025 torch). Per unit
(one ``fully_shard`` module), with ``N`` the unit's parameters and ``S = N / shards`` its local shard:

* **All-gather copy-in** (:func:`copy_in`), once per all-gather, on ``all_gather_copy_in_stream``
  (``foreach_all_gather``: ``with torch.cuda.stream(all_gather_copy_in_stream)``; the group picks that stream
  in forward and pre-backward, ``get_all_gather_streams`` in ``_fsdp_param_group.py``): the fp32 shard is
  cast to the bf16 parameter dtype (``FSDPParam.all_gather_inputs`` returns
  ``_to_dtype_if_needed(sharded_param_data, param_dtype)``; later the fused ``_get_param_all_gather_inputs``
  does it with one ``torch._foreach_copy_`` into a flat buffer), then ``torch._foreach_copy_`` writes the
  casts into this rank's slice of the all-gather output (``all_gather_copy_in``). Cast ``S x (4 + p)`` and
  copy ``2 S p`` bytes (``p`` the parameter bytes; no cast without mixed precision): 10 bytes per local
  element in bf16, 1.25 bytes per unit parameter at 8 shards.
* **All-gather copy-out** (:data:`FSDP2_COPY_OUT_READS_WRITES`, :func:`copy_out`), once per all-gather, on the
  current (compute) stream in ``wait_for_unshard``: ``torch.split_with_sizes_copy`` of the whole output into
  the unsharded parameters, ``2 N p`` bytes, one kernel.
* **Reduce-scatter copy-in**: ``foreach_reduce_scatter_copy_in`` (``torch._chunk_cat`` since pytorch#122888,
  2024-03-28; it casts bf16 to the fp32 ``reduce_dtype`` on the way), ``N x (p + r)`` bytes. It ran on the
  reduce-scatter stream until pytorch#129721 (2024-06-27) moved it to the current stream (so: the torchtitan
  A100 rows ran it on the side stream, every H100 row on the compute stream). Not priced here: every backward
  op already carries it as ``simgrid.model.cost.GRAD_ACCUM_BYTES_PER_PARAM`` (6 = 2 + 4).
* **After the reduce-scatter** (:func:`post_reduce`), on the reduce-scatter stream (``post_reduce_stream``):
  a division only when the reduce dtype risks overflow (fp16: ``_div_if_needed`` of the whole input by the
  pre-divide factor before the collective and of the output by the post-divide factor after it; fp32 since
  pytorch#120919, 2024-02-29, and bf16 since pytorch#123362, 2024-04-04, divide inside NCCL with
  ``ReduceOp.AVG``: no kernel); the cast of the ``S`` reduced elements back to the fp32 sharded parameter's
  dtype (``_to_dtype_if_needed(reduce_output, orig_dtype)``, none when reducing in fp32); and, from the
  second micro-batch of a step on, ``sharded_param.grad += new_sharded_grad`` per parameter (read 4 + 4,
  write 4 per element; the first micro-batch assigns a view, no copy).

The engine runs compute on one stream per rank and gives a communication stream nothing but collectives, so a
copy on FSDP2's side streams cannot be placed there, and the overlap model has no term for a side-stream
kernel's HBM traffic. Those copies are charged to the compute op they run beside: the all-gather copy-in to
the op before which the all-gather is issued, the post-reduce work to the first compute op after the
reduce-scatter is issued. FSDP2 creates all three of its streams with ``priority=-1`` (``FSDPCommContext.init``:
so that "their copies in/out are delayed and block computation" less), so their kernels' blocks are
dispatched ahead of the compute stream's and the copy holds the GPU's HBM for its duration; serialising it
with compute is the upper bound of its cost (overlapping it for free the lower one). Every copy here is
``1/shards`` of a unit or less; docs/design.md ("FSDP2 copies") gives their size on the dev rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from simgrid.layout.spec import FP32_BYTES, Layout
from simgrid.model.spec import ModelSpec
from simgrid.model.zero3_units import block_modules, reduce_bytes_per_param

FSDP2_COPY_OUT_READS_WRITES = 2
"""FSDP2's all-gather copy-out moves every gathered element twice on the compute stream: read from the all-gather
output, written into the unsharded parameter (``foreach_all_gather_copy_out``, called by
``FSDPParamGroup.wait_for_unshard`` in the module's pre-forward / pre-backward hook on the current stream:
``torch.split_with_sizes_copy`` in torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py and in the first
FSDP2 of early 2024, torch/distributed/_composable/fsdp), so ``2 x numel x param bytes`` of HBM traffic and one
kernel per gather. DeepSpeed ZeRO-3 gathers straight into the flat buffer its parameters view, with no copy
(``zero_impl`` deepspeed pays nothing here)."""

ACCUMULATE_READS_WRITES = 3
"""``sharded_param.grad += new_sharded_grad`` reads both operands and writes the sum (fp32 each)."""


@dataclass(frozen=True, kw_only=True)
class CopyCost:
    """HBM traffic and launches of FSDP2 copies that the lowering adds to one compute op."""

    hbm_bytes: int = 0
    """Bytes read plus bytes written."""
    kernels: int = 0
    """Kernel launches."""

    def __add__(self, other: CopyCost) -> CopyCost:
        return CopyCost(hbm_bytes=self.hbm_bytes + other.hbm_bytes, kernels=self.kernels + other.kernels)


def _shard(numel: int, layout: Layout) -> int:
    """Elements of one rank's shard of ``numel`` over FSDP2's shard group (``dp * cp`` ranks; FSDP2 pads
    dim 0 to a multiple of it, hence the ceiling)."""
    return math.ceil(numel / layout.grad_sync_size)


def copy_out(numel: int, layout: Layout) -> CopyCost:
    """The all-gather copy-out of a unit of ``numel`` parameters (compute stream)."""
    return CopyCost(hbm_bytes=FSDP2_COPY_OUT_READS_WRITES * numel * layout.param_bytes, kernels=1)


def copy_in(numel: int, layout: Layout) -> CopyCost:
    """The all-gather copy-in of a unit of ``numel`` parameters (all-gather copy-in stream): the cast of the
    fp32 shard to the parameter dtype under mixed precision, then the foreach copy into the send slice."""
    shard = _shard(numel, layout)
    copy = CopyCost(hbm_bytes=2 * shard * layout.param_bytes, kernels=1)
    if not layout.mixed_precision:
        return copy
    return copy + CopyCost(hbm_bytes=shard * (FP32_BYTES + layout.param_bytes), kernels=1)


def fp16_divide_factors(shards: int) -> tuple[int, float]:
    """FSDP2's pre- and post-divide factors for a reduce dtype that can overflow (fp16): the pre-divide factor
    doubles while it divides ``shards`` and stays below ``shards / factor`` (``_get_gradient_divide_factors``,
    after FSDP1's ``_get_gradient_predivide_factor``); the rest is divided after the reduction."""
    pre = 1
    while shards % pre == 0 and shards / pre > pre:
        pre *= 2
    return pre, shards / pre


def post_reduce(model: ModelSpec, layout: Layout, blocks: tuple[int, ...], numel: int, *,
                accumulate: bool) -> CopyCost:
    """Work around one unit's reduce-scatter of ``numel`` gradient elements (reduce-scatter stream): fp16's
    pre-/post-division, the cast back to fp32, and the accumulation into the sharded gradient when an earlier
    micro-batch of the step left one (``accumulate``)."""
    reduce_bytes = reduce_bytes_per_param(layout)
    shard = _shard(numel, layout)
    cost = CopyCost()
    if layout.precision == "fp16" and reduce_bytes != FP32_BYTES and layout.grad_sync_size > 1:
        pre, post = fp16_divide_factors(layout.grad_sync_size)
        if pre != 1:
            cost += CopyCost(hbm_bytes=2 * numel * reduce_bytes, kernels=1)
        if post != 1:
            cost += CopyCost(hbm_bytes=2 * shard * reduce_bytes, kernels=1)
    if layout.mixed_precision and reduce_bytes != FP32_BYTES:
        cost += CopyCost(hbm_bytes=shard * (reduce_bytes + FP32_BYTES), kernels=1)
    if accumulate:
        tensors = sum(len(t) for b in blocks for _, t in block_modules(model, layout, b))
        cost += CopyCost(hbm_bytes=ACCUMULATE_READS_WRITES * FP32_BYTES * shard, kernels=tensors)
    return cost
