"""The package's import graph has no cycle, every import runs down a floor, and the wings of
`read/` keep their rules: the unpickler (`read/pt/`) is entered only through its `__init__`,
`read/` (a dump's readers, remote staging among them) is never imported by `serve/`, which
reads a lake through its store only, and `transform/` never by `read/`.

Read from the source (every `import` and `from ... import`, function-local ones included), so
an import that hides inside a function to dodge a cycle still counts.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "pipeline" / "tokenlake"
# The floors, lowest first: a module imports only lower floors, or its own folder on its floor.
# Names and errors at the ground; storage; the stages in pipeline order; orchestration and the
# generator over them; the user's lake object; the command line on top. `read/` has two wings on
# floors of their own: the unpickler under the format readers, remote staging over them.
FLOORS: list[tuple[str, ...]] = [
    (
        "tokenlake.errors",
        "tokenlake.schema",
        "tokenlake.layout",
        "tokenlake.bounded",
        "tokenlake.extras",
        "tokenlake.processes",
        "tokenlake.threads",
        "tokenlake.tags",
        "tokenlake.terminal",
        "tokenlake.steps",
        "tokenlake.steptypes",
    ),
    ("tokenlake.store",),
    ("tokenlake.read.pt",),
    ("tokenlake.read",),
    ("tokenlake.read.remote",),
    ("tokenlake.transform",),
    ("tokenlake.load",),
    ("tokenlake.serve", "tokenlake.sql"),
    ("tokenlake.serve.explore",),  # the explorer reads through the catalog and the report below
    ("tokenlake.orchestrate", "tokenlake.generator"),
    ("tokenlake.lake",),
    ("tokenlake.cli", "tokenlake.cli_util", "tokenlake.__main__", "tokenlake"),
]


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


# The folders (packages): a package's `__init__` is in its own folder.
_PACKAGES = {
    ".".join(("tokenlake", *path.relative_to(PACKAGE).parent.parts))
    for path in PACKAGE.rglob("__init__.py")
}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    assert len(modules) > 50  # the package was found
    return {name: _imports(path, modules) - {name} for name, path in modules.items()}


def _floor(module: str) -> tuple[int, str]:
    """(floor, the folder the module is in) by the longest prefix FLOORS names."""
    best: tuple[int, int] | None = None
    for number, prefixes in enumerate(FLOORS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > best[1]:
                    best = (number, len(prefix))
    assert best is not None, f"{module} is on no floor: add it to FLOORS"
    return best[0], module if module in _PACKAGES else module.rpartition(".")[0]


def _upward(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for module, imported in sorted(graph.items()):
        floor, folder = _floor(module)
        for other in sorted(imported):
            other_floor, other_folder = _floor(other)
            if other_floor > floor or (other_floor == floor and other_folder != folder):
                found.append(f"{module} (floor {floor}) imports {other} (floor {other_floor})")
    return found


# Wings: folders inside a floor's folder with rules of their own. A sealed wing is entered only
# through its `__init__` (its one way in); a wing may also be kept from some floors.
SEALED = ("tokenlake.read.pt",)  # the allow-listed unpickler, a security boundary
KEPT_FROM = {
    # A lake's readers (queries, the report, the explorer) read its store, never a dump: what
    # tells a lake from a dump (`store.require_lake`) and the private cache live in `store/`.
    "tokenlake.read": ("tokenlake.serve",),
    "tokenlake.transform": ("tokenlake.read",),  # the readers give values; no callback comes back
}


def _inside(module: str, folder: str) -> bool:
    return module == folder or module.startswith(folder + ".")


def _wing_breaches(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for module, imported in sorted(graph.items()):
        for other in sorted(imported):
            for wing in SEALED:
                if _inside(other, wing) and other != wing and not _inside(module, wing):
                    found.append(f"{module} imports {other}, inside the sealed {wing}")
            for wing, kept_from in KEPT_FROM.items():
                for folder in kept_from:
                    if _inside(other, wing) and _inside(module, folder):
                        found.append(f"{module} imports {other}: {folder} never imports {wing}")
    return found


def _benchmark_graph() -> dict[str, set[str]]:
    modules = _modules()
    benchmarks = sorted(PACKAGE.parent.joinpath("benchmarks").glob("*.py"))
    assert len(benchmarks) >= 3
    return {f"benchmarks.{path.stem}": _imports(path, modules) for path in benchmarks}


def test_wings_keep_their_rules() -> None:
    graph = _graph()
    assert {wing for wing in (*SEALED, *KEPT_FROM) if wing in graph} == {*SEALED, *KEPT_FROM}
    assert _wing_breaches({**graph, **_benchmark_graph()}) == []


def test_the_unpickler_is_entered_only_through_its_init() -> None:
    graph = _graph()
    inner = sorted(m for m in graph if m.startswith("tokenlake.read.pt."))
    assert len(inner) == 9  # the wing holds the unpickler's modules
    outside = {m for m, imported in graph.items() if "tokenlake.read.pt" in imported}
    assert {"tokenlake.read.dump", "tokenlake.read.formats"} <= outside


def test_the_wing_check_finds_each_breach() -> None:
    graph = {
        "tokenlake.read.dump": {"tokenlake.read.pt.ptzip", "tokenlake.read.pt"},
        "tokenlake.read.pt.ptread": {"tokenlake.read.pt.ptzip"},
        "tokenlake.serve.report_html": {"tokenlake.read.remote.remote_stage"},
        "tokenlake.serve.catalog": {"tokenlake.read.dump", "tokenlake.store"},
        "tokenlake.read.formats": {"tokenlake.transform.tables"},
    }
    assert _wing_breaches(graph) == [
        "tokenlake.read.dump imports tokenlake.read.pt.ptzip, inside the sealed tokenlake.read.pt",
        "tokenlake.read.formats imports tokenlake.transform.tables: tokenlake.read never imports"
        " tokenlake.transform",
        "tokenlake.serve.catalog imports tokenlake.read.dump: tokenlake.serve never imports"
        " tokenlake.read",
        "tokenlake.serve.report_html imports tokenlake.read.remote.remote_stage: tokenlake.serve"
        " never imports tokenlake.read",
    ]


def test_no_import_cycle() -> None:
    assert _cycles(_graph()) == []


def test_imports_run_downward() -> None:
    assert _upward(_graph()) == []


def test_the_floor_check_finds_an_upward_import() -> None:
    graph = {"tokenlake.read.dump": {"tokenlake.serve.catalog"}, "tokenlake.serve.catalog": set()}
    assert _upward(graph) == [
        "tokenlake.read.dump (floor 3) imports tokenlake.serve.catalog (floor 7)"
    ]


def test_the_benchmarks_stay_out_of_the_package() -> None:
    assert not (PACKAGE / "tools").exists()
    benchmarks = sorted(PACKAGE.parent.joinpath("benchmarks").glob("*.py"))
    assert len(benchmarks) >= 3
    for module, imported in _graph().items():
        assert not any(name.startswith("benchmarks") for name in imported), module


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [frozenset({"a", "b", "c"})]


def test_every_folder_of_the_package_is_in_the_wheel() -> None:
    """pyproject.toml lists the packages the wheel carries: a folder left out would be missing
    from every installation but the editable one."""
    pyproject = PACKAGE.parents[1].joinpath("pyproject.toml").read_text(encoding="utf-8")
    packages = re.search(r"^packages = \[(.*?)^\]", pyproject, re.M | re.S)
    assert packages is not None  # (Python 3.10, which the package supports, has no tomllib)
    listed = re.findall(r'"([\w.]+)"', packages.group(1))
    assert {"tokenlake.read.pt", "tokenlake.read.remote"} <= _PACKAGES
    assert sorted(_PACKAGES) == sorted(p for p in listed if p != "tokenlake.sql")
