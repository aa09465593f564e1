"""Write lake Parquet files: the only module that writes them (verify.py reads them back with
`pyarrow.parquet`; query.py's `--format parquet` and the generator write files outside a lake).

Every file is written by pyarrow (`write_lake_file`) but one: `tokenlake tag` writes a local
lake's one-row `runs` file through DuckDB (`write_runs_file_by_duckdb`), which it has open for
the catalog anyway, because importing pyarrow would be half of the command's CPU
(docs/performance.md); tests/store/test_runs_file_writers.py holds both files to the same
schema, metadata and values.

Every file is written through the lake's `write_with` (locally a hidden temporary name in its
partition directory, renamed into place; on an object store one upload under a fresh name), so a
reader (or a crash) never sees half a file. Every setting is stated here.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from tokenlake import schema
from tokenlake.errors import LakeError
from tokenlake.store.base import Store
from tokenlake.store.local import LocalStore
from tokenlake.store.parquet import footer_identity

if TYPE_CHECKING:  # imported where a file is written: `tokenlake tag` never imports pyarrow
    import duckdb
    import pyarrow as pa

# 128 Ki rows per row group, measured (docs/performance.md): against 1 Mi, a plain scan of a
# 0.6 M-token step ran 2x faster (DuckDB splits a file's work by row group, and 1 Mi left one
# group per step), reading one sample touches 1/18 of a 2.3 M-row step instead of 1/3, and the
# files are the same size; 64 Ki was slower again on point reads.
ROW_GROUP_SIZE = 1 << 17
# Pages end at a row group's end or at pyarrow's 1 MiB data page size, not at its default of
# 20,000 rows a page: measured on 618 k-token steps of `bench` (docs/performance.md), the
# tokens file is written with 13 % less CPU and is 4.5 % smaller (15.9 -> 15.2 B/token: fewer
# pages to compress, and fewer page headers and statistics), DuckDB's scans and point reads
# of it took the same time, pyarrow read it 16-40 % faster.
MAX_ROWS_PER_PAGE = ROW_GROUP_SIZE
COMPRESSION = "zstd"
# Level 1: measured within ~3 % of level 3's size on log-prob columns, at twice the speed.
COMPRESSION_LEVEL = 1
PARQUET_FORMAT_VERSION = "2.6"
# Delta encoding suits the monotone key columns; dictionary encoding only pays for strings
# (on float columns pyarrow tries it, gives up, and wastes time). Floats use BYTE_STREAM_SPLIT:
# grouping exponent bytes lets zstd squeeze them; measured on a 618 k-token step: 23.6 vs
# 24.8 B/token and 4.4 vs 2.7 M rows/s written. DuckDB, Spark >= 3.2 and Trino read it.
_DELTA_COLUMNS = (schema.BATCH_POSITION, schema.POSITION, schema.SAMPLE_INDEX)


def _writer_options(table: str, table_schema: pa.Schema) -> dict[str, object]:
    import pyarrow as pa

    names = set(table_schema.names)
    dictionary = [
        f.name
        for f in table_schema
        if pa.types.is_string(f.type)
        or pa.types.is_list(f.type)
        and f.name != schema.PROMPT_TOKEN_IDS
    ]
    encodings = {name: "DELTA_BINARY_PACKED" for name in _DELTA_COLUMNS if name in names}
    if table in schema.ROLLUP_TABLES:
        # A rollup's integers are counts and ranks (stored in rank order where it has one):
        # 4 % smaller files of drift_token_id_parts than plain, measured on the bench lake.
        encodings.update(
            {f.name: "DELTA_BINARY_PACKED" for f in table_schema if pa.types.is_integer(f.type)}
        )
    encodings.update(
        {f.name: "BYTE_STREAM_SPLIT" for f in table_schema if pa.types.is_floating(f.type)}
    )
    return {
        "compression": COMPRESSION,
        "compression_level": COMPRESSION_LEVEL,
        "version": PARQUET_FORMAT_VERSION,
        "use_dictionary": dictionary,
        "column_encoding": encodings,
        "write_statistics": True,
        **_page_options(),
    }


@cache
def _page_options() -> dict[str, int]:
    """`max_rows_per_page` where pyarrow has the option; older pyarrow ends pages at the data
    page size alone, as this setting does."""
    import pyarrow.parquet as pq

    accepted = inspect.signature(pq.ParquetWriter.__init__).parameters
    return {"max_rows_per_page": MAX_ROWS_PER_PAGE} if "max_rows_per_page" in accepted else {}


def file_metadata(table: str, run: str, source: str) -> dict[bytes, bytes]:
    """Key-value metadata stamped into every file: lineage and schema version."""
    return {
        b"tokenlake.table": table.encode(),
        b"tokenlake.schema_version": str(schema.SCHEMA_VERSION).encode(),
        b"tokenlake.run": run.encode(),
        b"tokenlake.source": source.encode(),
    }


def write_parquet(path: Path, table: str, data: pa.Table, metadata: dict[bytes, bytes]) -> str:
    """`write_lake_file` for a local file outside a lake's naming (benchmarks, tests)."""
    return write_lake_file(LocalStore(path.parent), path.name, table, data, metadata)


def write_lake_file(
    store: Store,
    relative: str,
    table: str,
    data: pa.Table,
    metadata: dict[bytes, bytes],
    table_schema: pa.Schema | None = None,
) -> str:
    """Write one step's rows of `table` as the lake file `relative`, atomically.

    A whole step is written at once: `write_table` splits it into ROW_GROUP_SIZE groups,
    whereas writing many small batches would make one tiny row group per batch.

    Args:
        store: The lake's store.
        table_schema: The rows' schema, for a table whose columns `schema.TABLE_SCHEMAS` does
            not hold (a rollup: its SQL header gives them, `serve.rollups.rollup_schema`).

    Returns:
        The file's identity as written (`store.parquet.footer_identity`: size and footer
        digest), which its manifest records and `verify` compares.
    """
    if table_schema is None:
        table_schema = schema.TABLE_SCHEMAS[table]
    table_schema = table_schema.with_metadata(metadata)
    if data.schema.remove_metadata() != table_schema.remove_metadata():
        where = store.url(relative)
        raise LakeError(where, f"rows do not match the `{table}` schema: {data.schema}")

    import pyarrow.parquet as pq

    def write(where: str, filesystem: object) -> None:
        with pq.ParquetWriter(
            where, table_schema, filesystem=filesystem, **_writer_options(table, table_schema)
        ) as writer:
            writer.write_table(data.replace_schema_metadata(metadata), ROW_GROUP_SIZE)

    store.write_with(relative, write)
    return footer_identity(store, relative)


# The temporary table `write_runs_file_by_duckdb` gathers the row in: its NOT NULL columns are
# written as Parquet REQUIRED, as pyarrow writes the schema's non-nullable fields.
_RUNS_ROW = "tokenlake_runs_row"
_PLAIN_KEY = re.compile(rb"[a-z_.]+")


def write_runs_file_by_duckdb(
    con: duckdb.DuckDBPyConnection,
    store: LocalStore,
    relative: str,
    row_sql: str,
    parameters: Sequence[object],
    metadata: dict[bytes, bytes],
) -> str:
    """Write the `runs` file `relative` of a local lake, atomically, from the one row that
    DuckDB's `row_sql` (a SELECT of `schema.RUNS_COLUMNS` in their order, with `parameters`)
    gives: the schema, key-value metadata and values `write_lake_file` writes from the same row
    (tests/store/test_runs_file_writers.py), without importing pyarrow, which would be half the
    CPU of `tokenlake tag` (docs/performance.md). Its encodings are DuckDB's: one row has no
    use for `_writer_options`.

    Returns:
        The file's identity as written, as `write_lake_file`.

    Raises:
        LakeError: The file could not be written, or `row_sql` gave not one row.
        duckdb.Error: `row_sql` failed (a file it reads could not be read, or its row breaks
            the schema: a NULL where a column is NOT NULL).
    """
    import duckdb

    columns = ", ".join(
        f'"{c.name}" {c.duckdb_type}{"" if c.nullable else " NOT NULL"}'
        for c in schema.RUNS_COLUMNS
    )
    # The keys are `file_metadata`'s own names (a struct's keys cannot be parameters); the
    # values, which name the run and its dump, are parameters. DuckDB writes the path it is
    # given, never a temporary of its own beside it: `write_with` makes the write atomic.
    assert all(_PLAIN_KEY.fullmatch(key) for key in metadata)
    keys = ", ".join(f"'{key.decode()}': ?" for key in metadata)
    options = (
        f"FORMAT parquet, COMPRESSION {COMPRESSION}, COMPRESSION_LEVEL {COMPRESSION_LEVEL},"
        f" KV_METADATA {{{keys}}}, USE_TMP_FILE false"
    )
    stamped = [value.decode() for value in metadata.values()]

    def write(where: str, filesystem: object) -> None:
        assert filesystem is None  # a local lake's temporary path
        try:
            con.execute(f"COPY {_RUNS_ROW} TO ? ({options})", [where, *stamped])
        except duckdb.Error as exc:
            raise LakeError(store.url(relative), f"cannot be written ({exc})") from exc

    # DuckDB writes a column REQUIRED where its statistics hold no NULL: a second row, NULL in
    # every nullable column and deleted before the COPY, leaves those OPTIONAL, as pyarrow
    # writes the schema's nullable fields.
    nulled = ", ".join(c.name if not c.nullable else "NULL" for c in schema.RUNS_COLUMNS)
    con.execute(f"CREATE OR REPLACE TEMP TABLE {_RUNS_ROW} ({columns})")
    try:
        inserted = con.execute(f"INSERT INTO {_RUNS_ROW} {row_sql}", list(parameters))
        if inserted.fetchall() != [(1,)]:
            raise LakeError(store.url(relative), "cannot be written (not one `runs` row)")
        con.execute(f"INSERT INTO {_RUNS_ROW} SELECT {nulled} FROM {_RUNS_ROW}")
        con.execute(f"DELETE FROM {_RUNS_ROW} WHERE rowid = 1")
        store.write_with(relative, write)
    finally:
        con.execute(f"DROP TABLE {_RUNS_ROW}")
    return footer_identity(store, relative)
