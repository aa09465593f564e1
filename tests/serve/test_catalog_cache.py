"""A reader's private catalog is kept in the user's cache and opened again while the
manifests, the user views and tokenlake's SQL are unchanged; anything else builds it again.

Builds are counted, never timed.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.conftest import store_of
from tests.serve.test_user_view_sandbox import FORM, lake_with_views, skipped
from tokenlake import layout
from tokenlake.cli import main
from tokenlake.serve import catalog, catalog_cache

QUESTION = "SELECT count(*), sum(token_id) FROM tokens"  # token ids 0, 0, 0


@pytest.fixture
def builds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The private builds made, with the cache in a folder of the test's."""
    monkeypatch.setenv("TOKENLAKE_CACHE", str(tmp_path / "cache"))
    made: list[Path] = []
    write = catalog._write_catalog

    def counting(tmp, store, problems, records=None):  # type: ignore[no-untyped-def]
        made.append(tmp)
        write(tmp, store, problems, records)

    monkeypatch.setattr(catalog, "_write_catalog", counting)
    return made


def _answer(lake: Path) -> list[tuple[object, ...]]:
    with catalog.connect(store_of(lake)) as con:
        return con.execute(QUESTION).fetchall()


def _kept(tmp_path: Path) -> list[str]:
    """The keys kept, over every lake's folder."""
    top = tmp_path / "cache" / catalog_cache.FOLDER
    return sorted(key.name for lake in top.iterdir() for key in lake.iterdir())


def test_a_second_reader_opens_the_kept_catalog(tmp_path: Path, builds: list[Path]) -> None:
    lake = lake_with_views(tmp_path, {"mine.sql": "CREATE VIEW mine AS SELECT 7 AS seven"})
    catalog.build_catalog(store_of(lake))
    builds.clear()  # the lake's own file: never what a reader opens
    first = _answer(lake)
    assert len(builds) == 1
    assert _answer(lake) == first == [(3, 0)]
    assert len(builds) == 1  # opened again, not built
    (key,) = _kept(tmp_path)
    kept = tmp_path / "cache" / catalog_cache.FOLDER
    modes = {os.stat(p).st_mode & 0o777 for p in (kept, *kept.iterdir())}
    assert modes == {0o700}

    result = CliRunner().invoke(main, ["tag", str(lake), "r", "k=v"])  # a manifest changes
    assert result.exit_code == 0
    builds.clear()
    assert _answer(lake) == first
    assert len(builds) == 1
    assert _kept(tmp_path) != [key] and len(_kept(tmp_path)) == 1  # the old key deleted

    (lake / "views" / "mine.sql").write_text("CREATE VIEW mine AS SELECT 8 AS seven")
    with catalog.connect(store_of(lake)) as con:
        assert con.execute("SELECT seven FROM mine").fetchall() == [(8,)]
    assert len(builds) == 2


def test_a_kept_build_says_its_problems_again(
    tmp_path: Path, builds: list[Path], caplog: pytest.LogCaptureFixture
) -> None:
    lake = lake_with_views(tmp_path, {"a.sql": "SELECT 1"})
    catalog.build_catalog(store_of(lake), [])
    line = skipped(lake, "a.sql", FORM.format("a"))
    for _ in range(2):
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            _answer(lake)
        assert [r.getMessage() for r in caplog.records] == [line]
    assert len(builds) == 2  # the lake's own file, then one private build


def test_a_cache_others_may_write_is_never_used(tmp_path: Path, builds: list[Path]) -> None:
    lake = lake_with_views(tmp_path, {})
    catalog.build_catalog(store_of(lake))
    builds.clear()
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    os.chmod(root, 0o777)  # a shared scratch folder
    assert _answer(lake) == _answer(lake) == [(3, 0)]
    assert len(builds) == 2  # built for each reader, as before
    assert list(root.iterdir()) == []
    assert not (lake / layout.CATALOG_FILE).with_suffix(".duckdb.wal").exists()


def test_only_the_lakes_used_last_keep_a_catalog(
    tmp_path: Path, builds: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(catalog_cache, "MAX_LAKES", 1)
    first = lake_with_views(tmp_path / "a", {})
    second = lake_with_views(tmp_path / "b", {})
    for lake in (first, second):
        catalog.build_catalog(store_of(lake))
    _answer(first)
    (folder,) = (tmp_path / "cache" / catalog_cache.FOLDER).iterdir()
    builds.clear()
    _answer(first)
    assert builds == []  # kept
    _answer(second)
    assert len(builds) == 1
    (kept,) = (tmp_path / "cache" / catalog_cache.FOLDER).iterdir()
    assert kept != folder and not folder.exists()  # the first lake's catalog forgotten
    _answer(first)  # built and kept again
    (kept,) = (tmp_path / "cache" / catalog_cache.FOLDER).iterdir()
    assert [entry.name for entry in kept.iterdir()] == _kept(tmp_path)
    assert len(builds) == 2


def test_a_lakes_stale_builds_and_older_keys_are_deleted(
    tmp_path: Path, builds: list[Path]
) -> None:
    lake = lake_with_views(tmp_path, {})
    catalog.build_catalog(store_of(lake))
    _answer(lake)
    (folder,) = (tmp_path / "cache" / catalog_cache.FOLDER).iterdir()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True, capture_output=True, text=True)  # fmt: skip
    stale = folder / f".building-{gone.stdout.strip()}-0a1b2c3d"  # a build killed midway
    running = folder / f".building-{os.getpid()}-0a1b2c3d"  # a build of a live process
    for made in (stale, running, folder / ("0" * 32)):
        made.mkdir()
    CliRunner().invoke(main, ["tag", str(lake), "r", "k=v"])
    _answer(lake)  # a new key kept
    names = sorted(entry.name for entry in folder.iterdir())
    assert names[0] == running.name  # only the stale build and the older keys are gone
    assert len(names) == 2 and len(names[1]) == 32 and names[1] != "0" * 32
