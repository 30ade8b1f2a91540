"""The command line shared by the single-measurement checks (gemm_published.py, kernels_published.py): print the
comparison, and unless ``--skip-write`` rewrite the script's document under docs/ with its sources."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from types import ModuleType


def run(module: ModuleType, argv: Sequence[str] | None) -> int:
    """Run ``module``'s check. Its ``DOC``, ``DOC_HEAD``, ``REPO``, ``compare``, ``report`` and ``sources`` are read at
    call time, so a test may replace them on the module."""
    doc = module.DOC
    parser = argparse.ArgumentParser(description=(module.__doc__ or "").splitlines()[0])
    parser.add_argument("--skip-write", action="store_true",
                        help=f"print only; do not rewrite docs/{doc.name}")
    args = parser.parse_args(argv)
    rows = module.compare()
    text = module.report(rows)
    print(text)
    if not args.skip_write:
        doc.write_text(module.DOC_HEAD + text + "\n\n## Sources\n\n" + module.sources(rows) + "\n")
        print(f"\nwrote {doc.relative_to(module.REPO)}")
    return 0
