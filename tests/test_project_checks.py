"""Project-wide checks: lint, types, and the layering rule that the simulator never imports torch."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_is_clean() -> None:
    """`ruff check` passes on the whole tree (rules in pyproject.toml)."""
    result = _run([sys.executable, "-m", "ruff", "check", "."])
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_is_clean() -> None:
    """mypy passes on simgrid/ and executor/ (settings in pyproject.toml)."""
    result = _run([sys.executable, "-m", "mypy"])
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]


def test_simulator_never_imports_torch() -> None:
    """Importing every simgrid module leaves torch unimported (torch belongs to executor/)."""
    import simgrid

    names = [m.name for m in pkgutil.walk_packages(simgrid.__path__, "simgrid.")]
    code = (
        "import importlib, sys\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module(name)\n"
        "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
        "print(len(bad))\n"
    )
    result = _run([sys.executable, "-c", code])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "0", "a simgrid module imported torch"
    assert len(names) > 5


def test_ir_imports_neither_simpy_nor_torch() -> None:
    """simgrid.ir is pure data: neither the simulator's SimPy nor torch is pulled in."""
    code = (
        "import sys, simgrid.ir\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('simpy', 'torch')))\n"
    )
    result = _run([sys.executable, "-c", code])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
