"""Start-up time of the ``simgrid`` command: ``simgrid --help`` and ``simgrid profiles`` (target < 0.3 s).

Usage::

    python benchmarks/startup_speed.py              # 15 runs of each command
    python benchmarks/startup_speed.py --runs 30

Each run is a fresh process (the console script when it is on PATH, else ``python -m simgrid``); the script
prints the median and the fastest wall time, the median CPU time of the child, the load average (a busy
machine slows every figure), and which heavy libraries each command imported (none of matplotlib,
pandas, SimPy or numpy should load for these two). A report, not a test: exit status 0 whatever the
verdict.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

TARGET_S = 0.3
COMMANDS = (["--help"], ["profiles"])
HEAVY = ("matplotlib", "pandas", "simpy", "numpy", "tqdm", "ray")
PROBE = ("import sys, runpy; sys.argv = ['simgrid', *sys.argv[1:]]\n"
         "try:\n    runpy.run_module('simgrid', run_name='__main__')\nexcept SystemExit:\n    pass\n"
         "print('LOADED', ' '.join(m for m in {heavy!r} if m in sys.modules), file=sys.stderr)\n")


def _command() -> list[str]:
    script = shutil.which("simgrid")
    return [script] if script else [sys.executable, "-m", "simgrid"]


def _time_once(argv: list[str]) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([*_command(), *argv], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False,
                   cwd=tempfile.gettempdir())
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def _heavy_imports(argv: list[str]) -> str:
    # Run outside the repository: ``python -c`` puts the working directory first on sys.path.
    out = subprocess.run([sys.executable, "-c", PROBE.format(heavy=HEAVY), *argv], capture_output=True, text=True,
                         check=False, cwd=tempfile.gettempdir())
    line = next((li for li in out.stderr.splitlines() if li.startswith("LOADED")), "LOADED ?")
    return line.removeprefix("LOADED").strip() or "none"


def main() -> None:
    parser = argparse.ArgumentParser(description="Benchmark the start-up of the simgrid command.")
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    print(f"command: {' '.join(_command())}; load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    for argv in COMMANDS:
        _time_once(argv)  # warm the file cache
        runs = [_time_once(argv) for _ in range(max(1, args.runs))]
        walls, cpus = [r[0] for r in runs], [r[1] for r in runs]
        median = statistics.median(walls)
        verdict = "met" if median < TARGET_S else "MISSED"
        print(f"simgrid {' '.join(argv)}: median {median:.3f} s, fastest {min(walls):.3f} s wall, "
              f"median CPU {statistics.median(cpus):.3f} s over {len(runs)} runs; target < {TARGET_S} s: {verdict}; "
              f"heavy libraries imported: {_heavy_imports(argv)}")
    print(f"load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
