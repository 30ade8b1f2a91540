"""Run the bad-input corpus (``benchmarks/fuzz_corpus.py``, ~800 cases) through the CLI and count outcomes.

Usage::

    python benchmarks/fuzz_cli.py                  # the whole corpus, one case at a time
    python benchmarks/fuzz_cli.py --group profile --show 20

Each case runs in a forked child (the parent has imported simgrid, pandas and matplotlib once) in its own
folder, with stdout and stderr captured, inside a new session so that a hung case and any process it
spawned are killed at the deadline. Outcomes:

* ``clean error``: exit 2, and stderr holds exactly one error line (progress lines aside);
* ``argparse error``: exit 2 with argparse's usage block and its one error line;
* ``answered``: exit 0, with a sane answer (strict JSON where ``--json`` was given: finite step time, MFU
  and bubble in [0, 1]) and no temporary files left next to the outputs;
* ``traceback``: a Python traceback, or an exit status other than 0 and 2;
* ``messy error``: exit 2 but more than one error line;
* ``hang``: still running at the deadline (``--deadline``, default 20 s);
* ``wrongly accepted``: exit 0 for an input that must be refused, an answer that is not sane, or (any
  exit) a file left behind by a failed command.

The closing line states the tracebacks, hangs and wrong acceptances; the issue's target is 0 of each.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import contextlib

from fuzz_corpus import Case, all_cases, materialise

PROGRESS_PREFIXES = ("simulating ", "simulated ", "wrote ", "trace written", "simgrid: warning:", "warning:")
BAD_OUTCOMES = ("traceback", "hang", "wrongly accepted")


def _invoke(case: Case) -> int:
    """Run the case's command in this (child) process; the return value is the exit status."""
    if case.tool == "simgrid":
        from simgrid.cli.main import main

        return main(case.argv)
    if case.tool == "simgrid-exec":
        from executor.cli import main as exec_main

        return exec_main(case.argv)
    from simgrid.errors import SimgridError

    module_name, _, function_name = (case.api or "").partition(":")
    module = __import__(module_name, fromlist=[function_name])
    text = Path("input.csv").read_text(encoding="utf-8", errors="surrogateescape")
    try:
        getattr(module, function_name)(text)
    except SimgridError as exc:
        print(f"api: error: {exc}", file=sys.stderr)
        return 2
    return 0


def _child(case: Case, folder: Path, out_fd: int, err_fd: int) -> None:
    os.setsid()
    code = 1
    try:
        os.chdir(folder)
        for key, value in case.env.items():
            os.environ[key] = value.replace("{dir}", str(folder))
        os.dup2(out_fd, 1)  # pipes, not files: the file-size limit below must not apply to the output
        os.dup2(err_fd, 2)
        if case.fsize is not None:
            # Writes past this size fail with EFBIG, as they would with ENOSPC on a full disk.
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (case.fsize, case.fsize))
        try:
            code = _invoke(case)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code if isinstance(code, int) else 1)


def _snapshot(folder: Path) -> set[str]:
    found = set()
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            found.add(os.path.relpath(os.path.join(root, name), folder))
    return found


def _strict_json(text: str) -> object:
    def refuse(token: str) -> object:
        raise ValueError(f"non-JSON constant {token}")

    return json.loads(text, parse_constant=refuse)


def _sane_answer(case: Case, stdout: str) -> str:
    """Empty when the answer is sane, else why not."""
    if not case.json_out:
        return ""
    try:
        data = _strict_json(stdout)
    except ValueError as exc:
        return f"stdout is not strict JSON ({exc})"
    if not isinstance(data, dict) or "step_time_s" not in data:
        return ""
    step = data["step_time_s"]
    if not (isinstance(step, int | float) and math.isfinite(step) and step > 0):
        return f"step_time_s = {step}"
    for key in ("mfu", "hfu", "bubble_fraction"):
        value = data.get(key)
        if isinstance(value, int | float) and not 0 <= value <= 1.0 + 1e-9:
            return f"{key} = {value}"
    return ""


def classify(case: Case, code: int | None, stdout: str, stderr: str, new_files: set[str]) -> tuple[str, str]:
    """(outcome, detail) of one run (see the module docstring)."""
    if code is None:
        return "hang", ""
    if "Traceback (most recent call last)" in stderr or code not in (0, 2):
        tail = [line for line in stderr.strip().splitlines() if line.strip()]
        return "traceback", f"exit {code}: {tail[-1] if tail else ''}"[:200]
    if code == 2:
        if new_files:
            return "wrongly accepted", f"failed but left {sorted(new_files)[:3]}"
        lines = [ln for ln in stderr.splitlines() if ln.strip() and not ln.startswith(PROGRESS_PREFIXES)]
        if lines and lines[0].startswith("usage:"):
            return "argparse error", lines[-1][:200]
        errors = [ln for ln in lines if "error" in ln.lower()]
        if len(lines) == 1 and errors:
            return "clean error", lines[0][:200]
        return "messy error", " | ".join(lines)[:200]
    if case.expect == "reject":
        return "wrongly accepted", "exit 0"
    leftovers = [f for f in new_files if ".tmp" in f or f.startswith(".")]
    if leftovers:
        return "wrongly accepted", f"left temporary files {leftovers[:3]}"
    why = _sane_answer(case, stdout)
    if why:
        return "wrongly accepted", why
    return "answered", ""


def _drain(fd: int, sink: list[bytes]) -> threading.Thread:
    def read() -> None:
        with os.fdopen(fd, "rb") as pipe:
            while chunk := pipe.read(65536):
                if sum(map(len, sink)) < 1 << 20:  # keep the first MiB
                    sink.append(chunk)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def run_case(case: Case, folder: Path, deadline_s: float) -> tuple[str, str, float]:
    """Materialise, fork, wait (killing the session at the deadline), classify."""
    materialise(case, folder)
    before = _snapshot(folder)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        os.close(out_r)
        os.close(err_r)
        _child(case, folder, out_w, err_w)
    os.close(out_w)
    os.close(err_w)
    out_chunks: list[bytes] = []
    err_chunks: list[bytes] = []
    readers = [_drain(out_r, out_chunks), _drain(err_r, err_chunks)]
    code: int | None = None
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            break
        if time.perf_counter() - start > deadline_s:
            for sig in (signal.SIGKILL,):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, sig)
            os.waitpid(pid, 0)
            break
        time.sleep(0.01)
    elapsed = time.perf_counter() - start
    if code is not None:  # the case may have left rank processes in its session
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    for reader in readers:
        reader.join(timeout=5)
    stdout = b"".join(out_chunks).decode(errors="replace")
    stderr = b"".join(err_chunks).decode(errors="replace")
    new_files = _snapshot(folder) - before
    outcome, detail = classify(case, code, stdout, stderr, new_files)
    return outcome, detail, elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--group", action="append", help="only these corpus groups (repeatable)")
    parser.add_argument("--deadline", type=float, default=20.0, help="seconds before a case counts as a hang")
    parser.add_argument("--show", type=int, default=40, help="bad cases to list (default 40)")
    parser.add_argument("--match", help="only cases whose name contains this text")
    parser.add_argument("--keep", action="store_true", help="keep the case folders")
    args = parser.parse_args()

    # Import once in the parent so every forked case starts warm.
    import matplotlib
    import pandas  # noqa: F401

    matplotlib.use("Agg")
    import simgrid.cli.main
    import simgrid.engine
    import simgrid.hardware
    import simgrid.plots
    import simgrid.schedules
    import simgrid.simulation
    import simgrid.sweep

    simgrid.cli.main.build_parser()  # imports every command module

    cases = all_cases(tuple(args.group) if args.group else None)
    if args.match:
        cases = [c for c in cases if args.match in c.name]
    root = Path(tempfile.mkdtemp(prefix="simgrid-fuzz-"))
    # Cases that move HOME must not make matplotlib write its cache into their folders.
    os.environ.setdefault("MPLCONFIGDIR", str(Path(matplotlib.get_configdir())))
    counts: Counter[str] = Counter()
    by_group: dict[str, Counter[str]] = {}
    bad: list[tuple[str, Case, str, float]] = []
    slowest: list[tuple[float, str]] = []
    t0 = time.perf_counter()
    for index, case in enumerate(cases):
        outcome, detail, elapsed = run_case(case, root / f"{index:04d}", args.deadline)
        if case.expect == "accept" and outcome in ("clean error", "argparse error", "messy error"):
            outcome, detail = "wrongly refused", detail
        counts[outcome] += 1
        by_group.setdefault(case.group, Counter())[outcome] += 1
        slowest.append((elapsed, f"{case.group}: {case.name}"))
        if outcome in (*BAD_OUTCOMES, "messy error", "wrongly refused"):
            bad.append((outcome, case, detail, elapsed))
        if not args.keep:
            shutil.rmtree(root / f"{index:04d}", ignore_errors=True)
        if (index + 1) % 100 == 0:
            print(f"  {index + 1}/{len(cases)} cases, {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    order = ("clean error", "argparse error", "answered", "messy error", "wrongly refused", "traceback", "hang",
             "wrongly accepted")
    print(f"corpus: {len(cases)} inputs in {time.perf_counter() - t0:.0f} s")
    print(f"{'group':<14}" + "".join(f"{name:>17}" for name in order))
    for group, counter in by_group.items():
        print(f"{group:<14}" + "".join(f"{counter.get(name, 0):>17}" for name in order))
    print(f"{'all':<14}" + "".join(f"{counts.get(name, 0):>17}" for name in order))
    slowest.sort(reverse=True)
    print("slowest: " + "; ".join(f"{name} {t:.1f} s" for t, name in slowest[:3]))
    for outcome, case, detail, elapsed in bad[: args.show]:
        print(f"  [{outcome}] {case.group}: {case.name} ({elapsed:.1f} s) {detail}")
    if len(bad) > args.show:
        print(f"  ... {len(bad) - args.show} more")
    print(f"result: {counts['traceback']} tracebacks, {counts['hang']} hangs, {counts['wrongly accepted']} wrongly "
          f"accepted ({counts['messy error']} multi-line errors, {counts['wrongly refused']} valid inputs refused)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
