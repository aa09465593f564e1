"""Rollups: every view read from the stored per-step rollups equals the same view computed
from the tokens, the stored form never reads a token file, other drift_settings fall back to
the tokens, and a lake without rollups gets them from `tokenlake views` or the next extraction
(docs/rollups.md)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from tests.conftest import store_of
from tokenlake import schema
from tokenlake.cli import main
from tokenlake.generator import synth
from tokenlake.orchestrate.extract import ExtractOptions, extract_run
from tokenlake.serve import catalog, catalog_cache, rollups
from tokenlake.serve.sql_views import iter_audit_files
from tokenlake.store import manifest

LAYOUTS = [
    "example",
    "multi-turn",
    "cp-thd",
    "weight-spans",
    "sampling-support",
    "nonfinite",
    "removed",
    "slime-v2",
    "nemo-rl",
]


def run_cli(*args: str) -> tuple[int, str]:
    """Exit code and what the user sees (stdout and stderr, as printed)."""
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def extracted(tmp_path: Path, preset: str) -> Path:
    dump, lake = tmp_path / "dump", tmp_path / "lake"
    synth.write_dump(dump, synth.PRESETS[preset])
    extract_run(dump, store_of(lake), ExtractOptions(workers=1))
    return lake


def from_tokens(lake: Path, monkeypatch: pytest.MonkeyPatch) -> duckdb.DuckDBPyConnection:
    """The lake's views with every rollup computed from the tokens, as before rollups (built
    for this connection only: a kept catalog of the lake holds its stored rollups)."""
    with monkeypatch.context() as patched:
        patched.setattr(
            rollups, "catalog_views", lambda steps, files: rollups.CatalogRollups({}, None)
        )
        patched.setattr(catalog_cache, "lake_folder", lambda store: None)
        return catalog.connect(store_of(lake))


def public_views(con: duckdb.DuckDBPyConnection) -> list[str]:
    rows = con.execute(
        "SELECT view_name FROM duckdb_views() WHERE NOT internal AND schema_name = 'main'"
        " ORDER BY view_name"
    ).fetchall()
    return [name for (name,) in rows]


def assert_same_rows(name: str, stored: list[tuple], computed: list[tuple]) -> None:
    assert len(stored) == len(computed), name
    for a, b in zip(stored, computed, strict=True):
        for x, y in zip(a, b, strict=True):
            if isinstance(x, float) and isinstance(y, float):
                assert (math.isnan(x) and math.isnan(y)) or math.isclose(
                    x, y, rel_tol=1e-12, abs_tol=1e-12
                ), (name, a, b)
            else:
                assert x == y, (name, a, b)


def rows(con: duckdb.DuckDBPyConnection, query: str) -> list[tuple]:
    return con.execute(f"SELECT * FROM ({query}) ORDER BY ALL").fetchall()


def audit_queries() -> dict[str, str]:
    return {p.stem: p.read_text(encoding="utf-8") for p in iter_audit_files()}


@pytest.mark.parametrize("preset", LAYOUTS)
def test_every_view_and_audit_from_rollups_equals_it_from_the_tokens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, preset: str
) -> None:
    lake = extracted(tmp_path, preset)
    stored, computed = catalog.connect(store_of(lake)), from_tokens(lake, monkeypatch)
    views = public_views(stored)
    assert views == public_views(computed)
    assert set(schema.ROLLUP_TABLES) <= set(views)
    for view in views:
        assert_same_rows(view, rows(stored, f"FROM {view}"), rows(computed, f"FROM {view}"))
    audits = audit_queries()
    assert audits
    for name, query in audits.items():
        assert_same_rows(name, rows(stored, query), rows(computed, query))


def scanned_files(con: duckdb.DuckDBPyConnection, query: str, profile: Path) -> list[str]:
    """Every Parquet file DuckDB reads to answer `query`."""
    con.execute("PRAGMA enable_profiling = 'json'")
    con.execute(f"PRAGMA profiling_output = '{profile}'")
    try:
        con.execute(query).fetchall()
    finally:
        con.execute("PRAGMA disable_profiling")
    found: list[str] = []

    def walk(node: dict) -> None:
        listed = node.get("extra_info", {}).get("Filename(s)")
        if listed:
            found.extend(name.strip() for name in listed.split(","))
        for child in node.get("children", []):
            walk(child)

    for node in json.loads(profile.read_text())["operator"]:
        walk(node)
    return found


# Views that list tokens or read them by design: the token rows themselves.
TOKEN_VIEWS = {
    "tokens",
    "trained_tokens",
    "drift_tokens",
    "drift_token_samples",
    "drift_teacher_tokens",
}


def test_views_and_audits_from_rollups_read_no_token_file(tmp_path: Path) -> None:
    lake = extracted(tmp_path, "example")
    con = catalog.connect(store_of(lake))
    queries = {v: f"SELECT * FROM {v}" for v in public_views(con) if v not in TOKEN_VIEWS}
    queries.update(audit_queries())
    read_tokens = {}
    for name, query in queries.items():
        files = scanned_files(con, query, tmp_path / "profile.json")
        read_tokens[name] = [f for f in files if "/tokens/" in f]
    assert {name: files for name, files in read_tokens.items() if files} == {}
    # The check sees a token read when there is one.
    assert scanned_files(con, "SELECT * FROM drift_tokens", tmp_path / "profile.json")


def test_other_drift_settings_compute_the_rollup_from_the_tokens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lake = extracted(tmp_path, "example")
    stored, computed = catalog.connect(store_of(lake)), from_tokens(lake, monkeypatch)
    query = "SELECT rollout_id, is_frac_above_cap, ess, k3_kl_smtm FROM drift_steps"
    default = rows(stored, query)
    override = (
        "CREATE OR REPLACE TEMP VIEW drift_settings AS SELECT * REPLACE (1.05::DOUBLE AS is_cap)"
        " FROM tokenlake.main.drift_settings"
    )
    for con in (stored, computed):
        con.execute(override)
    changed = rows(stored, query)
    assert changed != default
    assert_same_rows("drift_steps", changed, rows(computed, query))
    files = scanned_files(stored, query, tmp_path / "profile.json")
    assert any("/tokens/" in f for f in files)


def strip_rollups(lake: Path) -> None:
    """Make the lake look written before rollups: no rollup files listed or recorded."""
    for path in (lake / "_manifest").glob("*.json"):
        data = json.loads(path.read_text())
        for step in data["steps"].values():
            step["files"] = {
                t: n for t, n in step["files"].items() if t not in schema.ROLLUP_TABLES
            }
            step.pop("rollup_version", None)
            step.pop("rollup_settings", None)
        path.write_text(json.dumps(data))


def test_a_lake_without_rollups_reads_the_tokens_until_views_computes_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lake = extracted(tmp_path, "example")
    before = rows(catalog.connect(store_of(lake)), "FROM drift_steps")
    strip_rollups(lake)
    assert_same_rows(
        "drift_steps", rows(catalog.connect(store_of(lake)), "FROM drift_steps"), before
    )
    assert caplog.messages == [
        "4 of 4 steps have no rollups of this tokenlake version: the views read the"
        " tokens (slower) until `tokenlake views LAKE` computes them"
    ]
    code, out = run_cli("views", str(lake))
    assert (code, out) == (
        0,
        f"Computed the rollups of 4 steps from their tokens.\nRebuilt {lake / 'tokenlake.duckdb'}\n",
    )
    assert_same_rows(
        "drift_steps", rows(catalog.connect(store_of(lake)), "FROM drift_steps"), before
    )
    code, out = run_cli("views", str(lake))
    assert (code, out) == (0, f"Rebuilt {lake / 'tokenlake.duckdb'}\n")


def test_the_next_extraction_computes_the_rollups_a_step_lacks(tmp_path: Path) -> None:
    lake = extracted(tmp_path, "example")
    strip_rollups(lake)
    summary = extract_run(tmp_path / "dump", store_of(lake), ExtractOptions(workers=1))
    assert summary.counts["unchanged"] == 4
    steps = [s for r in manifest.load_all(store_of(lake)) for s in r.steps.values()]
    current = rollups.default_settings_digests()
    assert len(steps) == 4
    assert all(rollups.is_current(step, current) for step in steps)
    assert catalog.catalog_problem(store_of(lake)) is None


def test_verify_deep_finds_a_rollup_that_differs_from_its_tokens(tmp_path: Path) -> None:
    lake = extracted(tmp_path, "example")
    code, out = run_cli("verify", str(lake), "--deep")
    assert (code, out) == (0, "4 steps checked, 0 problems\n")
    record = manifest.load_all(store_of(lake))[0]
    name = record.steps["1"].files["drift_step_parts"]
    table = pq.read_table(lake / name)
    column = table.schema.get_field_index("p99_abs_lp_diff")
    table = table.set_column(column, "p99_abs_lp_diff", pa.array([9.5]))
    pq.write_table(table, lake / name)
    code, out = run_cli("verify", str(lake), "--deep")
    assert code == 1
    assert out.splitlines()[0].startswith(
        "run `dump` step 1: rollup `drift_step_parts` differs from its tokens: row 1 of 1:"
        " `p99_abs_lp_diff` is 9.5 stored, "
    )
    assert out.splitlines()[0].endswith(
        "from the tokens; `tokenlake views LAKE --recompute` computes the rollups again"
    )
    code, out = run_cli("views", str(lake), "--recompute")
    assert code == 0
    assert out.startswith("Computed the rollups of 4 steps from their tokens.\n")
    assert run_cli("verify", str(lake), "--deep") == (0, "4 steps checked, 0 problems\n")


def test_a_manifest_with_a_rollup_digest_that_is_no_digest_is_damaged(tmp_path: Path) -> None:
    lake = extracted(tmp_path, "example")
    path = lake / "_manifest" / "dump.json"
    data = json.loads(path.read_text())
    data["steps"]["1"]["rollup_settings"]["drift_sample_parts"] = "x' OR 1=1 --"
    path.write_text(json.dumps(data))
    code, out = run_cli("query", str(lake), "SELECT 1 AS one")
    assert code == 1
    assert out == (
        f"Error: Lake `{path}`: manifest is damaged: a step's `rollup_settings` holds"
        """ 'drift_sample_parts': "x' OR 1=1 --". Remove the run with `tokenlake drop LAKE dump`"""
        " or extract it again\n"
    )


def test_rollups_are_replaced_with_their_step_and_dropped_with_their_run(tmp_path: Path) -> None:
    lake = extracted(tmp_path, "example")
    before = sorted(p.relative_to(lake) for p in (lake / "rollups").rglob("*.parquet"))
    assert len(before) == 4 * len(schema.ROLLUP_TABLES)
    (tmp_path / "dump" / "rollout_data" / "1.pt").touch()
    extract_run(tmp_path / "dump", store_of(lake), ExtractOptions(workers=1))
    after = sorted(p.relative_to(lake) for p in (lake / "rollups").rglob("*.parquet"))
    assert len(after) == len(before)
    assert len(set(after) - set(before)) == len(schema.ROLLUP_TABLES)  # step 1's, anew
    assert run_cli("drop", str(lake), "dump")[0] == 0
    assert list((lake / "rollups").rglob("*.parquet")) == []


def test_the_schema_names_every_rollup_file() -> None:
    assert schema.ROLLUP_TABLES == rollups.rollup_names()
    assert list(rollups.rollup_names()) == sorted(rollups.rollup_names())
