"""Build the DuckDB catalog `LAKE/tokenlake.duckdb`: base views over the Parquet files, then
every view under `sql/`. This is the only module that imports duckdb.

The base views list the Parquet files that the run manifests name (pipeline/manifest.py),
with absolute paths, so the catalog works from any working directory, shows only committed
files, and a path with quotes or glob characters cannot break or inject into the SQL. The
catalog is rebuilt by every extract, so the lists stay current.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from pipeline import manifest, schema
from pipeline.errors import LakeError

if TYPE_CHECKING:
    import duckdb

log = logging.getLogger(__name__)

_VIEW_STATEMENT = re.compile(r"CREATE\s+OR\s+REPLACE\s+VIEW\s+(\w+)\s", re.IGNORECASE)

_ARROW_TO_DUCKDB: dict[pa.DataType, str] = {
    pa.bool_(): "BOOLEAN",
    pa.int8(): "TINYINT",
    pa.int32(): "INTEGER",
    pa.int64(): "BIGINT",
    pa.float32(): "FLOAT",
    pa.float64(): "DOUBLE",
    pa.string(): "VARCHAR",
    pa.timestamp("us", tz="UTC"): "TIMESTAMP WITH TIME ZONE",
    pa.list_(pa.string()): "VARCHAR[]",
    pa.list_(pa.int64()): "BIGINT[]",
}


def sql_dir() -> Path:
    """The one place that knows where the view files live."""
    return Path(__file__).resolve().parent.parent / "sql"


def iter_view_files() -> Iterator[Path]:
    """Every view definition, one `CREATE OR REPLACE VIEW <file stem>` per file."""
    yield from sorted(sql_dir().glob("*.sql"))


def iter_macro_files() -> Iterator[Path]:
    """Scalar macros the views use; created before every view."""
    yield from sorted((sql_dir() / "macros").glob("*.sql"))


def iter_audit_files() -> Iterator[Path]:
    """Every audit query (returns the offending rows; zero rows means healthy)."""
    yield from sorted((sql_dir() / "audits").glob("*.sql"))


def quote_literal(text: str) -> str:
    """A SQL string literal for DuckDB.

    Examples:
        >>> quote_literal("it's")
        "'it''s'"
    """
    return "'" + text.replace("'", "''") + "'"


def duckdb_type(arrow_type: pa.DataType) -> str:
    """DuckDB type name of a schema column type."""
    return _ARROW_TO_DUCKDB[arrow_type]


def table_files(lake: Path, table: str) -> list[Path]:
    """The Parquet files of one table that the runs' manifests list, by run then step."""
    return [lake / name for run in manifest.load_all(lake) for name in run.files(table)]


def base_view_sql(table: str, files: list[Path]) -> str:
    """`SELECT` over a table's files with the partition columns first, typed from the schema."""
    table_schema = schema.TABLE_SCHEMAS[table]
    partitions = schema.TABLE_PARTITIONS[table]
    if not files:
        columns = [
            f"NULL::{duckdb_type(schema.PARTITION_TYPES[col])} AS {col}" for col in partitions
        ]
        columns += [f"NULL::{duckdb_type(f.type)} AS {f.name}" for f in table_schema]
        return "SELECT " + ", ".join(columns) + " WHERE false"
    file_list = ", ".join(quote_literal(str(p.resolve())) for p in files)
    partition_types = ", ".join(
        f"'{col}': {duckdb_type(schema.PARTITION_TYPES[col])}" for col in partitions
    )
    selected = ", ".join([*partitions, *(f.name for f in table_schema)])
    return (
        f"SELECT {selected} FROM read_parquet([{file_list}], hive_partitioning = true, "
        f"hive_types = {{{partition_types}}}, hive_types_autocast = false)"
    )


def header_comment(sql_text: str) -> str:
    """The leading `--` comment block of a view file, used as the view's COMMENT."""
    lines = []
    for line in sql_text.splitlines():
        if not line.startswith("--"):
            break
        lines.append(line[2:].strip())
    return "\n".join(lines).strip()


def create_base_views(con: duckdb.DuckDBPyConnection, lake: Path) -> None:
    """`tokens`, `samples`, `runs` over the lake's Parquet files."""
    for table in schema.TABLES:
        con.execute(
            f"CREATE OR REPLACE VIEW {table} AS {base_view_sql(table, table_files(lake, table))}"
        )


def create_sql_views(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Create every `sql/*.sql` view, retrying in rounds so a view may build on another.

    Returns:
        The view names in the order they were created.
    """
    import duckdb

    pending = {path: path.read_text(encoding="utf-8") for path in iter_view_files()}
    for path, text in pending.items():
        _check_view_file(path, text)
    created: list[str] = []
    while pending:
        created_before = len(created)
        errors: dict[Path, Exception] = {}
        for path, text in list(pending.items()):
            try:
                con.execute(text)
            except duckdb.CatalogException as exc:  # may depend on a view not created yet
                errors[path] = exc
                continue
            comment = header_comment(text)
            con.execute(f"COMMENT ON VIEW {path.stem} IS {quote_literal(comment)}")
            created.append(path.stem)
            del pending[path]
        if errors and len(created) == created_before:  # a round without progress: give up
            problems = "; ".join(f"`{p.stem}`: {str(e).splitlines()[0]}" for p, e in errors.items())
            raise LakeError(sql_dir(), f"views cannot be created: {problems}")
    return created


def _check_view_file(path: Path, text: str) -> None:
    match = _VIEW_STATEMENT.search(text)
    if match is None or match.group(1) != path.stem:
        raise LakeError(path, f"must hold one `CREATE OR REPLACE VIEW {path.stem} AS ...`")


def build_catalog(lake: Path) -> Path:
    """(Re)build `LAKE/tokenlake.duckdb`; replaced atomically so readers never see half of it.

    Returns:
        The path of the catalog file.
    """
    import duckdb

    lake = lake.resolve()
    target = lake / schema.CATALOG_FILE
    tmp = lake / f".{schema.CATALOG_FILE}.{os.getpid()}.tmp"
    tmp.unlink(missing_ok=True)
    try:
        # Storage format 1.0: DuckDB clients from 1.0 on can open the catalog (it holds only
        # views, so nothing newer is needed).
        con = duckdb.connect(str(tmp), config={"storage_compatibility_version": "v1.0.0"})
        try:
            create_base_views(con, lake)
            for path in iter_macro_files():
                con.execute(path.read_text(encoding="utf-8"))
            create_sql_views(con)
        finally:
            con.close()
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
        Path(f"{tmp}.wal").unlink(missing_ok=True)
    log.info("catalog %s rebuilt", target)
    return target


def connect(lake: Path, *, read_only: bool = True) -> duckdb.DuckDBPyConnection:
    """Open the lake's catalog."""
    import duckdb

    path = lake / schema.CATALOG_FILE
    if not path.is_file():
        raise LakeError(lake, f"has no `{schema.CATALOG_FILE}`; run `tokenlake extract` first")
    return duckdb.connect(str(path), read_only=read_only)
