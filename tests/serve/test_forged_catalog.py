"""A forged `LAKE/tokenlake.duckdb` never reaches a reader: tokenlake's own readers build their
views from the manifests, `sql/` and the checked user views, and never run what the file holds.

Whoever may write a shared lake's folder may replace the catalog file with a DuckDB database of
their own: views that read the reader's files, macros that shadow built-ins. `query`, `audit`
and the Python API give the same answers as before the forgery; `verify` reports the file.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

import tokenlake
from tests.fixture_paths import REAL_DUMPS
from tokenlake.cli import main

pytestmark = pytest.mark.slow  # extracts a real fixture dump

STEP_STATS = "SELECT run, rollout_id, n_samples, reward_mean FROM step_stats ORDER BY ALL"


def cli(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def forge_catalog(lake: Path, canary: Path) -> None:
    """Replace the catalog by a database whose views read `canary` and whose macro breaks abs."""
    catalog = lake / "tokenlake.duckdb"
    catalog.unlink()
    with duckdb.connect(str(catalog)) as con:
        con.execute("CREATE MACRO abs(x) AS x * 0.0")
        con.execute(
            "CREATE VIEW step_stats AS SELECT content AS run, 0 AS rollout_id, 0 AS n_samples,"
            f" 0.0 AS reward_mean FROM read_text('{canary}')"
        )
        con.execute(f"CREATE VIEW tokens AS SELECT content FROM read_text('{canary}')")


def test_a_forged_catalog_file_never_reaches_a_reader(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    assert cli("extract", str(REAL_DUMPS / "basic"), "--lake", str(lake), "--silent")[0] == 0
    before = cli("query", str(lake), STEP_STATS)
    audit_before = cli("audit", str(lake))
    canary = tmp_path / "secret.txt"
    canary.write_text("the reader's secret")
    forge_catalog(lake, canary)

    assert cli("query", str(lake), STEP_STATS) == before
    assert cli("query", str(lake), "SELECT abs(-2.5) AS a") == (0, "  a\n---\n2.5\n(1 row)\n", "")
    assert cli("audit", str(lake)) == audit_before
    opened = tokenlake.open_lake(lake)
    try:
        assert opened.sql("SELECT count(*) FROM tokens").fetchall() == [
            (opened.tokens().collect().height,)
        ]
        assert opened.sql("SELECT abs(-2.5)").fetchall() == [(2.5,)]
    finally:
        opened.close()
    code, out, err = cli("verify", str(lake))
    assert "secret" not in out + err
    assert (code, err) == (1, "")
    assert out.splitlines() == [
        "catalog `tokenlake.duckdb` lacks views `samples`, `runs`, `vocab`, `metrics`,"
        " `experts` ...; run `tokenlake views LAKE` or extract again",
        "3 steps checked, 1 problem",
    ]
    assert cli("views", str(lake))[0] == 0  # the way out verify names
    assert cli("verify", str(lake))[:2] == (0, "3 steps checked, 0 problems\n")
