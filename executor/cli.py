"""``simgrid-exec``: run schedules for real, check the machine, calibrate it, validate predictions.

Commands::

    simgrid-exec run (--program F.json | layout flags [--pipeline-csv F.csv]) [--steps K] [--trace out.json] [--json]
    simgrid-exec doctor
    simgrid-exec calibrate [--out profile.toml] [--ranks N]
    simgrid-exec validate (layout flags) [--profile P] [--steps K] [--trace-dir D] [--json]

Under ``torchrun`` (``RANK`` and ``WORLD_SIZE`` set), ``run`` executes this process's rank only and rank 0
prints the summary. Errors a user can cause print one line and exit with status 2, before any rank is
started where the input allows (bad flags, program files, unsupported optimizers, output paths). A failing
rank is one line naming the rank, its op and the cause; ``SIMGRID_EXEC_DEBUG=1`` adds that rank's traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

from simgrid.errors import SimgridError

DEFAULT_PROFILE = "localhost-gloo.toml"
"""Where ``calibrate`` writes and ``validate`` reads the profile when no path is given."""


def _parser() -> argparse.ArgumentParser:
    from simgrid import __version__
    from simgrid.cli.common import Parser, add_model_layout_args, add_pipeline_csv_arg, positive_int, positive_number

    raw = argparse.RawDescriptionHelpFormatter
    parser = Parser(prog="simgrid-exec", description=__doc__.split("\n")[0],
                    epilog="example: simgrid-exec run --model tiny-gpt --pp 2 --gbs 8 --steps 5", formatter_class=raw)
    parser.add_argument("--version", action="version", version=f"simgrid-exec {__version__}")
    # Sub-parsers refuse abbreviated options too (Parser): --gpu must never mean --gpus.
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    run = sub.add_parser(
        "run", help="run a Program (or a layout's Program) for real on torch.distributed", formatter_class=raw,
        description="Run one or more training steps of a program for real, one process per rank (gloo on CPU, "
        "NCCL on GPU), and print each step's loss and time. The program comes from a file (--program), from "
        "the model and layout flags, or from those flags with the pipeline order of a torch schedule CSV "
        "(--pipeline-csv). The first step is warm-up (allocations, gloo connections) and is marked; the step "
        "time is the median of the others.",
        epilog="examples:\n"
        "  simgrid-exec run --model tiny-gpt --pp 2 --gbs 8 --steps 5 --trace measured.json\n"
        "  simgrid program --model tiny-gpt --pp 2 --vpp 2 --schedule dualpipev --gbs 4 --out p.json && "
        "simgrid-exec run --program p.json\n"
        "  simgrid schedule --schedule interleaved-zb --pp 2 --microbatches 4 --format torch-csv --out zb.csv && "
        "simgrid-exec run --pipeline-csv zb.csv",
    )
    run.add_argument("--program", help="Program JSON file (from `simgrid program --out`)")
    add_model_layout_args(run, default_model="tiny-gpt")
    add_pipeline_csv_arg(run)
    run.add_argument("--steps", type=positive_int, default=1, help="optimizer steps (default 1; the first is warm-up)")
    run.add_argument("--seed", type=int, default=0, help="seed of weights and data (default 0)")
    run.add_argument("--trace", help="write the measured trace (Chrome/Perfetto JSON) here")
    run.add_argument("--timeout", type=positive_number, default=300.0,
                     help="overall deadline in seconds, finite and > 0 (default 300)")
    run.add_argument("--json", action="store_true", help="print a JSON summary")
    sub.add_parser(
        "doctor", help="check backends, GPUs and the rendezvous address/port, and say what to fix",
        description="Check that torch.distributed, gloo (and NCCL with GPUs) are usable, that MASTER_ADDR "
        "resolves and MASTER_PORT is free, and say what to fix for each failed check (exit 1 if any fails).",
        epilog="example: simgrid-exec doctor", formatter_class=raw)
    cal = sub.add_parser(
        "calibrate", help="micro-benchmark this machine and write a cluster profile", formatter_class=raw,
        description="Measure compute ops at the model's shapes, collectives and send/recv at its message sizes, "
        "the compute slowdown under communication and the interpreter's own overhead, and write a cluster "
        "profile with those tables for `simgrid-exec validate` and the simulator. With --device cuda (the "
        "default when a GPU is visible) measure the GPU instead: GEMMs at the models' shapes, fused attention "
        "by sequence length, memory-bound kernels, sustained vs burst throughput and launch overhead, fitted "
        "to the device's datasheet profile (docs/gpu_validation.md).",
        epilog="examples: simgrid-exec calibrate --out localhost.toml --ranks 2\n"
        "          simgrid-exec calibrate --device cuda --out h100.toml --bench-json h100.json")
    # small-gpt: a step long enough that compute, not gloo wake-up jitter, decides it (see presets).
    add_model_layout_args(cal, default_model="small-gpt")
    cal.add_argument("--out", default=DEFAULT_PROFILE, help=f"profile path (default {DEFAULT_PROFILE})")
    cal.add_argument("--ranks", type=positive_int, default=2, help="ranks to calibrate for (default 2)")
    cal.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                     help="cuda: micro-benchmark this GPU and fit its datasheet profile; cpu: measure gloo ranks "
                     "in situ on --model; auto (default): cuda when a GPU is visible")
    cal.add_argument("--models", help="cuda: comma-separated PRESET[:TP] whose shapes are measured (default: "
                     "gpt3-125m, gpt3-350m, gpt3-1.3b, gpt3-2.7b, llama3-8b, gpt3-175b:8)")
    cal.add_argument("--sustained-s", type=float, default=60.0,
                     help="cuda: seconds of the sustained-throughput GEMM run (default 60)")
    cal.add_argument("--datasheet", help="cuda: cluster profile of this GPU's datasheet when its name has no "
                     "shipped one (default: chosen from the device name, e.g. H100 -> dgx-h100-ndr)")
    cal.add_argument("--bench-json", help="cuda: also write every raw measurement here as JSON")
    val = sub.add_parser(
        "validate", help="run a layout for real and compare with the simulator's prediction", formatter_class=raw,
        description="Simulate a layout on a calibrated profile, run it for real, and print predicted vs "
        "measured step time per op kind, with a check of the numerics against the single-process reference. "
        "The first real step is warm-up and is left out of the measured time.",
        epilog="example: simgrid-exec validate --pp 2 --gbs 4 --profile localhost.toml --json")
    add_model_layout_args(val, default_model="small-gpt")
    val.add_argument("--profile", default=DEFAULT_PROFILE, help="calibrated cluster profile (default "
                     f"{DEFAULT_PROFILE}; run `simgrid-exec calibrate` first)")
    val.add_argument("--steps", type=positive_int, default=4, help="real steps; the first is warm-up (default 4)")
    val.add_argument("--trace-dir", help="write predicted.json and measured.json traces here")
    val.add_argument("--json", action="store_true", help="print predicted_step_s, measured_step_s, error, "
                     "numerics_match as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``simgrid-exec`` console script."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "doctor":
            return _doctor()
        if args.command == "run":
            return _run(args)
        if args.command == "calibrate":
            return _calibrate(args)
        return _validate(args)
    except SimgridError as exc:
        # The first line says what failed (rank, op); a failing rank's traceback only when debugging.
        lines = str(exc).splitlines() or [type(exc).__name__]
        detail = "\n".join(lines[1:]) if os.environ.get("SIMGRID_EXEC_DEBUG") == "1" else ""
        print(f"simgrid-exec: error: {lines[0]}" + (f"\n{detail}" if detail else ""), file=sys.stderr)
        return 2


def _model_layout(args: argparse.Namespace, order: Any = None, *, keep_precision: bool = False) -> tuple[Any, Any]:
    """Model and layout of the flags; computed in fp32 (the CPU executor's precision) unless ``keep_precision``."""
    from executor.runner import refuse_fp8
    from executor.validate import fp32
    from simgrid.cli.common import model_layout_from_args

    model, layout = model_layout_from_args(args, order=order)
    refuse_fp8(layout)
    return model, layout if keep_precision else fp32(layout)


def _run(args: argparse.Namespace) -> int:
    from executor.devices import default_backend
    from executor.launch import LaunchConfig
    from executor.runner import run_program, validate_or_raise
    from executor.validate import fp32
    from simgrid.cli.common import pipeline_order_from_args
    from simgrid.io import atomic_output, check_output_path
    from simgrid.ir.jsonio import load_program
    from simgrid.schedules import build_program

    if args.trace is not None:
        check_output_path(args.trace, flag="--trace")
    if args.program:
        if args.pipeline_csv:
            raise SimgridError(f"--program {args.program} carries its own order; drop --pipeline-csv")
        program = load_program(args.program)
    else:
        order = pipeline_order_from_args(args)
        # On GPUs (NCCL) the layout's precision is run as it is costed: bf16 autocast over fp32 master weights.
        model, layout = _model_layout(args, order, keep_precision=True)
        if default_backend(layout.world_size) != "nccl":
            layout = fp32(layout)
        program = build_program(model, layout, order=order)
    validate_or_raise(program)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return _run_torchrun(program, args)
    world = len(program.ranks)
    config = LaunchConfig(world_size=world, run_timeout_s=args.timeout, backend=default_backend(world))
    result = run_program(program, steps=args.steps, seed=args.seed, config=config, collect_weights=False)
    if args.trace:
        with atomic_output(args.trace, flag="--trace") as temp:
            result.trace.to_chrome_trace(temp)
    warmup = 1 if args.steps > 1 else 0  # measured_step_s leaves the first step out when there are others
    summary = {"world_size": world, "steps": args.steps, "losses": result.losses,
               "step_times_s": result.step_times_s, "warmup_steps": warmup, "measured_step_s": result.measured_step_s}
    if args.json:
        print(json.dumps(summary))
    else:
        for i, (loss, t) in enumerate(zip(result.losses, result.step_times_s, strict=True)):
            mark = "  (warm-up: allocations and connections; not in the step time)" if i < warmup else ""
            print(f"step {i}: loss {loss:.4f}  time {t * 1e3:.2f} ms{mark}")
        counted = ("one step, warm-up included" if not warmup else
                   "step 1, after the warm-up" if args.steps == 2 else f"median of steps 1-{args.steps - 1}")
        print(f"step time {result.measured_step_s * 1e3:.2f} ms ({counted})")
        if args.trace:
            print(f"trace written to {args.trace} (open in https://ui.perfetto.dev)")
    return 0


def _run_torchrun(program: Any, args: argparse.Namespace) -> int:
    """One rank of a torchrun launch: interpret this rank's ops; rank 0 prints its own step times."""
    import torch.distributed as dist

    from executor.interpreter import RankInterpreter
    from executor.launch import run_under_torchrun

    def worker(ctx: Any, _: Any) -> list[float]:
        interp = RankInterpreter(ctx, program, seed=args.seed, backend=str(dist.get_backend()))
        times = []
        for step in range(args.steps):
            dist.barrier()
            times.append(interp.run_step(step).step_s)
        return times

    backend = "nccl" if _cuda_available() else "gloo"
    times = run_under_torchrun(worker, None, program.groups, backend=backend, timeout_s=args.timeout)
    if int(os.environ["RANK"]) == 0:
        print(json.dumps({"rank": 0, "step_times_s": times, "warmup_steps": 1 if len(times) > 1 else 0})
              if args.json else
              "\n".join(f"step {i}: rank 0 time {t * 1e3:.2f} ms{'  (warm-up)' if i == 0 and len(times) > 1 else ''}"
                        for i, t in enumerate(times)))
    return 0


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def doctor_checks() -> list[tuple[str, bool, str]]:
    """(check, ok, detail or what to fix) for the backend, GPUs and the rendezvous address."""
    import torch
    import torch.distributed as dist

    checks: list[tuple[str, bool, str]] = []
    checks.append(("torch.distributed", dist.is_available(),
                   "available" if dist.is_available() else "missing: install a torch build with distributed"))
    checks.append(("gloo backend", dist.is_gloo_available(),
                   "available" if dist.is_gloo_available() else "reinstall torch (gloo is in every official build)"))
    nccl = dist.is_nccl_available()
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    checks.append(("NCCL backend", True, "available" if nccl else "not available: CPU runs use gloo (fine); "
                   "for GPUs install a CUDA build of torch"))
    checks.append(("GPUs", True, f"{gpus} visible" if gpus else "none: runs use gloo on CPU"))
    addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    try:
        resolved = socket.gethostbyname(addr)
        checks.append((f"MASTER_ADDR {addr}", True, f"resolves to {resolved}"))
    except OSError as exc:
        checks.append((f"MASTER_ADDR {addr}", False, f"does not resolve ({exc}); set MASTER_ADDR to a reachable "
                       "host name or IP"))
        resolved = None
    port_text = os.environ.get("MASTER_PORT")
    if port_text is None:
        checks.append(("MASTER_PORT", True, "unset: local runs pick a free port each time"))
    else:
        ok, detail = _port_check(resolved or "127.0.0.1", port_text)
        checks.append((f"MASTER_PORT {port_text}", ok, detail))
    cores = os.cpu_count() or 1
    checks.append(("CPU cores", True, f"{cores}; ranks share them ({max(1, cores // 2)} thread(s) each at 2 ranks)"))
    return checks


def _port_check(host: str, text: str) -> tuple[bool, str]:
    try:
        port = int(text)
    except ValueError:
        return False, f"{text!r} is not a port number; set MASTER_PORT to an integer 1024-65535"
    if not 0 < port < 65536:
        return False, f"{port} is outside 1-65535"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError as exc:
            return False, f"cannot bind {host}:{port} ({exc.strerror}): another process uses it; pick another port"
    return True, "free"


def _doctor() -> int:
    checks = doctor_checks()
    for name, ok, detail in checks:
        print(f"[{'ok' if ok else 'FAIL'}] {name}: {detail}")
    return 0 if all(ok for _, ok, _ in checks) else 1


def _calibrate(args: argparse.Namespace) -> int:
    from executor.calibrate import calibrate
    from executor.devices import cuda_available
    from simgrid.io import check_output_path

    if Path(args.out).parent.exists():  # calibrate creates missing folders; an unusable path fails now
        check_output_path(args.out, flag="--out")
    if args.device == "cuda" or (args.device == "auto" and cuda_available()):
        return _calibrate_device(args)
    model, _ = _model_layout(args)
    spec, fit = calibrate(model, world_size=args.ranks, out=args.out)
    measured = spec.measured
    assert measured is not None
    print(f"wrote {args.out}: compute {fit.describe()}; "
          f"{len(measured.collectives)} collective and {len(measured.p2p)} send/recv measurements, "
          f"{len(measured.compute)} in-situ op rows, compute slowdown under communication "
          f"{spec.node.gpu.comm_compute_slowdown:.0%}")
    if fit.generation_summary:
        print(fit.generation_summary)
    if fit.drift_warning():
        print(f"simgrid-exec: {fit.drift_warning()}", file=sys.stderr)
    return 0


def _calibrate_device(args: argparse.Namespace) -> int:
    """``calibrate --device cuda``: micro-benchmarks of this GPU fitted to its datasheet profile."""
    from executor.devicecal import calibrate_device, format_calibration, write_bench_json
    from executor.devices import cuda_available
    from simgrid.hardware import write_profile
    from simgrid.model import get_model

    if not cuda_available():
        raise SimgridError("calibrate --device cuda needs a CUDA GPU and a CUDA build of torch; none is visible "
                           "here (use --device cpu to calibrate gloo ranks on this CPU)")
    if not args.sustained_s > 0:
        raise SimgridError(f"--sustained-s = {args.sustained_s} must be > 0 seconds")
    models = None
    if args.models:
        models = []
        for item in args.models.split(","):
            name, _, tp = item.strip().partition(":")
            if tp and (not tp.isdigit() or int(tp) < 1):
                raise SimgridError(f"--models: {item!r} must be PRESET or PRESET:TP with TP a positive integer")
            models.append((get_model(name), int(tp or 1)))
    out = args.out
    cal = calibrate_device(models, out=None, datasheet=args.datasheet, sustained_s=args.sustained_s,
                           progress=lambda text: print(f"calibrate: {text}", file=sys.stderr, flush=True))
    if out == DEFAULT_PROFILE:
        out = f"{cal.spec.name}.toml"
    write_profile(cal.spec, out)
    if args.bench_json:
        write_bench_json(cal.bench, args.bench_json)
    print(format_calibration(cal))
    print(f"wrote {out}")
    return 0


def _validate(args: argparse.Namespace) -> int:
    from executor.validate import format_report, validate_layout
    from simgrid.hardware import load_cluster_spec
    from simgrid.io import atomic_output, check_output_paths

    if not Path(args.profile).exists():
        raise SimgridError(f"profile {args.profile!r} does not exist; run `simgrid-exec calibrate --out "
                           f"{args.profile}` first")
    load_cluster_spec(args.profile)  # a broken profile fails before any rank starts
    out = Path(args.trace_dir) if args.trace_dir else None
    if out is not None:
        if not out.is_dir():
            check_output_paths([("--trace-dir", out)])
            out.mkdir()
        check_output_paths([("--trace-dir", out / "predicted.json"), ("--trace-dir", out / "measured.json")])
    model, layout = _model_layout(args)
    report = validate_layout(model, layout, profile=args.profile, steps=args.steps)
    if out is not None:
        with atomic_output(out / "predicted.json", flag="--trace-dir") as predicted, \
                atomic_output(out / "measured.json", flag="--trace-dir") as measured:
            report.predicted.to_chrome_trace(predicted)
            report.measured.to_chrome_trace(measured)
    if args.json:
        print(json.dumps(report.to_json_dict()))
    else:
        print(format_report(f"{model.name} dp={layout.dp} tp={layout.tp} pp={layout.pp} {layout.schedule}", report))
    return 0 if report.numerics_match else 1


if __name__ == "__main__":
    sys.exit(main())
