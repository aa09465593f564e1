"""A manifest is written linearly in its size and reads back as the same record.

The old serialiser (`json.dumps(dataclasses.asdict(m), indent=1)`) is the oracle: the new
bytes must hold the same JSON, for every field of every record (a field added later that the
writer forgot fails here).
"""

from __future__ import annotations

import json
from dataclasses import asdict

from tokenlake import layout, schema
from tokenlake.store.manifest import (
    MetricsSource,
    RunManifest,
    SourceFile,
    StepRecord,
    manifest_bytes,
    parse_manifest,
)

RUN = "rün-1"  # non-ASCII: written as UTF-8, not escaped


def _step(rollout_id: int, evaluation: bool) -> StepRecord:
    stem = "eval" if evaluation else "train"
    return StepRecord(
        rollout_id=rollout_id,
        evaluation=evaluation,
        sources=[SourceFile(f"rollout_data/{rollout_id}.pt", 1000 + rollout_id, 17 * rollout_id)],
        files={
            table: layout.new_name(table, RUN, stem, rollout_id, f"{rollout_id:08x}")
            for table in (schema.TOKENS, schema.SAMPLES)
        },
        samples=4,
        tokens=65 + rollout_id,
        train_files=2,
        checksum=f"{rollout_id:032x}",
        schema_version=schema.SCHEMA_VERSION,
        rollup_version="ab" * 16,
        rollup_settings={schema.ROLLUP_TABLES[0]: "cd" * 16},
    )


def _manifest(steps: int) -> RunManifest:
    record = RunManifest(
        run=RUN,
        source_dir="/dumps/rün-1",
        runs_file=layout.new_name(schema.RUNS, RUN, "run"),
        vocab_file=layout.new_name(schema.VOCAB, RUN, "vocab"),
        vocab_source=SourceFile("tokenizer/tokenizer.json", 10, 20),
        tags={"precision": "fp8", "note": 'line "two"\tend'},
        metrics_files=[layout.new_name(schema.METRICS, RUN, "metrics")],
        metrics_sources={"metrics.jsonl": MetricsSource(120, "ef" * 16, inside_long=True)},
        meta_source=SourceFile("dashboard/meta.json", 30, 40),
    )
    for rollout_id in range(steps):
        step = _step(rollout_id, evaluation=rollout_id % 5 == 4)
        record.steps[step.key] = step
    return record


def _step_json(step: StepRecord) -> dict[str, object]:
    """A step as the old serialiser wrote it: a complete step's entry lacks `incomplete`."""
    content = asdict(step)
    if content["incomplete"] is None:
        del content["incomplete"]
    return content


def _old_bytes(record: RunManifest) -> bytes:
    content = asdict(record)
    content["steps"] = {key: _step_json(step) for key, step in record.steps.items()}
    return json.dumps(content, ensure_ascii=False, indent=1).encode("utf-8")


def test_manifest_holds_the_same_json_as_the_old_serialiser() -> None:
    for steps in (0, 1, 300):
        record = _manifest(steps)
        written = manifest_bytes(record)
        assert json.loads(written) == json.loads(_old_bytes(record))
        assert parse_manifest(f"_manifest/{RUN}.json", written) == record


def test_manifest_is_one_line_per_step_in_utf8() -> None:
    written = manifest_bytes(_manifest(3)).decode("utf-8")
    lines = written.splitlines()
    assert lines[0] == "{"
    assert lines[1] == ' "run": "rün-1",'
    steps = lines.index(' "steps": {')
    assert lines[steps - 1 : steps + 5] == [
        ' "source_dir": "/dumps/rün-1",',
        ' "steps": {',
        '  "0": ' + json.dumps(_step_json(_step(0, False)), ensure_ascii=False) + ",",
        '  "1": ' + json.dumps(_step_json(_step(1, False)), ensure_ascii=False) + ",",
        '  "2": ' + json.dumps(_step_json(_step(2, False)), ensure_ascii=False),
        " },",
    ]
    assert lines[-2:] == [
        ' "meta_source": {"name": "dashboard/meta.json", "size": 30, "mtime_ns": 40}',
        "}",
    ]
    assert ' "steps": {},' in manifest_bytes(_manifest(0)).decode("utf-8").splitlines()


def test_an_incomplete_step_keeps_its_mark() -> None:
    record = _manifest(2)
    record.steps["1"].incomplete = "rank 1 of ranks 0-1 has no train file"
    written = manifest_bytes(record)
    assert (
        json.loads(written)["steps"]["1"]["incomplete"] == "rank 1 of ranks 0-1 has no train file"
    )
    assert "incomplete" not in json.loads(written)["steps"]["0"]
    assert parse_manifest(f"_manifest/{RUN}.json", written) == record
