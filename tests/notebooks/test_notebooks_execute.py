"""The example notebooks execute end to end, match their sources, and write only to the working directory.

Every notebook in ``notebooks/`` is run top to bottom in a fresh ``python3`` kernel (nbclient) whose
working directory is a temporary directory, so nothing a notebook writes lands in the repository. A
cell that raises fails the test with the cell's traceback. The committed ``.ipynb`` files must equal
what ``notebooks/build_notebooks.py`` renders from ``notebooks/sources/*.py`` (reviewable as Python,
no outputs committed).
"""

from __future__ import annotations

import time
from pathlib import Path

import nbformat
import pytest
from script_modules import load_script
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK_DIR = REPO / "notebooks"
CELL_TIMEOUT_S = 240
"""Per-cell limit: generous, since the suite shares two cores; each notebook takes well under a minute alone."""


BUILDER = load_script(NOTEBOOK_DIR / "build_notebooks.py", "build_notebooks", register=False)
NAMES: tuple[str, ...] = BUILDER.NOTEBOOK_NAMES


def _execute(nb: nbformat.NotebookNode, workdir: Path) -> float:
    """Run ``nb`` in place with ``workdir`` as the kernel's working directory; returns wall seconds."""
    client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(workdir)}})
    start = time.perf_counter()
    try:
        client.execute()
    except CellExecutionError as exc:  # the message holds the failing cell and its traceback
        pytest.fail(f"a notebook cell raised:\n{exc}")
    return time.perf_counter() - start


def _outputs(nb: nbformat.NotebookNode, mime: str) -> list[str]:
    return [out["data"][mime] for cell in nb.cells if cell.cell_type == "code" for out in cell.get("outputs", [])
            if out.get("output_type") in ("display_data", "execute_result") and mime in out.get("data", {})]


def _stream_text(nb: nbformat.NotebookNode) -> str:
    return "".join(out.get("text", "") for cell in nb.cells if cell.cell_type == "code"
                   for out in cell.get("outputs", []) if out.get("output_type") == "stream")


def test_every_source_has_a_committed_notebook_and_back() -> None:
    """The list of notebooks, the sources and the committed .ipynb files name the same nine notebooks."""
    sources = {p.stem for p in (NOTEBOOK_DIR / "sources").glob("*.py")}
    committed = {p.stem for p in NOTEBOOK_DIR.glob("*.ipynb")}
    assert set(NAMES) == sources == committed
    assert len(NAMES) == 9


@pytest.mark.parametrize("name", NAMES)
def test_committed_notebook_matches_its_source_and_carries_its_outputs(name: str) -> None:
    """A committed notebook holds exactly its source's cells (no stale edits), every code cell executed
    once in order, and the figures it draws (what a reader on GitHub sees)."""
    committed = (NOTEBOOK_DIR / f"{name}.ipynb").read_text()
    fix = f"run: python notebooks/build_notebooks.py {name}"
    assert BUILDER.matches_source(committed, name), f"{name} is stale; {fix}"
    assert BUILDER.executed_in_order(committed), f"{name} was not executed top to bottom; {fix}"
    nb = nbformat.reads(committed, as_version=4)
    assert _outputs(nb, "image/png"), f"{name} carries no figure; {fix}"
    assert not any(out.get("output_type") == "error" for cell in nb.cells for out in cell.get("outputs", []))


def test_outputs_do_not_count_as_source_changes() -> None:
    """Stripping outputs from a committed notebook gives the bare rendering; editing a cell does not."""
    committed = (NOTEBOOK_DIR / "quickstart.ipynb").read_text()
    nb = nbformat.reads(committed, as_version=4)
    assert nbformat.writes(BUILDER.without_outputs(nb)) + "\n" == BUILDER.render("quickstart")
    nb.cells[-1].source += "\n# edited by hand"
    assert not BUILDER.matches_source(nbformat.writes(nb), "quickstart")


def test_percent_format_parser_splits_markdown_code_and_magics() -> None:
    """Markdown comment lines lose their '# ', commented magics become magics, code stays verbatim."""
    text = "# %% [markdown]\n# # Title\n#\n# prose\n\n# %%\n# %matplotlib inline\nx = 1  # note\n"
    assert BUILDER.parse_cells(text) == [("markdown", "# Title\n\nprose"),
                                         ("code", "%matplotlib inline\nx = 1  # note")]


def test_percent_format_parser_rejects_code_in_a_markdown_cell() -> None:
    """A non-comment line inside a markdown cell is an error naming the line (it would vanish silently)."""
    with pytest.raises(ValueError, match="markdown cell line is not a comment: 'x = 1'"):
        BUILDER.parse_cells("# %% [markdown]\n# text\nx = 1\n")


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_notebook_executes_without_error(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The notebook runs top to bottom in a fresh kernel, draws its figures and leaves the repo untouched."""
    monkeypatch.setenv("MPLBACKEND", "Agg")
    before = {p.name for p in NOTEBOOK_DIR.iterdir()}
    nb = nbformat.read(NOTEBOOK_DIR / f"{name}.ipynb", as_version=4)
    seconds = _execute(nb, tmp_path)
    print(f"{name}: {seconds:.1f} s")
    assert {p.name for p in NOTEBOOK_DIR.iterdir()} == before, "the notebook wrote into notebooks/"
    skipped = "SKIPPED: PyTorch is not installed" in _stream_text(nb)
    if not skipped:
        assert _outputs(nb, "image/png"), "the notebook drew no figure"
    if name == "quickstart":
        assert (tmp_path / "quickstart_trace.json").stat().st_size > 0
    if name == "predicted_vs_measured" and not skipped:
        assert (tmp_path / "localhost-quick.toml").exists()


def test_predicted_vs_measured_skips_cleanly_without_torch(tmp_path: Path) -> None:
    """With torch hidden from importlib, the executor notebook prints why it skips and raises nothing."""
    nb = nbformat.read(NOTEBOOK_DIR / "predicted_vs_measured.ipynb", as_version=4)
    hide_torch = (
        "import importlib.util as _u\n"
        "_find = _u.find_spec\n"
        "_u.find_spec = lambda name, *a, **k: None if name == 'torch' else _find(name, *a, **k)"
    )
    nb.cells.insert(0, nbformat.v4.new_code_cell(hide_torch))
    _execute(nb, tmp_path)
    text = _stream_text(nb)
    assert "SKIPPED: PyTorch is not installed" in text
    assert "running for real" not in text
    assert not _outputs(nb, "image/png")
    assert not (tmp_path / "localhost-quick.toml").exists()
