"""Engine speed benchmark (issue 4): CPU and wall time and peak memory of one simulated step per case.

Run from the repository root::

    python benchmarks/engine_speed.py                # every case, each in a fresh process
    python benchmarks/engine_speed.py gpt3-1024      # one case
    python benchmarks/engine_speed.py --repeat 5     # five runs of each case; medians printed
    python benchmarks/engine_speed.py --engine simpy # the same cases on the SimPy interpreter

Each run of a case is its own subprocess so that its peak RSS (``ru_maxrss`` of the child) is its own.
Targets: gpt3-175b on 1024 A100 under 2 s (program build at stage granularity included); llama3-405b
(the real 126 layers, 7 on the first and last of 16 stages, 8 elsewhere) on 16,384 H100 under 10 s and
4 GB; full mode of the 1024-GPU case under 60 s; full mode of gpt3-175b on 4096 A100 (dp 64, 96
micro-batches per replica: 7.5 million ops) under 10 s (issue 14). The ``-tpo`` cases are gpt3-175b at tp 8,
pp 16, dp 8 with Transformer Engine's TP communication overlap (every GEMM chunk and ring-exchange step an op:
921,600 GEMM-chunk ops over the 16 pipeline ranks at block granularity); their targets are the plain cases' (stage: 2 s as gpt3-1024;
block: 10 s), not the issue's; the ``-sp`` cases are the same layouts without the overlap (sequence parallelism still on). The plain cases run
:func:`simgrid.simulate` on the built program (trace, metrics, memory report and the saved memory
timeline, as a user gets them; the fast engine defers the trace rows until something reads them). The
``-step`` case runs the same step through :func:`simgrid.engine.fast.simulate_step`, the metrics only
(what the layout search does); the ``-rows`` case is ``simulate`` and then reading every trace row (what a
Gantt chart or an export costs on top). ``--engine simpy`` runs the plain cases on the SimPy interpreter
(:func:`simgrid.engine.simulate_program` and :func:`simgrid.metrics.compute_metrics` of its trace).
The targets are for one core: the verdict is printed
for CPU time (``time.process_time``) and for wall time, since on a shared machine wall time also counts
the time other processes held the core. This is a report, not a test: the exit status is 0 whatever the
verdicts (2 only for an unknown case name).
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Case:
    """One benchmark configuration and its targets."""

    name: str
    model: str
    cluster: str
    tp: int
    pp: int
    dp: int
    gbs: int
    seq: int | None
    mode: str
    target_s: float
    target_gb: float | None = None
    path: str = "trace"
    """``trace``: simulate (SimPy: simulate_program + compute_metrics); ``step``: simulate_step + summary_metrics;
    ``rows``: simulate, then read every trace row."""
    sequence_parallel: bool = False
    """Megatron's sequence parallelism (on whenever ``tp_comm_overlap`` is)."""
    tp_comm_overlap: bool = False
    """Transformer Engine's TP communication overlap (with sequence parallelism, which it needs): every GEMM
    chunk and ring-exchange step is an op."""
    granularity: str = "stage"
    """Program granularity built and simulated."""


CASES = (
    Case("gpt3-1024", "gpt3-175b", "dgx-a100-hdr", 8, 8, 16, 1536, None, "symmetric", 2.0),
    Case("llama3-405b-16k", "llama3-405b", "dgx-h100-ndr", 8, 16, 128, 2048, 8192, "symmetric", 10.0, 4.0),
    Case("gpt3-1024-full", "gpt3-175b", "dgx-a100-hdr", 8, 8, 16, 1536, None, "full", 60.0),
    Case("gpt3-4096-full", "gpt3-175b", "dgx-a100-hdr", 8, 8, 64, 6144, None, "full", 10.0),
    Case("gpt3-4096-full-step", "gpt3-175b", "dgx-a100-hdr", 8, 8, 64, 6144, None, "full", 10.0, path="step"),
    Case("gpt3-4096-full-rows", "gpt3-175b", "dgx-a100-hdr", 8, 8, 64, 6144, None, "full", 10.0, path="rows"),
    Case("gpt3-1024-sp", "gpt3-175b", "dgx-a100-hdr", 8, 16, 8, 1536, None, "symmetric", 2.0,
         sequence_parallel=True),
    Case("gpt3-1024-sp-block", "gpt3-175b", "dgx-a100-hdr", 8, 16, 8, 1536, None, "symmetric", 10.0,
         sequence_parallel=True, granularity="block"),
    Case("gpt3-1024-tpo", "gpt3-175b", "dgx-a100-hdr", 8, 16, 8, 1536, None, "symmetric", 2.0, tp_comm_overlap=True),
    Case("gpt3-1024-tpo-block", "gpt3-175b", "dgx-a100-hdr", 8, 16, 8, 1536, None, "symmetric", 10.0,
         tp_comm_overlap=True, granularity="block"),
)


def run_case(case: Case, engine: str = "auto") -> dict[str, object]:
    """Build and simulate one step in this process: CPU and wall time of each part, and peak RSS."""
    from simgrid import simulate
    from simgrid.engine import simulate_program
    from simgrid.engine.fast import simulate_step, summary_metrics
    from simgrid.hardware import load_cluster
    from simgrid.layout import Layout
    from simgrid.metrics import compute_metrics
    from simgrid.model import get_model
    from simgrid.schedules import build_program

    model = get_model(case.model)
    if case.seq is not None:
        model = model.with_seq_length(case.seq)
    layout = Layout(dp=case.dp, tp=case.tp, pp=case.pp, micro_batch_size=1, global_batch_size=case.gbs,
                    schedule="1f1b", sequence_parallel=case.sequence_parallel or case.tp_comm_overlap,
                    tp_comm_overlap=case.tp_comm_overlap)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    program = build_program(model, layout, granularity=case.granularity)  # type: ignore[arg-type]
    wall1, cpu1 = time.perf_counter(), time.process_time()
    cluster = load_cluster(case.cluster, gpus=layout.world_size)
    peak = cluster.gpu.peak_flops(layout.precision)
    if case.path == "step":
        summary = simulate_step(program, cluster, mode=case.mode)
        metrics = summary_metrics(summary, model=model, layout=layout, peak_flops_per_gpu=peak,
                                  memory_capacity_bytes=cluster.gpu.memory_bytes)
        mode, simulated, rows = summary.mode, len(summary.weights), 0
    elif engine == "auto":
        run = simulate(model, cluster, layout, mode=case.mode, program=program)
        if case.path == "rows":
            run.trace.timing_rows  # noqa: B018 - make every row
        metrics, mode, simulated, rows = run.metrics, run.engine.mode, len(run.engine.simulated_ranks), len(run.trace)
    else:
        result = simulate_program(program, cluster, mode=case.mode, engine=engine)
        metrics = compute_metrics(result.trace, model=model, layout=layout, peak_flops_per_gpu=peak,
                                  peak_memory_bytes=result.memory.peak_bytes,
                                  memory_capacity_bytes=result.memory.capacity_bytes)
        mode, simulated, rows = result.mode, len(result.simulated_ranks), len(result.trace)
    wall2, cpu2 = time.perf_counter(), time.process_time()
    rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9
    return {
        "case": case.name, "model": model.name, "layers": model.num_layers, "world": layout.world_size,
        "wall_s": wall2 - wall0, "cpu_s": cpu2 - cpu0, "build_wall_s": wall1 - wall0,
        "build_cpu_s": cpu1 - cpu0, "engine_wall_s": wall2 - wall1, "engine_cpu_s": cpu2 - cpu1,
        "peak_rss_GB": rss_gb, "mode": mode, "simulated_ranks": simulated,
        "ops": program.num_ops, "trace_rows": rows, "step_time_s": metrics.step_time_s,
        "mfu": metrics.mfu, "target_s": case.target_s, "target_GB": case.target_gb,
        "engine": {"step": "fast (step)", "rows": "auto, rows read"}.get(case.path, engine),
        "granularity": case.granularity, "tp_comm_overlap": case.tp_comm_overlap,
        "sequence_parallel": case.sequence_parallel or case.tp_comm_overlap,
    }


def _verdict(seconds: float, rss_gb: float, r: dict[str, object]) -> str:
    target_s, target_gb = float(r["target_s"]), r["target_GB"]  # type: ignore[arg-type]
    ok = seconds < target_s and (target_gb is None or rss_gb < float(target_gb))  # type: ignore[arg-type]
    return "met" if ok else "MISSED"


def _report(runs: list[dict[str, object]]) -> str:
    """One case's line: medians over its runs (min..max when there are several)."""
    def med(key: str) -> float:
        return statistics.median(float(r[key]) for r in runs)  # type: ignore[arg-type]

    def spread(key: str) -> str:
        values = [float(r[key]) for r in runs]  # type: ignore[arg-type]
        return f" [{min(values):.2f}..{max(values):.2f}]" if len(values) > 1 else ""

    r = runs[0]
    gb = f" and < {r['target_GB']:g} GB" if r["target_GB"] else ""
    cpu, wall, rss = med("cpu_s"), med("wall_s"), med("peak_rss_GB")
    return (
        f"{r['case']}: {r['model']} ({r['layers']} layers) on {r['world']} GPUs, {r['mode']} mode, "
        f"{r['granularity']} granularity{', sequence parallel' if r['sequence_parallel'] else ''}"
        f"{', TP comm overlap' if r['tp_comm_overlap'] else ''}, "
        f"engine {r['engine']}, "
        f"{r['simulated_ranks']} ranks simulated, {r['ops']} ops, {r['trace_rows']} trace rows; "
        f"step {float(r['step_time_s']):.3f} s, MFU {float(r['mfu']):.1%}\n"  # type: ignore[arg-type]
        f"  {'median of ' + str(len(runs)) + ' runs' if len(runs) > 1 else '1 run'}: "
        f"build CPU {med('build_cpu_s'):.2f} s{spread('build_cpu_s')}, "
        f"engine CPU {med('engine_cpu_s'):.2f} s{spread('engine_cpu_s')}, "
        f"total CPU {cpu:.2f} s{spread('cpu_s')}, wall {wall:.2f} s{spread('wall_s')}, "
        f"peak RSS {rss:.2f} GB{spread('peak_rss_GB')}\n"
        f"  target < {r['target_s']:g} s{gb}: CPU {_verdict(cpu, rss, r)}, wall {_verdict(wall, rss, r)} "
        f"(load average {os.getloadavg()[0]:.1f})"
    )


def main(argv: list[str]) -> int:
    """Run the named cases (default: all), each run in a subprocess, and print each case's medians."""
    if "--help" in argv or "-h" in argv:
        print(__doc__)
        print(f"cases: {', '.join(c.name for c in CASES)}")
        return 0
    if len(argv) == 3 and argv[0] == "--child":
        case = next(c for c in CASES if c.name == argv[1])
        print(json.dumps(run_case(case, argv[2])))
        return 0
    engine = "auto"
    if "--engine" in argv:
        at = argv.index("--engine")
        engine = argv[at + 1] if at + 1 < len(argv) else ""
        if engine not in ("auto", "fast", "simpy"):
            print("--engine needs auto, fast or simpy", file=sys.stderr)
            return 2
        argv = argv[:at] + argv[at + 2:]
    repeat = 1
    if "--repeat" in argv:
        at = argv.index("--repeat")
        try:
            repeat = int(argv[at + 1])
        except (IndexError, ValueError):
            print("--repeat needs a whole number of runs, e.g. --repeat 5", file=sys.stderr)
            return 2
        argv = argv[:at] + argv[at + 2:]
    names = argv or [c.name for c in CASES if not (engine == "simpy" and c.path != "trace")]
    unknown = [n for n in names if n not in {c.name for c in CASES}]
    if unknown:
        print(f"unknown case(s) {unknown}; known: {[c.name for c in CASES]}", file=sys.stderr)
        return 2
    for name in names:
        runs = []
        for _ in range(max(1, repeat)):
            out = subprocess.run([sys.executable, __file__, "--child", name, engine], capture_output=True, text=True)
            if out.returncode:
                print(f"{name}: FAILED\n{out.stderr[-3000:]}")
                break
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        if runs:
            print(_report(runs), flush=True)
    return 0

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
