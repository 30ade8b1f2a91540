"""Module-level worker functions for the launcher tests (spawned processes import them by name)."""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from executor.launch import RankContext


def all_reduce_rank_plus_one(ctx: RankContext, payload: Any) -> dict[str, Any]:
    """Sum (rank + 1) over the world and over the named groups; report threads and the port env."""
    t = torch.tensor([float(ctx.rank + 1)])
    dist.all_reduce(t)
    sums = {"world": float(t)}
    for name, group in ctx.groups.items():
        g = torch.tensor([float(ctx.rank + 1)])
        dist.all_reduce(g, group=group)
        sums[name] = float(g)
    return {"sums": sums, "threads": torch.get_num_threads()}


def fail_on_rank_one(ctx: RankContext, payload: Any) -> None:
    """Rank 1 raises inside a named op; rank 0 waits in a collective that never completes."""
    ctx.report_op("F s0 m0 b1:2")
    if ctx.rank == 1:
        raise ValueError("boom")
    dist.barrier()


def stall_on_rank_one(ctx: RankContext, payload: Any) -> None:
    """Rank 1 sleeps instead of joining the all-reduce, so rank 0's collective times out."""
    ctx.report_op("ALLREDUCE tp b3:fwd")
    if ctx.rank == 1:
        time.sleep(payload)
        return
    dist.all_reduce(torch.ones(4))
