"""Load a script that is not part of an installed package (benchmarks/, notebooks/) as a module for tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

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


def written_doc(module: ModuleType, rows: object, tmp_path: Path, monkeypatch: Any) -> str:
    """Run a single-measurement check's command line (benchmarks/published_doc_cli.py) on precomputed ``rows`` with
    its document redirected under ``tmp_path``: ``--skip-write`` must leave no file, a plain run must write one;
    returns what it wrote."""
    doc = tmp_path / module.DOC.name
    monkeypatch.setattr(module, "DOC", doc)
    monkeypatch.setattr(module, "REPO", tmp_path)
    monkeypatch.setattr(module, "compare", lambda points=None: rows)
    assert module.main(["--skip-write"]) == 0 and not doc.exists()
    assert module.main([]) == 0
    return doc.read_text()
