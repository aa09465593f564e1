"""BI clients reach the catalog: SQLAlchemy + duckdb-engine (Superset, Metabase's Python
path) and a user's own DuckDB database that ATTACHes the lake read-only (docs/bi.md)."""

from __future__ import annotations

import re
import shutil
import warnings
from pathlib import Path

import duckdb
import pytest
import sqlalchemy as sa

from tests.conftest import store_of
from tests.fixture_paths import REAL_DUMPS
from tokenlake import layout, schema
from tokenlake.orchestrate.extract import extract_run
from tokenlake.serve import sql_views

README = Path(__file__).resolve().parents[2] / "README.md"
SQL_DIR = Path(__file__).resolve().parents[2] / "sql"

# What duckdb-engine reflects for each DuckDB type of the catalog (class names of
# SQLAlchemy types). LIST columns have no SQLAlchemy type: they reflect as NullType with a
# warning (docs/bi.md says so); TIMESTAMPTZ loses its time zone flag in reflection.
REFLECTED_TYPES = {
    "BIGINT": "BigInteger",
    "INTEGER": "Integer",
    "TINYINT": "TinyInteger",
    "BOOLEAN": "BOOLEAN",
    "DOUBLE": "FLOAT",
    "FLOAT": "FLOAT",
    "VARCHAR": "String",
    "TIMESTAMP WITH TIME ZONE": "TIMESTAMP",
    "BIGINT[]": "NullType",
    "VARCHAR[]": "NullType",
    "INTEGER[][]": "NullType",
}
LIST_COLUMNS = {"weight_versions", "prompt_token_ids", "routed_experts", "indexer_topk"}

# miles' own reader on the `basic` dump (tests/fixtures/miles-real/oracle/basic).
ORACLE_STEPS = {
    0: {"reward_mean": 0.25, "n_samples": 8, "mean_abs_lp_diff": 0.30936517380177975},
    1: {"reward_mean": 0.375, "n_samples": 8, "mean_abs_lp_diff": 0.38447922840714455},
}


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> Path:
    lake = tmp_path_factory.mktemp("bi") / "lake"
    extract_run(REAL_DUMPS / "basic", store_of(lake))
    return lake


def _engine(lake: Path) -> sa.Engine:
    return sa.create_engine(
        f"duckdb:///{lake / layout.CATALOG_FILE}", connect_args={"read_only": True}
    )


def _readme_queries() -> list[str]:
    return re.findall(r"```sql\n(.*?)```", README.read_text(), re.DOTALL)


@pytest.mark.slow
def test_sqlalchemy_reflects_every_view_and_column(lake):
    engine = _engine(lake)
    try:
        inspector = sa.inspect(engine)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            views = inspector.get_view_names()
            # one reflection query for all views (per-view get_columns takes ~0.25 s each)
            multi = inspector.get_multi_columns(kind=sa.engine.ObjectKind.ANY)
            reflected = {name: columns for (_, name), columns in multi.items()}
            one_by_one = inspector.get_columns("step_stats")  # what Superset does per table
        with engine.connect() as con:
            described = {
                view: con.exec_driver_sql(f'DESCRIBE "{view}"').fetchall() for view in views
            }
    finally:
        engine.dispose()
    assert [(c["name"], repr(c["type"])) for c in one_by_one] == [
        (c["name"], repr(c["type"])) for c in reflected["step_stats"]
    ]
    assert inspector.get_table_names() == []  # the catalog holds views only
    expected_views = {*schema.TABLES, *(p.stem for p in sql_views.iter_view_files())}
    assert sorted(views) == sorted(expected_views)
    for view in views:
        names = [c["name"] for c in reflected[view]]
        assert names == [row[0] for row in described[view]], view
        for column, row in zip(reflected[view], described[view], strict=True):
            assert type(column["type"]).__name__ == REFLECTED_TYPES[row[1]], (view, row)
    unknown = {re.search(r"of column '(\w+)'", str(w.message)).group(1) for w in caught}
    assert unknown == LIST_COLUMNS


@pytest.mark.slow
def test_sqlalchemy_runs_the_readme_queries_read_only(lake):
    queries = _readme_queries()
    assert len(queries) == 3
    # DuckDB refuses a second connection to one file with another configuration in the same
    # process (duckdb-engine sets its own), so the reference answers come from a copy.
    copy = lake.parent / "reference.duckdb"
    shutil.copyfile(lake / layout.CATALOG_FILE, copy)
    with duckdb.connect(str(copy), read_only=True) as con:
        expected = [con.execute(q).fetchall() for q in queries]
    engine = _engine(lake)
    try:
        with engine.connect() as con:
            actual = [[tuple(r) for r in con.execute(sa.text(q))] for q in queries]
            with pytest.raises(sa.exc.DBAPIError, match="read-only mode"):
                con.exec_driver_sql("CREATE TABLE scratch (a INTEGER)")
    finally:
        engine.dispose()
    assert actual == expected
    # The URL form of the flag (what a Superset user types); on a copy, see above.
    url_copy = lake.parent / "url.duckdb"
    shutil.copyfile(lake / layout.CATALOG_FILE, url_copy)
    url_engine = sa.create_engine(f"duckdb:///{url_copy}?access_mode=read_only")
    try:
        with url_engine.connect() as con:
            assert [tuple(r) for r in con.execute(sa.text(queries[0]))] == expected[0]
            with pytest.raises(sa.exc.DBAPIError, match="read-only mode"):
                con.exec_driver_sql("CREATE TABLE scratch (a INTEGER)")
    finally:
        url_engine.dispose()
    health = {row[1]: row[2] for row in actual[0]}
    assert health == {rid: step["reward_mean"] for rid, step in ORACLE_STEPS.items()}
    assert all(len(rows) > 0 for rows in actual)


@pytest.mark.slow
def test_attach_the_lake_from_a_users_database(lake, tmp_path):
    scores = tmp_path / "eval_scores.csv"
    scores.write_text("run,rollout_id,gsm8k\nbasic,0,0.41\nbasic,1,0.47\nbasic,2,0.5\n")
    con = duckdb.connect(str(tmp_path / "mine.duckdb"))
    try:
        con.execute(f"CREATE TABLE eval_scores AS SELECT * FROM read_csv('{scores}')")
        con.execute(f"ATTACH '{lake / layout.CATALOG_FILE}' AS tl (READ_ONLY)")
        rows = con.execute(
            """
            SELECT e.run, e.rollout_id, e.gsm8k, s.n_samples, s.reward_mean, s.mean_abs_lp_diff
            FROM eval_scores AS e
            LEFT JOIN tl.step_stats AS s USING (run, rollout_id)
            ORDER BY e.rollout_id
            """
        ).fetchall()
        with pytest.raises(duckdb.Error, match="read-only"):
            con.execute("CREATE TABLE tl.scratch (a INTEGER)")
    finally:
        con.close()
    assert [row[:5] for row in rows] == [
        ("basic", 0, 0.41, 8, 0.25),
        ("basic", 1, 0.47, 8, 0.375),
        ("basic", 2, 0.5, None, None),  # no step 2 in the lake: NULL, not a made-up number
    ]
    for row in rows[:2]:
        expected = ORACLE_STEPS[row[1]]["mean_abs_lp_diff"]
        assert row[5] == pytest.approx(expected, rel=1e-6)  # float32 tokens, as in test_oracle


@pytest.mark.slow
def test_plain_parquet_readers_read_the_manifest_listed_files(lake):
    """The pyarrow and polars recipes of docs/bi.md give the `tokens` view's rows and types."""
    import polars as pl
    import pyarrow as pa
    import pyarrow.dataset as ds

    from tokenlake.store import manifest

    files = [
        str(lake / name)
        for run in manifest.load_all(store_of(lake))
        for name in run.files("tokens")
    ]
    partitioning = ds.partitioning(
        pa.schema([("run", pa.string()), ("rollout_id", pa.int64())]), flavor="hive"
    )
    table = ds.dataset(
        files, format="parquet", partitioning=partitioning, partition_base_dir=str(lake / "tokens")
    ).to_table()
    frame = pl.scan_parquet(
        files, hive_partitioning=True, hive_schema={"run": pl.String, "rollout_id": pl.Int64}
    ).collect()
    copy = lake.parent / "plain.duckdb"
    shutil.copyfile(lake / layout.CATALOG_FILE, copy)
    with duckdb.connect(str(copy), read_only=True) as con:
        per_step = con.execute(
            "SELECT run, rollout_id, count(*) FROM tokens GROUP BY ALL ORDER BY ALL"
        ).fetchall()
    assert table.schema.field("rollout_id").type == pa.int64()
    assert frame.schema["rollout_id"] == pl.Int64
    by_arrow = table.group_by(["run", "rollout_id"]).aggregate([([], "count_all")])
    assert sorted(tuple(r.values()) for r in by_arrow.to_pylist()) == per_step
    assert frame.group_by("run", "rollout_id").len().sort("rollout_id").rows() == per_step
    assert table.num_rows == frame.height == sum(n for _, _, n in per_step) == 206


@pytest.mark.slow
def test_one_url_for_every_engine_of_a_lake_as_bi_md_says(lake, tmp_path):
    """Engines made with the same URL share the file; the connect_args form beside them fails
    with DuckDB's configuration error (docs/bi.md tells readers to use the URL)."""
    copy = tmp_path / "catalog.duckdb"
    shutil.copyfile(lake / layout.CATALOG_FILE, copy)
    first = sa.create_engine(f"duckdb:///{copy}?access_mode=read_only")
    second = sa.create_engine(f"duckdb:///{copy}?access_mode=read_only")
    other = sa.create_engine(f"duckdb:///{copy}", connect_args={"read_only": True})
    try:
        with first.connect() as a, second.connect() as b:
            assert (
                a.execute(sa.text("SELECT 1")).fetchall()
                == b.execute(sa.text("SELECT 1")).fetchall()
            )
            with pytest.raises(sa.exc.DBAPIError, match="different configuration"):
                other.connect()
    finally:
        for engine in (first, second, other):
            engine.dispose()
