"""Pass: Megatron-Core DDP's gradient scaling before each bucket's collective (``bucket_policy = "megatron"``).

Megatron-Core's ``Bucket.start_grad_sync`` (megatron/core/distributed/param_and_grad_buffer.py lines 120-123 at
Megatron-LM f2e5db4) multiplies the bucket's whole gradient buffer in place, ``self.grad_data *=
self.gradient_scaling_factor``, right before it issues the bucket's all-reduce or (distributed optimizer)
reduce-scatter, whenever the factor is not 1. ``DistributedDataParallel.__init__``
(distributed_data_parallel.py lines 146-158) sets the factor to ``1 / get_data_parallel_world_size()`` (the
data-parallel degree without context parallelism) unless ``calculate_per_token_loss`` or
``ddp_config.average_in_collective`` (both off by default: arguments.py line 1087, distributed_data_parallel_config.py
line 30), and the same ``1 / dp`` for the expert buffers. So with ``dp > 1`` every bucket costs one element-wise kernel
more, launched from the grad-ready hook (or the interleaved schedule's ``grad_sync_func``) on the compute stream,
reading and writing the bucket's gradient buffer in its own dtype (the ``grad_dtype`` of the buffer: fp32 under bf16,
arguments.py lines 302-305, else the parameters' 16-bit type), which is what ``Bucket.bytes`` counts
(:func:`simgrid.schedules.buckets.grad_buckets`).

In the IR the kernel is folded into the compute op issued last before the bucket's collective (``hbm_bytes`` + read
and write of the bucket, ``kernels`` + 1), as :mod:`.dtensor_copies` folds its copies: it runs on the compute
stream, and the collective, which starts only when every compute op before it has finished, waits for it. The
pass runs after the tensor-parallel passes, which rebuild compute ops from the block costs. Layouts with another
bucket policy (PyTorch DDP divides inside its comm hook; apex's DistributedFusedAdam, ``zero_impl = "apex"``) are
left alone.
"""

from __future__ import annotations

from dataclasses import replace

from simgrid.ir.ops import Collective, Compute, Op
from simgrid.schedules.lower.context import LoweringContext, Role

SCALED_PURPOSES = ("dp-grad", "zero-grad")
"""Collectives of Megatron-Core's gradient buckets (dense and expert; :mod:`.data_parallel`, :mod:`.moe`)."""

SCALE_READS_WRITES = 2
"""An in-place ``tensor *= scalar`` reads and writes each element once."""


def scales_gradients(ctx: LoweringContext) -> bool:
    """True when Megatron-Core's DDP scales each bucket by ``1 / dp`` before its collective (module docstring)."""
    lay = ctx.layout
    return lay.bucket_policy == "megatron" and lay.zero_impl != "apex" and lay.zero <= 1 and lay.dp > 1


def add_grad_scaling(ctx: LoweringContext, role: Role) -> Role:
    """Fold one read-and-write of each bucket into the compute op issued last before the bucket's collective."""
    if not scales_gradients(ctx):
        return role
    for step in role:
        if not any(isinstance(op, Collective) and op.purpose in SCALED_PURPOSES for op in step.ops):
            continue
        ops: list[Op] = list(step.ops)
        last = None
        for i, op in enumerate(ops):
            if isinstance(op, Compute):
                last = i
            elif isinstance(op, Collective) and op.purpose in SCALED_PURPOSES:
                if last is None:
                    raise AssertionError(f"internal: gradient bucket {op.label} issued before any compute op of "
                                         f"step {step.action}")
                prev = ops[last]
                assert isinstance(prev, Compute)
                ops[last] = replace(prev, hbm_bytes=prev.hbm_bytes + SCALE_READS_WRITES * op.bytes,
                                    kernels=prev.kernels + 1)
        step.ops = ops
    return role
