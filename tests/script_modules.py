"""Load a script that is not part of an installed package (benchmarks/, notebooks/) as a module for tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]
"""Repository root."""
BENCHMARKS = REPO / "benchmarks"
"""The benchmark and validation scripts."""


def load_script(path: Path, name: str, *, register: bool = True) -> ModuleType:
    """Execute ``path`` as module ``name``. ``register`` puts it in ``sys.modules`` first, which dataclasses
    defined in the script need (they resolve their module by name)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_benchmark(script: str, name: str) -> ModuleType:
    """``benchmarks/<script>.py`` as module ``name`` (a name of its own, so two tests may load one script)."""
    return load_script(BENCHMARKS / f"{script}.py", name)
