"""Build small lakes from hand-written rows, for tests of the SQL views.

Rows are dicts keyed by `tokenlake.schema` column names; missing columns are NULL, except a
token's `turn_index` and `first_occurrence`, which are derived from the sample's rows as
extraction does.
Partition columns (`run`, `rollout_id`) go in the dicts too and choose the partition directory.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa

from tests.conftest import local_store
from tokenlake import schema
from tokenlake.layout import partition_dir
from tokenlake.load import write
from tokenlake.orchestrate import maintain
from tokenlake.serve import catalog
from tokenlake.store import manifest


def _defaults(table: str) -> dict[str, Any]:
    defaults: dict[str, Any] = {}
    for field in schema.TABLE_SCHEMAS[table]:
        if not field.nullable:
            defaults[field.name] = False if pa.types.is_boolean(field.type) else 0
    if table == schema.SAMPLES:  # a miles dump always says (NULL is NeMo-RL's, which logs none)
        defaults[schema.TRUNCATED] = False
    return defaults


def _record(
    lake: Path, table: str, key: tuple[Any, ...], path: Path, rows: int, identity: str
) -> None:
    """List the file in the run's manifest with its rows and identity, as an extraction
    would."""
    run, store = key[0], local_store(lake)
    entry = manifest.load_manifest(store, run) or manifest.RunManifest(run=run, source_dir="")
    relative = str(path.relative_to(lake))
    if table == schema.RUNS:
        entry.runs_file = relative
    else:
        rollout_id, evaluation = key[1], key[-1]
        step_key = f"eval_{rollout_id}" if evaluation else str(rollout_id)
        step = entry.steps.setdefault(
            step_key,
            manifest.StepRecord(rollout_id, evaluation, [], {}, 0, 0, 0, ""),
        )
        step.files[table] = relative
        step.identities[table] = identity
        if table == schema.TOKENS:
            step.tokens = rows
        elif table == schema.SAMPLES:
            step.samples = rows
    manifest.save_manifest(store, entry)


def _add_turn_index(rows: list[dict[str, Any]]) -> None:
    """Number each sample's loss-covered runs by position, where a row has no `turn_index`."""
    samples: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        samples[row[schema.BATCH_POSITION]].append(row)
    for sample in samples.values():
        turn, previous = -1, False
        for row in sorted(sample, key=lambda r: r[schema.POSITION]):
            covered = (row.get(schema.LOSS_MASK) or 0) > 0
            turn += covered and not previous
            previous = covered
            row.setdefault(schema.TURN_INDEX, turn if covered else None)


def _is_drift_row(row: dict[str, Any]) -> bool:
    values = [row.get(c) for c in (schema.LP_DIFF, schema.TRAIN_LOG_PROB, schema.ROLLOUT_LOG_PROB)]
    return (row.get(schema.LOSS_MASK) or 0) > 0 and all(
        v is not None and math.isfinite(v) for v in values
    )


def _add_first_occurrence(rows: list[dict[str, Any]]) -> None:
    """Flag each sample's first drift row of every token id by position, where a row has no
    `first_occurrence`; NULL on rows the drift statistics leave out."""
    seen: set[tuple[Any, Any]] = set()
    for row in sorted(rows, key=lambda r: (r[schema.BATCH_POSITION], r[schema.POSITION])):
        key = (row[schema.BATCH_POSITION], row[schema.TOKEN_ID])
        first = None if not _is_drift_row(row) else key not in seen
        if first:
            seen.add(key)
        row.setdefault(schema.FIRST_OCCURRENCE, first)


def write_rows(lake: Path, table: str, rows: list[dict[str, Any]]) -> None:
    """Write rows of one table, one file per (run, rollout_id, evaluation)."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    partitions = schema.TABLE_PARTITIONS[table]
    for row in rows:
        key = tuple(row[col] for col in partitions) + (row.get(schema.EVALUATION, False),)
        groups[key].append(row)
    table_schema = schema.TABLE_SCHEMAS[table]
    for key, group in groups.items():
        full = [{**_defaults(table), **row} for row in group]
        if table == schema.TOKENS:
            _add_turn_index(full)
            _add_first_occurrence(full)
        data = pa.Table.from_pylist(
            [{f.name: r.get(f.name) for f in table_schema} for r in full], schema=table_schema
        )
        directory = lake / partition_dir(table, *key[: len(partitions)])
        stem = schema.EVAL_STEM if key[-1] else schema.TRAIN_STEM
        identity = write.write_parquet(directory / f"{stem}.parquet", table, data, {})
        _record(lake, table, key, directory / f"{stem}.parquet", len(group), identity)


def build_lake(
    lake: Path,
    tokens: list[dict[str, Any]] = (),  # type: ignore[assignment]
    samples: list[dict[str, Any]] = (),  # type: ignore[assignment]
    runs: list[dict[str, Any]] = (),  # type: ignore[assignment]
) -> Path:
    """Write the rows, each step's rollups (as extraction would), and build the catalog;
    returns the catalog path."""
    for table, rows in ((schema.TOKENS, tokens), (schema.SAMPLES, samples), (schema.RUNS, runs)):
        if rows:
            write_rows(lake, table, list(rows))
    add_rollups(lake)
    return catalog.build_catalog(local_store(lake))


def add_rollups(lake: Path) -> None:
    """Compute the rollups of every step that lacks them, from its files."""
    store = local_store(lake)
    for record in manifest.load_all(store):
        if maintain.refresh_rollups(store, record):
            manifest.save_manifest(store, record)
