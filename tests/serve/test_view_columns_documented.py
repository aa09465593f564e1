"""Each view's columns are documented in one place: the `-- Columns:` block of its SQL file's
header (name, DuckDB type, meaning), which is also the view's DuckDB comment. The header must
give exactly the names and types `DESCRIBE` gives, in order; docs/drift.md's tables of formulas
and framework names must name exactly the columns of their view.
"""

from __future__ import annotations

import re
from pathlib import Path

import duckdb
import pytest

from tests.conftest import store_of
from tokenlake import schema
from tokenlake.errors import LakeError
from tokenlake.serve import catalog, sql_views

DRIFT_DOCS = Path(__file__).resolve().parents[2] / "docs" / "drift.md"
VIEW_FILES = list(sql_views.iter_view_files())
BAD_LINE = (
    "header line `{}` is none of `--   name  TYPE  meaning`, a continuation indented further,"
    " or `--   + the columns of macro NAME`"
)


@pytest.fixture(scope="module")
def empty_catalog(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    lake = tmp_path_factory.mktemp("lake")
    con = duckdb.connect(str(catalog.build_catalog(store_of(lake))), read_only=True)
    yield con
    con.close()


def described(con: duckdb.DuckDBPyConnection, view: str) -> list[tuple[str, str]]:
    return [(row[0], row[1]) for row in con.execute(f"DESCRIBE {view}").fetchall()]


def test_every_view_of_the_catalog_is_checked(empty_catalog) -> None:  # type: ignore[no-untyped-def]
    views = {
        n
        for (n,) in empty_catalog.execute(
            "SELECT view_name FROM duckdb_views() WHERE NOT internal"
        ).fetchall()
    }
    checked = {path.stem for path in VIEW_FILES}
    assert checked  # a check over no view would pass on anything
    assert views - set(schema.TABLES) == checked


@pytest.mark.parametrize("path", VIEW_FILES, ids=lambda p: p.stem)
def test_the_header_documents_exactly_the_views_columns(empty_catalog, path: Path) -> None:  # type: ignore[no-untyped-def]
    assert sql_views.documented_columns(path) == described(empty_catalog, path.stem)


def drift_docs_table(section: str) -> list[str]:
    """The column names in the first cells of the first table under `## {section}`."""
    body = DRIFT_DOCS.read_text(encoding="utf-8").split(f"\n## {section}\n", 1)[1]
    body = body.split("\n## ", 1)[0]
    table = body[body.index("\n| column |") :].split("\n\n", 1)[0]
    rows = table.strip().splitlines()[2:]  # after the header and the |---| line
    return [name for row in rows for name in re.findall(r"`(\w+)`", row.split(" | ")[0])]


def test_drift_docs_tables_name_exactly_the_views_columns(empty_catalog) -> None:  # type: ignore[no-untyped-def]
    settings = [name for name, _ in described(empty_catalog, "drift_settings")]
    steps = [name for name, _ in described(empty_catalog, "drift_steps")]
    statistics = [name for name, _ in sql_views.macro_columns("drift_statistics")]
    assert sorted(drift_docs_table("`drift_settings`: thresholds in one place")) == sorted(settings)
    assert drift_docs_table("`drift_steps`: one row per training step") == [
        name for name in steps if name not in ("run", "rollout_id")
    ]
    assert drift_docs_table("Breakdowns") == statistics


def test_a_macro_line_stands_for_the_macros_columns(tmp_path: Path) -> None:
    path = tmp_path / "v.sql"
    path.write_text(
        "-- Purpose.\n-- Columns:\n--   run  VARCHAR  run name\n--   a, b  DOUBLE  two of a kind\n"
        "--         (a continuation)\n"
        "--   + the columns of macro drift_statistics (sql/macros/drift_breakdown.sql)\n"
        "CREATE OR REPLACE VIEW v AS SELECT 1",
        encoding="utf-8",
    )
    assert sql_views.documented_columns(path) == [
        ("run", "VARCHAR"),
        ("a", "DOUBLE"),
        ("b", "DOUBLE"),
        ("tokens", "BIGINT"),
        ("samples", "BIGINT"),
        ("mean_lp_diff", "DOUBLE"),
        ("mean_abs_lp_diff", "DOUBLE"),
        ("max_abs_lp_diff", "DOUBLE"),
        ("k3_kl", "DOUBLE"),
        ("k3_share", "DOUBLE"),
        ("mult_prob_error", "DOUBLE"),
    ]


@pytest.mark.parametrize(
    ("header", "problem"),
    [
        ("-- Purpose.\n-- Grain: one row.\n", "has no `-- Columns:` block in its header"),
        ("-- Columns:\n--   run      run name\n", BAD_LINE.format("--   run      run name")),
        ("-- Columns:\n--     run  VARCHAR  name\n", BAD_LINE.format("--     run  VARCHAR  name")),
        ("-- Columns:\n-- A note.\n", BAD_LINE.format("-- A note.")),
    ],
)
def test_a_header_without_well_formed_columns_is_one_clear_error(
    tmp_path: Path, header: str, problem: str
) -> None:
    path = tmp_path / "v.sql"
    path.write_text(header + "CREATE OR REPLACE VIEW v AS SELECT 1", encoding="utf-8")
    with pytest.raises(LakeError) as caught:
        sql_views.documented_columns(path)
    assert (caught.value.path, caught.value.problem) == (str(path), problem)


def test_a_line_naming_an_unknown_macro_is_one_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "v.sql"
    path.write_text(
        "-- Columns:\n--   + the columns of macro nope\nCREATE OR REPLACE VIEW v AS SELECT 1",
        encoding="utf-8",
    )
    with pytest.raises(LakeError) as caught:
        sql_views.documented_columns(path)
    assert (caught.value.path, caught.value.problem) == (
        str(sql_views.sql_dir() / "macros"),
        "no file defines the macro `nope`",
    )
