"""Predicted vs measured step time on this machine: calibrate, then run and simulate five 2-rank layouts.

Usage: ``python benchmarks/executor_accuracy.py [--profile P] [--skip-calibrate] [--steps K]``.
Prints one line per layout (predicted, measured, relative error, numerics) and the mean absolute error.
Targets from issue 5: within 15% for each layout and 10% on average (2 ranks, gloo, tiny-gpt).
"""

from __future__ import annotations

import argparse
import json
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
    parser.add_argument("--profile", default="localhost-gloo.toml")
    parser.add_argument("--skip-calibrate", action="store_true", help="reuse an existing profile")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--json", help="also write the table as JSON here")
    args = parser.parse_args()
    model = get_model("tiny-gpt")
    if not (args.skip_calibrate and Path(args.profile).exists()):
        _, fit = calibrate(model, world_size=2, out=args.profile)
        print(f"calibrated: {fit.peak_flops / 1e9:.2f} GFLOP/s, {fit.bandwidth_Bps / 1e9:.2f} GB/s, "
              f"{fit.overhead_s * 1e6:.1f} us/kernel, fit error {fit.mean_abs_error:.0%} over {fit.samples} ops")
    rows = []
    print(f"{'layout':<11}{'predicted ms':>14}{'measured ms':>14}{'error':>9}  numerics")
    for name, layout in LAYOUTS.items():
        report = validate_layout(model, layout, profile=args.profile, steps=args.steps)
        rows.append({"layout": name, **report.to_json_dict()})
        print(f"{name:<11}{report.predicted_step_s * 1e3:>14.2f}{report.measured_step_s * 1e3:>14.2f}"
              f"{report.error:>+9.1%}  {'match' if report.numerics_match else 'MISMATCH'}")
    mean = sum(abs(r["error"]) for r in rows) / len(rows)
    worst = max(abs(r["error"]) for r in rows)
    print(f"mean |error| {mean:.1%}, worst {worst:.1%} (targets: each <= 15%, mean <= 10%)")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "mean_abs_error": mean}, indent=1))


if __name__ == "__main__":
    main()
