"""Another program that opens the catalog for writing cannot change what tokenlake shows.

`extract` and `views` refuse a catalog held for writing with one line naming the holder's
program and PID, before reading a step; tokenlake's readers never open the file (they build
their views privately), so they answer meanwhile, and a write-ahead log that such a program
left beside the catalog changes nothing they read; the next rebuild removes it (verify names
it until then).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixture_paths import REAL_DUMPS

pytestmark = pytest.mark.slow  # each test extracts a real fixture dump

IGNORED_LOG = (
    "Warning: ignored `tokenlake.duckdb.wal` beside the catalog"
    " (another program's changes; tokenlake writes none); `tokenlake views LAKE` removes it"
)
STEP_STATS = "SELECT run, rollout_id, n_samples FROM step_stats ORDER BY ALL"


def tokenlake(*args: str) -> tuple[int, str, list[str]]:
    """The installed CLI in a child process: its log lines reach stderr as a user sees them."""
    done = subprocess.run(
        [sys.executable, "-m", "tokenlake", *args], capture_output=True, text=True, timeout=300
    )
    return done.returncode, done.stdout, done.stderr.splitlines()


def extract(dump: Path, lake: Path) -> tuple[int, str, list[str]]:
    return tokenlake("extract", str(dump), "--lake", str(lake), "--workers", "1", "--silent")


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.fixture
def lake(tmp_path: Path) -> Path:
    lake = tmp_path / "lake"
    code, _, err = extract(REAL_DUMPS / "basic", lake)
    assert (code, err) == (0, [])
    return lake


@pytest.fixture
def holder(lake: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A DuckDB client holding the catalog open for writing until the test ends."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import duckdb, sys; c = duckdb.connect(sys.argv[1]);"
         " print('ready', flush=True); sys.stdin.read()", str(lake / "tokenlake.duckdb")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert child.stdout is not None and child.stdout.readline() == b"ready\n"
        yield child
    finally:
        child.kill()
        child.wait()


def held_line(lake: Path, pid: int) -> str:
    catalog = re.escape(str(lake / "tokenlake.duckdb"))
    return (
        rf"Error: Lake `{catalog}`: is open for writing in \S+ \(PID {pid}\); close it there,"
        rf" or open the catalog read-only \(`duckdb -readonly {catalog}`\)"
    )


def test_extract_refuses_a_catalog_held_for_writing_before_reading_a_step(
    lake: Path, holder: subprocess.Popen[bytes]
) -> None:
    before = snapshot(lake)
    code, out, err = extract(REAL_DUMPS / "pp2", lake)
    assert (code, out, len(err)) == (1, "", 1)
    assert re.fullmatch(held_line(lake, holder.pid), err[0])
    assert snapshot(lake) == before  # no step read, nothing written, no log beside it
    # Readers never open the file (they build their views privately), so they still answer.
    code, out, err = tokenlake("query", str(lake), STEP_STATS)
    assert (code, out.splitlines()[-1], err) == (0, "(2 rows)", [])


def test_views_refuses_a_catalog_held_for_writing(
    lake: Path, holder: subprocess.Popen[bytes]
) -> None:
    before = snapshot(lake)
    code, out, err = tokenlake("views", str(lake))
    assert (code, out, len(err)) == (1, "", 1)
    assert re.fullmatch(held_line(lake, holder.pid), err[0])
    assert snapshot(lake) == before


def leave_foreign_log(lake: Path) -> None:
    """A client that drops a view and adds one, then dies before its checkpoint: its
    write-ahead log stays beside the catalog, and a plain DuckDB reader replays it."""
    import duckdb

    script = (
        "import duckdb, os, sys; c = duckdb.connect(sys.argv[1]);"
        " c.execute('DROP VIEW step_stats'); c.execute('CREATE VIEW planted AS SELECT 1 AS x');"
        " os._exit(0)"
    )
    subprocess.run([sys.executable, "-c", script, str(lake / "tokenlake.duckdb")], check=True)
    assert (lake / "tokenlake.duckdb.wal").is_file()
    with duckdb.connect(str(lake / "tokenlake.duckdb"), read_only=True) as con:
        replayed = {
            name for (name,) in con.execute("SELECT view_name FROM duckdb_views()").fetchall()
        }
    assert "planted" in replayed and "step_stats" not in replayed


def test_a_foreign_log_beside_the_catalog_changes_nothing_tokenlake_reads(lake: Path) -> None:
    code, expected, err = tokenlake("query", str(lake), STEP_STATS)
    assert (code, err) == (0, [])
    leave_foreign_log(lake)
    assert tokenlake("query", str(lake), STEP_STATS) == (0, expected, [])
    code, out, err = tokenlake("query", str(lake), "SELECT * FROM planted")
    assert (code, out) == (1, "")
    assert err[0].startswith("Error: Query failed: Catalog Error: Table with name planted")
    code, out, err = tokenlake("verify", str(lake))
    assert (code, out.splitlines()[-1], err) == (0, "3 steps checked, 0 problems", [IGNORED_LOG])
    api = (
        "import sys, tokenlake; lake = tokenlake.open_lake(sys.argv[1]);"
        " print(lake.sql('SELECT count(*) FROM step_stats').fetchall())"
    )
    done = subprocess.run([sys.executable, "-c", api, str(lake)], capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (0, "[(2,)]\n")


def test_the_next_extraction_removes_a_foreign_log(lake: Path) -> None:
    leave_foreign_log(lake)
    code, out, err = extract(REAL_DUMPS / "basic", lake)  # nothing to re-read: only the log
    assert (code, err) == (0, [])
    assert "0 new, 0 updated, 3 unchanged" in out
    assert not os.path.lexists(lake / "tokenlake.duckdb.wal")
    code, out, err = tokenlake("query", str(lake), STEP_STATS)
    assert (code, err, out.splitlines()[-1]) == (0, [], "(2 rows)")


def test_the_advice_on_a_foreign_log_fits_a_lake_the_reader_cannot_write(tmp_path, monkeypatch):
    from tokenlake.serve import catalog

    assert catalog._removal_advice(tmp_path) == "`tokenlake views LAKE` removes it"
    monkeypatch.setattr(catalog.os, "access", lambda path, mode: False)  # root may write anything
    assert catalog._removal_advice(tmp_path) == (
        "the lake is read-only to you: whoever writes it can remove it with `tokenlake views LAKE`"
    )
