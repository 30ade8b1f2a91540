"""Write the example notebooks (``notebooks/*.ipynb``) from their sources in ``notebooks/sources/*.py``.

Each source is a plain Python file in the "percent" cell format (as jupytext and VS Code read it), so
the notebooks are reviewed as Python; the committed ``.ipynb`` files are those sources executed top to
bottom, outputs included, so readers on GitHub see the tables and figures:

* ``# %%`` starts a code cell; ``# %% [markdown]`` starts a markdown cell whose lines are comments
  (``# `` is stripped);
* an IPython magic is written as a comment (``# %matplotlib inline``) so the source stays valid Python,
  and becomes the magic again in the notebook.

``tests/notebooks/test_notebooks_execute.py`` executes every notebook again (so they cannot rot) and
checks that the committed ``.ipynb`` files hold exactly their sources' cells, executed in order. After
editing a source, run::

    python notebooks/build_notebooks.py                 # execute the sources and write the .ipynb files
    python notebooks/build_notebooks.py quickstart      # only some of them
    python notebooks/build_notebooks.py --no-execute    # cells only, no outputs (fast; the check still fails)
    python notebooks/build_notebooks.py --check         # exit 1 if a committed notebook is out of date

Executing runs each notebook in a temporary directory (what it writes stays out of the repository) with
the Agg backend; timings and cell metadata that change every run are dropped so rebuilds diff cleanly.
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import sys
import tempfile
from pathlib import Path

import nbformat
from nbformat.notebooknode import NotebookNode

NOTEBOOK_DIR = Path(__file__).resolve().parent
SOURCE_DIR = NOTEBOOK_DIR / "sources"
KERNEL = {"name": "python3", "display_name": "Python 3", "language": "python"}

#: The notebooks, in reading order (the quickstart first).
NOTEBOOK_NAMES = (
    "quickstart",
    "pipeline_bubbles",
    "scaling_curves",
    "memory_and_zero",
    "communication",
    "zero3_vs_3d",
    "moe",
    "predicted_vs_measured",
    "serving",
)

_CELL_MARKER = re.compile(r"^# %%( \[markdown\])?\s*$")
_COMMENTED_MAGIC = re.compile(r"^# (%{1,2}[A-Za-z].*)$")


def parse_cells(text: str) -> list[tuple[str, str]]:
    """``(kind, source)`` pairs of a percent-format file; kind is ``"markdown"`` or ``"code"``."""
    cells: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        marker = _CELL_MARKER.match(line)
        if marker:
            cells.append(("markdown" if marker.group(1) else "code", []))
            continue
        if not cells:
            if line.strip():
                raise ValueError(f"text before the first '# %%' cell marker: {line!r}")
            continue
        kind, lines = cells[-1]
        if kind == "markdown":
            if line and not line.startswith("#"):
                raise ValueError(f"markdown cell line is not a comment: {line!r}")
            lines.append(line[2:] if line.startswith("# ") else line[1:])
        else:
            magic = _COMMENTED_MAGIC.match(line)
            lines.append(magic.group(1) if magic else line)
    return [(kind, "\n".join(lines).strip("\n")) for kind, lines in cells]


def build_notebook(name: str) -> NotebookNode:
    """The notebook of source ``name``, without outputs; cell ids derive from the name (stable rebuilds)."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = dict(KERNEL)
    nb.metadata["language_info"] = {"name": "python"}
    for index, (kind, source) in enumerate(parse_cells((SOURCE_DIR / f"{name}.py").read_text())):
        cell = nbformat.v4.new_markdown_cell(source) if kind == "markdown" else nbformat.v4.new_code_cell(source)
        cell["id"] = f"{name.replace('_', '-')}-{index:02d}"
        nb.cells.append(cell)
    nbformat.validate(nb)
    return nb


def render(name: str) -> str:
    """The file text of notebook ``name`` without outputs (what its executed file reduces to)."""
    return nbformat.writes(build_notebook(name)) + "\n"


def without_outputs(nb: NotebookNode) -> NotebookNode:
    """A copy of ``nb`` with outputs, execution counts, cell metadata and kernel details removed."""
    bare = copy.deepcopy(nb)
    bare.metadata = nbformat.from_dict({"kernelspec": dict(KERNEL), "language_info": {"name": "python"}})
    for cell in bare.cells:
        cell.metadata = nbformat.from_dict({})
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    return bare


def matches_source(text: str, name: str) -> bool:
    """Whether a notebook file holds exactly the cells of source ``name`` (outputs aside)."""
    return nbformat.writes(without_outputs(nbformat.reads(text, as_version=4))) + "\n" == render(name)


def execute(name: str, cell_timeout_s: int = 600) -> str:
    """Notebook ``name`` built from its source and run top to bottom in a temporary directory, as file text."""
    from nbclient import NotebookClient

    nb = build_notebook(name)
    os.environ.setdefault("MPLBACKEND", "Agg")
    with tempfile.TemporaryDirectory() as workdir:
        NotebookClient(nb, timeout=cell_timeout_s, kernel_name="python3", record_timing=False,
                       resources={"metadata": {"path": workdir}}).execute()
    nb.metadata["language_info"] = {"name": "python"}  # the kernel's version details would churn every rebuild
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
    nbformat.validate(nb)
    return nbformat.writes(nb) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write notebooks/*.ipynb (executed) from notebooks/sources/*.py.")
    parser.add_argument("names", nargs="*", help=f"notebooks to build (default: all of {', '.join(NOTEBOOK_NAMES)})")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if a committed notebook's cells differ from its source or it has no outputs")
    parser.add_argument("--no-execute", action="store_true", help="write the cells without running them")
    parser.add_argument("--out", type=Path, default=NOTEBOOK_DIR, help="directory to write to (default: notebooks/)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(NOTEBOOK_NAMES))
    if unknown:
        parser.error(f"unknown notebook(s) {', '.join(unknown)}; known: {', '.join(NOTEBOOK_NAMES)}")
    stale = []
    for name in args.names or NOTEBOOK_NAMES:
        path = args.out / f"{name}.ipynb"
        if args.check:
            if not path.exists() or not matches_source(path.read_text(), name) or not executed_in_order(path.read_text()):
                stale.append(path.name)
            continue
        path.write_text(render(name) if args.no_execute else execute(name))
        print(f"wrote {path}")
    if stale:
        print(f"out of date (run python notebooks/build_notebooks.py): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


def executed_in_order(text: str) -> bool:
    """Every code cell ran, once, top to bottom (execution counts 1, 2, 3, ...)."""
    counts = [cell.execution_count for cell in nbformat.reads(text, as_version=4).cells if cell.cell_type == "code"]
    return counts == list(range(1, len(counts) + 1))


if __name__ == "__main__":
    raise SystemExit(main())
