"""How fast the layout search runs: enumeration, memory filter, and simulated layouts per second.

Usage::

    python benchmarks/sweep_speed.py                       # llama2-7b on 64 A100s, 40 layouts
    python benchmarks/sweep_speed.py --model gpt3-175b --gpus 1024 --gbs 1536 --limit 20
    python benchmarks/sweep_speed.py --limit 500           # the issue's target: 500 layouts < 60 s

Layouts are taken evenly spread over the enumerated space that fits in memory (every k-th one), so a
limited run sees the same mix of small and large pipelines as the full sweep. The target of the issue
is 500 layouts in under a minute on this machine's two cores, i.e. >= 8.3 layouts/s.
"""

from __future__ import annotations

import argparse
import os
import time

TARGET_LAYOUTS = 500
TARGET_S = 60.0


def main() -> None:
    from simgrid.hardware import load_cluster
    from simgrid.memory import estimate_memory
    from simgrid.model import get_model
    from simgrid.sweep import cheapest_recompute, enumerate_layout_space, sweep_layouts

    parser = argparse.ArgumentParser(description="Benchmark the layout search (layouts per second).")
    parser.add_argument("--model", default="llama2-7b")
    parser.add_argument("--cluster", default="dgx-a100-hdr")
    parser.add_argument("--gpus", type=int, default=64)
    parser.add_argument("--gbs", type=int, default=256)
    parser.add_argument("--limit", type=int, default=500, help="layouts to simulate (spread over the space)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()

    model = get_model(args.model)
    cluster = load_cluster(args.cluster, gpus=args.gpus)
    t0 = time.perf_counter()
    space = enumerate_layout_space(model, cluster, gpus=args.gpus, global_batch=args.gbs)
    t1 = time.perf_counter()
    fitting = [lay for lay in space.layouts if estimate_memory(model, lay, cluster.gpu).fits]
    t2 = time.perf_counter()
    kept = cheapest_recompute(fitting)
    step = max(1, len(fitting) // max(1, args.limit))
    chosen = fitting[::step][: args.limit]
    print(f"{args.model} on {args.gpus} GPUs of {args.cluster}, gbs {args.gbs}, {args.workers} workers")
    # Other work on the machine slows the workers: report the load so a number can be judged.
    print(f"load average before: {_load_average()}")
    print(f"enumerate: {space.tried} candidates, {len(space.layouts)} valid in {t1 - t0:.2f} s "
          f"({space.tried / max(t1 - t0, 1e-9):,.0f} candidates/s)")
    print(f"memory filter: {len(fitting)} of {len(space.layouts)} fit, {t2 - t1:.2f} s "
          f"({len(space.layouts) / max(t2 - t1, 1e-9):,.0f} layouts/s); {len(kept)} left after skipping "
          "recompute variants of fitting layouts")
    start = time.perf_counter()
    result = sweep_layouts(model, args.cluster, args.gpus, chosen, workers=args.workers, progress=True,
                           cluster=cluster, prune_recompute=False)
    wall = time.perf_counter() - start
    rate = len(chosen) / wall if wall > 0 else float("inf")
    print(f"simulate: {len(chosen)} layouts ({len(result.failures)} failed) in {wall:.1f} s "
          f"= {rate:.2f} layouts/s (incl. worker start-up)")
    print(f"load average after: {_load_average()}")
    projected = TARGET_LAYOUTS / rate if rate > 0 else float("inf")
    verdict = "meets" if projected <= TARGET_S else "MISSES"
    print(f"projected {TARGET_LAYOUTS} layouts: {projected:.0f} s -> {verdict} the {TARGET_S:.0f} s target")
    if not result.table.empty:
        best = result.best()
        print(f"best of the sample: dp={best['dp']} tp={best['tp']} pp={best['pp']} vpp={best['vpp']} "
              f"zero={best['zero']} mbs={best['mbs']} {best['schedule']} {best['recompute']}: "
              f"{best['step_time_s']:.3f} s, MFU {100 * best['mfu']:.1f}%")


def _load_average() -> str:
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:  # not available on this platform
        return "n/a"


if __name__ == "__main__":
    main()
