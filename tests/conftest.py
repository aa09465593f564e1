"""How the suite is spread over pytest-xdist workers (`make test` runs `-n auto --dist loadgroup`).

A module whose tests share a module-scoped fixture (a lake built once, an S3 server, a Ray
cluster, a Spark session, a browser) runs on one worker, so the fixture is built once; every
other test is scheduled on its own. The modules that take longest start first, so the short
tests fill in around them instead of one worker finishing a long module alone at the end.
"""

from __future__ import annotations

import pytest

# The longest modules, longest first (each one worker's work for a minute or more).
LONGEST_FIRST = (
    "test_object_lake",
    "test_spark",
    "test_ray",
    "test_report",
    "test_crash",
    "test_remote_dump",
)


def _module(item: pytest.Item) -> str:
    return item.path.stem


def _shares_a_module_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:  # a doctest
        return False
    return any(
        definition.scope in ("module", "package", "session")
        and getattr(definition.func, "__module__", "").startswith("tests.")  # not pytest's own
        for definitions in info.name2fixturedefs.values()
        for definition in definitions
    )


def _rank(item: pytest.Item) -> int:
    name = _module(item)
    return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    grouped = {_module(i) for i in items if i.path.stem in LONGEST_FIRST}
    grouped |= {_module(i) for i in items if _shares_a_module_fixture(i)}
    for item in items:
        if _module(item) in grouped:
            item.add_marker(pytest.mark.xdist_group(_module(item)))
    items.sort(key=_rank)  # stable: each module's tests stay together and in order
