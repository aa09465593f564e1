"""The `runs` file `tokenlake tag` writes through DuckDB (`lake_files.rewrite_run_row`) reads
the same as the one pyarrow writes from the same row (`lake_files.write_run_row` with the
stored row kept): the same schema, nullability and key-value metadata, the same values. A
current file that is not a plain one-row `runs` file is left to pyarrow's path."""

from __future__ import annotations

import copy
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tokenlake import schema
from tokenlake.load import lake_files, write
from tokenlake.store import manifest, parquet
from tokenlake.store.local import LocalStore

EXTRACTED_AT = datetime(2026, 3, 1, 12, 30, 15, 123456, tzinfo=timezone.utc)
STORED = {
    "extracted_at": EXTRACTED_AT,
    schema.START_TS: datetime(2026, 2, 28, 23, 59, 59, 1, tzinfo=timezone.utc),
    schema.WANDB_PROJECT: "proj 'quoted'",
    schema.WANDB_GROUP: None,
    schema.WANDB_RUN_ID: "id-7",
    schema.HF_CHECKPOINT: "/models/Qwen3 ☃",
    schema.ARGS_JSON: '{"lr": 1e-06}',
    schema.FRAMEWORK: "slime",
    schema.DUMP_FORMAT: "slime-v2",
    schema.FORMAT_VERSION: 2,
}


def _lake(tmp_path: Path, stored: dict[str, Any]) -> tuple[LocalStore, manifest.RunManifest]:
    """A local store with run `r1`'s `runs` file written by pyarrow from `stored`."""
    store = LocalStore(tmp_path / "lake")
    store.root.mkdir()
    record = manifest.RunManifest("r1", "/dumps/it's here", tags={"team": "rl"})
    lake_files.write_run_row(store, record, keep=stored)
    return store, record


def _both_writers(
    store: LocalStore, record: manifest.RunManifest
) -> tuple[manifest.RunManifest, manifest.RunManifest]:
    """The record after a tag rewrote its row through pyarrow, then through DuckDB."""
    by_arrow, by_duckdb = copy.deepcopy(record), copy.deepcopy(record)
    for tagged in (by_arrow, by_duckdb):
        tagged.tags = {"team": "rl", "k": "it's"}
    keep = lake_files.stored_run_row(store, by_arrow)
    lake_files.write_run_row(store, by_arrow, keep=keep)
    with duckdb.connect() as con:
        assert lake_files.rewrite_run_row(con, store, by_duckdb)
    return by_arrow, by_duckdb


def _read(store: LocalStore, record: manifest.RunManifest) -> tuple[pa.Schema, list[dict]]:
    assert record.runs_file is not None
    path = store.file(record.runs_file)
    return pq.read_schema(path), pq.read_table(path).to_pylist()


def test_the_duckdb_runs_file_reads_as_pyarrows(tmp_path: Path) -> None:
    store, record = _lake(tmp_path, STORED)
    by_arrow, by_duckdb = _both_writers(store, record)
    arrow_schema, arrow_rows = _read(store, by_arrow)
    duckdb_schema, duckdb_rows = _read(store, by_duckdb)
    assert duckdb_schema.equals(arrow_schema, check_metadata=True)
    assert duckdb_schema.equals(schema.RUNS_SCHEMA.with_metadata(arrow_schema.metadata))
    assert arrow_schema.metadata == {
        b"tokenlake.table": b"runs",
        b"tokenlake.schema_version": str(schema.SCHEMA_VERSION).encode(),
        b"tokenlake.run": b"r1",
        b"tokenlake.source": b"/dumps/it's here",
    }
    assert duckdb_rows == arrow_rows
    assert duckdb_rows[0] == {
        "source_dir": "/dumps/it's here",
        "tool": arrow_rows[0]["tool"],
        "schema_version": schema.SCHEMA_VERSION,
        "train_steps": 0,
        "eval_steps": 0,
        **STORED,
        schema.TAGS_JSON: '{"k": "it\'s", "team": "rl"}',
    }
    assert by_duckdb.side_identities[by_duckdb.runs_file] == parquet.footer_identity(
        store, by_duckdb.runs_file
    )


def test_a_runs_file_of_an_older_schema_reads_null_in_the_columns_added_since(
    tmp_path: Path,
) -> None:
    """A file of schema version 1 (base columns only) and one of version 3 (no format
    columns): the columns they lack are NULL, as pyarrow's path writes them."""
    store, record = _lake(tmp_path, STORED)
    assert record.runs_file is not None
    current = pq.read_table(store.file(record.runs_file))
    grown = pa.schema([*schema.RUNS_BASE_SCHEMA, *schema.RUN_META_SCHEMA])
    for kept in (schema.RUNS_BASE_SCHEMA, grown):
        rows = current.select(kept.names)
        metadata = write.file_metadata(schema.RUNS, record.run, record.source_dir)
        name = f"runs/run=r1/run-older{len(kept)}.parquet"
        pq.write_table(rows.cast(kept).replace_schema_metadata(metadata), store.file(name))
        record.runs_file = name
        record.side_identities[name] = parquet.footer_identity(store, name)
        by_arrow, by_duckdb = _both_writers(store, record)
        assert _read(store, by_duckdb) == _read(store, by_arrow)
        fresh = [*kept.names, schema.TAGS_JSON]
        lacking = [n for n in schema.RUNS_SCHEMA.names if n not in fresh]
        assert {n: _read(store, by_duckdb)[1][0][n] for n in lacking} == dict.fromkeys(lacking)


@pytest.mark.parametrize(
    "change", ["identity", "two rows", "unknown column", "other type", "garbled pages"]
)
def test_a_runs_file_that_is_not_plain_is_left_to_pyarrow(tmp_path: Path, change: str) -> None:
    """Not the file its manifest records, not one row of `runs` columns of their types, or
    pages DuckDB cannot decode: nothing is written, and the record is as it was."""
    store, record = _lake(tmp_path, STORED)
    assert record.runs_file is not None
    path = store.file(record.runs_file)
    rows = pq.read_table(path)
    if change == "two rows":
        rows = pa.concat_tables([rows, rows])
    elif change == "unknown column":
        rows = rows.append_column("extra", pa.array([1]))
    elif change == "other type":
        rows = rows.set_column(3, "schema_version", pa.array(["5"]))
    if change == "garbled pages":  # its footer, and so its identity, as written
        data = bytearray(path.read_bytes())
        data[8:200] = bytes(b ^ 0xFF for b in data[8:200])
        path.write_bytes(bytes(data))
    elif change != "identity":
        pq.write_table(rows, path)
        record.side_identities[record.runs_file] = parquet.footer_identity(store, record.runs_file)
    else:
        record.side_identities[record.runs_file] = "1:" + "0" * 32
    before = copy.deepcopy(record)
    with duckdb.connect() as con:
        assert not lake_files.rewrite_run_row(con, store, record)
    assert record == before
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]
