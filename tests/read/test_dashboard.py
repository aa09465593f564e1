"""pipeline/tokenlake/read/dashboard.py: the readers of miles' `dashboard/meta.json` and `metrics.jsonl`."""

from __future__ import annotations

import json
import math
import tracemalloc
from dataclasses import replace
from datetime import datetime, timezone

import pytest

from tests.conftest import store_of
from tokenlake import bounded, layout, schema
from tokenlake.errors import UsageError
from tokenlake.generator import synth, synth_dashboard
from tokenlake.orchestrate.extract import ExtractOptions
from tokenlake.read import dashboard

NONE_META = {
    "start_ts": None,
    "wandb_project": None,
    "wandb_group": None,
    "wandb_run_id": None,
    "hf_checkpoint": None,
    "args_json": None,
}


def _write(dump, name, data):
    path = dump / "dashboard" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


def _line(ts=1767225600.0, step_key="rollout/step", step=0, metrics=None):
    record = {"ts": ts, "step_key": step_key, "step": step, "metrics": metrics or {"a": 1.5}}
    return json.dumps(record, separators=(",", ":")) + "\n"


def _rows(read):
    return [(r["step_key"], r["step"], r["metric"], r["value"]) for r in read.table.to_pylist()]


# --- meta.json ---------------------------------------------------------------------------------


def test_meta_absent_is_all_null(tmp_path):
    assert dashboard.read_run_meta(tmp_path) == (NONE_META, [])


def test_meta_in_miles_format(tmp_path):
    spec = synth.PRESETS["example"]
    _write(tmp_path, "meta.json", json.dumps(synth_dashboard.meta_record(spec), indent=1))
    meta, warnings = dashboard.read_run_meta(tmp_path)
    assert warnings == []
    assert meta == {
        "start_ts": datetime(2026, 1, 1, tzinfo=timezone.utc),
        "wandb_project": "tokenlake-synth",
        "wandb_group": "synth-0",
        "wandb_run_id": "synth0000",
        "hf_checkpoint": "/models/synth-0.5b",
        "args_json": json.dumps(synth_dashboard.run_args(spec), sort_keys=True),
    }
    assert set(meta) | {schema.TAGS_JSON} == set(schema.RUN_META_SCHEMA.names)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (
            "{not json",
            "is not valid JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))",
        ),
        ("[1, 2]", "holds a JSON list, not an object"),
        (b"\xff\xfe\x00", "is not valid JSON"),
        ("[" * 100_000 + "]" * 100_000, "is nested more than 64 levels deep"),
    ],
)
def test_meta_malformed_is_one_warning(tmp_path, content, problem):
    path = _write(tmp_path, "meta.json", content)
    meta, warnings = dashboard.read_run_meta(tmp_path)
    assert meta == NONE_META
    assert len(warnings) == 1
    assert warnings[0].startswith(f"`{path}` {problem}")
    assert warnings[0].endswith("; its run metadata is left NULL.")


def test_meta_too_large_or_not_a_file(tmp_path, monkeypatch):
    path = _write(tmp_path, "meta.json", json.dumps({"args": {"x": "y" * 100}}))
    monkeypatch.setattr(dashboard, "MAX_META_BYTES", 50)
    assert dashboard.read_run_meta(tmp_path)[1] == [
        f"`{path}` is 119 bytes; a dashboard `meta.json` may be at most 50 bytes;"
        " its run metadata is left NULL."
    ]
    path.unlink()
    path.mkdir()
    assert dashboard.read_run_meta(tmp_path)[1] == [
        f"`{path}` is a directory, not a regular file; its run metadata is left NULL."
    ]


def test_meta_bad_fields_are_null_and_named(tmp_path):
    data = {
        "run_name": "r",
        "start_ts": "yesterday",
        "args": {"wandb_project": 7, "wandb_group": "g", "hf_checkpoint": None, "x": 1e999},
        "schema_version": 2,
    }
    path = _write(tmp_path, "meta.json", json.dumps(data).replace("Infinity", "1e999"))
    meta, warnings = dashboard.read_run_meta(tmp_path)
    assert meta == {
        **NONE_META,
        "wandb_group": "g",
        # 1e999 is not a JSON number any reader can hold again: it becomes null
        "args_json": '{"hf_checkpoint": null, "wandb_group": "g", "wandb_project": 7, "x": null}',
    }
    assert warnings == [
        f"`{path}`: `schema_version` is 2; read as version 1.",
        f"`{path}`: `start_ts` is not epoch seconds; left NULL.",
        f"`{path}`: `args.wandb_project` is not a string; left NULL.",
    ]


@pytest.mark.parametrize("start_ts", ["NaN", "-1", "1e300", "true"])
def test_meta_start_ts_out_of_range_is_null(tmp_path, start_ts):
    _write(tmp_path, "meta.json", f'{{"start_ts": {start_ts}, "args": {{}}}}')
    meta, warnings = dashboard.read_run_meta(tmp_path)
    assert meta == {**NONE_META, "args_json": "{}"}
    assert len(warnings) == 1 and "`start_ts` is not epoch seconds" in warnings[0]


def test_meta_args_not_an_object(tmp_path):
    path = _write(tmp_path, "meta.json", '{"start_ts": 0, "args": "x"}')
    meta, warnings = dashboard.read_run_meta(tmp_path)
    assert meta == {**NONE_META, "start_ts": datetime(1970, 1, 1, tzinfo=timezone.utc)}
    assert warnings == [f"`{path}`: `args` is not an object; left NULL."]


# --- metrics.jsonl -----------------------------------------------------------------------------


@pytest.mark.slow
def test_generated_dump_metrics_round_trip(tmp_path):
    spec = replace(synth.PRESETS["rollout-only"], miles_dashboard=True)
    synth.write_dump(tmp_path, spec)
    written = (tmp_path / "dashboard/metrics.jsonl").read_bytes()
    payloads = synth_dashboard.write_miles_dashboard(tmp_path / "again", spec)
    assert (tmp_path / "again/dashboard/metrics.jsonl").read_bytes() == written
    assert dashboard.read_run_meta(tmp_path)[0]["wandb_run_id"] == "synth0000"
    read = dashboard.read_metrics(tmp_path)
    expected = [
        (p["step_key"], p["step"], name, float(value))
        for p in payloads
        for name, value in p["metrics"].items()
    ]
    assert _rows(read) == expected
    assert len(expected) == 25  # 3 rollout + 2 perf per step, 4 train on steps 0 and 2, 2 eval
    raw = {r[1]: r[3] for r in expected if r[2] == "rollout/raw_reward"}
    assert raw == {0: 0.25, 1: 0.375, 2: 0.5}
    assert read.table.schema == schema.METRICS_SCHEMA
    assert read.table.column("ts")[0].as_py() == datetime(2026, 1, 1, 0, 1, tzinfo=timezone.utc)
    assert read.offsets == {"metrics.jsonl": (tmp_path / "dashboard/metrics.jsonl").stat().st_size}
    assert (read.skipped, read.bad_lines, read.warnings, read.restarted) == (0, 0, [], [])


def test_half_written_last_line_waits_and_resumes(tmp_path):
    first = _line(step=0, metrics={"a": 1.0})
    second = _line(step=1, metrics={"a": 2.0})
    path = _write(tmp_path, "metrics.jsonl", first + second[:20])
    read = dashboard.read_metrics(path)
    assert _rows(read) == [("rollout/step", 0, "a", 1.0)]
    assert (read.end_offset, read.warnings, read.bad_lines) == (len(first), [], 0)
    with open(path, "a") as handle:
        handle.write(second[20:])
    again = dashboard.read_metrics(path, read.end_offset)
    assert _rows(again) == [("rollout/step", 1, "a", 2.0)]
    assert again.end_offset == len(first) + len(second)
    assert _rows(dashboard.read_metrics(path, again.end_offset)) == []


def test_values_kept_converted_or_skipped(tmp_path):
    metrics = {
        "f": 0.5,
        "i": 3,
        "big": 2**60 + 1,
        "nan": float("nan"),
        "inf": float("inf"),
        "ninf": float("-inf"),
        "yes": True,
        "no": False,
        "s": "fast",
        "none": None,
        "list": [1],
        "obj": {"x": 1},
        "huge": 10**400,
    }
    text = json.dumps({"ts": 1.0, "step_key": None, "step": None, "metrics": metrics})
    read = dashboard.read_metrics(_write(tmp_path, "metrics.jsonl", text + "\n"))
    values = {r["metric"]: r["value"] for r in read.table.to_pylist()}
    assert math.isnan(values.pop("nan"))
    assert values == {
        "f": 0.5,
        "i": 3.0,
        "big": float(2**60),
        "inf": math.inf,
        "ninf": -math.inf,
        "yes": 1.0,
        "no": 0.0,
    }
    assert read.skipped == 5
    assert {(r["step_key"], r["step"]) for r in read.table.to_pylist()} == {(None, None)}


def test_bad_lines_are_skipped_named_and_counted(tmp_path):
    bad = [
        "{broken\n",
        "[1, 2]\n",
        _line(ts="now"),
        _line(ts=-5),
        _line(step=1.5),
        _line(step=2**70),
        _line(step_key=3),
        json.dumps({"ts": 1, "step_key": None, "step": None, "metrics": [1]}) + "\n",
    ]
    good = _line(step=9, metrics={"ok": 1})
    text = "".join(bad) + "\n" + b"\xff\n".decode("latin-1") + good
    path = _write(tmp_path, "metrics.jsonl", "".join(bad) + "\n")
    with open(path, "ab") as handle:
        handle.write(b"\xff\n" + good.encode())
    read = dashboard.read_metrics(tmp_path)
    assert _rows(read) == [("rollout/step", 9, "ok", 1.0)]
    assert read.bad_lines == 9  # the blank line is not bad
    offsets = [0]
    for line in bad:
        offsets.append(offsets[-1] + len(line))
    assert read.warnings == [
        f"`{path}` at byte 0: not valid JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1)); line skipped.",
        f"`{path}` at byte {offsets[1]}: a JSON list, not an object; line skipped.",
        f"`{path}` at byte {offsets[2]}: `ts` is not epoch seconds; line skipped.",
        f"`{path}` at byte {offsets[3]}: `ts` is not epoch seconds; line skipped.",
        f"`{path}` at byte {offsets[4]}: `step` is not an integer or null; line skipped.",
        f"`{path}`: 4 more bad lines skipped.",
    ]
    assert read.offsets == {"metrics.jsonl": len(text.encode("latin-1"))}


@pytest.mark.parametrize("chunk", [1, 7, 64, 1 << 20])
def test_chunk_boundaries_do_not_change_the_result(tmp_path, monkeypatch, chunk):
    lines = [_line(step=i, metrics={"a": i, "b": -i}) for i in range(20)]
    path = _write(tmp_path, "metrics.jsonl", "".join(lines) + lines[0][:10])
    monkeypatch.setattr(bounded, "READ_CHUNK", chunk)
    read = dashboard.read_metrics(path)
    assert len(_rows(read)) == 40
    assert read.end_offset == sum(len(line) for line in lines)


def test_oversize_line_is_refused_and_the_rest_read(tmp_path, monkeypatch):
    monkeypatch.setattr(dashboard, "MAX_LINE_BYTES", 100)
    monkeypatch.setattr(bounded, "READ_CHUNK", 32)
    long_line = _line(metrics={f"m{i}": i for i in range(40)})
    path = _write(tmp_path, "metrics.jsonl", _line(step=1) + long_line + _line(step=2))
    read = dashboard.read_metrics(path)
    assert _rows(read) == [("rollout/step", 1, "a", 1.5), ("rollout/step", 2, "a", 1.5)]
    start = len(_line(step=1))
    assert read.warnings == [f"`{path}` at byte {start}: longer than 100 bytes; line skipped."]
    assert read.bad_lines == 1


def test_oversize_line_memory_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(dashboard, "MAX_LINE_BYTES", 1 << 16)
    monkeypatch.setattr(bounded, "READ_CHUNK", 1 << 16)
    path = tmp_path / "metrics.jsonl"
    with open(path, "wb") as handle:
        handle.write(b'{"ts": 1, "metrics": {"x": "' + b"y" * (8 << 20) + b'"}}\n')
        handle.write(_line().encode())
    tracemalloc.start()
    read = dashboard.read_metrics(path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert _rows(read) == [("rollout/step", 0, "a", 1.5)]
    assert peak < 1 << 20  # an 8 MiB line, read in 64 KiB chunks, never held whole


def test_hourly_partitions_and_resume_by_file(tmp_path):
    _write(tmp_path, "metrics.jsonl", _line(step=0))
    _write(tmp_path, "metrics/20260101_01.jsonl", _line(step=2))
    _write(tmp_path, "metrics/20260101_00.jsonl", _line(step=1))
    _write(tmp_path, "metrics/notes.txt", "ignored")
    read = dashboard.read_metrics(tmp_path)
    assert [r[1] for r in _rows(read)] == [0, 1, 2]
    size = len(_line(step=0))
    assert read.offsets == {
        "metrics.jsonl": size,
        "metrics/20260101_00.jsonl": size,
        "metrics/20260101_01.jsonl": size,
    }
    _write(tmp_path, "metrics/20260101_01.jsonl", _line(step=2) + _line(step=3))
    _write(tmp_path, "metrics/20260101_02.jsonl", _line(step=4))
    again = dashboard.read_metrics(tmp_path, read.offsets)
    assert [r[1] for r in _rows(again)] == [3, 4]


def test_shrunk_file_is_read_again_and_reported(tmp_path):
    path = _write(tmp_path, "metrics.jsonl", _line(step=5))
    read = dashboard.read_metrics(tmp_path, {"metrics.jsonl": 10_000})
    assert [r[1] for r in _rows(read)] == [5]
    assert read.restarted == ["metrics.jsonl"]
    assert read.warnings == [
        f"`{path}` is shorter than the 10000 bytes read before; read again from the start."
    ]


def test_absent_metrics_and_a_fifo_are_empty(tmp_path):
    assert dashboard.read_metrics(tmp_path).table.num_rows == 0
    assert dashboard.read_metrics(tmp_path / "nope.jsonl").offsets == {}
    import os

    (tmp_path / "dashboard").mkdir()
    os.mkfifo(tmp_path / "dashboard" / "metrics.jsonl")  # would block a naive reader forever
    read = dashboard.read_metrics(tmp_path)
    assert (read.table.num_rows, read.offsets, read.warnings) == (0, {}, [])


def test_int_offset_for_a_dump_directory_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError) as err:
        dashboard.read_metrics(tmp_path, 12)
    assert str(err.value) == (
        f"`start_offset` 12 for the dump directory `{tmp_path}`: give a mapping of file names"
        " to offsets (`MetricsRead.offsets`)."
    )


@pytest.mark.slow
def test_generated_raw_reward_joins_step_stats(tmp_path):
    """The worked join of docs (metrics on step = rollout_id for one step_key) on a real lake."""
    import duckdb

    from tokenlake.orchestrate.extract import extract_run

    spec = replace(synth.PRESETS["example"], miles_dashboard=True)
    synth.write_dump(tmp_path / "dump", spec)
    extract_run(tmp_path / "dump", store_of(tmp_path / "lake"), ExtractOptions(run_name="example"))
    metrics = dashboard.read_metrics(tmp_path / "dump").table  # noqa: F841 (read by DuckDB)
    with duckdb.connect(str(tmp_path / "lake" / layout.CATALOG_FILE), read_only=True) as con:
        rows = con.execute(
            """
            SELECT s.rollout_id, s.reward_mean, m.value
            FROM step_stats AS s
            JOIN metrics AS m
              ON m.step = s.rollout_id AND m.step_key = 'rollout/step'
             AND m.metric = 'rollout/raw_reward'
            ORDER BY s.rollout_id
            """
        ).fetchall()
    assert [r[0] for r in rows] == [0, 1, 2]
    assert all(r[1] == pytest.approx(r[2], abs=1e-12) for r in rows)


def test_control_characters_in_file_names_stay_escaped(tmp_path):
    _write(tmp_path, "metrics/evil\nname.jsonl", "[1]\n")
    read = dashboard.read_metrics(tmp_path)
    assert len(read.warnings) == 1
    assert "\n" not in read.warnings[0] and "evil\\nname.jsonl" in read.warnings[0]
    _write(tmp_path, "meta.json", '{"schema_version": "x\\ny"}')
    warnings = dashboard.read_run_meta(tmp_path)[1]
    assert warnings == [
        f"`{tmp_path}/dashboard/meta.json`: `schema_version` is 'x\\ny'; read as version 1."
    ]
