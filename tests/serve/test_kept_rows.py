"""A reader's kept catalog holds the rows of the samples and the stored rollups: the same
views, the same rows, a `--set` override still computed from the tokens, and none kept for a
lake beyond the bound (serve/kept_rows.py)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from tests.conftest import store_of
from tokenlake import schema
from tokenlake.cli import main
from tokenlake.generator import synth
from tokenlake.orchestrate.extract import ExtractOptions, extract_run
from tokenlake.serve import catalog, catalog_cache, kept_rows, rollups
from tokenlake.serve.audit import format_audit_report, run_audits
from tokenlake.serve.query import connect_reader

OVERRIDE = {"histogram_half_width": 0.25}  # a setting drift_histogram_parts depends on


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("kept_rows")
    synth.write_dump(root / "dump", synth.PRESETS["example"])
    extract_run(root / "dump", store_of(root / "lake"), ExtractOptions(workers=1))
    return root / "lake"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TOKENLAKE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def copied_tables(con: duckdb.DuckDBPyConnection) -> list[str]:
    listed = con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE schema_name = ? ORDER BY table_name",
        [kept_rows.SCHEMA],
    ).fetchall()
    return [name for (name,) in listed]


def uncached(lake: Path, monkeypatch: pytest.MonkeyPatch, settings: dict | None = None):  # type: ignore[no-untyped-def]
    """The lake's views built for one connection, over the files (no kept catalog)."""
    with monkeypatch.context() as patched:
        patched.setattr(catalog_cache, "lake_folder", lambda store: None)
        return connect_reader(store_of(lake), settings)


def test_a_kept_catalog_serves_the_rows_copied_into_it(
    lake: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with catalog.connect(store_of(lake)) as kept, uncached(lake, monkeypatch) as files:
        assert copied_tables(kept) == sorted([schema.SAMPLES, *rollups.rollup_names()])
        assert copied_tables(files) == []
        for view in ("samples", "step_stats", "drift_steps", "drift_histogram", "group_stats"):
            query = f"SELECT * FROM {view} ORDER BY ALL"
            assert kept.execute(query).fetchall() == files.execute(query).fetchall(), view
    assert len(list(cache.rglob(f"{kept_rows.FOLDER}/tokenlake.duckdb"))) == 1


def test_a_settings_override_computes_its_rollups_from_the_tokens(
    lake: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    query = "SELECT * FROM drift_histogram ORDER BY ALL"
    with connect_reader(store_of(lake), OVERRIDE) as kept:
        assert copied_tables(kept)  # the kept rows are there, and not read
        overridden = kept.execute(query).fetchall()
    with uncached(lake, monkeypatch, OVERRIDE) as files:
        assert overridden == files.execute(query).fetchall()
    with connect_reader(store_of(lake)) as default:
        assert overridden != default.execute(query).fetchall()


def test_a_lake_beyond_the_bound_keeps_its_views_over_the_files(
    lake: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kept_rows, "COPY_LIMIT", 0)
    with catalog.connect(store_of(lake)) as con:
        assert copied_tables(con) == []
        assert con.execute("SELECT count(*) FROM samples").fetchall() == [(112,)]
    assert list(cache.rglob(kept_rows.FOLDER)) == []


def test_a_tag_carries_the_kept_rows_over_to_the_next_reader(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synth.write_dump(tmp_path / "dump", synth.PRESETS["example"])
    lake = tmp_path / "lake"
    extract_run(tmp_path / "dump", store_of(lake), ExtractOptions(workers=1, run_name="r"))
    with catalog.connect(store_of(lake)) as con:
        before = con.execute("SELECT * FROM step_stats ORDER BY ALL").fetchall()
    copies: list[int] = []
    copy_queries = kept_rows.copy_queries

    def counting(*args):  # type: ignore[no-untyped-def]
        copies.append(1)
        return copy_queries(*args)

    monkeypatch.setattr(kept_rows, "copy_queries", counting)
    result = CliRunner().invoke(main, ["tag", str(lake), "r", "k=v"])
    assert (result.exit_code, result.output) == (0, "Run `r` tags: k=v\n")
    with catalog.connect(store_of(lake)) as con:
        assert copied_tables(con) == sorted([schema.SAMPLES, *rollups.rollup_names()])
        assert con.execute("SELECT key, value FROM run_tags").fetchall() == [("k", "v")]
        assert con.execute("SELECT * FROM step_stats ORDER BY ALL").fetchall() == before
    assert copies == []  # the rows of before, carried over by the tag
    assert len(list(cache.rglob(f"{kept_rows.FOLDER}/tokenlake.duckdb"))) == 1


def test_a_small_lakes_reader_runs_duckdb_on_one_thread(
    lake: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The example lake (4,079 tokens) is under one row group of tokens: one thread, kept
    catalog or not; a lake at the bound keeps DuckDB's default of one thread a core."""
    threads = "SELECT current_setting('threads')"
    with duckdb.connect() as fresh:
        default = fresh.execute(threads).fetchall()
    with catalog.connect(store_of(lake)) as kept, uncached(lake, monkeypatch) as files:
        assert kept.execute(threads).fetchall() == [(1,)]
        assert files.execute(threads).fetchall() == [(1,)]
    monkeypatch.setattr(catalog, "ONE_THREAD_TOKENS", 4_079)
    with catalog.connect(store_of(lake)) as kept, uncached(lake, monkeypatch) as files:
        assert kept.execute(threads).fetchall() == default
        assert files.execute(threads).fetchall() == default


def test_an_audit_reads_the_views_rows_the_kept_catalog_holds(
    lake: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rows of the views several audits read are kept with the copied rows and read by an
    audit without `--set`: the report is the one of a catalog without them, overrides too."""
    with catalog.connect(store_of(lake)) as kept:
        assert kept_rows.kept_views(kept) == set(kept_rows.SHARED_VIEWS)
    with uncached(lake, monkeypatch) as files:
        assert kept_rows.kept_views(files) == set()
    override = {"alarm_ess_min": 0.99, "abs_lp_diff_limit": 0.01}
    reports = {}
    for name, folder in (("kept", catalog_cache.lake_folder), ("files", lambda store: None)):
        monkeypatch.setattr(catalog_cache, "lake_folder", folder)
        reports[name] = [
            format_audit_report(run_audits(store_of(lake), settings), max_rows=1000)
            for settings in (None, override)
        ]
    assert reports["kept"] == reports["files"]
    assert reports["kept"][0] != reports["kept"][1]  # the override changed what the audits found


def test_a_tag_drops_the_kept_rows_of_the_views_and_the_next_reader_computes_them(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Some of the views audits read read the `runs` row, which a tag rewrites: the copy it
    carries over lacks their rows, and the next reader computes them into it."""
    synth.write_dump(tmp_path / "dump", synth.PRESETS["example"])
    lake = tmp_path / "lake"
    extract_run(tmp_path / "dump", store_of(lake), ExtractOptions(workers=1, run_name="r"))
    before = format_audit_report(run_audits(store_of(lake)))
    with catalog.connect(store_of(lake)) as con:
        assert kept_rows.kept_views(con) == set(kept_rows.SHARED_VIEWS)
    assert CliRunner().invoke(main, ["tag", str(lake), "r", "k=v"]).exit_code == 0
    (carried,) = cache.rglob(f"{kept_rows.FOLDER}/tokenlake.duckdb")
    with duckdb.connect(str(carried), read_only=True) as con:
        assert kept_rows.kept_views(con) == set()
    with catalog.connect(store_of(lake)) as con:
        assert copied_tables(con) == sorted([schema.SAMPLES, *rollups.rollup_names()])
        assert kept_rows.kept_views(con) == set(kept_rows.SHARED_VIEWS)
        assert con.execute("SELECT key, value FROM run_tags").fetchall() == [("k", "v")]
    assert format_audit_report(run_audits(store_of(lake))) == before
    assert sorted(p.name for p in carried.parent.iterdir()) == ["tokenlake.duckdb"]
