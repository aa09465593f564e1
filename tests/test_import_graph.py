"""The package's import graph has no cycle but the one the typed store will remove.

Read from the source (every `import` and `from ... import`, function-local ones included), so
an import that hides inside a function to dodge a cycle still counts.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "pipeline" / "tokenlake"
# `load/lake.py` names the files and gives the store of a location (`lake_at`), which imports
# the stores, which import the names back; manifest.py and the stores use each other too.
KNOWN_CYCLE = frozenset(
    {
        "tokenlake.load.lake",
        "tokenlake.load.local_lake",
        "tokenlake.load.manifest",
        "tokenlake.load.nofollow",
        "tokenlake.load.object_lake",
        "tokenlake.load.object_lock",
    }
)


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ("tokenlake", *path.relative_to(PACKAGE).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that `path` imports (`from a import b` names `a.b` when it is one)."""
    named: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            named |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            submodules = {f"{node.module}.{alias.name}" for alias in node.names}
            named |= (submodules & modules.keys()) or {node.module}
    return named & modules.keys()


def _cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[frozenset[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_but_the_known_one() -> None:
    modules = _modules()
    assert len(modules) > 50  # the package was found
    graph = {name: _imports(path, modules) - {name} for name, path in modules.items()}
    assert sorted(sorted(c) for c in _cycles(graph)) == [sorted(KNOWN_CYCLE)]


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [frozenset({"a", "b", "c"})]
