"""Which tensor-parallel collectives a DTensor Llama block issues per pass under full activation checkpointing.

Run from the repository root (needs the executor extra, i.e. torch; CPU only, about 20 s)::

    python benchmarks/dtensor_ac_collectives.py

It builds one Llama-style block (RMSNorm, wq/wk/wv/wo around SDPA, w1/w3/w2 SwiGLU) with the tensor-parallel
plan torchtitan applies (``torchtitan/models/llama3/parallelize_llama.py`` at 820504e, ``apply_tp``: sequence-
parallel norms, ``PrepareModuleInput`` Shard(1) -> Replicate, column-parallel wq/wk/wv/w1/w3, row-parallel
wo/w2 with Shard(1) outputs), wraps it as ``apply_ac`` does for mode "full" (``checkpoint_wrapper(module,
preserve_rng_state=False)``, lines 237-238) and prints, for eager mode and for torch.compile (AOTAutograd's
min-cut partitioner, which is what torchtitan's per-block ``torch.compile`` uses; aot_eager, no Inductor), the
collectives and matrix multiplies of the forward and of the backward, recompute included, with and without
the checkpoint, and how many of the forward's matrix multiplies the recompute reruns (the backward's count
with the checkpoint less the count without). A single-process fake process group of size 2 stands in for NCCL: the collectives are
recorded, not run. The simulator's DTensor lowering (``simgrid.schedules.lower.tensor_parallel``,
``dtensor_full_recompute_drops`` and ``early_stop_drops``; the 6-of-7 GEMM recompute in
``simgrid.model.early_stop``) follows what this prints; it is evidence for the row
``titan-70b-fsdp32-tp8``, whose torch (38410cf9, June 2025) is older than the torch installed here.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.utils._python_dispatch import TorchDispatchMode

HIDDEN, HEADS, FFN, SEQ, BATCH, TP = 64, 4, 128, 16, 2, 2


class _Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(HIDDEN, HIDDEN, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (w(x).view(b, s, -1, HIDDEN // HEADS).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).contiguous().view(b, s, -1))


class _FeedForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1, self.w3 = nn.Linear(HIDDEN, FFN, bias=False), nn.Linear(HIDDEN, FFN, bias=False)
        self.w2 = nn.Linear(FFN, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention_norm, self.ffn_norm = nn.RMSNorm(HIDDEN), nn.RMSNorm(HIDDEN)
        self.attention, self.feed_forward = _Attention(), _FeedForward()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


def _block(mesh: object, checkpointed: bool) -> nn.Module:
    gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    block = parallelize_module(_Block(), mesh, {
        "attention_norm": SequenceParallel(), "attention": gather,
        "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(),
        "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
    })
    return checkpoint_wrapper(block, preserve_rng_state=False) if checkpointed else block


def _short(name: str) -> str | None:
    """AG / RS for the sequence-parallel collectives, mm for a matrix multiply, None for anything else."""
    if "all_gather_into_tensor" in name:
        return "AG"
    if "reduce_scatter_tensor" in name:
        return "RS"
    return "mm" if name.startswith("aten.mm") else None


class _Recorder(TorchDispatchMode):
    """Eager mode: the ops below autograd, in issue order."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if (short := _short(str(func))) is not None:
            self.ops.append(short)
        return func(*args, **(kwargs or {}))


def _compact(ops: list[str]) -> str:
    """'AG mm x3 RS ...': runs of mm folded."""
    out: list[str] = []
    for op in ops:
        if op == "mm" and out and out[-1].startswith("mm"):
            count = int(out[-1][4:] or 1) + 1
            out[-1] = f"mm x{count}"
        else:
            out.append(op)
    return " ".join(out)


def _eager(mesh: object, checkpointed: bool) -> tuple[list[str], list[str]]:
    block = _block(mesh, checkpointed)
    x = torch.randn(BATCH, SEQ // TP, HIDDEN, requires_grad=True)
    forward, backward = _Recorder(), _Recorder()
    with forward:
        y = block(x)
    with backward:
        y.sum().backward()
    return forward.ops, backward.ops


class _Partitioned(Exception):
    """Raised once the partitioner has produced the forward and backward graphs (nothing needs to run)."""


def _compiled(mesh: object, checkpointed: bool) -> tuple[list[str], list[str]]:
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    graphs: list[list[str]] = []

    def partition(joint, inputs, **kwargs):
        for module in min_cut_rematerialization_partition(joint, inputs, **kwargs):
            graphs.append([s for n in module.graph.nodes if n.op == "call_function"
                           and (s := _short(str(n.target))) is not None])
        raise _Partitioned

    torch._dynamo.reset()
    block = torch.compile(_block(mesh, checkpointed), fullgraph=True, backend=aot_autograd(
        fw_compiler=lambda gm, _: gm.forward, partition_fn=partition))
    try:
        block(torch.randn(BATCH, SEQ // TP, HIDDEN, requires_grad=True))
    except Exception as error:  # Dynamo wraps the backend's exception
        if not graphs:
            raise error
    return graphs[0], graphs[1]


def main() -> None:
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=TP)
    mesh = init_device_mesh("cpu", (TP,))
    print("| mode | checkpoint | forward | backward (recompute included) | TP collectives | mm rerun / forward mm |")
    print("|---|---|---|---|---|---|")
    for mode, run in (("eager", _eager), ("torch.compile", _compiled)):
        plain_backward_mm = 0
        for checkpointed in (False, True):
            forward, backward = run(mesh, checkpointed)
            collectives = sum(op in ("AG", "RS") for op in forward + backward)
            backward_mm = backward.count("mm")
            rerun = f"{backward_mm - plain_backward_mm} / {forward.count('mm')}" if checkpointed else "-"
            plain_backward_mm = backward_mm
            print(f"| {mode} | {'full' if checkpointed else 'none'} | {_compact(forward)} | "
                  f"{_compact(backward)} | {collectives} | {rerun} |")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
