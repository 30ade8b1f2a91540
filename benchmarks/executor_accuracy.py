"""Predicted vs measured step time on this machine: calibrate, then run and simulate five 2-rank layouts.

Usage: ``python benchmarks/executor_accuracy.py [--profile P] [--skip-calibrate] [--steps K] [--doc PATH]``.
Prints one line per layout (predicted, measured, relative error, numerics), the mean absolute error and the
load average, and writes the same table with the date and the discussion to ``docs/executor_accuracy.md``.
Targets from issue 5: within 15% for each layout and 10% on average (2 ranks, gloo, tiny-gpt).

Calibration never runs a validated program: it runs micro-benchmarks and small in-situ programs with one
micro-batch (two for PP); the validated layouts have two (four for PP) (see executor.calibrate).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
from pathlib import Path

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
    parser.add_argument("--steps", type=int, default=12, help="real steps per layout (the first is warm-up)")
    parser.add_argument("--doc", default=str(Path(__file__).resolve().parents[1] / "docs" / "executor_accuracy.md"),
                        help="Markdown report to write ('' to skip)")
    parser.add_argument("--json", help="also write the table as JSON here")
    args = parser.parse_args()
    model = get_model("tiny-gpt")
    load_before = os.getloadavg()
    calibration = f"reused the existing profile {args.profile}"
    if not (args.skip_calibrate and Path(args.profile).exists()):
        Path(args.profile).parent.mkdir(parents=True, exist_ok=True)
        spec, fit = calibrate(model, world_size=2, out=args.profile)
        calibration = (f"compute slowdown under communication {spec.node.gpu.comm_compute_slowdown:.0%}; "
                       f"fallback compute fit {fit.bandwidth_Bps / 1e9:.2f} GB/s, {fit.overhead_s * 1e6:.1f} us/kernel "
                       f"(mean error {fit.mean_abs_error:.0%} over {fit.samples} ops, used only for unmeasured ops)")
        print(f"calibrated: {calibration}")
    rows = []
    lines = [f"{'layout':<11}{'predicted ms':>14}{'measured ms':>14}{'error':>9}{'host speed':>12}  numerics"]
    print(lines[0])
    for name, layout in LAYOUTS.items():
        report = validate_layout(model, layout, profile=args.profile, steps=args.steps)
        rows.append({"layout": name, **report.to_json_dict()})
        line = (f"{name:<11}{report.predicted_step_s * 1e3:>14.2f}{report.measured_step_s * 1e3:>14.2f}"
                f"{report.error:>+9.1%}{report.host_speed:>12.2f}  {'match' if report.numerics_match else 'MISMATCH'}")
        lines.append(line)
        print(line)
    mean = sum(abs(r["error"]) for r in rows) / len(rows)
    worst = max(abs(r["error"]) for r in rows)
    load_after = os.getloadavg()
    met = "met" if worst <= 0.15 and mean <= 0.10 else "NOT met"
    summary = [f"mean |error| {mean:.1%}, worst {worst:.1%} (targets: each <= 15%, mean <= 10%: {met})",
               f"load average (1, 5, 15 min): before {_load(load_before)}, after {_load(load_after)} "
               f"on {os.cpu_count()} cores"]
    for line in summary:
        print(line)
    if args.doc:
        Path(args.doc).write_text(_document(lines + summary, calibration, args.steps))
        print(f"wrote {args.doc}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "mean_abs_error": mean}, indent=1))


def _load(values: tuple[float, float, float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


def _document(table: list[str], calibration: str, steps: int) -> str:
    """docs/executor_accuracy.md: the table as printed, when and how it was made, and what limits it."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    body = "\n".join(table)
    return DOC_TEMPLATE.format(date=now, table=body, calibration=calibration, steps=steps)


DOC_TEMPLATE = """# Executor accuracy: predicted vs measured step time on this machine

Generated {date} by `python benchmarks/executor_accuracy.py` (calibrates, then validates; {steps} real steps
per layout, the first excluded as warm-up, the median of the rest is the measured step). Regenerate with
the same command (`--skip-calibrate --profile P` reuses a profile). Model tiny-gpt, 2 ranks, gloo on CPU,
fp32; the target (issue 5) is within 15% per layout and 10% on average.

```
{table}
```

Calibration: {calibration}.

## How the prediction is made

`simgrid-exec calibrate` (`executor/calibrate.py`) writes a self-contained profile whose measured tables
hold (warm-up excluded; micro-benchmarks as medians over repeats, in-situ op costs as 10%-trimmed means because a
step is a sum of hundreds of them and the median of a sum tends to the sum of the means):

* every collective the executor issues, by kind and size, and send/recv by size (micro-benchmarks, both
  ranks synchronised by a barrier);
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
* a host-speed probe (a fixed loop of small forward/backward torch ops on both ranks at once, the kind of
  work that dominates the interpreter) just before and after the in-situ programs.

Around each validated run the probe is run again (before and after it); the ratio calibration probe /
current probe is the "host speed" column: the CPU speed the machine offered around the run relative to
calibration (other processes share the two cores). It is a diagnostic only: `validate_layout(...,
correct_host_speed=True)` divides predicted op times by it, but with bursty background load the probe
(taken just before and after, never during, the run) missed the bursts that hit the run and made the
errors larger in a trial (mean 31% with the correction vs 26% without at load 3-6), so the table
does not use it.

`executor/validate.py` simulates the validated Program with `simgrid.engine.simulate_program` and
`executor.costmodel.MeasuredCostModel`: compute ops cost their measured row, collectives and send/recv
their interpolated table time, and each rank's host work is added to the neighbouring compute op (issue
work before the collective it issues, completion work after its WAIT), since it runs on the same host
thread and delays the compute stream. Nothing in the profile comes from the runs being validated.

## What limits the accuracy (honest discussion)

The targets were not met in any trial while this was developed (2026-11-22, load average 2-6 on the 2
cores from other engineers' test runs; the machine was never quiet): over eight trials the mean |error|
ranged 11-36% (the lowest, the table above, at the lowest load), with the sign of a layout's error
changing from one trial to the next (DP2 from -42% to +32%, PP2-1F1B from -42% to +52%, ZeRO-3 from
-48% to +78%). An error that flips sign between identical runs is noise, not a
modelling bias, so no further tuning on these numbers was attempted (it would be fitting the noise). In two trials PP2 was over-predicted by ~50%; a suspect is the
in-situ send issue cost (2.5-3.5 ms, far above a bare `isend`), which may include waiting for the peer
that the engine also models (counted twice). Not verified.
The previous version of the prediction (GPU formulas, no host work, no slowdown) was -13% to -88%,
always too fast; the largest missing physics was the interpreter's host work, now measured per op:
issuing an async gloo collective costs 0.2-1.5 ms of host time on this machine (measured alone too:
`dist.all_reduce(..., async_op=True)` returns after ~0.2-0.5 ms), a ZeRO-3 FREE of gathered parameters
~2.5-3 ms, a DP bucket issue (flattening the gradients) ~6-7 ms, and a pipeline send ~2.5-3.5 ms.

* Noise dominates. Two cores are shared by two ranks, gloo's threads and whatever else runs on the
  machine; a step is 50-300 ms of mostly Python dispatch, and consecutive steps of the same program
  differ by 30-80% whenever another process runs (see the load average above: a load above 2 means the
  ranks were time-sliced). The error of one layout then says more about the load during its run than
  about the model. Run it on a quiet machine (load average well under 1) for meaningful numbers.
* The host-speed probe corrects for load that persists over a run, not for bursts inside it: a 12-step
  run lasts about a second per layout and another engineer's test can start or stop in the middle.
* Collectives are timed alone (after a barrier); inside a run they also pay for rank drift (TP's
  synchronous all-reduces wait for the slower rank, which the engine does model) and for CPU contention
  with the peer's compute (which the tables do not capture beyond the compute-side slowdown).
* Per-op host costs are medians per op signature; the real cost of the same op varies with what is
  pending (segments finished lazily when a result is first needed, allocator state).
* Measured communication rows end when the interpreter first observed completion (an upper bound), so
  per-kind communication times are not comparable; the step time is.
"""


if __name__ == "__main__":
    main()
