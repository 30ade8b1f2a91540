"""Imports run one way: no cycle in simgrid/ or executor/, and the executor's layers stay in their order.

The import graph is read from the source with the standard library's :mod:`ast` (nothing is imported), so
it sees every import: module-level, inside functions and under ``if TYPE_CHECKING:`` (a type-only cycle
still makes two modules that cannot be read one before the other, and the next change turns it into a
real one). An edge goes from a module to the module an import names: ``from pkg import mod`` names
``pkg.mod`` when that is a module and ``pkg`` otherwise; relative imports are resolved against the
importing module's package. The parent packages' ``__init__`` files that Python runs on the way are not
edges (a package that re-exports its submodules would otherwise form a cycle with each of them).
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("simgrid", "executor")

Graph = dict[str, set[str]]


# -- the graph -------------------------------------------------------------------------------------------
def module_files(root: Path, packages: Iterable[str]) -> dict[str, tuple[Path, bool]]:
    """Module name -> (file, whether it is a package ``__init__``) for every ``.py`` under ``root/<package>``."""
    found: dict[str, tuple[Path, bool]] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            is_init = parts[-1] == "__init__"
            found[".".join(parts[:-1] if is_init else parts)] = (path, is_init)
    return found


def _known_prefix(name: str, known: set[str]) -> str | None:
    """The longest prefix of dotted ``name`` that is a known module (``pkg.mod.func`` -> ``pkg.mod``)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in known:
            return candidate
    return None


def _from_source(node: ast.ImportFrom, module: str, is_init: bool) -> str:
    """Absolute name of the module a ``from ... import`` reads from."""
    if not node.level:
        return node.module or ""
    package = (module if is_init else module.rpartition(".")[0]).split(".")
    keep = len(package) - (node.level - 1)
    if keep <= 0:
        raise ValueError(f"{module}: relative import goes above the top-level package")
    base = ".".join(package[:keep])
    return f"{base}.{node.module}" if node.module else base


def module_imports(tree: ast.AST, module: str, is_init: bool, known: set[str]) -> set[str]:
    """Known modules that the imports anywhere in ``tree`` (functions and TYPE_CHECKING blocks included) name."""
    targets: set[str | None] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets.update(_known_prefix(alias.name, known) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            source = _from_source(node, module, is_init)
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                targets.add(submodule if submodule in known else _known_prefix(source, known))
    return {t for t in targets if t is not None and t != module}


def import_graph(root: Path, packages: Iterable[str]) -> Graph:
    """Module -> modules of ``packages`` it imports, read from the source text."""
    files = module_files(root, packages)
    known = set(files)
    return {module: module_imports(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)),
                                   module, is_init, known)
            for module, (path, is_init) in files.items()}


# -- cycles ----------------------------------------------------------------------------------------------
def strongly_connected(graph: Graph) -> list[list[str]]:
    """Tarjan's strongly connected components of ``graph`` (iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


def _shortest_cycle(graph: Graph, members: list[str]) -> list[str]:
    """A shortest cycle through the first of ``members`` inside them, as ``[a, b, ..., a]``."""
    inside = set(members)
    start = members[0]
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph.get(node, ())):
                if child not in inside:
                    continue
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if child not in previous:
                    previous[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"{members} is not a cycle")


def find_cycles(graph: Graph) -> list[list[str]]:
    """One import cycle per group of modules that import each other (empty: imports run one way)."""
    return [_shortest_cycle(graph, c) for c in strongly_connected(graph) if len(c) > 1]


def reachable(graph: Graph, start: str) -> set[str]:
    """Every module ``start`` imports, directly or through others."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for child in graph.get(todo.pop(), ()):
            if child not in seen:
                seen.add(child)
                todo.append(child)
    return seen


@pytest.fixture(scope="module")
def project_graph() -> Graph:
    return import_graph(ROOT, PACKAGES)


# -- the project -----------------------------------------------------------------------------------------
def test_simgrid_and_executor_have_no_import_cycle(project_graph: Graph) -> None:
    """No module of simgrid/ or executor/ imports itself through others (type-only and local imports too)."""
    assert len(project_graph) > 100 and sum(map(len, project_graph.values())) > 300  # the whole tree was read
    groups = [c for c in strongly_connected(project_graph) if len(c) > 1]
    assert not groups, "import cycles: " + "; ".join(
        f"{' -> '.join(_shortest_cycle(project_graph, c))} (modules in the circle: {', '.join(c)})" for c in groups)


def test_simgrid_never_imports_executor(project_graph: Graph) -> None:
    """The simulator stands alone: nothing under simgrid/ reaches executor/ (DESIGN.md, layers)."""
    offenders = {m: sorted(t for t in targets if t.startswith("executor"))
                 for m, targets in project_graph.items() if m.startswith("simgrid")}
    assert not {m: t for m, t in offenders.items() if t}


EXECUTOR_LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("entry points", ("executor", "executor.cli", "executor.runner", "executor.validate", "executor.calibrate",
                      "executor.commbench", "executor.hostprobe", "executor.profilefit", "executor.costmodel",
                      "executor.reference", "executor.collectives", "executor.generate", "executor.devicecal",
                      "executor.devicefit", "executor.kernelbench", "executor.gencal")),
    ("interpreter", ("executor.interpreter",)),
    ("op handlers", ("executor.handlers", "executor.handlers.*")),
    ("rank state", ("executor.state", "executor.recorder")),
    ("runs and gradients", ("executor.blockrun", "executor.grads", "executor.cutplan")),
    ("model", ("executor.model", "executor.weights", "executor.block", "executor.layers", "executor.moe_layers",
               "executor.tp", "executor.cp")),
    ("primitives", ("executor.comm", "executor.optim", "executor.data", "executor.timing", "executor.launch",
                    "executor.precision", "executor.devices")),
)
"""The executor's layers, top first (docs/design.md, Executor, draws them): a module imports modules of its
own layer or of the layers below, never above. A new module is placed here when it is added."""


def executor_layer(module: str) -> int:
    """Index in :data:`EXECUTOR_LAYERS` of an executor module's layer (0 = top)."""
    for index, (_, patterns) in enumerate(EXECUTOR_LAYERS):
        if any(module == p or (p.endswith(".*") and module.startswith(p[:-1])) for p in patterns):
            return index
    raise AssertionError(f"{module} is in no layer of EXECUTOR_LAYERS: add it to the layer it belongs to")


def upward_imports(graph: Graph) -> list[str]:
    """Each import of an executor module from a layer above its own, as text (every module must be placed)."""
    def name(module: str) -> str:
        return f"{module} ({EXECUTOR_LAYERS[executor_layer(module)][0]})"

    found = []
    for module in sorted(m for m in graph if m == "executor" or m.startswith("executor.")):
        layer = executor_layer(module)
        found += [f"{name(module)} imports {name(t)}" for t in sorted(graph[module])
                  if t.startswith("executor") and executor_layer(t) < layer]
    return found


def test_executor_imports_run_top_down(project_graph: Graph) -> None:
    """Every executor module sits in one layer and imports only its own layer and those below: the op
    handlers never reach the interpreter, the model never reaches the runs, the state or the handlers."""
    handlers = [m for m in project_graph if m.startswith("executor.handlers.")]
    assert len(handlers) >= 5
    upward = upward_imports(project_graph)
    assert not upward, "imports against the layering: " + "; ".join(upward)
    for handler in handlers:
        assert "executor.interpreter" not in reachable(project_graph, handler), handler


def test_layer_check_reports_upward_imports_and_unplaced_modules() -> None:
    """On a made-up graph, a handler importing the interpreter and the model importing the rank state are
    the two imports reported (the handler's import of the state below it is not); a module in no layer
    is an error that says where to add it."""
    graph: Graph = {"executor.handlers.compute": {"executor.interpreter", "executor.state"},
                    "executor.interpreter": set(), "executor.state": set(), "executor.layers": {"executor.state"}}
    assert upward_imports(graph) == [
        "executor.handlers.compute (op handlers) imports executor.interpreter (interpreter)",
        "executor.layers (model) imports executor.state (rank state)",
    ]
    with pytest.raises(AssertionError, match=r"executor\.experts is in no layer of EXECUTOR_LAYERS"):
        upward_imports({"executor.experts": set()})


# -- the cycle finder on small made-up packages ------------------------------------------------------------
def _package(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")


def test_finder_names_a_cycle_made_of_type_only_and_function_local_imports(tmp_path: Path) -> None:
    """a -> b only under TYPE_CHECKING, b -> c only inside a function, c -> a at module level: one cycle."""
    _package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": """
            from typing import TYPE_CHECKING
            if TYPE_CHECKING:
                from pkg.b import Thing
            """,
        "pkg/b.py": """
            def later():
                from . import c
                return c
            """,
        "pkg/c.py": "import pkg.a\n",
        "pkg/d.py": "from pkg import a\n",
    })
    graph = import_graph(tmp_path, ["pkg"])
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == {"pkg.c"} and graph["pkg.d"] == {"pkg.a"}
    assert find_cycles(graph) == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]


def test_finder_resolves_relative_imports_from_subpackages(tmp_path: Path) -> None:
    """``from ..x import y`` in ``pkg/sub/m.py`` names ``pkg.x`` (``y`` is a function), ``from .. import z``
    names the module ``pkg.z``, and ``pkg.sub/__init__`` importing ``.m`` names ``pkg.sub.m``: a two-module
    cycle between ``pkg.x`` and ``pkg.sub.m`` is found, the package ``__init__`` is no part of it."""
    _package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/x.py": "from pkg.sub.m import helper\n",
        "pkg/z.py": "",
        "pkg/sub/__init__.py": "from .m import helper\n",
        "pkg/sub/m.py": """
            from ..x import y
            from .. import z
            def helper(): ...
            """,
    })
    graph = import_graph(tmp_path, ["pkg"])
    assert graph["pkg.sub.m"] == {"pkg.x", "pkg.z"}
    assert graph["pkg.sub"] == {"pkg.sub.m"}
    assert find_cycles(graph) == [["pkg.sub.m", "pkg.x", "pkg.sub.m"]]


def test_finder_accepts_a_package_whose_imports_run_one_way(tmp_path: Path) -> None:
    """A layered package (top imports middle imports bottom, the ``__init__`` re-exports all) has no cycle."""
    _package(tmp_path, {
        "pkg/__init__.py": "from pkg.top import run\nfrom pkg.bottom import Base\n",
        "pkg/bottom.py": "class Base: ...\n",
        "pkg/middle.py": "from pkg.bottom import Base\n",
        "pkg/top.py": "from pkg import middle\nfrom pkg.bottom import Base\ndef run(): ...\n",
    })
    graph = import_graph(tmp_path, ["pkg"])
    assert graph["pkg.top"] == {"pkg.middle", "pkg.bottom"}
    assert find_cycles(graph) == []
    assert reachable(graph, "pkg.top") == {"pkg.middle", "pkg.bottom"}
