"""Predicted vs measured on one GPU: real training steps of four GPT-3 shapes (125M to 2.7B), three variants each.

Usage::

    python benchmarks/gpu_accuracy.py [--profile CALIBRATED.toml] [--steps K] [--models a,b] [--json OUT]
    python benchmarks/gpu_accuracy.py --dry-run [--device-name "NVIDIA H100 80GB HBM3"]   # CPU: plumbing only

On a CUDA device, world size 1 (NCCL), each case trains ``--steps`` real steps with the executor: bf16
autocast over fp32 master weights and fp32 Adam states, as the profiles assume (``Layout.precision`` bf16),
every op timed with CUDA events. Variants: the unfused attention core (scores materialised), the fused core
(``scaled_dot_product_attention``: FlashAttention where torch has it), and the fused core with full
recompute. Printed per case: every step's time, the median step after the first against the engine's
prediction of the same Program on the shipped datasheet profile (chosen by the device name: h100-sxm,
h200-sxm, ...) and on a calibrated profile (``simgrid-exec calibrate --device cuda``), MFU each way, the
allocator's peak memory against the simulator's, and per op group (kind and block type) the mean time of one
op measured and predicted. A summary table closes the output; ``--json`` keeps everything.

Without CUDA it exits 2 with one line saying so; ``--dry-run`` builds the programs, the predictions and the
table skeleton on the CPU (measured columns empty), so the CPU test suite checks the script's plumbing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simgrid.errors import SimgridError
from simgrid.ir.ops import Compute
from simgrid.layout.spec import Layout
from simgrid.model import get_model, model_flops_per_iteration, param_count
from simgrid.model.spec import ModelSpec

MODELS = ("gpt3-125m", "gpt3-350m", "gpt3-1.3b", "gpt3-2.7b")
"""Brown et al. 2020 Table 2.1 shapes (presets, see simgrid.model.presets), 126M to 2.65B parameters."""
VARIANTS: dict[str, dict[str, Any]] = {
    "unfused": {"flash_attention": False, "recompute": "none"},
    "sdpa": {"flash_attention": True, "recompute": "none"},
    "sdpa+full-recompute": {"flash_attention": True, "recompute": "full"},
}
"""Variant -> layout settings: without and with the fused attention core, and the fused core with full recompute."""
DEFAULT_DEVICE_NAME = "NVIDIA H100 80GB HBM3"
"""What ``--dry-run`` assumes when no device name is given (picks the h100-sxm datasheet)."""
GIB = 2**30


@dataclass(kw_only=True)
class Prediction:
    """The engine's answer for one case on one profile."""

    label: str
    """``datasheet`` or ``calibrated``."""
    profile: str
    """Cluster profile name or path."""
    step_s: float
    """Predicted step time."""
    peak_memory_bytes: int
    """Predicted peak device memory."""
    per_op_s: dict[str, float]
    """Op group -> mean predicted seconds of one op."""


@dataclass(kw_only=True)
class Case:
    """One model and variant, with its predictions and (on a GPU) its measurement."""

    model: ModelSpec
    """The model."""
    variant: str
    """Key of :data:`VARIANTS`."""
    layout: Layout
    """World size 1, bf16."""
    predictions: list[Prediction] = field(default_factory=list)
    """Datasheet first, then the calibrated profile when given."""
    step_times_s: list[float] = field(default_factory=list)
    """Every measured step (the first is warm-up)."""
    measured_per_op_s: dict[str, float] = field(default_factory=dict)
    """Op group -> mean measured seconds of one op (last step)."""
    peak_device_bytes: int = 0
    """Allocator peak on the device."""
    losses: list[float] = field(default_factory=list)
    """Loss of every step."""
    failure: str = ""
    """Why the run did not finish (e.g. out of memory), or ''."""

    @property
    def name(self) -> str:
        return f"{self.model.name} {self.variant}"

    @property
    def measured_step_s(self) -> float | None:
        """Median of the steps after the first."""
        steps = self.step_times_s[1:] or self.step_times_s
        return float(statistics.median(steps)) if steps else None


def layout_for(variant: str, microbatches: int = 4) -> Layout:
    """One GPU, micro-batch 1, bf16 mixed precision, Adam, the variant's attention core and recompute."""
    return Layout(global_batch_size=microbatches, micro_batch_size=1, precision="bf16", **VARIANTS[variant])


def cases(models: list[str], variants: list[str], microbatches: int = 4) -> list[Case]:
    """Every (model, variant) pair."""
    return [Case(model=get_model(m), variant=v, layout=layout_for(v, microbatches)) for m in models for v in variants]


def op_group(kind: str, text: str, model: ModelSpec) -> str | None:
    """``F attn``, ``B mlp``, ``OPT``, ... for a compute row (None for other rows)."""
    if kind == "OPT":
        return "OPT"
    if kind not in ("F", "B", "I", "W", "R") or "blocks=" not in text:
        return None
    first = int(text.split("blocks=", 1)[1].split(":", 1)[0])
    last = 2 * model.num_layers + 1
    block = "embed" if first == 0 else "head" if first == last else "attn" if first % 2 else "mlp"
    return f"{kind} {block}"


def per_op_seconds(rows: list[Any], program: Any, model: ModelSpec) -> dict[str, float]:
    """Op group -> summed row time over the number of the program's ops in that group (deferred rows included)."""
    from simgrid.ir.text import format_op

    counts: dict[str, int] = defaultdict(int)
    for op in program.ranks[0]:
        if isinstance(op, Compute):
            group = op_group(op.kind, format_op(op), model)
            if group:
                counts[group] += 1
    totals: dict[str, float] = defaultdict(float)
    for row in rows:
        group = op_group(row.kind, row.op, model)
        if group in counts:
            totals[group] += row.end_s - row.start_s
    return {g: totals[g] / counts[g] for g in sorted(counts)}


def predict(case: Case, label: str, profile: str) -> Prediction:
    """Simulate the case's Program on ``profile`` (a cluster name or path, sized to one GPU)."""
    from simgrid.engine.run import simulate_program
    from simgrid.hardware import load_cluster
    from simgrid.schedules import build_program

    program = build_program(case.model, case.layout)
    engine = simulate_program(program, load_cluster(profile, gpus=1), mode="full")
    return Prediction(label=label, profile=profile, step_s=float(engine.makespan_s), peak_memory_bytes=int(engine.peak_memory_bytes),
                      per_op_s=per_op_seconds(list(engine.trace.rows), program, case.model))


def measure(case: Case, steps: int, timeout_s: float) -> None:
    """Run the case on the GPU (one process, NCCL) and store what it measured; a failure is recorded, not raised."""
    from executor.devices import default_backend
    from executor.launch import LaunchConfig
    from executor.runner import run_program
    from simgrid.schedules import build_program

    program = build_program(case.model, case.layout)
    config = LaunchConfig(world_size=1, backend=default_backend(1), run_timeout_s=timeout_s, comm_timeout_s=timeout_s)
    try:
        run = run_program(program, steps=steps, config=config, collect_weights=False)
    except SimgridError as exc:
        text = str(exc).splitlines()[0]
        case.failure = "out of memory" if "out of memory" in text.lower() else text[:200]
        return
    case.step_times_s = list(run.step_times_s)
    case.losses = list(run.losses)
    case.peak_device_bytes = max(run.peak_device_bytes or [0])
    case.measured_per_op_s = per_op_seconds(list(run.trace.rows), program, case.model)


def mfu(case: Case, step_s: float | None, peak_flops: float) -> float | None:
    """Model FLOPs (6N + attention, no recompute: :func:`simgrid.model.model_flops_per_iteration`) per second
    over the peak."""
    if not step_s:
        return None
    return model_flops_per_iteration(case.model, case.layout.gbs) / step_s / peak_flops


def _ms(seconds: float | None) -> str:
    return f"{seconds * 1e3:.2f}" if seconds is not None else "-"


def _err(predicted: float | None, measured: float | None) -> str:
    return f"{(predicted - measured) / measured:+.1%}" if predicted is not None and measured else "-"


def _pct(value: float | None) -> str:
    return f"{value:.1%}" if value is not None else "-"


def format_case(case: Case, peak_flops: float) -> str:
    """The per-case block: steps, step time and MFU each way, memory, per op group."""
    measured = case.measured_step_s
    tokens = case.layout.gbs * case.model.seq_length
    lines = [f"== {case.name}: {param_count(case.model) / 1e9:.2f}B parameters, {tokens} tokens per step, "
             f"flash_attention={case.layout.flash_attention}, recompute={case.layout.recompute}"]
    if case.failure:
        lines.append(f"  measured: FAILED ({case.failure})")
    elif case.step_times_s:
        lines.append("  steps (ms): " + " ".join(_ms(t) for t in case.step_times_s) + "  (first is warm-up)")
    parts = [f"measured {_ms(measured)} ms"] + [f"{p.label} {_ms(p.step_s)} ms ({_err(p.step_s, measured)})"
                                                for p in case.predictions]
    lines.append("  step: " + ", ".join(parts))
    mfus = [f"measured {_pct(mfu(case, measured, peak_flops))}"] + [
        f"{p.label} {_pct(mfu(case, p.step_s, peak_flops))}" for p in case.predictions]
    lines.append("  MFU: " + ", ".join(mfus))
    memory = [f"measured {case.peak_device_bytes / GIB:.2f} GiB" if case.peak_device_bytes else "measured -"]
    memory += [f"{p.label} {p.peak_memory_bytes / GIB:.2f} GiB" for p in case.predictions[:1]]
    lines.append("  peak memory: " + ", ".join(memory))
    header = f"  {'op group':<12}{'measured ms':>13}" + "".join(f"{p.label[:20]:>22}" for p in case.predictions)
    lines.append(header)
    for group in sorted(case.predictions[0].per_op_s if case.predictions else case.measured_per_op_s):
        got = case.measured_per_op_s.get(group)
        cells = "".join(f"{_ms(p.per_op_s.get(group)) + ' (' + _err(p.per_op_s.get(group), got) + ')':>22}"
                        for p in case.predictions)
        lines.append(f"  {group:<12}{_ms(got):>13}{cells}")
    return "\n".join(lines)


def format_summary(all_cases: list[Case], peak_flops: float) -> str:
    """One line per case: measured step, each prediction's error, MFU measured and predicted."""
    names = [p.label for p in all_cases[0].predictions] if all_cases else []
    head = f"{'case':<32}{'measured ms':>12}" + "".join(f"{n + ' ms':>16}{'error':>9}" for n in names)
    head += f"{'MFU measured':>14}" + "".join(f"{'MFU ' + n:>16}" for n in names)
    lines = ["summary (error = (predicted - measured) / measured)", head]
    for case in all_cases:
        measured = case.measured_step_s
        cells = "".join(f"{_ms(p.step_s):>16}{_err(p.step_s, measured):>9}" for p in case.predictions)
        mfus = "".join(f"{_pct(mfu(case, p.step_s, peak_flops)):>16}" for p in case.predictions)
        shown = "FAILED" if case.failure else _ms(measured)
        lines.append(f"{case.name:<32}{shown:>12}{cells}{_pct(mfu(case, measured, peak_flops)):>14}{mfus}")
    for index, name in enumerate(names):
        errors = [abs(c.predictions[index].step_s - c.measured_step_s) / c.measured_step_s
                  for c in all_cases if c.measured_step_s and not c.failure]
        if errors:
            lines.append(f"{name}: mean absolute step error {statistics.fmean(errors):.1%} over {len(errors)} cases, "
                         f"worst {max(errors):.1%}")
    return "\n".join(lines)


def to_json(all_cases: list[Case], env: dict[str, str]) -> dict[str, Any]:
    """Everything measured and predicted, for docs/gpu_validation.md."""
    return {"environment": env, "cases": [
        {"model": c.model.name, "variant": c.variant, "layout": {"flash_attention": c.layout.flash_attention,
                                                                 "recompute": c.layout.recompute, "gbs": c.layout.gbs},
         "step_times_s": c.step_times_s, "measured_step_s": c.measured_step_s, "losses": c.losses,
         "peak_device_bytes": c.peak_device_bytes, "failure": c.failure, "measured_per_op_s": c.measured_per_op_s,
         "predictions": [p.__dict__ for p in c.predictions]} for c in all_cases]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated presets (default {','.join(MODELS)})")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated of {', '.join(VARIANTS)}")
    parser.add_argument("--steps", type=int, default=6, help="real steps per case; the first is warm-up (default 6)")
    parser.add_argument("--microbatches", type=int, default=4,
                        help="micro-batches of one sequence per step (default 4: the optimizer step, which one "
                        "micro-batch would leave a third of a 2.7B step, is amortised as in training)")
    parser.add_argument("--profile", help="calibrated cluster profile (simgrid-exec calibrate --device cuda --out ...)")
    parser.add_argument("--datasheet", help="datasheet cluster profile (default: from the device name)")
    parser.add_argument("--device-name", help=f"--dry-run: the device to assume (default {DEFAULT_DEVICE_NAME!r})")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per case before it is stopped (default 300)")
    parser.add_argument("--json", help="write everything measured and predicted here")
    parser.add_argument("--dry-run", action="store_true", help="CPU: build programs and predictions, measure nothing")
    args = parser.parse_args(argv)
    try:
        return _run(args)
    except SimgridError as exc:
        print(f"gpu_accuracy: error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    from executor.devices import cuda_available, default_device, device_name, environment, require_datasheet

    if not args.dry_run and not cuda_available():
        print("gpu_accuracy: needs a CUDA GPU (torch.cuda.is_available() is False here); --dry-run builds the "
              "programs and predictions on the CPU", file=sys.stderr)
        return 2
    if args.steps < 2 or args.microbatches < 1:
        raise SimgridError(f"--steps = {args.steps} must be >= 2 (one warm-up) and --microbatches "
                           f"= {args.microbatches} >= 1")
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SimgridError(f"--variants: unknown {unknown}; choose from {', '.join(VARIANTS)}")
    if args.profile and not Path(args.profile).exists():
        raise SimgridError(f"--profile {args.profile!r} does not exist; write it with `simgrid-exec calibrate "
                           f"--device cuda --out {args.profile}`")
    name = (args.device_name or DEFAULT_DEVICE_NAME) if args.dry_run else device_name(default_device())
    sheet = require_datasheet(name, args.datasheet)
    from simgrid.hardware import load_cluster_spec

    peak = load_cluster_spec(sheet.cluster).node.gpu.peak_flops("bf16")
    all_cases = cases([m.strip() for m in args.models.split(",") if m.strip()], variants, args.microbatches)
    profiles = [("datasheet", sheet.cluster)] + ([("calibrated", args.profile)] if args.profile else [])
    print(f"device {name}{' (dry run: nothing measured)' if args.dry_run else ''}; datasheet {sheet.cluster}; "
          f"calibrated {args.profile or '(none given)'}; bf16 peak {peak / 1e12:.1f} TFLOP/s", flush=True)
    env = {"device": name} if args.dry_run else environment(default_device())
    for index, case in enumerate(all_cases):
        case.predictions = [predict(case, label, p) for label, p in profiles]
        if not args.dry_run:
            measure(case, args.steps, args.timeout)
        print(format_case(case, peak), flush=True)
        if args.json:  # after every case: a session stopped at its time limit keeps what it measured
            done = all_cases[: index + 1]
            Path(args.json).write_text(json.dumps(to_json(done, env), indent=1) + "\n", encoding="utf-8")
    print(format_summary(all_cases, peak))
    return 0


if __name__ == "__main__":
    sys.exit(main())
