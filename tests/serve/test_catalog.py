"""The catalog opens in plain DuckDB clients, from any directory, with odd paths."""

from __future__ import annotations

import os
import struct

import duckdb

from tests.conftest import store_of
from tests.lakes import build_lake


def test_catalog_uses_the_1_0_storage_format(tmp_path):
    """DuckDB's main header: 8-byte checksum, `DUCK`, then the storage version number; 64 is
    the format of DuckDB 1.0 (checked: every view opens in a DuckDB 1.1.3 client)."""
    path = build_lake(tmp_path, samples=[{"run": "r", "rollout_id": 0, "batch_position": 0}])
    header = path.read_bytes()[:20]
    assert header[8:12] == b"DUCK"
    assert struct.unpack("<Q", header[12:20]) == (64,)


def test_catalog_works_from_another_directory_with_quotes_and_globs_in_the_path(tmp_path):
    lake = tmp_path / "it's a [lake] *"
    path = build_lake(lake, samples=[{"run": "r'1", "rollout_id": 2, "batch_position": 0}])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    cwd = os.getcwd()
    os.chdir(elsewhere)
    try:
        con = duckdb.connect(str(path), read_only=True)
        rows = con.execute("SELECT run, rollout_id, batch_position FROM samples").fetchall()
    finally:
        os.chdir(cwd)
    assert rows == [("r'1", 2, 0)]


def test_a_catalog_found_healthy_is_opened_again_once_it_changes(tmp_path, monkeypatch):
    """A follower checks the catalog every round: an unchanged file is not opened again, and
    any change to it (here a view dropped in place by a DuckDB client) is seen."""
    from tests.fixture_paths import REAL_DUMPS
    from tokenlake.orchestrate.extract import ExtractOptions, extract_run
    from tokenlake.serve import catalog

    lake = tmp_path / "lake"
    extract_run(REAL_DUMPS / "basic", store_of(lake), ExtractOptions(workers=1))
    opened = []
    check = catalog._opened_file_problem

    def counted(*args):
        opened.append(args[0])
        return check(*args)

    monkeypatch.setattr(catalog, "_opened_file_problem", counted)
    assert [catalog.catalog_problem(store_of(lake)) for _ in range(3)] == [None, None, None]
    assert len(opened) == 1
    with duckdb.connect(str(lake / "tokenlake.duckdb")) as con:
        con.execute("DROP VIEW step_stats")
    assert catalog.catalog_problem(store_of(lake)) == (
        "catalog `tokenlake.duckdb` lacks views `step_stats`; run `tokenlake views LAKE` or"
        " extract again"
    )
    assert len(opened) == 2
