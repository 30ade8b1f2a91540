"""``simgrid-exec``: run schedules for real, check the machine, calibrate it, validate predictions.

Commands::

    simgrid-exec run (--program F.json | layout flags) [--steps K] [--trace out.json] [--json]
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
    from simgrid.cli.common import add_model_layout_args, positive_int, positive_number

    parser = argparse.ArgumentParser(prog="simgrid-exec", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a Program (or a layout's Program) for real on torch.distributed")
    run.add_argument("--program", help="Program JSON file (from `simgrid program --out`)")
    add_model_layout_args(run, default_model="tiny-gpt")
    run.add_argument("--steps", type=positive_int, default=1, help="optimizer steps (default 1)")
    run.add_argument("--seed", type=int, default=0, help="seed of weights and data (default 0)")
    run.add_argument("--trace", help="write the measured trace (Chrome/Perfetto JSON) here")
    run.add_argument("--timeout", type=positive_number, default=300.0,
                     help="overall deadline in seconds, finite and > 0 (default 300)")
    run.add_argument("--json", action="store_true", help="print a JSON summary")
    sub.add_parser("doctor", help="check backends, GPUs and the rendezvous address/port, and say what to fix")
    cal = sub.add_parser("calibrate", help="micro-benchmark this machine and write a cluster profile")
    # small-gpt: a step long enough that compute, not gloo wake-up jitter, decides it (see presets).
    add_model_layout_args(cal, default_model="small-gpt")
    cal.add_argument("--out", default=DEFAULT_PROFILE, help=f"profile path (default {DEFAULT_PROFILE})")
    cal.add_argument("--ranks", type=positive_int, default=2, help="ranks to calibrate for (default 2)")
    val = sub.add_parser("validate", help="run a layout for real and compare with the simulator's prediction")
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


def _model_layout(args: argparse.Namespace) -> tuple[Any, Any]:
    from executor.validate import fp32
    from simgrid.cli.common import model_layout_from_args

    model, layout = model_layout_from_args(args)
    return model, fp32(layout)


def _run(args: argparse.Namespace) -> int:
    from executor.launch import LaunchConfig
    from executor.runner import run_program, validate_or_raise
    from simgrid.io import atomic_output, check_output_path
    from simgrid.ir.jsonio import load_program
    from simgrid.schedules import build_program

    if args.trace is not None:
        check_output_path(args.trace, flag="--trace")
    if args.program:
        program = load_program(args.program)
    else:
        model, layout = _model_layout(args)
        program = build_program(model, layout)
    validate_or_raise(program)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return _run_torchrun(program, args)
    world = len(program.ranks)
    config = LaunchConfig(world_size=world, run_timeout_s=args.timeout)
    result = run_program(program, steps=args.steps, seed=args.seed, config=config, collect_weights=False)
    if args.trace:
        with atomic_output(args.trace, flag="--trace") as temp:
            result.trace.to_chrome_trace(temp)
    summary = {"world_size": world, "steps": args.steps, "losses": result.losses,
               "step_times_s": result.step_times_s, "measured_step_s": result.measured_step_s}
    if args.json:
        print(json.dumps(summary))
    else:
        for i, (loss, t) in enumerate(zip(result.losses, result.step_times_s, strict=True)):
            print(f"step {i}: loss {loss:.4f}  time {t * 1e3:.2f} ms")
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
        print(json.dumps({"rank": 0, "step_times_s": times}) if args.json else
              "\n".join(f"step {i}: rank 0 time {t * 1e3:.2f} ms" for i, t in enumerate(times)))
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
    from simgrid.io import check_output_path

    if Path(args.out).parent.exists():  # calibrate creates missing folders; an unusable path fails now
        check_output_path(args.out, flag="--out")
    model, _ = _model_layout(args)
    spec, fit = calibrate(model, world_size=args.ranks, out=args.out)
    measured = spec.measured
    assert measured is not None
    print(f"wrote {args.out}: compute {fit.peak_flops / 1e9:.2f} GFLOP/s, {fit.bandwidth_Bps / 1e9:.2f} GB/s, "
          f"{fit.overhead_s * 1e6:.1f} us/kernel (fit over {fit.samples} ops, mean error {fit.mean_abs_error:.0%}); "
          f"{len(measured.collectives)} collective and {len(measured.p2p)} send/recv measurements, "
          f"{len(measured.compute)} in-situ op rows, compute slowdown under communication "
          f"{spec.node.gpu.comm_compute_slowdown:.0%}")
    if fit.drift_warning():
        print(f"simgrid-exec: {fit.drift_warning()}", file=sys.stderr)
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
