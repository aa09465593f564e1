"""The writers `make bench-formats` measures (pipeline/benchmarks/bench_formats.py); they write to
moto's S3 server (pipeline/benchmarks/s3server.py).

Each `bench_*` function writes the same step tables, one commit per step, into a fresh bucket
and returns its `Figures`: tokenlake's real code (`write_lake_file` under fresh names, then
`save_manifest`, the one PUT that commits a step, under the conditional-PUT writer lock),
delta-rs (`write_deltalake`, append per step), pyiceberg (append per step, SQL catalog).
Objects and bytes are counted after the N steps, before re-extracting one step (Delta and
Iceberg keep the superseded files for time travel; tokenlake deletes them).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks import s3server
from tokenlake import Lake, schema
from tokenlake.layout import new_name
from tokenlake.load import write
from tokenlake.read import dump
from tokenlake.store import manifest
from tokenlake.store.base import Store

RUN = "bench"
STEP_TABLES = (schema.TOKENS, schema.SAMPLES)
PARTITIONS = ["run", "rollout_id"]


@dataclasses.dataclass
class Step:
    files: dump.StepFiles
    tables: dict[str, pa.Table]


@dataclasses.dataclass
class Figures:
    """One format's run over the steps: seconds, objects and bytes as the store lists them."""

    name: str
    steps: list[float]
    commits: list[float]  # the commit alone, where it is a request of its own
    rewrite: float
    objects: int = 0
    data_objects: int = 0
    data_bytes: int = 0
    other_bytes: int = 0

    @property
    def total(self) -> float:
        return sum(self.steps)


# -- the S3 server: pipeline/benchmarks/s3server.py --------------------------------------------


def new_bucket() -> str:
    return s3server.new_bucket("bench")


def list_objects(bucket: str, prefix: str) -> list[tuple[str, int]]:
    import boto3

    pages = boto3.client("s3").get_paginator("list_objects_v2")
    found = pages.paginate(Bucket=bucket, Prefix=prefix)
    return [(o["Key"], int(o["Size"])) for page in found for o in page.get("Contents", [])]


def count_objects(figures: Figures, bucket: str, prefix: str) -> None:
    objects = list_objects(bucket, prefix)
    data = [size for key, size in objects if key.endswith(".parquet")]
    figures.objects, figures.data_objects = len(objects), len(data)
    figures.data_bytes = sum(data)
    figures.other_bytes = sum(size for _, size in objects) - sum(data)


def delta_options(env: dict[str, str]) -> dict[str, str]:
    """delta-rs's S3 settings: no locking provider; it commits with conditional PUTs."""
    return {
        "AWS_ENDPOINT_URL": env["AWS_ENDPOINT_URL"],
        "AWS_ACCESS_KEY_ID": env["AWS_ACCESS_KEY_ID"],
        "AWS_SECRET_ACCESS_KEY": env["AWS_SECRET_ACCESS_KEY"],
        "AWS_REGION": env["AWS_DEFAULT_REGION"],
        "AWS_ALLOW_HTTP": "true",
    }


def with_partitions(table: pa.Table, rollout_id: int) -> pa.Table:
    """The table with the Hive partition columns as real columns (what a table format needs)."""
    rows = table.num_rows
    run = pa.array([RUN], pa.string()).take(np.zeros(rows, dtype=np.int64))
    rid = pa.array(np.full(rows, rollout_id, dtype=np.int64))
    return table.append_column("run", run).append_column("rollout_id", rid)


def tiny_steps(steps: list[Step], count: int) -> list[Step]:
    """`count` steps of one row per table: what a commit costs with almost no data to write."""
    return [
        Step(
            dataclasses.replace(steps[k % len(steps)].files, rollout_id=k),
            {table: data.slice(0, 1) for table, data in steps[k % len(steps)].tables.items()},
        )
        for k in range(count)
    ]


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


# -- tokenlake -----------------------------------------------------------------------------


def _put_step(store: Store, step: Step) -> dict[str, str]:
    """The step's objects under fresh names (what `orchestrate/step.py` writes)."""
    names = {}
    for table, data in step.tables.items():
        names[table] = new_name(table, RUN, schema.TRAIN_STEM, step.files.rollout_id)
        meta = write.file_metadata(table, RUN, str(step.files.rollout_file))
        write.write_lake_file(store, names[table], table, data, meta)
    return names


def _record(step: Step, names: dict[str, str]) -> manifest.StepRecord:
    tokens = step.tables[schema.TOKENS]
    return manifest.StepRecord(
        rollout_id=step.files.rollout_id,
        evaluation=False,
        sources=dump.fingerprint(step.files),
        files=names,
        samples=step.tables[schema.SAMPLES].num_rows,
        tokens=tokens.num_rows,
        train_files=len(step.files.train_files),
        checksum=manifest.tokens_checksum(tokens),
        schema_version=schema.SCHEMA_VERSION,
    )


def bench_tokenlake(steps: list[Step], bucket: str, env: dict[str, str], folder: Path) -> Figures:
    """tokenlake's protocol with its own code; the lock is taken once, in the first step."""
    store = Lake(f"s3://{bucket}/tokenlake").store
    record = manifest.RunManifest(run=RUN, source_dir=str(steps[0].files.root))
    figures = Figures("tokenlake (manifest)", [], [], 0.0)
    started = time.perf_counter()
    with store.lock():
        lock = time.perf_counter() - started
        for step in steps:
            began = time.perf_counter()
            record.steps[step.files.label] = _record(step, _put_step(store, step))
            figures.commits.append(timed(lambda: manifest.save_manifest(store, record)))
            figures.steps.append(time.perf_counter() - began)
        figures.steps[0] += lock  # the lock is taken once, before the first step
        count_objects(figures, bucket, "tokenlake/")
        first = steps[0]
        began = time.perf_counter()
        old = list(record.steps[first.files.label].files.values())
        record.steps[first.files.label] = _record(first, _put_step(store, first))
        manifest.save_manifest(store, record)
        store.delete(old)
        figures.rewrite = time.perf_counter() - began
    return figures


# -- Delta Lake ----------------------------------------------------------------------------


def delta_writer_properties() -> Any:
    """Our Parquet settings (pipeline/tokenlake/load/write.py) as delta-rs WriterProperties."""
    from deltalake import ColumnProperties, WriterProperties

    columns: dict[str, Any] = {}
    for table in STEP_TABLES:
        options = write._writer_options(table, schema.TABLE_SCHEMAS[table])
        for name, encoding in options["column_encoding"].items():  # type: ignore[attr-defined]
            columns[name] = ColumnProperties(dictionary_enabled=False, encoding=encoding)
        for name in options["use_dictionary"]:  # type: ignore[attr-defined]
            columns[name] = ColumnProperties(dictionary_enabled=True)
    return WriterProperties(
        compression="ZSTD",
        compression_level=write.COMPRESSION_LEVEL,
        max_row_group_size=write.ROW_GROUP_SIZE,
        default_column_properties=ColumnProperties(dictionary_enabled=False),
        column_properties=columns,
    )


def bench_delta(
    steps: list[Step], bucket: str, env: dict[str, str], folder: Path, *, ours: bool, keep: bool
) -> Figures:
    """delta-rs: each table its own Delta table, one append (one commit) per table and step.

    With `keep`, a long-running writer: each table's `DeltaTable` is kept and passed to the
    next write (delta-rs updates it in place). Without, every commit opens the table by its URL
    as a new process would, and first replays the log (it grows until a checkpoint).
    """
    from deltalake import DeltaTable
    from deltalake import write_deltalake as write_delta

    write_deltalake: Any = write_delta  # its overloads tie `mode` to `predicate`
    options = delta_options(env)
    props = delta_writer_properties() if ours else None
    kept: dict[str, Any] = {}

    def put(step: Step, mode: Literal["append", "overwrite"], predicate: str | None = None) -> None:
        for table, data in step.tables.items():
            uri = f"s3://{bucket}/delta/{table}"
            write_deltalake(
                kept.get(table, uri),
                with_partitions(data, step.files.rollout_id),
                mode=mode,
                partition_by=PARTITIONS,
                predicate=predicate,
                storage_options=None if table in kept else options,
                writer_properties=props,
            )
            if keep and table not in kept:
                kept[table] = DeltaTable(uri, storage_options=options)

    names = {True: "our settings", False: "its defaults"}
    figures = Figures(f"delta-rs {names[ours]}, {'table kept' if keep else 'URL'}", [], [], 0.0)
    for step in steps:
        figures.steps.append(timed(functools.partial(put, step, "append")))
    count_objects(figures, bucket, "delta/")
    where = f"run = '{RUN}' AND rollout_id = {steps[0].files.rollout_id}"
    figures.rewrite = timed(lambda: put(steps[0], "overwrite", where))
    return figures


# -- Iceberg -------------------------------------------------------------------------------


def iceberg_catalog(folder: Path, bucket: str, env: dict[str, str]) -> Any:
    from pyiceberg.catalog.sql import SqlCatalog

    return SqlCatalog(
        "bench",
        uri=f"sqlite:///{folder / 'iceberg-catalog.db'}",
        warehouse=f"s3://{bucket}/iceberg",
        **{
            "s3.endpoint": env["AWS_ENDPOINT_URL"],
            "s3.access-key-id": env["AWS_ACCESS_KEY_ID"],
            "s3.secret-access-key": env["AWS_SECRET_ACCESS_KEY"],
            "s3.region": env["AWS_DEFAULT_REGION"],
        },
    )


def iceberg_tables(catalog: Any, steps: list[Step]) -> dict[str, Any]:
    """One Iceberg table per lake table, identity-partitioned, with the settings it accepts."""
    catalog.create_namespace_if_not_exists("tl")
    tables = {}
    for table, data in steps[0].tables.items():
        created = catalog.create_table(
            f"tl.{table}",
            schema=with_partitions(data.slice(0, 0), 0).schema,
            properties={
                "write.parquet.compression-codec": "zstd",
                "write.parquet.compression-level": str(write.COMPRESSION_LEVEL),
                "write.parquet.row-group-limit": str(write.ROW_GROUP_SIZE),
            },
        )
        with created.update_spec() as spec:
            for column in PARTITIONS:
                spec.add_identity(column)
        tables[table] = created
    return tables


def bench_iceberg(steps: list[Step], bucket: str, env: dict[str, str], folder: Path) -> Figures:
    tables = iceberg_tables(iceberg_catalog(folder, bucket, env), steps)
    figures = Figures("pyiceberg, sqlite catalog", [], [], 0.0)

    def put(step: Step, overwrite: bool) -> None:
        rid = step.files.rollout_id
        for table, data in step.tables.items():
            rows = with_partitions(data, rid)
            if overwrite:
                where = f"run = '{RUN}' AND rollout_id = {rid}"
                tables[table].overwrite(rows, overwrite_filter=where)
            else:
                tables[table].append(rows)

    for step in steps:
        figures.steps.append(timed(functools.partial(put, step, False)))
    count_objects(figures, bucket, "iceberg/")
    figures.rewrite = timed(lambda: put(steps[0], True))
    return figures


# -- what each writer produced ------------------------------------------------------------


def parquet_settings(bucket: str, prefix: str) -> dict[str, str]:
    """Settings read back from the first `tokens` data file under a prefix."""
    import s3fs

    key = next(k for k, _ in sorted(list_objects(bucket, prefix)) if k.endswith(".parquet"))
    with s3fs.S3FileSystem().open(f"{bucket}/{key}", "rb") as handle:
        meta = pq.ParquetFile(handle).metadata
    group = meta.row_group(0)
    columns = {group.column(i).path_in_schema: group.column(i) for i in range(group.num_columns)}

    def encodings(name: str) -> str:
        return "/".join(sorted(set(columns[name].encodings) - {"RLE"}))  # RLE: levels only

    return {
        "codec": "/".join(sorted({c.compression for c in columns.values()})),
        "float": encodings(schema.LP_DIFF),
        "key": encodings(schema.POSITION),
        "rows/group": str(max(meta.row_group(i).num_rows for i in range(meta.num_row_groups))),
        "version": meta.format_version,
        "lineage": "yes" if b"tokenlake.run" in (meta.metadata or {}) else "no",
    }
