"""Measured vs predicted time to first token and time per output token of real greedy generation on gloo.

Usage: ``python benchmarks/serving_accuracy.py [--profile P] [--skip-calibrate] [--trials K] ...``

1. Calibrate this machine (``simgrid-exec calibrate``'s :func:`executor.calibrate.calibrate`, 2 ranks, the
   model below) unless ``--skip-calibrate`` reuses a profile.
2. Run :func:`executor.generate.generate` for TP2 and PP2 (a batch of identical-length prompts; greedy,
   with a KV cache), ``--trials`` times each, and check its tokens against the single-process reference.
3. Predict the same steps with the serving simulator's iteration cost model
   (:class:`simgrid.serving.IterationCostModel`) on the calibrated profile: TTFT = the prefill iteration,
   TPOT = the mean of the decode iterations with the cache growing by one token each.

Prints one line per layout: measured (median over trials) and predicted TTFT and TPOT with the errors. This
is printed, never asserted: timings on a shared 2-core host move by several percent between identical runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import torch

from executor.calibrate import calibrate
from executor.generate import generate, reference_generate
from simgrid.hardware import load_cluster
from simgrid.model import get_model
from simgrid.model.spec import ModelSpec
from simgrid.serving import IterationCostModel, ServingConfig, ServingLayout, chunk_shape, combine
from simgrid.topology import Topology

LAYOUTS = {"TP2": ServingLayout(tp=2), "PP2": ServingLayout(pp=2)}


def predict(model: ModelSpec, profile: str, layout: ServingLayout, *, batch: int, prompt: int,
            new_tokens: int) -> tuple[float, float]:
    """(TTFT, TPOT) in seconds from the iteration cost model on the calibrated profile (fp32, as the executor)."""
    cost = IterationCostModel(model, layout, ServingConfig(dtype="fp32"),
                              Topology(load_cluster(profile, gpus=layout.world_size)))
    ttft = cost.time(combine([chunk_shape(prompt, 0, sampled=True)] * batch)).latency_s
    decodes = [cost.time(combine([chunk_shape(1, prompt + i, sampled=True)] * batch)).latency_s
               for i in range(new_tokens - 1)]
    return ttft, statistics.fmean(decodes)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", default="out/localhost-gloo.toml", help="profile to write (or reuse)")
    parser.add_argument("--skip-calibrate", action="store_true", help="reuse an existing profile")
    parser.add_argument("--model", default="small-gpt", help="model preset (default small-gpt, as calibrated)")
    parser.add_argument("--batch", type=int, default=4, help="sequences generated together (default 4)")
    parser.add_argument("--prompt", type=int, default=128, help="prompt tokens (default 128)")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens generated (default 32)")
    parser.add_argument("--trials", type=int, default=3, help="real runs per layout (default 3; median kept)")
    args = parser.parse_args()
    model = get_model(args.model)
    if not (args.skip_calibrate and Path(args.profile).exists()):
        Path(args.profile).parent.mkdir(parents=True, exist_ok=True)
        print(f"calibrating on {model.name} ...", flush=True)
        _, fit = calibrate(model, world_size=2, out=args.profile)
        print(f"calibrated {args.profile}: fit {fit.peak_flops / 1e9:.1f} GFLOP/s, {fit.overhead_s * 1e6:.1f} us/op "
              f"(mean error {fit.mean_abs_error:.0%} over {fit.samples} ops)", flush=True)
        if fit.drift_warning():
            print(fit.drift_warning())
    prompt = torch.randint(0, model.vocab_size, (args.batch, args.prompt), generator=torch.Generator().manual_seed(0))
    reference = reference_generate(model, prompt, args.new_tokens)
    print(f"{model.name}: batch {args.batch}, prompt {args.prompt}, {args.new_tokens} new tokens; load average "
          f"{os.getloadavg()[0]:.1f}")
    print(f"{'layout':<7}{'TTFT meas':>11}{'TTFT pred':>11}{'error':>8}{'TPOT meas':>11}{'TPOT pred':>11}"
          f"{'error':>8}  tokens")
    for name, layout in LAYOUTS.items():
        runs = [generate(model, prompt, args.new_tokens, tp=layout.tp, pp=layout.pp) for _ in range(args.trials)]
        ttft = statistics.median(r.ttft_s for r in runs)
        tpot = statistics.median(r.tpot_s for r in runs)
        p_ttft, p_tpot = predict(model, args.profile, layout, batch=args.batch, prompt=args.prompt,
                                 new_tokens=args.new_tokens)
        same = all(r.tokens == reference for r in runs)
        print(f"{name:<7}{ttft * 1e3:>9.2f}ms{p_ttft * 1e3:>9.2f}ms{p_ttft / ttft - 1:>+8.1%}"
              f"{tpot * 1e3:>9.2f}ms{p_tpot * 1e3:>9.2f}ms{p_tpot / tpot - 1:>+8.1%}  "
              f"{'same as reference' if same else 'DIFFERENT'}", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
