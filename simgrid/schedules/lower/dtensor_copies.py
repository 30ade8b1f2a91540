"""Pass helper: the chunk + cat copies DTensor tensor parallelism adds around its sequence-parallel collectives.

torchtitan (``torchtitan/models/llama3/parallelize_llama.py`` at 820504e, ``apply_tp``, lines 135-197) keeps
Llama activations ``[batch, seq, hidden]`` and shards them on the sequence dim: the embedding's output and
every ``wo`` / ``w2`` output are ``Shard(1)``, every attention / feed-forward input is redistributed
``Shard(1) -> Replicate`` (``PrepareModuleInput``), and the output layer takes ``Shard(1)``. DTensor runs those
redistributions as ``funcol.all_gather_tensor(gather_dim=1)`` and ``reduce_scatter_tensor(scatter_dim=1)``
(``torch/distributed/tensor/placement_types.py``, ``Shard._to_replicate_tensor`` /
``_reduce_shard_tensor``), and NCCL gathers and scatters along dim 0 only, so
``torch/distributed/_functional_collectives.py`` does ``torch.cat(torch.chunk(out, group_size, dim=0),
dim=gather_dim)`` after the gather and ``torch.cat(torch.chunk(x, group_size, dim=scatter_dim))`` before the
reduce-scatter (the 2023 version in the code index, and the unfused path of torch 2.13; the view shortcut
for a batch of 1, pytorch/pytorch#169404, came in December 2025, after the rows' torch of June 2025). The
backward redistributes run the conjugate collective with the same copy (a ``Partial`` source is taken back
to ``Replicate``, ``_redistribute.py``). Inductor keeps the copy as a kernel of its own: the only pass that
matches the all-gather + cat pattern is async TP's ``micro_pipeline_tp`` (``_micro_pipeline_tp``, set by
torchtitan only with ``enable_async_tensor_parallel``), and the copy's neighbours are extern GEMMs
(checked by compiling the same graph on CPU: ``mm``, ``addmm`` for the summed input gradient, then one
``cat`` kernel). torchtitan's own comment at lines 175-177 and its PR #437 say the same: "an extra
``aten.cat`` after each collective", measured there at 0.18 ms of 3 ms of FFN compute (8k tokens, H100).

Megatron-LM keeps ``[s, b, h]``, so its gathers and scatters are on dim 0 and copy nothing.

Each copy reads and writes the whole gathered (or about-to-be-scattered) tensor, ``bytes`` of the
collective in the nccl-tests convention (:mod:`simgrid.model.comm`), as one memory-bound kernel on the
compute stream between the collective's wait and the GEMM that reads it (or between the GEMM and the
reduce-scatter). The tensor-parallel collectives are synchronous, so adding the copies to the wrapped
compute op gives the same stream order and time as separate ops.
"""

from __future__ import annotations

from dataclasses import replace

from simgrid.ir.ops import Collective, Compute, Op
from simgrid.layout.spec import Layout

COPIED_KINDS = ("all_gather", "reduce_scatter")
"""Collectives DTensor runs on a non-zero tensor dim (sequence-parallel ``Shard(1)``); all-reduces
(``Partial -> Replicate``, the loss-parallel reductions) need no re-layout."""


def copies_dtensor(layout: Layout) -> bool:
    """Whether the layout's TP collectives carry DTensor's chunk + cat copies: ``tp_impl = "dtensor"``,
    tp > 1 and sequence parallelism (without it the TP collectives are all-reduces)."""
    return layout.tp_impl == "dtensor" and layout.tp > 1 and layout.sequence_parallel


def copy_cost(ops: list[Op]) -> tuple[int, int]:
    """(HBM bytes, kernels) of the copies of the sequence-parallel collectives among ``ops``: each reads and
    writes its collective's full tensor once, one kernel per folded collective."""
    hbm = 0
    kernels = 0
    for op in ops:
        if isinstance(op, Collective) and op.kind in COPIED_KINDS:
            hbm += 2 * op.bytes
            kernels += op.count
    return hbm, kernels


def with_copies(op: Compute, before: list[Op], after: list[Op]) -> Compute:
    """``op`` with the copies of the collectives issued around it added to its memory-bound work."""
    hbm, kernels = copy_cost([*before, *after])
    if kernels == 0:
        return op
    return replace(op, hbm_bytes=op.hbm_bytes + hbm, kernels=op.kernels + kernels)
