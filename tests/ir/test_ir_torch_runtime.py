"""Our exported torch CSVs run in torch's own pipeline runtime and train correctly.

For every pipeline schedule, on 2 and 4 gloo ranks, a program built by ``build_program`` is exported with
``to_torch_csv`` in both of torch's formats (``compute_only``, which torch lowers itself, and
``compute_comms``, which it runs as written), loaded by torch 2.13's ``_PipelineScheduleRuntime`` and
stepped once; every rank's stage gradients must equal a single-process reference. A ``compute_comms``
file without ``REDUCE_GRAD`` fails here with gradients m times too large (torch divides by the
micro-batch count only at that action).
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.torch, pytest.mark.slow]
pytest.importorskip("torch.distributed.pipelining", reason="torch is not installed (executor extra)")

#: (schedule, vpp, m) per world size: every schedule, interleaving with m not a multiple of pp included.
CASES = {
    2: [("gpipe", 1, 3), ("1f1b", 1, 4), ("interleaved-1f1b", 2, 4), ("interleaved-1f1b", 2, 3), ("zb-h1", 1, 4),
        ("interleaved-zb", 2, 4), ("looped-bfs", 2, 3), ("zbv", 2, 3), ("dualpipev", 2, 5)],
    4: [("gpipe", 1, 4), ("1f1b", 1, 6), ("interleaved-1f1b", 2, 8), ("interleaved-1f1b", 2, 6), ("zb-h1", 1, 5),
        ("interleaved-zb", 2, 4), ("looped-bfs", 2, 4), ("zbv", 2, 7), ("dualpipev", 2, 8)],
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run_world(world: int, cases: list[dict[str, Any]], out: Path) -> list[list[dict[str, Any]]]:
    import torch.multiprocessing as mp
    from torch_runtime_workers import run

    context = mp.start_processes(run, args=(world, _free_port(), cases, str(out)), nprocs=world, join=False,
                                 start_method="spawn")
    try:
        while not context.join(timeout=240):
            pass
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(world)]


@pytest.mark.parametrize("world", sorted(CASES))
def test_exported_csvs_train_like_a_single_process_in_torchs_runtime(world: int, tmp_path: Path) -> None:
    """compute_only and compute_comms CSVs of every schedule give the reference gradients on every rank."""
    cases = [{"schedule": s, "vpp": v, "m": m, "format": fmt}
             for s, v, m in CASES[world] for fmt in ("compute_only", "compute_comms")]
    results = _run_world(world, cases, tmp_path)
    for rank, rows in enumerate(results):
        assert len(rows) == len(cases), f"rank {rank} stopped: {rows[-1]}"
        failed = [f"{r['schedule']} vpp {r['vpp']} m {r['m']} {r['format']}: {r['problem']}" for r in rows if r["problem"]]
        assert not failed, f"rank {rank}: " + "\n".join(failed)
