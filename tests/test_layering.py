"""The package's import graph: no cycle anywhere, and the sources below the layers that use them.

Every ``import`` and ``from ... import`` of every module under ``gatewayscope/`` counts, at module level
and inside functions and classes alike (a function-level import is a dependency all the same: it only
runs later). Imports under ``if TYPE_CHECKING:`` never run and count for the layering rule only.

An edge goes to the module an import names: ``from a.b import c`` depends on ``a.b.c`` when that is a
module of the package, else on ``a.b`` (whose ``__init__`` defines ``c``). Importing ``a.b.c`` also runs
``a/__init__`` and ``a/b/__init__``, but those parents are not edges: a package that re-exports its own
submodules would otherwise always close a loop, though Python runs it fine.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = "gatewayscope"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE

#: the layers a source (``gatewayscope.sources.*``) must never import: they are built on the sources
ABOVE_THE_SOURCES = ("gatewayscope.analysis", "gatewayscope.guard", "gatewayscope.remediate")


def module_names(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its own name, for its ``__init__``)."""
    names: dict[str, Path] = {}
    for file in sorted(root.rglob("*.py")):
        parts = list(file.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = file
    return names


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, *, typing_only: bool = False) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Each import statement under ``tree`` (at any depth), and whether it sits under ``if TYPE_CHECKING:``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, typing_only
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                yield from _imports(ast.Module(body=[child], type_ignores=[]), typing_only=True)
            for child in node.orelse:
                yield from _imports(ast.Module(body=[child], type_ignores=[]), typing_only=typing_only)
        else:
            yield from _imports(node, typing_only=typing_only)


def _resolve(module: str, is_package: bool, node: ast.Import | ast.ImportFrom, known: dict[str, Path]) -> set[str]:
    """The package's modules one import statement of ``module`` depends on."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in known}
    base = node.module or ""
    if node.level:
        anchor = module.split(".") if is_package else module.split(".")[:-1]
        anchor = anchor[:len(anchor) - (node.level - 1)]
        base = ".".join([*anchor, base] if base else anchor)
    found: set[str] = set()
    for alias in node.names:
        child = f"{base}.{alias.name}"
        if child in known:
            found.add(child)
        elif base in known:
            found.add(base)
    return found


def import_graph(root: Path = ROOT) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """``(runtime, all)``: each module's imports of the package's modules, without and with the ones under
    ``if TYPE_CHECKING:``."""
    known = module_names(root)
    runtime: dict[str, set[str]] = {name: set() for name in known}
    every: dict[str, set[str]] = {name: set() for name in known}
    for name, file in known.items():
        tree = ast.parse(file.read_text(encoding="utf-8"), filename=str(file))
        is_package = file.name == "__init__.py"
        for node, typing_only in _imports(tree):
            targets = _resolve(name, is_package, node, known) - {name}
            every[name] |= targets
            if not typing_only:
                runtime[name] |= targets
    return runtime, every


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of two or more modules, each as one cycle through it (Tarjan's
    algorithm, iteratively), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:  # bounded: every module enters the work list once
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group: list[str] = []
                while True:  # bounded: pops down to ``node``, which is on the stack
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(_cycle_through(sorted(group), graph))
    return sorted(groups)


def _cycle_through(group: list[str], graph: dict[str, set[str]]) -> list[str]:
    """One cycle inside a strongly connected ``group``, from its first module back to it (breadth first)."""
    members = set(group)
    start = group[0]
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:  # bounded: each member is reached once
        following: list[str] = []
        for node in frontier:
            for child in sorted(graph[node] & members):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if child not in came_from:
                    came_from[child] = node
                    following.append(child)
        frontier = following
    return group


def layering_violations(graph: dict[str, set[str]]) -> list[str]:
    """``source -> module`` for every import of a layer above the sources by a module of ``gatewayscope.sources``."""
    found: list[str] = []
    for module, imported in sorted(graph.items()):
        if module != "gatewayscope.sources" and not module.startswith("gatewayscope.sources."):
            continue
        for target in sorted(imported):
            if any(target == layer or target.startswith(layer + ".") for layer in ABOVE_THE_SOURCES):
                found.append(f"{module} -> {target}")
    return found


def test_the_package_has_no_import_cycle() -> None:
    runtime, _ = import_graph()
    cycles = find_cycles(runtime)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(cycle) for cycle in cycles)


def test_the_sources_import_no_layer_built_on_them() -> None:
    _, every = import_graph()
    violations = layering_violations(every)
    assert not violations, "gatewayscope.sources imports a layer above it:\n" + "\n".join(violations)


# -- the checks themselves, on a small package written for them ---------------------------------------------


#: the packages every small test package has
_PACKAGES = {f"gatewayscope/{name}__init__.py": "" for name in ("", "sources/", "guard/", "analysis/")}


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in {**_PACKAGES, **files}.items():
        file = root / name
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(text, encoding="utf-8")
    return root / PACKAGE


def test_a_function_level_import_closes_a_cycle(tmp_path: Path) -> None:
    root = _write(tmp_path, {
        "gatewayscope/sources/reader.py": "def read():\n    from gatewayscope.guard import sqlite\n",
        "gatewayscope/guard/sqlite.py": "from gatewayscope.sources.reader import read\n",
    })
    runtime, every = import_graph(root)
    assert find_cycles(runtime) == [["gatewayscope.guard.sqlite", "gatewayscope.sources.reader",
                                     "gatewayscope.guard.sqlite"]]
    assert layering_violations(every) == ["gatewayscope.sources.reader -> gatewayscope.guard.sqlite"]


def test_relative_imports_packages_and_type_checking(tmp_path: Path) -> None:
    root = _write(tmp_path, {
        "gatewayscope/sources/pkg/__init__.py": "from .read import read\nfrom . import redact\n",
        "gatewayscope/sources/pkg/read.py": "from .redact import clean\n",
        "gatewayscope/sources/pkg/redact.py": (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gatewayscope.analysis import pools\n"
            "clean = 1\n"),
        "gatewayscope/analysis/pools.py": "from gatewayscope.sources.pkg import read\n",
    })
    runtime, every = import_graph(root)
    assert runtime["gatewayscope.sources.pkg"] == {"gatewayscope.sources.pkg.read", "gatewayscope.sources.pkg.redact"}
    assert runtime["gatewayscope.sources.pkg.read"] == {"gatewayscope.sources.pkg.redact"}
    assert find_cycles(runtime) == []  # the type-only import runs never
    assert find_cycles(every) == [["gatewayscope.analysis.pools", "gatewayscope.sources.pkg.read",
                                   "gatewayscope.sources.pkg.redact", "gatewayscope.analysis.pools"]]
    assert layering_violations(every) == ["gatewayscope.sources.pkg.redact -> gatewayscope.analysis.pools"]


@pytest.mark.parametrize("statement", ["import gatewayscope.guard.sqlite", "from gatewayscope.guard import sqlite",
                                       "from gatewayscope.guard.sqlite import install", "from ..guard import sqlite"])
def test_each_spelling_of_an_import_is_an_edge(tmp_path: Path, statement: str) -> None:
    root = _write(tmp_path, {
        "gatewayscope/sources/reader.py": f"class Reader:\n    def read(self):\n        {statement}\n",
        "gatewayscope/guard/sqlite.py": "install = 1\n",
    })
    runtime, _ = import_graph(root)
    assert runtime["gatewayscope.sources.reader"] == {"gatewayscope.guard.sqlite"}


# -- the tests: each module stands alone ------------------------------------------------------------------------

TESTS = Path(__file__).resolve().parent


def imports_between_test_modules(root: Path = TESTS) -> list[str]:
    """``module imports name from other`` for every import of a test module (or a conftest) by a module under
    ``root``: what tests share lives in helpers (tests/helpers.py, tests/factories.py, tests/e2e/_support.py)
    and fixtures in a conftest.py. Returns the offences (the test below wants none)."""
    offences = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node, _ in _imports(tree):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            for name in names:
                last = name.rsplit(".", 1)[-1]
                if name.startswith("tests.") and (last.startswith("test_") or last == "conftest"):
                    offences.append(f"{path.relative_to(root.parent)} imports {name}")
    return offences


def test_no_test_module_imports_another() -> None:
    assert imports_between_test_modules() == []


def test_an_import_of_a_test_module_or_a_conftest_is_found(tmp_path: Path) -> None:
    files = {"helpers.py": "from tests.e2e._support import x\n",
             "e2e/test_a.py": "from tests.e2e.test_b import fixture\n",
             "e2e/test_c.py": "import tests.conftest\nfrom tests import helpers\n"}
    root = tmp_path / "tests"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    assert imports_between_test_modules(root) == ["tests/e2e/test_a.py imports tests.e2e.test_b",
                                                  "tests/e2e/test_c.py imports tests.conftest"]
