"""Calibration of generation in situ: what a decode step is made of on this machine, timed inside real steps.

The training calibration (:mod:`executor.calibrate`) fits compute to training-sized ops, where a step is
matrix work, and times collectives alone or at training's message sizes. A decode step of the same model
is a few MFLOP per sequence: on a CPU it is the host's per-op dispatch, a synchronous all-reduce of a few
KB after every block, and blocking hand-offs between stages. So calibration also runs real greedy
generation (:func:`executor.generate.generate_runs`, recording every rank's step and communication
stamps) on tensor- and pipeline-parallel layouts of the calibration's ranks, with prompt counts and
lengths of its own (:data:`GENERATION_RUNS`, never a validated run's), and derives the rows of
:mod:`simgrid.serving.insitu`:

* each tensor-parallel collective's time from its call to its return, on every rank;
* each stage hand-off from the sender's call to the receiver's return (stamps of one host's monotonic
  clock, so ranks compare);
* generation's own rates (:func:`fit_rates`), from each rank's compute (its step without its
  communication calls): the host time per kernel the serving cost model counts
  (:meth:`~simgrid.serving.IterationCostModel.kernels`) from decode steps, where it is most of the step,
  and the matrix rate from prefill steps, where matrix work is. Training's fit (forward and backward
  ops under autograd, fitted with no per-op term on this host) prices neither: a no-grad forward ran at
  ~90 GFLOP/s where training's fit said 55, and a decode step's ~50 counted kernels cost ~1 ms of host.

Every measured event is filed under the message size the cost model gives the same event, so the model
looks its own events up: the executor hands one ``tokens x h`` tensor between stages where the model
prices vLLM's two (:data:`simgrid.serving.iteration.PP_TENSORS`), and an all-gather's size is its whole
output. Each row is a mean over runs of each run's plain mean (:func:`run_means`): a step pays gloo's
bimodal latency (0.3 ms, or a 4 ms tick) at the rate the ticks come, so single calls are not trimmed;
trimming the slowest 10% of calls, as the training tables do, dropped most ticks and under-predicted TP2's
time per output token by about 20% here. Whole runs are trimmed (10%), as the benchmark trims its trials.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from executor.costmodel import mean_rows
from executor.generate import GenerationResult, RankTimeline, generate_runs
from executor.launch import LaunchConfig
from simgrid.errors import SimgridError
from simgrid.hardware import ClusterSpec, ComputeRow, MeasuredTables
from simgrid.layout.spec import check_layout
from simgrid.model.spec import ModelSpec
from simgrid.serving import IterationCostModel, ServingConfig, ServingLayout, chunk_shape, combine
from simgrid.serving.insitu import LAUNCH_KEY, MATRIX_KEY, SERVE_PREFIX, InSituCosts, collective_key, hop_key
from simgrid.serving.iteration import BatchShape
from simgrid.serving.spec import model_layout
from simgrid.topology import Topology

GENERATION_RUNS: tuple[tuple[int, int], ...] = ((2, 96), (8, 80))
"""(prompts, prompt tokens) of the calibration's generation runs: a small and a large batch, so decode
messages of 2 and 8 KB and prefills of 192 and 640 tokens (small-gpt) bracket the validated 4 x 128 of
``benchmarks/serving_accuracy.py`` without running it. Prompts are shortened to fit a smaller context."""
GENERATION_NEW_TOKENS = 24
"""Tokens generated per run (23 decode steps each)."""
GENERATION_REPEATS = 4
"""Runs of each shape per layout, in one world (weights built once): a prefill is one sample per rank and
run, and gloo's latency on a shared host is bimodal, so a few runs are needed for a mean."""
WARMUP_RUN = (1, 8, 2)
"""(prompts, prompt tokens, new tokens) generated first in each world and not sampled: a process's first
use of each op and message pays one-time costs a running server does not."""


FIT_ROUNDS = 30
"""Most rounds of :func:`fit_rates` (a few suffice: decode's matrix terms are small)."""
COMPUTE_PARTS = ("gemm", "attention", "elementwise", "launch")
"""Parts of :meth:`simgrid.serving.IterationCostModel.stage_parts` that are the rank's compute."""


@dataclass(frozen=True, kw_only=True)
class GenerationFit:
    """What the generation calibration measured (for a summary line)."""

    launch_us: float
    """Host microseconds per counted kernel in decode steps."""
    matrix_gflops: float
    """Matrix work's rate in prefill steps, GFLOP/s."""
    decode_samples: int
    """Decode stage-steps the per-kernel time is averaged over."""
    prefill_samples: int
    """Prefill stage-steps the matrix rate is averaged over."""
    rows: tuple[tuple[str, float], ...]
    """(key, seconds) rows for the profile's measured compute table (:mod:`simgrid.serving.insitu`)."""

    def summary(self) -> str:
        """One line: the rates and the in-situ collective and hand-off rows."""
        comm = ", ".join(f"{key.removeprefix(SERVE_PREFIX)} {sec * 1e3:.2f} ms" for key, sec in self.rows
                         if key not in (LAUNCH_KEY, MATRIX_KEY))
        return (f"generation in situ: {self.launch_us:.1f} us per kernel ({self.decode_samples} decode stage-steps), "
                f"{self.matrix_gflops:.1f} GFLOP/s of matrix work ({self.prefill_samples} prefill stage-steps); "
                f"{comm or 'no communication (one rank)'}")


@dataclass(frozen=True, kw_only=True)
class StageStep:
    """One rank's compute in one generation step: what the serving model must price as a stage's compute."""

    layout: ServingLayout
    """The layout generated with."""
    stage: int
    """Pipeline stage of the rank."""
    shape: BatchShape
    """The iteration (:func:`step_shape`)."""
    prefill: bool
    """Step 0 (the prompts) or a decode step."""
    compute_s: float
    """The step's wall time on the rank less its communication calls."""
    run: int = 0
    """Which generation run the step belongs to (:func:`run_means`)."""


def generation_layouts(model: ModelSpec, world_size: int) -> list[ServingLayout]:
    """Tensor parallelism over every rank and a pipeline over every rank, where the model splits so."""
    candidates = [ServingLayout()] if world_size == 1 else [ServingLayout(tp=world_size), ServingLayout(pp=world_size)]
    layouts = []
    for layout in candidates:
        try:
            check_layout(model, model_layout(layout, ServingConfig(dtype="fp32")))
        except SimgridError:
            continue
        layouts.append(layout)
    return layouts


def _prompts(model: ModelSpec, runs: Sequence[tuple[int, int]], new_tokens: int, repeats: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1234)
    out = []
    for _ in range(repeats):
        for count, tokens in runs:
            length = max(1, min(tokens, model.seq_length - new_tokens))
            out.append(torch.randint(0, model.vocab_size, (count, length), generator=gen))
    return out


def step_shape(batch: int, prompt_tokens: int, step: int) -> BatchShape:
    """The iteration of ``step`` (0 = prefill of every prompt, then one token per sequence)."""
    if step == 0:
        return combine([chunk_shape(prompt_tokens, 0, sampled=True)] * batch)
    return combine([chunk_shape(1, prompt_tokens + step - 1, sampled=True)] * batch)


def _by_step(timeline: RankTimeline) -> dict[int, list]:
    calls: dict[int, list] = {}
    for call in timeline.calls:
        calls.setdefault(call.step, []).append(call)
    return calls


def run_samples(result: GenerationResult, cost: IterationCostModel, batch: int,
                prompt_tokens: int) -> tuple[list[tuple[str, float]], list[StageStep]]:
    """(key, seconds) samples of one recorded run's collectives and hand-offs, and its ranks' compute."""
    layout = cost.layout
    tp, pp = layout.tp, layout.pp
    timelines = {t.rank: t for t in result.timelines}
    if len(timelines) != tp * pp:
        raise SimgridError(f"generation calibration needs every rank's timeline; got {sorted(timelines)}")
    calls = {rank: _by_step(t) for rank, t in timelines.items()}
    samples: list[tuple[str, float]] = []
    steps: list[StageStep] = []
    for step in range(len(result.step_s)):
        shape = step_shape(batch, prompt_tokens, step)
        for rank, timeline in timelines.items():
            stage = rank // tp
            mine = calls[rank].get(step, [])
            # Tensor-parallel calls in the executor's order (embedding, then two per layer; the logits'
            # gather), each under the size the model gives it.
            expected = [(kind, nbytes / count) for kind, nbytes, count in cost.tp_calls(stage, shape)
                        for _ in range(count)]
            done = [c for c in mine if c.kind in ("all_reduce", "all_gather")]
            if sorted(k for k, _ in expected) != sorted(c.kind for c in done):
                raise SimgridError(f"generation made {[c.kind for c in done]} on rank {rank} in step {step}; the "
                                   f"serving cost model expects {[k for k, _ in expected]}: they must agree")
            sizes = {kind: [b for k, b in expected if k == kind] for kind in ("all_reduce", "all_gather")}
            for call in done:
                samples.append((collective_key(call.kind, tp, int(sizes[call.kind].pop(0))), call.end_s - call.start_s))
            # The hand-off after this stage: this rank's send until its peer's recv returned.
            for call in mine:
                if call.kind != "send":
                    continue
                peer = rank + tp if stage < pp - 1 else rank % tp
                received = [c for c in calls[peer].get(step, []) if c.kind == "recv"]
                if len(received) != 1:
                    raise SimgridError(f"rank {peer} received {len(received)} hand-offs in step {step}, expected 1")
                samples.append((hop_key(cost.hop_bytes(stage, shape)), received[0].end_s - call.start_s))
            start, end = timeline.steps[step]
            steps.append(StageStep(layout=layout, stage=stage, shape=shape, prefill=step == 0,
                                   compute_s=(end - start) - sum(c.end_s - c.start_s for c in mine)))
    return samples, steps


def fit_rates(model: ModelSpec, spec: ClusterSpec, steps: Sequence[StageStep]) -> list[tuple[str, float]]:
    """``SERVE:launch`` and ``SERVE:gflop`` rows (seconds) from the ranks' compute in generation steps.

    Each decode stage-step gives a host time per counted kernel: its compute less the matrix and memory
    terms the serving model charges, over its kernels. Each prefill stage-step gives the matrix rate at
    which the serving model's whole stage time equals its compute (bisection: the model's time falls as
    the rate grows, and some terms are bound by bytes, so the rate is not a simple ratio). Each estimate
    depends on the other, so the two alternate from the profile's fitted rate until both settle (to 1e-4,
    at most :data:`FIT_ROUNDS` rounds). Trimmed means, as every in-situ row.
    """
    gpu = spec.node.gpu
    base: dict[ServingLayout, IterationCostModel] = {}
    for s in steps:
        if s.layout not in base:
            base[s.layout] = IterationCostModel(model, s.layout, ServingConfig(dtype="fp32"),
                                                Topology(spec.sized(s.layout.world_size)))

    def stage_s(s: StageStep, launch_us: float, gflop_us: float) -> dict[str, float]:
        rates = InSituCosts(launch_us=launch_us, matrix_us_per_gflop=gflop_us).rank_gpu(gpu)
        return base[s.layout].with_gpu(rates).stage_parts(s.stage, s.shape)

    launch_us = 0.0
    gflop_us = 1e15 / gpu.peak_flops("fp32")
    for _ in range(FIT_ROUNDS):
        decode: list[tuple[str, int, float]] = []
        for s in steps:
            if not s.prefill:
                parts = stage_s(s, launch_us, gflop_us)
                rest = s.compute_s - parts["gemm"] - parts["attention"] - parts["elementwise"]
                decode.append((LAUNCH_KEY, s.run, rest / max(1, base[s.layout].kernels(s.stage, s.shape))))
        new_launch = max(0.0, run_means(decode).get(LAUNCH_KEY, 0.0))
        prefill: list[tuple[str, int, float]] = []
        for s in steps:
            found = _solve_gflop_us(functools.partial(_excess_s, stage_s, s, new_launch)) if s.prefill else None
            if found is not None:
                prefill.append((MATRIX_KEY, s.run, found * 1e-6))
        new_gflop = run_means(prefill).get(MATRIX_KEY, gflop_us)
        settled = abs(new_launch - launch_us) <= 1e-4 * max(new_launch, 1e-9) and \
            abs(new_gflop - gflop_us) <= 1e-4 * gflop_us
        launch_us, gflop_us = new_launch, new_gflop
        if settled:
            break
    return [(LAUNCH_KEY, launch_us * 1e-6), (MATRIX_KEY, gflop_us * 1e-6)]


def run_means(samples: Sequence[tuple[str, int, float]]) -> dict[str, float]:
    """Key -> microseconds: each run's plain mean of its (key, run, seconds) samples, then the 10%-trimmed
    mean over runs (:func:`executor.costmodel.mean_rows`; see the module docstring for why calls are not
    trimmed)."""
    by_run: dict[tuple[str, int], list[float]] = {}
    for key, run, seconds in samples:
        by_run.setdefault((key, run), []).append(seconds)
    return mean_rows([(key, statistics.fmean(values)) for (key, _), values in by_run.items()])


def _excess_s(stage_s: Callable[[StageStep, float, float], dict[str, float]], step: StageStep, launch_us: float,
              gflop_us: float) -> float:
    """The model's compute time of ``step`` at these rates (its communication excluded, as from the
    measurement) less the measured."""
    parts = stage_s(step, launch_us, gflop_us)
    return sum(parts[k] for k in COMPUTE_PARTS) - step.compute_s


def _solve_gflop_us(excess_s: Callable[[float], float], low: float = 1e-3, high: float = 1e9) -> float | None:
    """Microseconds per GFLOP in ``[low, high]`` (1 PFLOP/s to 1 MFLOP/s) where ``excess_s`` (the model's
    time minus the measured, growing with the microseconds per GFLOP) is zero, or ``None`` outside."""
    if excess_s(low) > 0 or excess_s(high) < 0:
        return None  # slower than the terms that do not depend on the rate, or absurdly slow
    for _ in range(60):  # geometric bisection: ~1e-5 relative after 60 halvings of 12 decades
        mid = math.sqrt(low * high)
        if excess_s(mid) > 0:
            high = mid
        else:
            low = mid
    return math.sqrt(low * high)


def with_rows(spec: ClusterSpec, rows: Sequence[tuple[str, float]]) -> ClusterSpec:
    """``spec`` with (key, seconds) rows set in its measured compute table (replacing rows of those keys)."""
    measured = spec.measured or MeasuredTables()
    keys = {key for key, _ in rows}
    kept = tuple(r for r in measured.compute if r.key not in keys)
    added = tuple(ComputeRow(key=key, time_us=sec * 1e6) for key, sec in rows)
    return dataclasses.replace(spec, measured=dataclasses.replace(measured, compute=kept + added))


def generation_samples(model: ModelSpec, spec: ClusterSpec, *, world_size: int = 2,
                       runs: Sequence[tuple[int, int]] = GENERATION_RUNS, new_tokens: int = GENERATION_NEW_TOKENS,
                       repeats: int = GENERATION_REPEATS,
                       config: LaunchConfig | None = None) -> tuple[list[tuple[str, int, float]], list[StageStep]]:
    """Communication samples (key, run, seconds) and ranks' compute of recorded generation on each of
    :func:`generation_layouts`, events named as the serving cost model on ``spec`` (the profile calibrated
    so far) names them; runs are numbered across layouts."""
    prompts = _prompts(model, runs, new_tokens, repeats)
    samples: list[tuple[str, int, float]] = []
    steps: list[StageStep] = []
    counter = itertools.count()
    for layout in generation_layouts(model, world_size):
        cost = IterationCostModel(model, layout, ServingConfig(dtype="fp32"), Topology(spec.sized(layout.world_size)))
        warm = torch.zeros(WARMUP_RUN[:2], dtype=torch.int64)
        results = generate_runs(model, [(warm, WARMUP_RUN[2]), *((p, new_tokens) for p in prompts)], tp=layout.tp,
                                pp=layout.pp, config=config, record=True)[1:]
        for prompt, result in zip(prompts, results, strict=True):
            run = next(counter)
            run_comm, run_steps = run_samples(result, cost, prompt.shape[0], prompt.shape[1])
            samples += [(key, run, sec) for key, sec in run_comm]
            steps += [dataclasses.replace(s, run=run) for s in run_steps]
    return samples, steps


def calibrate_generation(model: ModelSpec, spec: ClusterSpec, *, world_size: int = 2,
                         config: LaunchConfig | None = None) -> GenerationFit:
    """The ``SERVE:`` rows of this machine: in-situ collectives and hand-offs (:func:`run_means` per key) and
    generation's rates (:func:`fit_rates`)."""
    samples, steps = generation_samples(model, spec, world_size=world_size, config=config)
    rates = fit_rates(model, spec, steps)
    comm = sorted((k, us * 1e-6) for k, us in run_means(samples).items())
    launch_s, gflop_s = dict(rates)[LAUNCH_KEY], dict(rates)[MATRIX_KEY]
    return GenerationFit(launch_us=launch_s * 1e6, matrix_gflops=1.0 / gflop_s if gflop_s > 0 else float("inf"),
                         decode_samples=sum(1 for s in steps if not s.prefill),
                         prefill_samples=sum(1 for s in steps if s.prefill), rows=(*rates, *comm))
