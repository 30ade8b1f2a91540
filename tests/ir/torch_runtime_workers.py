"""Worker for test_ir_torch_runtime: run our exported CSVs in torch's own pipeline runtime (spawned by name).

Every rank builds the same seeded model (one ``Linear + Tanh`` per pipeline stage) and computes the
single-process reference gradients itself, then runs one training step of each case through
``torch.distributed.pipelining``'s ``_PipelineScheduleRuntime`` loaded from the CSV that
:func:`simgrid.ir.to_torch_csv` wrote for a program built by :func:`simgrid.schedules.build_program`, and
compares the gradients of the stages it holds with the reference's.
"""

from __future__ import annotations

import copy
import json
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

from simgrid.ir import to_torch_csv
from simgrid.layout import Layout
from simgrid.model.spec import ModelSpec
from simgrid.schedules import build_program, rank_stages

WIDTH = 8
MICRO_BATCH = 2


def _model(num_stages: int) -> list[nn.Module]:
    torch.manual_seed(1234)
    return [nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh()) for _ in range(num_stages)]


def _reference(stages: list[nn.Module], x: torch.Tensor, y: torch.Tensor) -> list[list[torch.Tensor]]:
    """Gradients of the mean-squared error over the whole batch (= the mean of the equal-sized
    micro-batches' losses, which torch's runtime reproduces by dividing the summed gradients by m)."""
    out = x
    for stage in stages:
        out = stage(out)
    nn.functional.mse_loss(out, y).backward()
    return [[p.grad.detach().clone() for p in stage.parameters()] for stage in stages]


def one_case(rank: int, pp: int, case: dict[str, Any], out_dir: Path) -> str:
    """Run one (schedule, vpp, m, format) case; '' when every local gradient matches, else the mismatch."""
    schedule, vpp, m, fmt = case["schedule"], case["vpp"], case["m"], case["format"]
    layout = Layout(pp=pp, vpp=vpp, schedule=schedule, global_batch_size=m)
    model = ModelSpec(name="tiny-8", num_layers=8, hidden_size=64, num_heads=4, vocab_size=256, seq_length=32)
    path = out_dir / f"{schedule}-v{vpp}-m{m}-{fmt}-r{rank}.csv"
    path.write_text(to_torch_csv(build_program(model, layout), fmt), newline="")
    num_stages = layout.num_stages
    stages = _model(num_stages)
    copies = [copy.deepcopy(s) for s in stages]
    torch.manual_seed(99)
    x, y = torch.randn(m * MICRO_BATCH, WIDTH), torch.randn(m * MICRO_BATCH, WIDTH)
    reference = _reference(stages, x, y)
    mine = rank_stages(rank, pp, vpp, schedule)
    pipe_stages = [PipelineStage(copies[s], s, num_stages, torch.device("cpu")) for s in mine]
    runtime = _PipelineScheduleRuntime(pipe_stages, n_microbatches=m, loss_fn=nn.functional.mse_loss)
    runtime._load_csv(str(path), format=fmt)
    runtime.step(x, target=y)
    problems = []
    for s in mine:
        for got, want in zip((p.grad for p in copies[s].parameters()), reference[s], strict=True):
            if got is None or not torch.allclose(got, want, rtol=1e-5, atol=1e-7):
                ratio = float(got.norm() / want.norm()) if got is not None else 0.0
                problems.append(f"stage {s}: gradient off by a factor {ratio:.3f}")
    return "; ".join(problems)


def run(rank: int, world: int, port: int, cases: list[dict[str, Any]], out_dir: str) -> None:
    """Spawned entry: one process group, every case in turn, results written to ``out_dir/rank{r}.json``."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    results = []
    try:
        for case in cases:
            try:
                results.append({**case, "problem": one_case(rank, world, case, Path(out_dir))})
            except Exception:  # report and stop: the peers of a failed step cannot continue either
                results.append({**case, "problem": traceback.format_exc(limit=3)})
                break
    finally:
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
        dist.destroy_process_group()
