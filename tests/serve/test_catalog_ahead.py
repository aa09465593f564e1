"""A catalog begun ahead while an extraction writes its steps (`catalog.CatalogAhead`: every
view of `sql/` bound over base views that list no file), then completed over the lake's files,
is the catalog a full build makes: the same views with the same definitions, comments and
columns, the same macros, and every view gives the same rows.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import duckdb
import pytest

from tests.conftest import local_store
from tests.fixture_paths import REAL_DUMPS
from tokenlake.orchestrate.extract import ExtractOptions, extract_run
from tokenlake.serve import catalog, sql_views

USER_VIEW = (
    "CREATE OR REPLACE VIEW my_steps AS\n"
    "SELECT run, rollout_id, count(*) AS tokens FROM tokens GROUP BY ALL;\n"
)


def _contents(path: Path) -> dict[str, Any]:
    """Everything a reader of the catalog file sees: its views (definition, comment, columns
    and types), its macros and each view's rows (in a stable order)."""
    with duckdb.connect(str(path), read_only=True) as con:
        views = con.execute(
            "SELECT view_name, sql, comment FROM duckdb_views() WHERE NOT internal"
            " ORDER BY view_name"
        ).fetchall()
        columns = con.execute(
            "SELECT table_name, column_index, column_name, data_type FROM duckdb_columns()"
            " WHERE NOT internal ORDER BY ALL"
        ).fetchall()
        macros = con.execute(
            "SELECT function_name, function_type, macro_definition FROM duckdb_functions()"
            " WHERE function_type IN ('macro', 'table_macro') AND NOT internal"
            " ORDER BY function_name"
        ).fetchall()
        rows = {
            name: sorted(repr(row) for row in con.execute(f'SELECT * FROM "{name}"').fetchall())
            for name, _, _ in views
        }
    return {"views": views, "columns": columns, "macros": macros, "rows": rows}


def _built_in_full(lake: Path, into: Path) -> dict[str, Any]:
    catalog.build_catalog(local_store(lake))
    shutil.copyfile(lake / "tokenlake.duckdb", into)
    return _contents(into)


def _refuse_full_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    write = catalog._write_catalog

    def ahead_only(*args: Any, made: Any = None, **kwargs: Any) -> None:
        if made is None:
            raise AssertionError("built in full, not from the catalog made ahead")
        write(*args, made=made, **kwargs)

    monkeypatch.setattr(catalog, "_write_catalog", ahead_only)


def test_a_catalog_made_ahead_is_the_catalog_a_full_build_makes(
    basic_and_pp2_lake: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (basic_and_pp2_lake / "views").mkdir()
    (basic_and_pp2_lake / "views" / "my_steps.sql").write_text(USER_VIEW, encoding="utf-8")
    full = _built_in_full(basic_and_pp2_lake, tmp_path / "full.duckdb")
    assert {view[0] for view in full["views"]} == {*sql_views.expected_views(), "my_steps"}
    steps = [("basic", 0, 124), ("basic", 1, 82), ("pp2", 0, 127), ("pp2", 1, 67)]
    assert full["rows"]["my_steps"] == [repr(step) for step in steps]

    store = local_store(basic_and_pp2_lake)
    ahead = catalog.CatalogAhead(store)
    _refuse_full_builds(monkeypatch)
    warnings: list[str] = []
    try:
        catalog.build_catalog(store, warnings, ahead)
    finally:
        ahead.discard()
    assert warnings == []
    assert _contents(basic_and_pp2_lake / "tokenlake.duckdb") == full


def test_a_catalog_that_could_not_be_made_ahead_is_built_in_full(
    basic_and_pp2_lake: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    full = _built_in_full(basic_and_pp2_lake, tmp_path / "full.duckdb")

    def failing(path: Path, store: object) -> None:
        raise duckdb.IOException("IO Error: No space left on device")

    monkeypatch.setattr(catalog, "_make_ahead", failing)
    ahead = catalog.CatalogAhead(local_store(basic_and_pp2_lake))
    try:
        catalog.build_catalog(local_store(basic_and_pp2_lake), [], ahead)
    finally:
        ahead.discard()
    assert _contents(basic_and_pp2_lake / "tokenlake.duckdb") == full


@pytest.fixture
def temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The system's temporary folder, where catalogs are made ahead: one of the test's own."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def test_an_extraction_begins_its_catalog_ahead_only_with_steps_to_write_and_leaves_no_folder(
    tmp_path: Path, temporary: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    begun: list[catalog.CatalogAhead] = []
    made = catalog.CatalogAhead

    def counted(store: Any) -> catalog.CatalogAhead:
        begun.append(made(store))
        return begun[-1]

    monkeypatch.setattr(catalog, "CatalogAhead", counted)
    lake = tmp_path / "lake"
    _refuse_full_builds(monkeypatch)
    summary = extract_run(REAL_DUMPS / "basic", local_store(lake), ExtractOptions(workers=1))
    assert summary.tokens > 0 and len(begun) == 1
    assert list(temporary.iterdir()) == []
    again = extract_run(REAL_DUMPS / "basic", local_store(lake), ExtractOptions(workers=1))
    assert again.tokens == 0 and len(begun) == 1  # nothing to write: nothing begun
    assert list(temporary.iterdir()) == []


def test_the_folder_a_killed_extraction_left_is_swept_by_the_next(
    tmp_path: Path, temporary: Path
) -> None:
    ended = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    gone = int(ended.stdout)  # a process that has ended, as a SIGKILLed extraction has
    namespace = os.stat("/proc/self/ns/pid").st_ino
    left = temporary / f"tokenlake-catalog-{namespace}-{gone}-abc_12x"
    left.mkdir()
    (left / "catalog.duckdb").write_bytes(b"half")
    live = temporary / f"tokenlake-catalog-{namespace}-{os.getpid()}-zz9"  # this process's
    live.mkdir()
    other = temporary / "tokenlake-catalog-notapid"
    other.mkdir()
    # Another container's (pid namespace): its pid means nothing here, so it is left.
    elsewhere = temporary / f"tokenlake-catalog-{namespace + 1}-{gone}-abc_12x"
    elsewhere.mkdir()
    link = temporary / f"tokenlake-catalog-{namespace}-{gone}-link"  # never followed nor removed
    link.symlink_to(live)
    ahead = catalog.CatalogAhead(local_store(tmp_path / "lake"))
    made = ahead._folder.name
    ahead.discard()
    assert made.startswith(f"tokenlake-catalog-{namespace}-{os.getpid()}-")
    assert sorted(p.name for p in temporary.iterdir()) == sorted(
        [live.name, other.name, elsewhere.name, link.name]
    )
