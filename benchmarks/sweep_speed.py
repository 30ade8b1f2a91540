"""How fast the layout search runs: the complete searches of issue 14, in layouts per second per core.

Usage::

    python benchmarks/sweep_speed.py                        # the three searches, 2 workers each
    python benchmarks/sweep_speed.py --search gpt3-175b     # one of them
    python benchmarks/sweep_speed.py --exhaustive           # simulate every layout that fits (no bound)
    python benchmarks/sweep_speed.py --workers 1

Each search is the complete one: every valid layout (tp, pp, dp, vpp, micro-batch size, recompute,
sequence parallelism on and off, ZeRO stage, every pipeline schedule) of

* gpt3-175b on 1024 A100 (dgx-a100-hdr), global batch 1536;
* megatron-529.6b on 2520 A100, global batch 2520 (Calculon's README case);
* llama2-7b on 64 A100, global batch 256.

Each runs in a fresh process (``simgrid.sweep.sweep``, best 20 exact), so its CPU time is its own: the
script prints wall time, CPU time (the search process and its workers together), and valid layouts
decided per second of CPU, i.e. per core. Targets: each search ranked in <= 60 s of wall time on 2 cores,
and >= 150 layouts/s per core. The load average is printed too: on a shared machine other work stretches
the wall time (not so much the CPU time). A report, not a test: exit status 0 whatever the verdicts.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

SEARCHES = {
    "gpt3-175b": ("gpt3-175b", "dgx-a100-hdr", 1024, 1536),
    "megatron-529.6b": ("megatron-529.6b", "dgx-a100-hdr", 2520, 2520),
    "llama2-7b": ("llama2-7b", "dgx-a100-hdr", 64, 256),
}
TARGET_WALL_S = 60.0
TARGET_PER_CORE = 150.0


def run_search(name: str, workers: int, exhaustive: bool) -> dict[str, object]:
    """One complete search in this process; its figures as a dict."""
    from simgrid.sweep import SweepConstraints, sweep

    model, cluster, gpus, gbs = SEARCHES[name]
    wall0, cpu0 = time.perf_counter(), time.process_time()
    result = sweep(model, cluster, gpus, gbs, constraints=SweepConstraints(sequence_parallel=(False, True)),
                   workers=workers, progress=True, exact_top=None if exhaustive else 20)
    wall = time.perf_counter() - wall0
    own = time.process_time() - cpu0
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    best = result.best()
    return {
        "search": name, "valid": result.enumerated, "tried": result.tried, "simulated": result.simulated,
        "memory_dropped": result.memory_dropped, "dominated": result.dominated, "bounded": result.bounded,
        "failed": len(result.failures), "wall_s": wall, "cpu_s": own + children.ru_utime + children.ru_stime,
        "main_cpu_s": own, "workers": result.workers,
        "best": f"dp={best['dp']} tp={best['tp']} pp={best['pp']} vpp={best['vpp']} zero={best['zero']} "
                f"mbs={best['mbs']} {best['schedule']} {best['recompute']}"
                f"{' sp' if best['sequence_parallel'] else ''}: {best['step_time_s']:.3f} s",
    }


def _report(r: dict[str, object]) -> str:
    wall, cpu, valid = float(r["wall_s"]), float(r["cpu_s"]), int(r["valid"])  # type: ignore[arg-type]
    per_core = valid / cpu if cpu > 0 else float("inf")
    return (
        f"{r['search']}: {valid} valid layouts ({r['tried']} candidates); simulated {r['simulated']}, "
        f"memory-dropped {r['memory_dropped']}, skipped by the bound {r['bounded']}, recompute-dominated "
        f"{r['dominated']}, failed {r['failed']}\n"
        f"  wall {wall:.1f} s, CPU {cpu:.1f} s ({r['workers']} workers; search process {float(r['main_cpu_s']):.1f} s)"  # type: ignore[arg-type]
        f" -> {valid / wall:.0f} layouts/s wall, {per_core:.0f} layouts/s per core\n"
        f"  targets: wall <= {TARGET_WALL_S:.0f} s {'met' if wall <= TARGET_WALL_S else 'MISSED'}, "
        f">= {TARGET_PER_CORE:.0f} layouts/s per core {'met' if per_core >= TARGET_PER_CORE else 'MISSED'}; "
        f"best {r['best']}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description="Benchmark the complete layout searches of issue 14.")
    parser.add_argument("--search", choices=sorted(SEARCHES), action="append", help="run only these searches")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--exhaustive", action="store_true", help="simulate every layout that fits (no bound)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_search(args.child, args.workers, args.exhaustive)))
        return 0
    for name in args.search or list(SEARCHES):
        load = " ".join(f"{v:.2f}" for v in os.getloadavg())
        cmd = [sys.executable, __file__, "--child", name, "--workers", str(args.workers)]
        out = subprocess.run(cmd + (["--exhaustive"] if args.exhaustive else []), stdout=subprocess.PIPE, text=True,
                             check=False)
        if out.returncode:
            print(f"{name}: FAILED (exit {out.returncode})")
            continue
        print(_report(json.loads(out.stdout.strip().splitlines()[-1])))
        print(f"  load average before {load}, after {' '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
