"""Signs that tell the truth: every file or module a comment, docstring or doc names exists, and
every folder's `__init__` docstring names only modules in that folder.

What counts as a reference (anything else is prose): a path from the checkout's root
(`pipeline/…​.py`, `tests/…​.py`, `sql/…​.sql`, `docs/…​.md`), a path inside the package from one
of its folders (`read/x.py`, `read/pt/x.py`, `serve/x.py`, …), and a dotted name from the package
(`tokenlake.read.dump`, `tokenlake.read.dump.discover`: the module, then a name it defines).
Searched: every `.py` file of `pipeline/` and `tests/`, `docs/*.md` and README.md.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "pipeline" / "tokenlake"
FOLDERS = sorted(p.parent.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("__init__.py"))
_NOT_AFTER = r"(?<![\w/.\-])"  # the start of a path, not the middle of a longer one
ROOTED = re.compile(
    _NOT_AFTER + r"((?:pipeline|tests)/[\w/]+\.py|sql/[\w/]+\.sql|docs/[\w/-]+\.md)(?![\w/])"
)
IN_PACKAGE = re.compile(
    _NOT_AFTER
    + r"((?:"
    + "|".join(re.escape(f) for f in sorted(FOLDERS, key=len, reverse=True) if f != ".")
    + r")/\w+\.py)\b"
)
DOTTED = re.compile(_NOT_AFTER + r"(tokenlake(?:\.\w+)+)(?!\w|\.\w|/)")
# Dotted names that are not modules: the catalog's files, the lake's Parquet metadata keys
# (load/write.py), and DuckDB's name of the catalog's schema (`tokenlake.main.drift_settings`).
NOT_MODULES = {
    "tokenlake.duckdb",
    "tokenlake.duckdb.wal",
    "tokenlake.run",
    "tokenlake.source",
    "tokenlake.schema_version",
    "tokenlake.table",
    "tokenlake.nope",  # tests/e2e/test_api.py asks for a name the package lacks
}
NOT_MODULE_PREFIXES = ("tokenlake.main.",)
# Files of other projects that a doc names by their own path.
ELSEWHERE = {
    "docs/adding-new-models.md",  # NVIDIA-NeMo/RL's, quoted in docs/drift.md
    "tests/ci/metric_history/register.py",  # radixark/miles', quoted in docs/drift.md
}
# A log of past measurements names the code as it then was.
HISTORY = {"docs/bench-log.md"}


def _sources() -> list[Path]:
    found = sorted(REPO.joinpath("pipeline").rglob("*.py"))
    # The tests, but this file: its examples name files that are not there on purpose.
    found += [p for p in sorted(REPO.joinpath("tests").rglob("*.py")) if p != Path(__file__)]
    found += [p for p in sorted(REPO.joinpath("docs").glob("*.md")) if _name(p) not in HISTORY]
    found.append(REPO / "README.md")
    assert len(found) > 100
    return found


def _name(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def _module_file(dotted: str) -> Path | None:
    parts = dotted.split(".")[1:]
    if parts[:1] == ["sql"]:
        return REPO / "sql" if len(parts) == 1 else None
    base = PACKAGE.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _defined_names(path: Path) -> set[str]:
    names: set[str] = set()
    top = ast.parse(path.read_text(encoding="utf-8")).body
    # and what a top-level `if` defines (`if TYPE_CHECKING:` declares the names a module's
    # `__getattr__` builds on first use: tokenlake.schema's Arrow schemas)
    nested = [inner for node in top if isinstance(node, ast.If) for inner in node.body]
    for node in [*top, *nested]:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    if path.name == "__init__.py":
        names |= {p.stem for p in path.parent.glob("*.py")}
        names |= {p.parent.name for p in path.parent.glob("*/__init__.py")}
        names |= set(re.findall(r'"(\w+)"', path.read_text(encoding="utf-8")))  # __all__
    return names


def dotted_exists(dotted: str) -> bool:
    """Whether a dotted name is a module of the package, or a name such a module defines."""
    if dotted in NOT_MODULES or dotted.startswith(NOT_MODULE_PREFIXES):
        return True
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = _module_file(".".join(parts[:cut]))
        if module is not None:
            rest = parts[cut:]
            if not rest or rest[0].startswith("__"):  # a module, or its `__file__`
                return True
            return module.is_file() and rest[0] in _defined_names(module)
    return False


def references(text: str) -> list[tuple[str, bool]]:
    """(reference, whether it exists) for every reference in a text."""
    found = [(m, m in ELSEWHERE or (REPO / m).exists()) for m in ROOTED.findall(text)]
    found += [(m, (PACKAGE / m).is_file()) for m in IN_PACKAGE.findall(text)]
    found += [(m, dotted_exists(m)) for m in DOTTED.findall(text)]
    return found


def _all_references() -> list[tuple[str, str, bool]]:
    return [
        (_name(source), reference, exists)
        for source in _sources()
        for reference, exists in references(source.read_text(encoding="utf-8"))
    ]


def test_every_named_file_and_module_exists() -> None:
    found = _all_references()
    assert len(found) > 200  # the patterns still find what the sources name
    assert [f"{source}: {ref}" for source, ref, exists in found if not exists] == []


def test_each_kind_of_reference_is_found() -> None:
    kinds = {
        "rooted": ROOTED,
        "in the package": IN_PACKAGE,
        "dotted": DOTTED,
    }
    text = "\n".join(p.read_text(encoding="utf-8") for p in _sources())
    assert {kind: len(pattern.findall(text)) > 10 for kind, pattern in kinds.items()} == {
        kind: True for kind in kinds
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("see `transform/resolve.py`", [("transform/resolve.py", False)]),
        ("see read/resolve.py.", [("read/resolve.py", True)]),
        (
            "(pipeline/tokenlake/read/pt/ptread.py)",
            [("pipeline/tokenlake/read/pt/ptread.py", True)],
        ),
        ("in pipeline/tokenlake/read/ptread.py", [("pipeline/tokenlake/read/ptread.py", False)]),
        ("`tools/synth_frameworks.py`", []),  # no folder of the package: prose
        ("sql/rollups/drift_outlier_parts.sql", [("sql/rollups/drift_outlier_parts.sql", True)]),
        ("tests/repo/test_gone.py", [("tests/repo/test_gone.py", False)]),
        ("`tokenlake.layout.store_at`", [("tokenlake.layout.store_at", False)]),
        ("`tokenlake.store.store_at`", [("tokenlake.store.store_at", True)]),
        ("`tokenlake.read.pt.load`", [("tokenlake.read.pt.load", True)]),
        ("`tokenlake.transform.resolve`", [("tokenlake.transform.resolve", False)]),
        ("LAKE/tokenlake.duckdb and tokenlake.duckdb", [("tokenlake.duckdb", True)]),
    ],
)
def test_what_counts_as_a_reference(text: str, expected: list[tuple[str, bool]]) -> None:
    assert references(text) == expected


def _docstring_modules(init: Path) -> list[str]:
    docstring = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
    named = re.findall(r"(?<![\w/.])((?:\w+/)*\w+\.py)\b", docstring)
    return [name for name in named if not ROOTED.fullmatch(name)]  # a path from the root: not in it


def test_every_folder_docstring_names_only_modules_in_it() -> None:
    folders = sorted(PACKAGE.rglob("__init__.py"))
    assert len(folders) >= 10
    named = {
        init.parent.relative_to(PACKAGE).as_posix(): _docstring_modules(init) for init in folders
    }
    assert [f for f, names in named.items() if f != "." and not names] == []  # each names some
    assert {
        folder: [name for name in names if not (PACKAGE / folder / name).is_file()]
        for folder, names in named.items()
    } == {folder: [] for folder in named}
