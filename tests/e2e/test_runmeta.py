"""Run metadata and tags in `runs`, the `metrics` table, user views (LAKE/views)."""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from click.testing import CliRunner

import tokenlake
from tests.conftest import store_of
from tokenlake import layout, schema
from tokenlake.cli import main
from tokenlake.generator import synth, synth_dashboard
from tokenlake.load import lake_files, write
from tokenlake.orchestrate.extract import ExtractOptions, extract_run
from tokenlake.orchestrate.follow import FollowState, follow_round
from tokenlake.serve import catalog
from tokenlake.store import manifest

SPEC = replace(synth.PRESETS["example"], miles_dashboard=True)


@pytest.fixture(scope="module")
def dump(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runmeta") / "dump"
    synth.write_dump(out, SPEC)
    return out


@pytest.fixture
def own_dump(dump, tmp_path) -> Path:
    """A copy the test may change (the dump's files keep their times)."""
    return Path(shutil.copytree(dump, tmp_path / "dump"))


def _query(lake: Path, sql: str) -> list[tuple]:
    with duckdb.connect(str(lake / layout.CATALOG_FILE), read_only=True) as con:
        return con.execute(sql).fetchall()


def _payload_rows(payloads, run="r"):
    """What the `metrics` view must hold for the generator's payloads (all values numeric)."""
    return sorted(
        (run, p["step_key"], p["step"], name, float(value), p["ts"])
        for p in payloads
        for name, value in p["metrics"].items()
    )


def _metrics_rows(lake):
    rows = _query(lake, "SELECT run, step_key, step, metric, value, epoch_us(ts) FROM metrics")
    return sorted((*r[:5], r[5] / 1e6) for r in rows)


# --- runs: dashboard/meta.json ----------------------------------------------------------------


@pytest.mark.slow
def test_runs_row_holds_the_dashboard_meta(dump, tmp_path):
    summary = extract_run(dump, store_of(tmp_path / "lake"), ExtractOptions(run_name="r"))
    assert summary.warnings == []
    [row] = _query(
        tmp_path / "lake",
        "SELECT run, schema_version, start_ts, wandb_project, wandb_group, wandb_run_id,"
        " hf_checkpoint, args_json, tags_json, typeof(start_ts) FROM runs",
    )
    assert row == (
        "r",
        schema.SCHEMA_VERSION,
        datetime(2026, 1, 1, tzinfo=timezone.utc),
        "tokenlake-synth",
        "synth-0",
        "synth0000",
        "/models/synth-0.5b",
        json.dumps(synth_dashboard.run_args(SPEC), sort_keys=True),
        None,
        "TIMESTAMP WITH TIME ZONE",
    )


@pytest.mark.slow
def test_absent_meta_is_null_and_malformed_meta_is_one_warning(own_dump, tmp_path):
    meta = own_dump / "dashboard" / "meta.json"
    meta.unlink()
    lake = tmp_path / "lake"
    extract_run(own_dump, store_of(lake), ExtractOptions(run_name="r"))
    columns = "start_ts, wandb_project, wandb_group, wandb_run_id, hf_checkpoint, args_json"
    assert _query(lake, f"SELECT {columns} FROM runs") == [(None,) * 6]
    meta.write_text("{broken")
    result = CliRunner().invoke(
        main,
        [
            "extract",
            str(own_dump),
            "--lake",
            str(lake),
            "--run-name",
            "r",
            "--silent",
            "--workers",
            "1",
        ],
    )
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("Warning:")]
    assert warnings == [
        f"Warning: `{meta}` is not valid JSON (Expecting property name enclosed in double"
        " quotes: line 1 column 2 (char 1)); its run metadata is left NULL."
    ]
    assert result.stdout.startswith("Run `r`: 0 new, 0 updated, 4 unchanged")
    assert _query(lake, f"SELECT {columns} FROM runs") == [(None,) * 6]


@pytest.mark.slow
def test_a_runs_file_of_schema_version_1_reads_then_is_rewritten(dump, tmp_path):
    lake = tmp_path / "lake"
    extract_run(dump, store_of(lake), ExtractOptions(run_name="r"))
    record = manifest.load_manifest(store_of(lake), "r")
    old = pa.Table.from_pylist(
        [
            {
                "source_dir": str(dump),
                "extracted_at": datetime(2026, 1, 2, tzinfo=timezone.utc),
                "tool": "tokenlake 0.1.0",
                "schema_version": 1,
                "train_steps": 3,
                "eval_steps": 1,
            }
        ],
        schema=schema.RUNS_BASE_SCHEMA,
    )
    path = lake / "runs" / "run=r" / "run-00000001.parquet"
    import pyarrow.parquet as pq

    pq.write_table(old, path)
    record.runs_file, record.meta_source = "runs/run=r/run-00000001.parquet", None
    manifest.save_manifest(store_of(lake), record)
    catalog.build_catalog(store_of(lake))
    sql = "SELECT schema_version, train_steps, wandb_project, tags_json FROM runs"
    assert _query(lake, sql) == [(1, 3, None, None)]
    frame = tokenlake.open_lake(lake).runs().select(sql[7:-10].split(", ")).collect()
    assert frame.rows() == [(1, 3, None, None)]
    assert _query(lake, "SELECT count(*) FROM run_tags") == [(0,)]
    # The next extraction sees a meta.json the row was not made from: it rewrites the row.
    summary = extract_run(dump, store_of(lake), ExtractOptions(run_name="r"))
    assert summary.counts["unchanged"] == 4
    assert _query(lake, sql) == [(schema.SCHEMA_VERSION, 3, "tokenlake-synth", None)]


# --- tags -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_tags_are_set_kept_and_changed(dump, tmp_path):
    lake = tmp_path / "lake"
    meta = tmp_path / "run.json"
    meta.write_text(json.dumps({"precision": "bf16", "gpus": 8, "team": "rl"}))
    runner = CliRunner()
    args = [
        "extract",
        str(dump),
        "--lake",
        str(lake),
        "--run-name",
        "r",
        "--silent",
        "--workers",
        "1",
    ]
    result = runner.invoke(main, [*args, "--meta", str(meta), "--tag", "precision=fp8"])
    assert result.exit_code == 0, result.output
    tags = "SELECT key, value FROM run_tags WHERE run = 'r' ORDER BY key"
    assert _query(lake, tags) == [("gpus", "8"), ("precision", "fp8"), ("team", "rl")]
    runner.invoke(main, args)  # a re-extraction without tags keeps them
    assert _query(lake, tags) == [("gpus", "8"), ("precision", "fp8"), ("team", "rl")]
    result = runner.invoke(main, ["tag", str(lake), "r", "note=a=b", "--remove", "team"])
    assert result.exit_code == 0, result.output
    assert result.stdout == "Run `r` tags: gpus=8, note=a=b, precision=fp8\n"
    assert _query(lake, "SELECT tags_json FROM runs") == [
        ('{"gpus": "8", "note": "a=b", "precision": "fp8"}',)
    ]
    assert _query(lake, "SELECT extracted_at < now(), wandb_group FROM runs") == [(True, "synth-0")]
    runner.invoke(main, [*args, "--tag", "precision=bf16"])
    assert _query(lake, tags) == [("gpus", "8"), ("note", "a=b"), ("precision", "bf16")]
    assert len(list((lake / "runs" / "run=r").iterdir())) == 1  # superseded rows deleted


@pytest.mark.slow
def test_tag_errors_are_one_line(dump, tmp_path):
    lake = tmp_path / "lake"
    extract_run(dump, store_of(lake), ExtractOptions(run_name="r"))
    runner = CliRunner()
    result = runner.invoke(main, ["tag", str(lake), "nope", "a=b"])
    assert (result.exit_code, result.stderr) == (
        1,
        f"Error: Lake `{lake}`: has no run `nope` (runs: `r`)\n",
    )
    result = runner.invoke(main, ["tag", str(lake), "r", "a=1", "--remove", "a"])
    assert result.stderr == "Error: Tag `a` is both set and removed; give one of the two.\n"
    result = runner.invoke(main, ["tag", str(lake), "r"])
    assert result.stderr == "Error: Give tags to set (`key=value`) or --remove KEY.\n"
    runs_file = lake / manifest.load_manifest(store_of(lake), "r").runs_file
    runs_file.write_bytes(b"not parquet")
    result = runner.invoke(main, ["tag", str(lake), "r", "a=1"])
    assert result.exit_code == 1
    assert result.stderr.startswith(f"Error: Lake `{runs_file}`: cannot be read (")
    assert result.stderr.endswith("); extract the run again\n")
    assert manifest.load_manifest(store_of(lake), "r").tags == {}  # nothing was changed


# --- metrics ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_metrics_hold_every_logged_value_and_join_drift_steps(dump, tmp_path):
    lake = tmp_path / "lake"
    extract_run(dump, store_of(lake), ExtractOptions(run_name="r"))
    payloads = synth_dashboard.write_miles_dashboard(tmp_path / "again", SPEC)
    assert _metrics_rows(lake) == _payload_rows(payloads)
    # The worked join of docs/drift.md, with exact values.
    rows = _query(
        lake,
        """
        SELECT d.rollout_id, d.tokens, m.metric, m.value, s.reward_mean
        FROM drift_steps AS d
        JOIN metrics AS m
          ON m.run = d.run AND m.step = d.rollout_id
         AND m.step_key IN ('rollout/step', 'eval/step')
        JOIN step_stats AS s ON s.run = d.run AND s.rollout_id = d.rollout_id
        WHERE m.metric IN ('rollout/raw_reward', 'eval/gsm8k')
        ORDER BY d.rollout_id, m.metric
        """,
    )
    logged = {
        (p["step"], name): value
        for p in payloads
        for name, value in p["metrics"].items()
        if name in ("rollout/raw_reward", "eval/gsm8k")
    }
    assert [(r[0], r[2], r[3]) for r in rows] == [
        (step, name, logged[step, name]) for step, name in sorted(logged)
    ]
    assert all(r[3] == r[4] for r in rows if r[2] == "rollout/raw_reward")
    tokens = dict(_query(lake, "SELECT rollout_id, tokens FROM drift_steps"))
    assert all(r[1] == tokens[r[0]] for r in rows)


def _append(path: Path, text: str) -> None:
    with open(path, "a") as handle:
        handle.write(text)


def _line(step: int, value: float) -> str:
    record = {"ts": 1767300000.0 + step, "step_key": "rollout/step", "step": step}
    return json.dumps({**record, "metrics": {"late/x": value}}) + "\n"


@pytest.mark.slow
def test_metrics_read_only_new_lines_and_restart_on_a_rewrite(own_dump, tmp_path):
    lake = tmp_path / "lake"
    stream = own_dump / "dashboard" / "metrics.jsonl"
    extract_run(own_dump, store_of(lake), ExtractOptions(run_name="r"))
    count = "SELECT count(*) FROM metrics"
    (before,) = _query(lake, count)[0]
    _append(stream, _line(7, 1.5) + _line(8, 2.5)[:20])  # the second line is half-written
    summary = extract_run(own_dump, store_of(lake), ExtractOptions(run_name="r"))
    assert summary.counts["unchanged"] == 4 and summary.warnings == []
    assert _query(lake, count) == [(before + 1,)]
    assert len(manifest.load_manifest(store_of(lake), "r").metrics_files) == 2
    _append(stream, _line(8, 2.5)[20:])  # its writer finishes it
    state = FollowState()
    follow_round(
        own_dump, store_of(lake), "r", state, ExtractOptions(settle_seconds=0.0), None
    )  # --follow picks it up too
    assert _query(
        lake, "SELECT step, value FROM metrics WHERE metric = 'late/x' ORDER BY step"
    ) == [
        (7, 1.5),
        (8, 2.5),
    ]
    stream.write_text(_line(1, 9.0) + "not json\n")  # rewritten shorter: read again from 0
    summary = extract_run(own_dump, store_of(lake), ExtractOptions(run_name="r"))
    assert summary.warnings == [
        f"`{stream}` was rewritten or removed since it was read; the run's metrics are read"
        " again from the start.",
        f"`{stream}` at byte {len(_line(1, 9.0))}: not valid JSON (Expecting value: line 1"
        " column 1 (char 0)); line skipped.",
    ]
    assert _query(lake, "SELECT step, metric, value FROM metrics") == [(1, "late/x", 9.0)]
    record = manifest.load_manifest(store_of(lake), "r")
    assert len(record.metrics_files) == 1
    assert len(list((lake / "metrics" / "run=r").iterdir())) == 1
    assert CliRunner().invoke(main, ["drop", str(lake), "r"]).exit_code == 0
    assert not (lake / "metrics" / "run=r").exists()  # drop deletes the run's metrics too


def test_many_metrics_files_are_merged(tmp_path, monkeypatch):
    dump = tmp_path / "dump"
    (dump / "dashboard").mkdir(parents=True)
    lake = tmp_path / "lake"
    record = manifest.RunManifest(run="r", source_dir=str(dump))
    monkeypatch.setattr(lake_files, "MAX_METRICS_FILES", 2)
    stream = dump / "dashboard" / "metrics.jsonl"
    for step in range(4):
        _append(stream, _line(step, step / 2))
        assert lake_files.refresh_metrics(store_of(lake), record) == (True, [])
    assert len(record.metrics_files) == 2  # the third file merged all three into one
    assert lake_files.refresh_metrics(store_of(lake), record) == (False, [])
    import pyarrow.parquet as pq

    values = [
        pq.read_table(lake / name).column("value").to_pylist() for name in record.metrics_files
    ]
    assert values == [[0.0, 0.5, 1.0], [1.5]]


# --- user views -------------------------------------------------------------------------------


def _views(lake: Path, files: dict[str, str]) -> None:
    folder = lake / "views"
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)


def test_user_views_are_created_and_a_broken_one_is_skipped(tmp_path, caplog):
    """A user view may build on another; a broken one is one line, the rest is built."""
    from tests.lakes import build_lake

    lake = tmp_path / "lake"
    _views(
        lake,
        {
            "a_uses_b.sql": "CREATE VIEW a_uses_b AS SELECT n + 1 AS m FROM b_base;",
            "b_base.sql": "-- my base\nCREATE OR REPLACE VIEW b_base AS SELECT count(*) AS n FROM runs",
            "broken.sql": "CREATE VIEW broken AS SELECT no_such_column FROM runs",
            "steal.sql": "CREATE VIEW steal AS SELECT 1; DROP VIEW tokens",
            "tokens.sql": "CREATE OR REPLACE VIEW tokens AS SELECT 1 AS x",
            "wrong_name.sql": "CREATE VIEW other AS SELECT 1 AS x",
        },
    )
    build_lake(lake, runs=[{"run": "r", "source_dir": "/d", "tool": "t"}])
    warnings: list[str] = []
    catalog.build_catalog(store_of(lake), warnings)
    folder = lake / "views"
    assert warnings == [
        f"User view `{folder / 'broken.sql'}` skipped: Binder Error: Referenced column"
        ' "no_such_column" not found in FROM clause!.',
        f"User view `{folder / 'steal.sql'}` skipped: it must hold one `CREATE OR REPLACE VIEW"
        " steal AS ...` and nothing else.",
        f"User view `{folder / 'tokens.sql'}` skipped: `tokens` is one of tokenlake's views;"
        " give the file another name.",
        f"User view `{folder / 'wrong_name.sql'}` skipped: it must hold one `CREATE OR REPLACE"
        " VIEW wrong_name AS ...` and nothing else.",
    ]
    assert _query(lake, "SELECT m FROM a_uses_b") == [(2,)]
    assert _query(lake, "SELECT comment FROM duckdb_views() WHERE view_name = 'b_base'") == [
        ("my base",)
    ]
    assert _query(lake, "SELECT count(*) FROM tokens WHERE false") == [(0,)]
    assert catalog.catalog_problem(store_of(lake)) is None  # the catalog check ignores user views
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tokenlake.serve.catalog"):
        catalog.build_catalog(store_of(lake))  # without a list: logged, one record per file
    assert [r.getMessage() for r in caplog.records] == warnings


@pytest.mark.slow
def test_a_broken_user_view_is_one_warning_line_of_the_cli(dump, tmp_path):
    lake = tmp_path / "lake"
    _views(lake, {"x.sql": "CREATE VIEW x AS SELECT * FROM nowhere\n"})
    lake.joinpath("_manifest").mkdir()
    result = CliRunner().invoke(
        main, ["extract", str(dump), "--lake", str(lake), "--silent", "--workers", "1"]
    )
    assert result.exit_code == 0, result.output
    assert result.stderr == (
        f"Warning: User view `{lake / 'views' / 'x.sql'}` skipped: it reads `nowhere`, which"
        " is not a table or view of the lake nor another user view.\n"
    )
    assert _query(lake, "SELECT count(*) FROM step_stats") == [(3,)]
    result = CliRunner().invoke(main, ["views", str(lake)])
    assert (result.exit_code, result.stdout) == (0, f"Rebuilt {lake / layout.CATALOG_FILE}\n")
    assert result.stderr.startswith(f"Warning: User view `{lake / 'views' / 'x.sql'}` skipped:")


def test_write_parquet_refuses_rows_of_the_old_runs_schema(tmp_path):
    table = schema.RUNS_BASE_SCHEMA.empty_table()
    with pytest.raises(Exception, match="rows do not match the `runs` schema"):
        write.write_parquet(tmp_path / "run.parquet", schema.RUNS, table, {})


@pytest.mark.slow
def test_generate_writes_the_dashboard_files_on_request(tmp_path):
    runner = CliRunner()
    result = runner.invoke(
        main, ["generate", str(tmp_path / "d"), "--preset", "tp", "--miles-dashboard"]
    )
    assert result.exit_code == 0, result.output
    meta = json.loads((tmp_path / "d" / "dashboard" / "meta.json").read_text())
    assert meta == synth_dashboard.meta_record(replace(synth.PRESETS["tp"], miles_dashboard=True))
    assert (tmp_path / "d" / "dashboard" / "metrics.jsonl").read_text().count("\n") == 7
    runner.invoke(main, ["generate", str(tmp_path / "plain"), "--preset", "tp"])
    assert not (tmp_path / "plain" / "dashboard").exists()
