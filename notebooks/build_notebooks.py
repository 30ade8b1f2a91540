"""Write the example notebooks (``notebooks/*.ipynb``) from their sources in ``notebooks/sources/*.py``.

Each source is a plain Python file in the "percent" cell format (as jupytext and VS Code read it), so
the notebooks are reviewed as Python and committed without outputs:

* ``# %%`` starts a code cell; ``# %% [markdown]`` starts a markdown cell whose lines are comments
  (``# `` is stripped);
* an IPython magic is written as a comment (``# %matplotlib inline``) so the source stays valid Python,
  and becomes the magic again in the notebook.

``tests/notebooks/test_notebooks_execute.py`` executes every notebook (so they cannot rot) and checks
that the committed ``.ipynb`` files match their sources. After editing a source, run::

    python notebooks/build_notebooks.py            # rewrite the .ipynb files
    python notebooks/build_notebooks.py --check    # exit 1 if a committed notebook is out of date
"""

from __future__ import annotations

import argparse
import re
import sys
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
    """The exact file text of notebook ``name`` (``<name>.ipynb``)."""
    return nbformat.writes(build_notebook(name)) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write notebooks/*.ipynb from notebooks/sources/*.py.")
    parser.add_argument("--check", action="store_true", help="exit 1 if a committed notebook differs from its source")
    parser.add_argument("--out", type=Path, default=NOTEBOOK_DIR, help="directory to write to (default: notebooks/)")
    args = parser.parse_args(argv)
    stale = []
    for name in NOTEBOOK_NAMES:
        path = args.out / f"{name}.ipynb"
        text = render(name)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print(f"out of date (run python notebooks/build_notebooks.py): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
