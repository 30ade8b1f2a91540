"""Measured vs predicted time to first token and time per output token of real greedy generation on gloo.

Usage: ``python benchmarks/serving_accuracy.py [--profile P] [--skip-calibrate] [--trials N] ...``

1. Calibrate this machine (``simgrid-exec calibrate``'s :func:`executor.calibrate.calibrate`, 2 ranks, the
   model below) unless ``--skip-calibrate`` reuses a profile. Besides the training calibration it times
   real generation of its own prompt counts and lengths (:mod:`executor.gencal`: 2 x 96 and 8 x 80
   tokens, never this script's 4 x 128), so the profile carries generation's in-situ costs.
2. Run :func:`executor.generate.generate_runs` for TP2 and PP2 (a batch of identical-length prompts;
   greedy, with a KV cache): one world per layout, a short warm-up generation, then ``--trials`` runs;
   check their tokens against the single-process reference. The host-speed probe runs before and after.
3. Predict the same steps with the serving simulator's iteration cost model
   (:class:`simgrid.serving.IterationCostModel`) on the calibrated profile: TTFT = the prefill iteration,
   TPOT = the mean of the decode iterations with the cache growing by one token each; once with the
   generation rows (the prediction) and once without them (training's tables only, as before they existed).

Prints each trial; per layout the median and range over the trials, then the 10%-trimmed mean over the
trials (the statistic of every calibration row: the model prices an iteration's mean cost, see
:func:`executor.costmodel.mean_rows`) against the predictions with their errors; the host speed against calibration time and the probe's drift
over the runs. Printed, never asserted: on a shared 2-core host gloo's latency is bimodal (0.3 ms or a 4 ms
tick) and identical runs differ by tens of percent.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
from pathlib import Path

import torch

from executor.calibrate import PROBE_KEY, calibrate, host_drift, measure_probe
from executor.costmodel import mean_rows
from executor.generate import generate_runs, reference_generate
from simgrid.hardware import ClusterSpec, load_cluster_spec
from simgrid.model import get_model
from simgrid.model.spec import ModelSpec
from simgrid.serving import IterationCostModel, ServingConfig, ServingLayout, chunk_shape, combine
from simgrid.serving.insitu import SERVE_PREFIX, InSituCosts
from simgrid.topology import Topology

LAYOUTS = {"TP2": ServingLayout(tp=2), "PP2": ServingLayout(pp=2)}
WARMUP = (1, 16, 4)
"""(prompts, prompt tokens, new tokens) generated first in each world and discarded: the simulator models
a running server, not a process's first use of each tensor size."""


def predict(model: ModelSpec, spec: ClusterSpec, layout: ServingLayout, *, batch: int, prompt: int,
            new_tokens: int) -> tuple[float, float]:
    """(TTFT, TPOT) in seconds from the iteration cost model on the calibrated profile (fp32, as the executor)."""
    cost = IterationCostModel(model, layout, ServingConfig(dtype="fp32"), Topology(spec.sized(layout.world_size)))
    ttft = cost.time(combine([chunk_shape(prompt, 0, sampled=True)] * batch)).latency_s
    decodes = [cost.time(combine([chunk_shape(1, prompt + i, sampled=True)] * batch)).latency_s
               for i in range(new_tokens - 1)]
    return ttft, statistics.fmean(decodes)


def without_generation_rows(spec: ClusterSpec) -> ClusterSpec:
    """The profile as the training calibration alone writes it (no ``SERVE:`` rows)."""
    measured = spec.measured
    assert measured is not None
    rows = tuple(r for r in measured.compute if not r.key.startswith(SERVE_PREFIX))
    return dataclasses.replace(spec, measured=dataclasses.replace(measured, compute=rows))


def _err(pred: float, meas: float) -> str:
    return f"{pred * 1e3:8.2f} ms {pred / meas - 1:+7.1%}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", default="out/localhost-gloo.toml", help="profile to write (or reuse)")
    parser.add_argument("--skip-calibrate", action="store_true", help="reuse an existing profile")
    parser.add_argument("--model", default="small-gpt", help="model preset (default small-gpt, as calibrated)")
    parser.add_argument("--batch", type=int, default=4, help="sequences generated together (default 4)")
    parser.add_argument("--prompt", type=int, default=128, help="prompt tokens (default 128)")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens generated (default 32)")
    parser.add_argument("--trials", type=int, default=10, help="real runs per layout (default 10; trimmed mean compared)")
    args = parser.parse_args()
    if args.trials < 1:
        parser.error(f"--trials = {args.trials} must be >= 1")
    model = get_model(args.model)
    if not (args.skip_calibrate and Path(args.profile).exists()):
        Path(args.profile).parent.mkdir(parents=True, exist_ok=True)
        print(f"calibrating on {model.name} (load average {os.getloadavg()[0]:.1f}) ...", flush=True)
        _, fit = calibrate(model, world_size=2, out=args.profile)
        print(f"calibrated {args.profile}: fit {fit.describe()}; host-speed probe drift while "
              f"calibrating {fit.host_drift:.0%}", flush=True)
        print(fit.generation_summary)
        if fit.drift_warning():
            print(fit.drift_warning())
    spec = load_cluster_spec(args.profile)
    if InSituCosts.from_tables(spec.measured) is None:
        print(f"note: {args.profile} has no generation rows (calibrated before they existed): recalibrate")
    prompt = torch.randint(0, model.vocab_size, (args.batch, args.prompt), generator=torch.Generator().manual_seed(0))
    warm = torch.randint(0, model.vocab_size, WARMUP[:2], generator=torch.Generator().manual_seed(1))
    reference = reference_generate(model, prompt, args.new_tokens)
    print(f"{model.name}: batch {args.batch}, prompt {args.prompt}, {args.new_tokens} new tokens, {args.trials} "
          f"trials; load average {os.getloadavg()[0]:.1f}", flush=True)
    probe_before = measure_probe(2)
    measured: dict[str, tuple[float, float, bool]] = {}
    spread: dict[str, tuple[str, ...]] = {}
    for name, layout in LAYOUTS.items():
        runs = generate_runs(model, [(warm, WARMUP[2]), *[(prompt, args.new_tokens)] * args.trials],
                             tp=layout.tp, pp=layout.pp)[1:]
        for i, r in enumerate(runs):
            print(f"  {name} trial {i + 1}: TTFT {r.ttft_s * 1e3:7.2f} ms, TPOT {r.tpot_s * 1e3:6.2f} ms", flush=True)
        means = mean_rows([(k, v) for r in runs for k, v in (("ttft", r.ttft_s), ("tpot", r.tpot_s))])
        measured[name] = (means["ttft"] * 1e-6, means["tpot"] * 1e-6, all(r.tokens == reference for r in runs))
        spread[name] = tuple(f"{statistics.median(v) * 1e3:.2f} ms ({min(v) * 1e3:.1f}-{max(v) * 1e3:.1f})"
                             for v in ([r.ttft_s for r in runs], [r.tpot_s for r in runs]))
    probe_after = measure_probe(2)
    for name in LAYOUTS:
        print(f"{name} over the trials: TTFT median {spread[name][0]}, TPOT median {spread[name][1]}")
    print(f"{'layout':<7}{'TTFT meas':>12}{'TTFT pred':>20}{'(tables only)':>21}{'TPOT meas':>12}"
          f"{'TPOT pred':>20}{'(tables only)':>21}  tokens")
    for name, layout in LAYOUTS.items():
        ttft, tpot, same = measured[name]
        shape = {"batch": args.batch, "prompt": args.prompt, "new_tokens": args.new_tokens}
        p_ttft, p_tpot = predict(model, spec, layout, **shape)
        o_ttft, o_tpot = predict(model, without_generation_rows(spec), layout, **shape)
        print(f"{name:<7}{ttft * 1e3:9.2f} ms{_err(p_ttft, ttft):>20}{_err(o_ttft, ttft):>21}"
              f"{tpot * 1e3:9.2f} ms{_err(p_tpot, tpot):>20}{_err(o_tpot, tpot):>21}  "
              f"{'same as reference' if same else 'DIFFERENT'}", flush=True)
    calibrated = spec.measured.compute_time_us(PROBE_KEY) if spec.measured is not None else None
    now = (probe_before + probe_after) / 2
    speed = f"host speed {calibrated * 1e-6 / now:.2f}x calibration time's (probe); " if calibrated else ""
    print(f"{speed}probe drift over the runs {host_drift(probe_before, probe_after):.0%}; "
          f"load average after {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
