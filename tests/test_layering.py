"""Who may import what (docs/ARCHITECTURE.md), read from the source of every module.

Every import statement counts, at module level or inside a function: a lazy import is still
a dependency. Cycles are searched between modules by their explicit imports.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("pynode", "server")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def sources() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Modules `name` imports: `from a import b` is a.b where a.b is a module, else a."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in known else base)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    mods = sources()
    return {name: imports_of(name, path, set(mods)) for name, path in mods.items()}


def top(module: str) -> str:
    return module.split(".")[0]


def inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def violations(graph, layer: str, allowed) -> list[str]:
    return sorted(f"{m} imports {i}" for m, deps in graph.items() if inside(m, layer)
                  for i in deps if not allowed(i))


def test_core_imports_numpy_the_standard_library_and_itself(graph):
    def allowed(i: str) -> bool:
        return top(i) in sys.stdlib_module_names or top(i) == "numpy" or inside(i, "pynode.core")

    assert violations(graph, "pynode.core", allowed) == []


def test_transports_know_nothing_of_runs_training_or_the_command_line(graph):
    banned = ("pynode.run", "pynode.cli", "pynode.tasks", "pynode.browser", "server")
    assert violations(graph, "pynode.comm",
                      lambda i: not any(inside(i, b) for b in banned)) == []


def test_the_server_does_not_run_training(graph):
    banned = ("pynode.run", "pynode.cli", "pynode.comm")
    assert violations(graph, "server", lambda i: not any(inside(i, b) for b in banned)) == []


def test_the_run_layer_never_reaches_up_into_the_command_line(graph):
    assert violations(graph, "pynode.run", lambda i: not inside(i, "pynode.cli")) == []


def cycles_in(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module (or a self-import)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph[v]:
                cycles.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_no_import_cycles(graph):
    assert cycles_in(graph) == []


def test_the_checker_sees_a_violation_and_a_cycle(tmp_path):
    """The rules above can fail: a core module importing torch lazily, and two modules that
    import each other inside functions, are both found."""
    core = tmp_path / "core.py"
    core.write_text("def f():\n    import torch\n", encoding="utf-8")
    assert "torch" in imports_of("pynode.core.fake", core, set())
    a = tmp_path / "a.py"
    a.write_text("def f():\n    from pynode.cli import b\n", encoding="utf-8")
    found = imports_of("pynode.cli.a", a, {"pynode.cli.b"})
    assert found == {"pynode.cli.b"}
    graph = {"pynode.cli.a": found, "pynode.cli.b": {"pynode.cli.a"}, "x": {"pynode.cli.b"}}
    assert cycles_in(graph) == [["pynode.cli.a", "pynode.cli.b"]]
