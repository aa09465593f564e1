"""How the suite is spread over pytest-xdist workers (`make test` runs `pytest -n auto`).

A module that defines a module-scoped fixture (a lake built once, an S3 server, a Ray cluster,
a Spark session, a browser) runs whole on one worker, so the fixture is built once; every
other test is scheduled on its own. The modules that take longest start first, so the short
tests fill in around them instead of one worker finishing a long module alone at the end.

The grouping is a scheduler of our own (`pytest_xdist_make_scheduler`) rather than
`xdist_group` marks: xdist 3.8 renames a marked test's node id, which pytest 9 ignores, so
`--dist loadgroup` groups nothing there.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import HealthCheck, settings

if TYPE_CHECKING:
    from tokenlake.store.base import Store

# The longest modules, longest first (each one worker's work for a minute or more).
LONGEST_FIRST = (
    "test_object_lake",
    "test_spark",
    "test_ray",
    "test_report",
    "test_crash",
    "test_remote_dump",
)
MODULE_FIXTURE = 'scope="module"'  # as ruff formats `@pytest.fixture(scope="module")`


@cache
def runs_whole(path: Path) -> bool:
    """Whether the tests of the module at `path` go to one worker together."""
    if path.stem in LONGEST_FIRST:
        return True
    try:
        return path.suffix == ".py" and MODULE_FIXTURE in path.read_text(encoding="utf-8")
    except OSError:  # a node id that names no file here: schedule its tests one by one
        return False


# No test depends on wall-clock speed: Hypothesis's default deadline (200 ms an example) and its
# health check of slow data generation fail on a busy CI machine (an example that ran in
# 0.3 ms took 288 ms there once).
settings.register_profile("tokenlake", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("tokenlake")


@pytest.fixture(scope="session", autouse=True)
def own_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The suite's catalogs and stages kept in a cache of its own (each xdist worker its own),
    not in the user's (even one `TOKENLAKE_CACHE` names): hundreds of test lakes would otherwise
    push the user's own lakes' catalogs out of it. A test that sets `TOKENLAKE_CACHE` wins."""
    os.environ["TOKENLAKE_CACHE"] = str(tmp_path_factory.mktemp("cache") / "tokenlake")


def _rank(item: pytest.Item) -> int:
    name = item.path.stem
    return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_rank)  # stable: each module's tests stay together and in order


@pytest.hookimpl(optionalhook=True)  # a hook of xdist's: without xdist, pytest runs as ever
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class ModulesWholeTestsApart(LoadScopeScheduling):
        """Work units: a whole module where `runs_whole`, else a single test; in collection
        order (longest modules first), not xdist's largest-unit-first."""

        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if runs_whole(config.rootpath / module) else nodeid

    config.option.loadscopereorder = False
    return ModulesWholeTestsApart(config, log)


def local_store(path: Path | str) -> Store:
    """The store of a lake directory, for tests that call what lies below `tokenlake.Lake`."""
    from tokenlake.store.local import LocalStore

    return LocalStore(path)


def store_of(location: Path | str | Store) -> Store:
    """The store of a lake directory or object-store URL, resolved as `tokenlake.Lake` does (a
    store is returned as it is), for tests that call what lies below `tokenlake.Lake`."""
    from tokenlake.store import store_at

    return store_at(location)


@pytest.fixture(scope="module")
def basic_and_pp2_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A lake holding the real `basic` and `pp2` fixture runs, extracted once per module."""
    from tests.fixture_paths import REAL_DUMPS
    from tokenlake.orchestrate.extract import ExtractOptions, extract_run

    lake = tmp_path_factory.mktemp("two-runs") / "lake"
    extract_run(REAL_DUMPS / "basic", local_store(lake), ExtractOptions(workers=1))
    extract_run(REAL_DUMPS / "pp2", local_store(lake), ExtractOptions(workers=1))
    return lake


@pytest.fixture
def basic_and_pp2_lake(basic_and_pp2_template: Path, tmp_path: Path) -> Path:
    """A private copy of `basic_and_pp2_template` for one test to change."""
    import shutil

    from tokenlake.serve import catalog

    copy = tmp_path / "lake"
    shutil.copytree(basic_and_pp2_template, copy)
    catalog.build_catalog(local_store(copy))  # its views point at the copy
    return copy
