"""A reader's private catalog is kept in the user's cache and opened again while the
manifests, the user views and tokenlake's SQL are unchanged; anything else builds it again.

Builds are counted, never timed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from tests.conftest import store_of
from tests.fixture_paths import REAL_DUMPS
from tests.serve.test_user_view_sandbox import FORM, lake_with_views, skipped
from tokenlake import layout, schema
from tokenlake.cli import main
from tokenlake.serve import catalog, catalog_cache, kept_rows
from tokenlake.store import manifest, parquet, private_cache

QUESTION = "SELECT count(*), sum(token_id) FROM tokens"  # token ids 0, 0, 0


@pytest.fixture
def builds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The private builds made, with the cache in a folder of the test's."""
    monkeypatch.setenv("TOKENLAKE_CACHE", str(tmp_path / "cache"))
    made: list[Path] = []
    write = catalog._write_catalog

    def counting(tmp, store, problems, records=None, **ahead):  # type: ignore[no-untyped-def]
        made.append(tmp)
        write(tmp, store, problems, records, **ahead)

    monkeypatch.setattr(catalog, "_write_catalog", counting)
    return made


def _answer(lake: Path) -> list[tuple[object, ...]]:
    with catalog.connect(store_of(lake)) as con:
        return con.execute(QUESTION).fetchall()


def _kept(tmp_path: Path) -> list[str]:
    """The keys kept, over every lake's folder (folders: beside them, files of what readers
    found)."""
    top = tmp_path / "cache" / catalog_cache.FOLDER
    return sorted(key.name for lake in top.iterdir() for key in lake.iterdir() if key.is_dir())


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

    (lake / "views" / "other.sql").write_text("CREATE VIEW other AS SELECT 1 AS one")
    builds.clear()
    assert _answer(lake) == first
    assert len(builds) == 1  # a view file changed: built again
    assert _kept(tmp_path) != [key] and len(_kept(tmp_path)) == 1  # the old key deleted

    (lake / "views" / "mine.sql").write_text("CREATE VIEW mine AS SELECT 8 AS seven")
    with catalog.connect(store_of(lake)) as con:
        assert con.execute("SELECT seven FROM mine").fetchall() == [(8,)]
    assert len(builds) == 2


# DuckDB keeps an `EXCLUDE (...)` list as a set: a catalog it reopens and checkpoints writes
# the views' text again with each such list in another order (the same columns excluded).
_EXCLUDE = re.compile(r"EXCLUDE \(([^()]*)\)")


def _contents(path: Path) -> list[tuple[str, str]]:
    """Every view and macro a catalog file holds, with its SQL (each `EXCLUDE` list sorted),
    and every view's columns and types, by name."""
    with duckdb.connect(str(path), read_only=True) as con:
        rows = con.execute(
            "SELECT view_name, sql FROM duckdb_views() WHERE NOT internal"
            " UNION ALL SELECT function_name, macro_definition FROM duckdb_functions()"
            " WHERE function_type IN ('macro', 'table_macro') AND NOT internal"
            " ORDER BY ALL"
        ).fetchall()
        views = con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()
        columns = [(name, str(con.execute(f'DESCRIBE "{name}"').fetchall())) for (name,) in views]
    return [(str(name), _sorted_excludes(str(sql))) for name, sql in rows] + sorted(columns)


def _sorted_excludes(sql: str) -> str:
    """
    Examples:
        >>> _sorted_excludes("SELECT * EXCLUDE (run, b, a) FROM t")
        'SELECT * EXCLUDE (a, b, run) FROM t'
    """
    return _EXCLUDE.sub(lambda m: f"EXCLUDE ({', '.join(sorted(m.group(1).split(', ')))})", sql)


def _runs_view(contents: list[tuple[object, ...]]) -> object:
    return next(sql for name, sql in contents if name == "runs")


def test_tag_changes_the_kept_catalog_into_what_a_rebuild_makes(
    tmp_path: Path, builds: list[Path]
) -> None:
    """`tag` writes a new `runs` file: the lake's catalog and the reader's kept one become
    the kept one with that view and the listed files' digest replaced, equal to a rebuild's
    (the same views and macros, their SQL but for the order within `EXCLUDE` lists, the same
    columns), and the next reader opens it without building."""
    lake = lake_with_views(tmp_path, {"mine.sql": "CREATE VIEW mine AS SELECT run FROM runs"})
    catalog.build_catalog(store_of(lake))
    before = _contents(lake / layout.CATALOG_FILE)
    _answer(lake)
    builds.clear()
    result = CliRunner().invoke(main, ["tag", str(lake), "r", "k=v"])
    assert (result.exit_code, result.output) == (0, "Run `r` tags: k=v\n")
    assert builds == []  # neither the lake's catalog nor a reader's was built
    (key,) = _kept(tmp_path)
    (kept,) = (tmp_path / "cache" / catalog_cache.FOLDER).glob(f"*/{key}/{layout.CATALOG_FILE}")
    tagged = _contents(lake / layout.CATALOG_FILE)
    assert _runs_view(tagged) != _runs_view(before)
    assert _contents(kept) == tagged
    with catalog.connect(store_of(lake)) as con:
        assert con.execute("SELECT * FROM run_tags").fetchall() == [("r", "k", "v")]
        assert con.execute("SELECT * FROM mine").fetchall() == [("r",)]
    assert builds == []  # the reader opened the kept one
    catalog.build_catalog(store_of(lake))
    assert len(builds) == 1
    assert _contents(lake / layout.CATALOG_FILE) == tagged  # a rebuild makes the same
    assert catalog.catalog_problem(store_of(lake)) is None


def test_tag_without_a_kept_catalog_builds_the_lakes_in_full(
    tmp_path: Path, builds: list[Path]
) -> None:
    lake = lake_with_views(tmp_path, {})
    catalog.build_catalog(store_of(lake))
    builds.clear()
    assert CliRunner().invoke(main, ["tag", str(lake), "r", "k=v"]).exit_code == 0
    assert len(builds) == 1
    assert catalog.catalog_problem(store_of(lake)) is None


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
    assert [entry.name for entry in kept.iterdir() if entry.is_dir()] == _kept(tmp_path)
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
    names = sorted(entry.name for entry in folder.iterdir() if entry.is_dir())
    assert names[0] == running.name  # only the stale build and the older keys are gone
    assert len(names) == 2 and len(names[1]) == 32 and names[1] != "0" * 32


def test_a_healthy_catalog_files_check_is_kept_until_the_file_or_the_manifests_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOKENLAKE_CACHE", str(tmp_path / "cache"))
    lake = lake_with_views(tmp_path, {})
    store = store_of(lake)
    catalog.build_catalog(store)
    opened: list[Path] = []
    check = catalog._opened_file_problem

    def counting(path, rebuild, current):  # type: ignore[no-untyped-def]
        opened.append(path)
        return check(path, rebuild, current)

    monkeypatch.setattr(catalog, "_opened_file_problem", counting)
    assert catalog.catalog_problem(store) is None
    catalog._HEALTHY.clear()  # as in a new process: only the kept line remains
    assert catalog.catalog_problem(store) is None
    assert len(opened) == 1  # the second check opened nothing

    catalog.build_catalog(store)  # another file under the same name
    catalog._HEALTHY.clear()
    assert (catalog.catalog_problem(store), len(opened)) == (None, 2)

    (record,) = manifest.load_all(store)
    record.steps.pop(next(iter(record.steps)))  # the manifests list other files now
    manifest.save_manifest(store, record)
    catalog._HEALTHY.clear()
    assert catalog.catalog_problem(store) == (
        f"catalog `{layout.CATALOG_FILE}` lists other files than the manifests (a command was"
        " interrupted before rebuilding it); run `tokenlake views LAKE` or extract again"
    )
    assert len(opened) == 3


def test_verify_on_an_unchanged_catalog_does_not_import_duckdb(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOKENLAKE_CACHE", str(tmp_path / "cache"))
    lake = tmp_path / "lake"
    extracted = CliRunner().invoke(
        main, ["extract", str(REAL_DUMPS / "basic"), "--lake", str(lake), "--silent"]
    )
    assert extracted.exit_code == 0, extracted.output
    env = dict(os.environ)
    command = [sys.executable, "-X", "importtime", "-m", "tokenlake", "verify", str(lake)]
    runs = [subprocess.run(command, capture_output=True, text=True, env=env) for _ in range(2)]
    assert [(r.returncode, r.stdout) for r in runs] == [(0, "3 steps checked, 0 problems\n")] * 2
    imported = [{line.rsplit("|", 1)[-1].strip() for line in r.stderr.splitlines()} for r in runs]
    assert "_duckdb" in imported[0]
    assert "_duckdb" not in imported[1]


def test_tag_rewrites_the_runs_row_without_importing_pyarrow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`tag` of a local lake whose catalog this user keeps reads and writes the run's `runs`
    row through the DuckDB it has imported anyway, and changes the kept catalog: pyarrow's
    import is ~0.15 s of CPU, half of the command. The row keeps what it held but the tags."""
    monkeypatch.setenv("TOKENLAKE_CACHE", str(tmp_path / "cache"))
    lake = tmp_path / "lake"
    extracted = CliRunner().invoke(
        main, ["extract", str(REAL_DUMPS / "basic"), "--lake", str(lake), "--silent"]
    )
    assert extracted.exit_code == 0, extracted.output
    first = CliRunner().invoke(main, ["tag", str(lake), "basic", "k=v"])  # keeps its catalog
    assert first.exit_code == 0, first.output
    before = _runs_rows(lake)
    command = [sys.executable, "-X", "importtime", "-m", "tokenlake", "tag", str(lake), "basic"]
    done = subprocess.run([*command, "k=w"], capture_output=True, text=True, env=dict(os.environ))
    assert (done.returncode, done.stdout) == (0, "Run `basic` tags: k=w\n")
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()}
    assert "duckdb" in imported
    assert not {name for name in imported if name.startswith(("pyarrow", "numpy"))}
    assert _runs_rows(lake) == [{**before[0], "tags_json": '{"k": "w"}'}]


def _runs_rows(lake: Path) -> list[dict[str, object]]:
    """The lake's `runs` rows as pyarrow reads them from the files its manifests list."""
    store = store_of(lake)
    files = catalog.table_files(store, schema.RUNS)
    assert len(files) == 1
    return pq.read_table(files[0]).to_pylist()


def _counted_footer_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names whose footer identity is read from now on, in order."""
    read: list[str] = []
    footer_identity = parquet.footer_identity

    def counting(store, name):  # type: ignore[no-untyped-def]
        read.append(name)
        return footer_identity(store, name)

    monkeypatch.setattr(parquet, "footer_identity", counting)
    return read


def test_a_reader_reads_again_only_the_footers_of_files_changed_since_the_last(
    tmp_path: Path, builds: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    lake = lake_with_views(tmp_path, {})
    catalog.build_catalog(store_of(lake))
    read = _counted_footer_reads(monkeypatch)
    first = _answer(lake)
    listed = sorted(set(read))
    assert listed  # every listed file's footer, the first time
    read.clear()
    assert _answer(lake) == first
    assert read == []  # none changed since
    (tokens,) = (lake / "tokens").rglob("*.parquet")
    os.utime(tokens)  # the same bytes, another mtime and ctime: read again, and still served
    assert _answer(lake) == first
    assert read == [tokens.relative_to(lake).as_posix()]


@pytest.mark.parametrize("kept", ["too large", "not JSON", "a link"])
def test_kept_footers_too_large_unreadable_or_a_link_are_not_used_and_every_footer_is_read(
    tmp_path: Path, builds: list[Path], monkeypatch: pytest.MonkeyPatch, kept: str
) -> None:
    lake = lake_with_views(tmp_path, {})
    catalog.build_catalog(store_of(lake))
    first = _answer(lake)
    (footers,) = (tmp_path / "cache").rglob("footers.json")
    good = footers.read_bytes()
    footers.unlink()
    if kept == "too large":
        monkeypatch.setattr(catalog_cache, "MAX_FOOTERS_BYTES", len(good) - 1)
        footers.write_bytes(good)
    elif kept == "not JSON":
        footers.write_bytes(good[:-1])
    else:
        (tmp_path / "elsewhere.json").write_bytes(good)
        footers.symlink_to(tmp_path / "elsewhere.json")
    read = _counted_footer_reads(monkeypatch)
    assert _answer(lake) == first
    assert len(set(read)) == len(json.loads(good))  # every listed file's footer read again


def test_forgetting_skips_a_lakes_folder_another_command_deleted_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two commands of the user forget lakes at once: a folder the other one deleted between
    this one's listing and its look at the folder is skipped, not an error."""
    top = tmp_path / "catalogs"
    for age, name in enumerate(("oldest", "gone", "newer", "newest")):
        (top / name).mkdir(parents=True)
        os.utime(top / name, ns=(age * 10**9, age * 10**9))
    listing = os.scandir

    @contextlib.contextmanager
    def listing_then_other_deletes(path):  # type: ignore[no-untyped-def]
        with listing(path) as listed:
            entries = list(listed)
        (top / "gone").rmdir()  # the other command, after this one listed the folders
        yield iter(entries)

    monkeypatch.setattr(os, "scandir", listing_then_other_deletes)
    private_cache.forget_least_used(top, 2)
    monkeypatch.undo()
    assert sorted(entry.name for entry in top.iterdir()) == ["newer", "newest"]


def test_a_kept_catalog_another_command_deleted_before_it_was_opened_is_built_again(
    tmp_path: Path, builds: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another command of the user keeps a newer key of the lake (the lake changed, or another
    tokenlake version read it) and deletes this one between its lookup and its open."""
    lake = lake_with_views(tmp_path, {"mine.sql": "CREATE VIEW mine AS SELECT 7 AS seven"})
    catalog.build_catalog(store_of(lake))
    first = _answer(lake)
    builds.clear()
    with_rows = kept_rows.with_rows

    def then_deleted(path, store, served):  # type: ignore[no-untyped-def]
        opened = with_rows(path, store, served)
        shutil.rmtree(path.parent)  # the key's folder, as the other command's `keep` does
        return opened

    monkeypatch.setattr(kept_rows, "with_rows", then_deleted)
    with catalog.connect(store_of(lake)) as con:
        assert con.execute(QUESTION).fetchall() == first == [(3, 0)]
        assert con.execute("SELECT seven FROM mine").fetchall() == [(7,)]
    assert len(builds) == 1  # built for this command
