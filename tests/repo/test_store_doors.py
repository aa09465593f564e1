"""A lake's location is resolved into a store once, at the front door, and handed down.

The front door is `tokenlake.Lake` (pipeline/tokenlake/lake.py: the CLI and a Python user both
hold one); the store package (pipeline/tokenlake/store/) is where a location becomes a store.
Everything else takes the store it is given: it never builds one (`store_at`, `LocalStore`,
`ObjectStore`), never takes a location-or-store union to resolve again, and never calls a
store, a path or a connection `lake` (a parameter named `lake` is a `Lake`).

Read from the source with `ast`, so a call in a docstring or a comment does not count and one
inside a function does.
"""

from __future__ import annotations

import ast
from pathlib import Path

PIPELINE = Path(__file__).resolve().parents[2] / "pipeline"
PACKAGE = PIPELINE / "tokenlake"
FRONT_DOOR = PACKAGE / "lake.py"
STORE_PACKAGE = PACKAGE / "store"
# The command line: its commands take the `--lake` a user typed and hand it to `Lake`.
COMMAND_LINE = (PACKAGE / "cli.py",)
STORE_MAKERS = ("store_at", "LocalStore", "ObjectStore")
# (file relative to pipeline/, function, maker): a store built below the front door, and why.
EXCEPTIONS = {
    # A loose Parquet file in a folder that is no lake (benchmarks, tests): its folder is the
    # store the file is written through, with the lake's atomic writer.
    ("tokenlake/load/write.py", "write_parquet", "LocalStore"),
}


def _called_name(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


def _functions(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def store_makers(source: str, shown: str) -> list[str]:
    """Each call that builds a store, as `file:line function: maker(`, outside the exceptions."""
    tree = ast.parse(source)
    enclosing: dict[int, str] = {}
    for function in _functions(tree):  # outer first: an inner function overwrites its lines
        for node in ast.walk(function):
            if isinstance(node, ast.Call):
                enclosing[id(node)] = function.name
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _called_name(node) in STORE_MAKERS:
            function = enclosing.get(id(node), "<module>")
            if (shown, function, _called_name(node)) not in EXCEPTIONS:
                found.append(f"{shown}:{node.lineno} {function}: {_called_name(node)}(")
    return found


def lake_parameters(source: str, shown: str) -> list[str]:
    """Each parameter named `lake` that is not a `Lake`, and each parameter that takes a
    location or a store (to resolve it again), as `file:line function(parameter: annotation)`."""
    found = []
    for function in _functions(ast.parse(source)):
        arguments = function.args
        for argument in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs):
            annotation = ast.unparse(argument.annotation) if argument.annotation else ""
            names = (
                {n.id for n in ast.walk(argument.annotation) if isinstance(n, ast.Name)}
                if argument.annotation
                else set()
            )
            not_a_lake = argument.arg == "lake" and annotation != "Lake"
            if not_a_lake or {"Location", "Store"} <= names:
                found.append(
                    f"{shown}:{function.lineno} {function.name}({argument.arg}: {annotation})"
                )
    return found


def _below_the_front_door() -> list[Path]:
    files = sorted(PIPELINE.rglob("*.py"))
    assert len(files) > 80  # the package and the benchmarks were found
    return [
        path
        for path in files
        if path != FRONT_DOOR and STORE_PACKAGE not in path.parents and path not in COMMAND_LINE
    ]


def _shown(path: Path) -> str:
    return path.relative_to(PIPELINE).as_posix()


def test_no_store_is_built_below_the_front_door() -> None:
    files = _below_the_front_door()
    found = [line for path in files for line in store_makers(path.read_text(), _shown(path))]
    assert found == []


def test_every_exception_is_still_needed() -> None:
    """An exception whose call is gone is removed from the list, not kept to excuse a new one."""
    for shown, function, maker in sorted(EXCEPTIONS):
        tree = ast.parse((PIPELINE / shown).read_text())
        calls = [
            node
            for fn in _functions(tree)
            if fn.name == function
            for node in ast.walk(fn)
            if isinstance(node, ast.Call) and _called_name(node) == maker
        ]
        assert calls, f"{shown}: {function} no longer calls {maker}: remove its exception"


def test_below_the_front_door_a_lake_parameter_is_a_lake() -> None:
    files = [path for path in _below_the_front_door() if PACKAGE in path.parents]
    found = [line for path in files for line in lake_parameters(path.read_text(), _shown(path))]
    assert found == []


def test_the_front_door_resolves_the_location_once() -> None:
    """`Lake.__init__` is the one call of `store_at` outside the store package."""
    tree = ast.parse(FRONT_DOOR.read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and _called_name(n) == "store_at"]
    assert [call.lineno for call in calls] == [
        n.lineno
        for fn in _functions(tree)
        if fn.name == "__init__"
        for n in ast.walk(fn)
        if isinstance(n, ast.Call) and _called_name(n) == "store_at"
    ]
    assert len(calls) == 1


PLANTED = '''
"""store_at(location) in a docstring is no call."""
from tokenlake.store import store_at
from tokenlake.store.local import LocalStore


def tokens(lake: Location | Store, run: str) -> list[str]:
    store = store_at(lake)  # a second resolution
    return store.files(run)


def side(lake: Path) -> None:
    def inner(store: Location | Store) -> None:
        LocalStore(store)


def fine(lake: Lake, store: Store) -> None:
    lake.store.exists("x")
'''


def test_the_checks_find_planted_violations() -> None:
    assert store_makers(PLANTED, "tokenlake/x.py") == [
        "tokenlake/x.py:8 tokens: store_at(",
        "tokenlake/x.py:14 inner: LocalStore(",
    ]
    assert lake_parameters(PLANTED, "tokenlake/x.py") == [
        "tokenlake/x.py:7 tokens(lake: Location | Store)",
        "tokenlake/x.py:12 side(lake: Path)",
        "tokenlake/x.py:13 inner(store: Location | Store)",
    ]
    # the one exception covers its own function and maker only
    assert store_makers(
        "def write_parquet():\n    ObjectStore('s3://b')\n", "tokenlake/load/write.py"
    ) == ["tokenlake/load/write.py:2 write_parquet: ObjectStore("]
