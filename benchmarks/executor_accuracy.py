"""Predicted vs measured step time on this machine: calibrate, then run and simulate five 2-rank layouts.

Usage: ``python benchmarks/executor_accuracy.py [--profile P] [--skip-calibrate] [--steps K] [--doc PATH]``.
Prints one line per layout (predicted, measured, relative error, numerics), the mean absolute error and the
load average, and writes the same table with the date and the discussion to ``docs/executor_accuracy.md``.
Targets from issue 5: within 15% for each layout and 10% on average (2 ranks, gloo, small-gpt).

Calibration never runs a validated program: it runs micro-benchmarks and small in-situ programs with one
micro-batch (two for PP); the validated layouts have two (four for PP) (see executor.calibrate).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
from pathlib import Path
from typing import Any

from executor.calibrate import calibrate
from executor.validate import validate_layout
from simgrid.layout.spec import Layout
from simgrid.model.presets import get_model

LAYOUTS = {
    "DP2": Layout(dp=2, micro_batch_size=1, global_batch_size=4, precision="fp32"),
    "TP2": Layout(tp=2, micro_batch_size=1, global_batch_size=2, precision="fp32"),
    "PP2-1F1B": Layout(pp=2, schedule="1f1b", micro_batch_size=1, global_batch_size=4, precision="fp32"),
    "PP2-GPipe": Layout(pp=2, schedule="gpipe", micro_batch_size=1, global_batch_size=4, precision="fp32"),
    "ZeRO-3": Layout(dp=2, zero=3, micro_batch_size=1, global_batch_size=4, precision="fp32"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", default="out/localhost-gloo.toml", help="profile to write (or reuse)")
    parser.add_argument("--skip-calibrate", action="store_true", help="reuse an existing profile")
    parser.add_argument("--steps", type=int, default=16, help="real steps per layout (the first is warm-up)")
    parser.add_argument("--trials", type=int, default=3,
                        help="validate every layout this many times against one calibration (default 3): "
                             "identical runs differ by a few percent on a shared host, so one table is one sample")
    parser.add_argument("--doc", default=str(Path(__file__).resolve().parents[1] / "docs" / "executor_accuracy.md"),
                        help="Markdown report to write ('' to skip)")
    parser.add_argument("--json", help="also write the tables as JSON here")
    parser.add_argument("--model", default="small-gpt",
                        help="model preset (default small-gpt: a step is compute, not Python dispatch)")
    args = parser.parse_args()
    if args.trials < 1 or args.steps < 2:
        parser.error(f"--trials = {args.trials} and --steps = {args.steps} must be >= 1 and >= 2 (one warm-up step)")
    model = get_model(args.model)
    load_before = os.getloadavg()
    calibration = f"reused the existing profile {args.profile}"
    if not (args.skip_calibrate and Path(args.profile).exists()):
        Path(args.profile).parent.mkdir(parents=True, exist_ok=True)
        print(f"calibrating on {model.name} (about a minute) ...", flush=True)
        spec, fit = calibrate(model, world_size=2, out=args.profile)
        calibration = (f"compute slowdown under communication {spec.node.gpu.comm_compute_slowdown:.0%}; "
                       f"fallback compute fit {fit.describe()}, used only for unmeasured ops")
        print(f"calibrated: {calibration}")
        if fit.drift_warning():
            print(fit.drift_warning())
    header = f"{'layout':<11}{'predicted ms':>14}{'measured ms':>14}{'error':>9}{'host speed':>12}  numerics"
    lines: list[str] = []
    trials: list[list[dict[str, Any]]] = []
    for trial in range(1, args.trials + 1):
        rows: list[dict[str, Any]] = []
        lines += [f"trial {trial} of {args.trials}", header]
        print(lines[-2], lines[-1], sep="\n", flush=True)
        for name, layout in LAYOUTS.items():
            report = validate_layout(model, layout, profile=args.profile, steps=args.steps)
            rows.append({"layout": name, **report.to_json_dict()})
            line = (f"{name:<11}{report.predicted_step_s * 1e3:>14.2f}{report.measured_step_s * 1e3:>14.2f}"
                    f"{report.error:>+9.1%}{report.host_speed:>12.2f}  "
                    f"{'match' if report.numerics_match else 'MISMATCH'}")
            lines.append(line)
            print(line, flush=True)
        lines.append(_verdict(rows))
        print(lines[-1], flush=True)
        trials.append(rows)
    met = sum(_met(rows) for rows in trials)
    all_errors = [abs(float(r["error"])) for rows in trials for r in rows]
    summary = [f"targets met in {met} of {len(trials)} trials; over all trials mean |error| "
               f"{sum(all_errors) / len(all_errors):.1%}, worst {max(all_errors):.1%}",
               f"load average (1, 5, 15 min): before {_load(load_before)}, after {_load(os.getloadavg())} "
               f"on {os.cpu_count()} cores"]
    for line in summary:
        print(line)
    if args.doc:
        Path(args.doc).write_text(_document(lines + summary, calibration, args.steps, model.name))
        print(f"wrote {args.doc}")
    if args.json:
        Path(args.json).write_text(json.dumps({"trials": trials}, indent=1))


def _met(rows: list[dict[str, Any]]) -> bool:
    errors = [abs(float(r["error"])) for r in rows]
    return max(errors) <= 0.15 and sum(errors) / len(errors) <= 0.10


def _verdict(rows: list[dict[str, Any]]) -> str:
    errors = [abs(float(r["error"])) for r in rows]
    return (f"mean |error| {sum(errors) / len(errors):.1%}, worst {max(errors):.1%} "
            f"(targets: each <= 15%, mean <= 10%: {'met' if _met(rows) else 'NOT met'})")


def _load(values: tuple[float, float, float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


def _document(table: list[str], calibration: str, steps: int, model: str) -> str:
    """docs/executor_accuracy.md: the table as printed, when and how it was made, and what limits it."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    body = "\n".join(table)
    return DOC_TEMPLATE.format(date=now, table=body, calibration=calibration, steps=steps, model=model)


DOC_TEMPLATE = """# Executor accuracy: predicted vs measured step time on this machine

Generated {date} by `python benchmarks/executor_accuracy.py` (calibrates once, then validates every layout
in each trial; {steps} real steps per layout, the first excluded as warm-up, the median of the rest is the
measured step). Regenerate with the same command (`--skip-calibrate --profile P` reuses a profile,
`--trials N` sets the number of trials). Model {model}, 2 ranks, gloo on CPU, fp32; the target (issue 5)
is within 15% per layout and 10% on average.

```
{table}
```

Calibration: {calibration}.

## Why `small-gpt`, not `tiny-gpt`

gloo on this 2-core VM completes a small collective either in ~0.3 ms or after a ~4 ms scheduler tick
(256 B all-reduce, 2 ranks, loopback: median 0.5 ms, mean 1.7 ms, 90th percentile 4.1 ms; raw TCP
ping-pong between the same two processes is 30 us). `perf` shows gloo's `gloo_tcp_loop` thread spinning
in `epoll_wait` while an operation is pending, so a woken thread often waits for the spinner's time
slice to end. tiny-gpt (h = 64, s = 32) has steps of 30-150 ms made of hundreds of sub-millisecond ops, so
that jitter decided its step time: identical tiny-gpt runs differed by up to 30% (TP2) and two
calibrations predicted its TP2 step as 80 ms and 190 ms. small-gpt (4 layers, h = 256, s = 256, V = 2048)
has steps of 0.3-0.6 s of real compute, where the jitter is a few percent, as it is for a GPU step, which
is the regime the simulator is built for. The executor's numerics tests keep using tiny-gpt.

## How the prediction is made

`simgrid-exec calibrate` (`executor/calibrate.py`) writes a self-contained profile whose measured tables
hold (warm-up excluded; 10%-trimmed means, because a step is a sum of many op times and the median of a
sum tends to the sum of the means, while gloo's latency is bimodal):

* every collective the executor issues, by kind and size, and send/recv by size (micro-benchmarks, both
  ranks synchronised by a barrier), at a fixed grid of sizes plus every message size the model's
  calibration programs issue (gradient buckets, gathered ZeRO-3 blocks, activations), so the tables hold
  the model's own messages instead of interpolating between grid points;
* synchronous collectives (waited right after they are issued, as tensor parallelism's all-reduces are)
  also timed in situ, from the end of the issue to the end of the wait, in the calibration programs;
  those rows replace the micro-benchmark's at the same kind and size, because inside a step such a
  collective also pays for the peer arriving late and for gloo's wake-up after compute (a 256 KiB
  all-reduce: 1.2 ms alone after a barrier, 2.5 ms in a TP step);
* the CPU slowdown of compute while gloo communicates: both ranks run the same matmul loop alone and with
  an all-reduce always queued in gloo's background thread; the lost fraction becomes the profile's
  `comm_compute_slowdown`, which the engine applies to compute that overlaps communication;
* every compute op signature of the model (kind, blocks, FLOPs) timed in situ in a 2-process world while
  the other rank is busy too, and the interpreter's host work per non-compute op (issuing a collective
  including the tensor preparation it does, the completion callback at a WAIT, ALLOC/FREE bookkeeping,
  the per-op dispatch loop). These come from small programs (one micro-batch; two for PP) of the DP,
  TP, PP and ZeRO-3 layouts; the validated programs (two micro-batches; four for PP) are never run
  during calibration. Compute samples taken while communication was in flight are dropped when quiet
  samples exist, so the slowdown is not counted twice;
* a host-speed probe (a fixed loop of small forward/backward torch ops on both ranks at once) just before
  and after the in-situ programs.

Around each validated run the probe is run again; the ratio calibration probe / current probe is the
"host speed" column, a diagnostic of other load on the machine (1 = as calibrated). It is not used to
correct the prediction (`validate_layout(..., correct_host_speed=True)` would): with bursty background
load the probe, taken just before and after the run, misses the bursts that hit the run.

`executor/validate.py` simulates the validated Program with `simgrid.engine.simulate_program` and
`executor.costmodel.MeasuredCostModel`: compute ops cost their measured row, collectives and send/recv
their interpolated table time, and each rank's host work is added to the neighbouring compute op (issue
work before the collective it issues, completion work after its WAIT), since it runs on the same host
thread and delays the compute stream. Nothing in the profile comes from the runs being validated.

## What limits the accuracy

* Run-to-run noise. Three back-to-back runs of the same small-gpt program differ by 2-7% in their
  median step (measured 2026-11-22 on a quiet machine), so one trial's error carries a few percent of
  noise; read the trials together.
* The host's state during calibration. Every prediction comes from one calibration, so other load
  during it moves all of them together. On 2026-11-22, 06:25-06:45 UTC, the VM was noisy: the host-speed
  probe read 0.3-1.4 between layouts, against 0.9-1.3 for the table above. Two more calibrations then met
  the targets in 1 of 2 and 0 of 3 trials (mean |error| 10.7% and 10.5%). The predictions moved with the
  calibration: DP2 was predicted at 322, 352 and 325 ms. The measured steps did not move: in the trial
  where the probe read near 1, every layout's measured step fell inside the spread of the table above
  (DP2 356 ms, PP2-1F1B 405 ms, ZeRO-3 605 ms). So the misses are calibration noise, not a slower
  executor. Calibrate on a quiet machine. `simgrid-exec calibrate` and this script now warn when the
  host-speed probe moves by more than 15% while calibrating. Re-run the trials if the host-speed column
  strays far from 1.
* TP2 is the noisiest layout: its two ranks meet at a synchronous all-reduce after every attention and
  MLP block, so every gloo wake-up delay lands on the critical path of both ranks.
* Per-op host costs are trimmed means per op signature; the real cost of the same op varies with what is
  pending (segments finished lazily when a result is first needed, allocator state).
* Measured communication rows end when the interpreter first observed completion (an upper bound), so
  per-kind communication times are not comparable between prediction and measurement; the step time is.
"""


if __name__ == "__main__":
    main()
