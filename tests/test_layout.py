"""The code's layout rules: no import cycles between first-party modules, storage/ imports nothing above it,
pyproject ships every package, and the `flywheel` console entry point resolves.

The import graph is read from the source (ast), never by importing it:
- an edge per `import x.y` / `from x.y import z` of a first-party package (agents, configs, envs, flows, flywheel,
  storage, tasks, training, viewer), to the module it names (`from x import y` where x.y is a module: to x.y);
- the module-level graph skips imports inside functions and under `if TYPE_CHECKING:`; the full graph keeps them
  (a lazy import that closes a loop is still a cycle: issue 29 counted 7 of those).
A cycle is a strongly connected component of more than one module.
"""

from __future__ import annotations

import ast
import importlib
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agents", "configs", "envs", "flows", "flywheel", "storage", "tasks", "training", "viewer")


def modules() -> dict[str, Path]:
    """Every first-party module by dotted name (a package by its own name, for its __init__.py)."""
    out = {}
    for pkg in PACKAGES:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(f.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = f
    return out


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def imported_names(tree: ast.Module, module: str, is_package: bool, *, lazy: bool) -> list[str]:
    """Dotted names a module imports (`from x import y` gives x.y): at module level, or (lazy) at every level."""
    found: list[str] = []

    def visit(body: list[ast.stmt]) -> None:
        for n in body:
            if isinstance(n, ast.Import):
                found.extend(a.name for a in n.names)
            elif isinstance(n, ast.ImportFrom):
                base = n.module or ""
                if n.level:  # relative: resolved against the module's package
                    pkg = module.split(".") if is_package else module.split(".")[:-1]
                    base = ".".join(pkg[: len(pkg) - (n.level - 1)] + ([base] if base else []))
                # `from x import y`: x.y, which resolves to the submodule x.y if there is one, else to x
                found.extend(f"{base}.{a.name}" if base else a.name for a in n.names)
            elif isinstance(n, ast.If):
                if not _type_checking(n) or lazy:
                    visit(n.body)
                visit(n.orelse)
            elif isinstance(n, ast.Try):
                for part in (n.body, n.orelse, n.finalbody, *[h.body for h in n.handlers]):
                    visit(part)
            elif isinstance(n, (ast.With, ast.ClassDef)):
                visit(n.body)
            elif lazy and isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.For, ast.While)):
                visit(n.body)
                visit(getattr(n, "orelse", []))

    visit(tree.body)
    return found


def import_graph(*, lazy: bool) -> dict[str, set[str]]:
    mods = modules()

    def resolve(name: str) -> str | None:
        parts = name.split(".")
        for i in range(len(parts), 0, -1):
            if ".".join(parts[:i]) in mods:
                return ".".join(parts[:i])
        return None

    graph = {}
    for name, path in mods.items():
        names = imported_names(ast.parse(path.read_text()), name, path.name == "__init__.py", lazy=lazy)
        graph[name] = {r for r in map(resolve, names) if r is not None and r != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            connect(v)
    return out


def test_the_graph_sees_a_planted_cycle():
    """The checker itself: two modules importing each other (one lazily) are one cycle, under the full graph."""
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    tree = ast.parse(
        "import os\nfrom flywheel.cli import app\n"
        "if TYPE_CHECKING:\n    import flows.common\n"
        "def f():\n    import tasks.stages\n"
    )
    assert "flows.common" not in imported_names(tree, "m", False, lazy=False)
    assert {"flywheel.cli.app", "flows.common", "tasks.stages"} <= set(imported_names(tree, "m", False, lazy=True))
    top, every = import_graph(lazy=False), import_graph(lazy=True)
    assert "flywheel.cli.commands" in top["flywheel.cli.app"] and "storage.lake" in top["flywheel.specs"]
    assert "flywheel.cli.app" not in top["flywheel.cli"] and "flywheel.cli.app" in every["flywheel.cli"]  # lazy main


def test_no_import_cycles_at_module_level():
    assert cycles(import_graph(lazy=False)) == []


def test_no_import_cycles_counting_imports_inside_functions():
    assert cycles(import_graph(lazy=True)) == []


def test_storage_imports_only_storage_and_configs():
    """storage/ is the base layer: at any level (function bodies included) it imports no first-party package but
    itself and configs/."""
    bad = []
    for name, path in modules().items():
        if not name.startswith("storage"):
            continue
        for imp in imported_names(ast.parse(path.read_text()), name, path.name == "__init__.py", lazy=True):
            top = imp.split(".")[0]
            if top in PACKAGES and top not in ("storage", "configs"):
                bad.append(f"{name} imports {imp}")
    assert bad == []


def test_pyproject_ships_every_package():
    """A fresh (non-editable) install ships exactly the packages listed: each folder of .py files must be there."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {
        ".".join(d.relative_to(ROOT).parts)
        for pkg in PACKAGES
        for d in [ROOT / pkg, *(ROOT / pkg).rglob("*")]
        if d.is_dir() and d.name != "__pycache__" and any(d.glob("*.py"))
    }
    assert on_disk - listed == set(), "add these to [tool.setuptools] packages"
    assert listed - on_disk == set(), "listed but not on disk"
    assert all((ROOT / p.replace(".", "/") / "__init__.py").exists() for p in listed)


def test_console_entry_point_resolves_and_runs(monkeypatch, capsys):
    target = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["flywheel"]
    module, attr = target.split(":")
    main = getattr(importlib.import_module(module), attr)
    assert callable(main)
    monkeypatch.setattr(sys, "argv", ["flywheel", "--help"])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code == 0 and "stage" in capsys.readouterr().out
