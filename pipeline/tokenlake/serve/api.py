"""The Python API for notebooks: `tokenlake.open_lake(path)` returns a `TokenLake`.

`TokenLake` reads a lake: SQL through its DuckDB catalog (`.sql`), and the tables as polars
LazyFrames over exactly the Parquet files the run manifests list (`.tokens`, `.samples`,
`.runs`, `.metrics`), never a glob, so leftovers of a crashed extraction are never read. It
takes no lock to read: an extraction may run meanwhile, in this process (`.extract`) or
another one.

Consistency: each call reads the manifests once, so a frame holds the files of one manifest
snapshot per run (the previous extraction's or the new one's, never a mix). An extraction
deletes superseded files only after it has committed the new manifest; a call that finds a
listed file gone reads the manifests again, once. A LazyFrame is lazy: collect it soon, or
call the method again after an extraction (see docs/python.md).

Examples:
    >>> import tempfile
    >>> from pathlib import Path
    >>> import tokenlake
    >>> from tokenlake.tools import synth
    >>> folder = Path(tempfile.mkdtemp())
    >>> synth.write_dump(folder / "dump", synth.PRESETS["example"])
    >>> lake = tokenlake.open_lake(folder / "lake", create=True)
    >>> lake.extract(folder / "dump", run_name="demo", tags={"precision": "fp8"}).counts["new"]
    4
    >>> lake.sql("SELECT count(*) AS n FROM tokens").fetchall()
    [(4079,)]
    >>> step0 = lake.tokens(run="demo", steps=[0], columns=["evaluation", "lp_diff"])
    >>> step0.group_by("evaluation").len().sort("evaluation").collect().rows()  # train, eval
    [(False, 1234), (True, 709)]
    >>> lake.sql("SELECT rollout_id, n_samples FROM step_stats ORDER BY 1").pl().rows()
    [(0, 32), (1, 32), (2, 32)]
    >>> lake.runs().select("run", "tags_json").collect().rows()
    [('demo', '{"precision": "fp8"}')]
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenlake import schema
from tokenlake.errors import LakeError
from tokenlake.load import manifest
from tokenlake.load.lake import lake_at
from tokenlake.load.local_lake import Lake

if TYPE_CHECKING:
    import duckdb
    import polars as pl

    from tokenlake.load.extract import ExtractSummary
    from tokenlake.load.object_lake import ObjectLake

log = logging.getLogger(__name__)


def open_lake(path: Path | str, *, create: bool = False) -> TokenLake:
    """Open the lake at `path` for reading (and for `.extract`).

    Args:
        path: The lake root (the `--lake` directory of `tokenlake extract`).
        create: Allow a folder that is not a lake yet (its first `.extract` makes it one).

    Raises:
        LakeError: `path` is not a lake (and `create` is false), or is a dump.

    Examples:
        >>> open_lake("/nonexistent/lake")
        Traceback (most recent call last):
        ...
        tokenlake.errors.LakeError: Lake `/nonexistent/lake`: is not a lake: it has no `_manifest/`; run `tokenlake extract` first
    """
    return TokenLake(path, create=create)


class TokenLake:
    """A lake, read through its manifests and catalog. Create it with `tokenlake.open_lake`.

    (`tokenlake.load.local_lake.Lake` and `ObjectLake` are other classes: the internal owners of
    a lake's files, named by pipeline/tokenlake/load/lake.py.)
    """

    def __init__(self, path: Path | str, *, create: bool = False) -> None:
        self._layout = lake_at(path)
        if not create:
            self._layout.require()
        elif self._layout.is_dump():
            self._layout.require()  # says it is a dump
        self._con: duckdb.DuckDBPyConnection | None = None
        self._con_stamp: object = None

    def __repr__(self) -> str:
        return f"TokenLake({str(self.root)!r})"

    @property
    def root(self) -> Path | str:
        """The lake's absolute path (or its URL on an object store)."""
        return self._layout.location

    # --- SQL ---------------------------------------------------------------------------------

    def sql(self, query: str) -> duckdb.DuckDBPyRelation:
        """Run SQL against the catalog (every view of docs/views.md, and the user's views).

        Returns a DuckDB relation: `.pl()` (polars), `.df()` (pandas), `.arrow()`,
        `.fetchall()`. The catalog is opened read-only, and opened again when an extraction
        has replaced it since the last call (relations of earlier calls then stop working:
        run `.sql` again).
        """
        return self._connection().sql(query)

    def close(self) -> None:
        """Close the catalog connection (the next `.sql` opens it again)."""
        if self._con is not None:
            self._con.close()
        self._con, self._con_stamp = None, None

    def _connection(self) -> duckdb.DuckDBPyConnection:
        from tokenlake.serve import catalog

        stamp = _catalog_stamp(self._layout)
        if self._con is None or stamp != self._con_stamp:
            self.close()  # one connection per file: DuckDB caches databases by path
            self._con = catalog.connect(self.root)
            self._con_stamp = stamp
        return self._con

    # --- frames ------------------------------------------------------------------------------

    def tokens(
        self,
        run: str | Iterable[str] | None = None,
        steps: Iterable[int] | None = None,
        columns: Sequence[str] | None = None,
    ) -> pl.LazyFrame:
        """The `tokens` table (train and eval rows) as a polars LazyFrame.

        Args:
            run: One run name, several, or None for every run.
            steps: Only these `rollout_id`s (their train and eval files); None for all.
            columns: Only these columns of `tokens` (besides `run`, `rollout_id`, always
                first); None for all.
        """
        return self._frame(schema.TOKENS, run, steps, columns)

    def samples(
        self,
        run: str | Iterable[str] | None = None,
        steps: Iterable[int] | None = None,
        columns: Sequence[str] | None = None,
    ) -> pl.LazyFrame:
        """The `samples` table as a polars LazyFrame (arguments as in `tokens`)."""
        return self._frame(schema.SAMPLES, run, steps, columns)

    def runs(self) -> pl.LazyFrame:
        """The `runs` table (one row per run) as a polars LazyFrame."""
        return self._frame(schema.RUNS, None, None, None)

    def metrics(self, run: str | Iterable[str] | None = None) -> pl.LazyFrame:
        """The `metrics` table (logged metrics, long format) as a polars LazyFrame."""
        return self._frame(schema.METRICS, run, None, None)

    def _frame(
        self,
        table: str,
        run: str | Iterable[str] | None,
        steps: Iterable[int] | None,
        columns: Sequence[str] | None,
    ) -> pl.LazyFrame:
        runs = None if run is None else {run} if isinstance(run, str) else set(run)
        wanted = None if steps is None else set(steps)
        names = _columns(table, columns)
        for _attempt in (1, 2):
            listed = _listed_files(self._layout, table, runs, wanted)
            if all(self._layout.exists(name) for name, _ in listed):
                if isinstance(self._layout, Lake):
                    located = [(self._layout.file(n), v) for n, v in listed]
                    return _scan(table, located, names, self._layout.root)
                return _scan_objects(table, listed, names, self._layout)
            log.info("a listed file vanished (an extraction committed meanwhile); reading again")
        gone = next(name for name, _ in listed if not self._layout.exists(name))
        raise LakeError(
            self._layout.url(gone), "is listed by its run's manifest but is gone; read again"
        )

    # --- writing -----------------------------------------------------------------------------

    def extract(
        self, dump: Path | str, run_name: str | None = None, **options: Any
    ) -> ExtractSummary:
        """Extract a dump into this lake: `tokenlake.load.extract.extract_run`, same options
        (`steps`, `workers`, `replace`, `tags`, ...); takes the writer lock while it runs."""
        from tokenlake.load.extract import extract_run
        from tokenlake.read.remote_dump import is_remote

        self.close()
        source = dump if is_remote(dump) else Path(dump)  # a Path would fold a URL's `//`
        return extract_run(source, self._layout.location, run_name, **options)


def _columns(table: str, columns: Sequence[str] | None) -> list[str]:
    """The table's file columns to read, checked against the schema."""
    names = schema.TABLE_SCHEMAS[table].names
    if columns is None:
        return list(names)
    unknown = [c for c in columns if c not in names and c not in schema.TABLE_PARTITIONS[table]]
    if unknown:
        raise LakeError(Path(table), f"has no column `{unknown[0]}` (columns: {', '.join(names)})")
    return [c for c in names if c in columns]


def _catalog_stamp(layout: Lake | ObjectLake) -> object:
    """What changes when the catalog is replaced (None when there is none)."""
    if isinstance(layout, Lake):
        try:
            stat = layout.catalog_path.stat()
        except OSError:
            return None
        return (stat.st_ino, stat.st_mtime_ns)
    try:
        layout.fs.invalidate_cache()
        return layout.fs.info(layout.key(layout.catalog_name)).get("ETag")
    except OSError:
        return None


def _listed_files(
    layout: Lake | ObjectLake, table: str, runs: set[str] | None, steps: set[int] | None
) -> list[tuple[str, dict[str, Any]]]:
    """(file relative to the lake, partition values) of every file the manifests list: one
    read of each manifest."""
    listed: list[tuple[str, dict[str, Any]]] = []
    for record in manifest.load_all(layout.location):
        if runs is not None and record.run not in runs:
            continue
        if schema.ROLLOUT_ID not in schema.TABLE_PARTITIONS[table]:
            listed += [(n, {schema.RUN: record.run}) for n in record.files(table)]
            continue
        ordered = sorted(record.steps.values(), key=lambda s: (s.rollout_id, s.evaluation))
        for step in ordered:
            if table in step.files and (steps is None or step.rollout_id in steps):
                partition = {schema.RUN: record.run, schema.ROLLOUT_ID: step.rollout_id}
                listed.append((step.files[table], partition))
    return listed


_FILE_COLUMN = "__tokenlake_file"


def _scan(
    table: str, listed: list[tuple[Path, dict[str, Any]]], names: list[str], root: Path
) -> pl.LazyFrame:
    """One LazyFrame over exactly the listed files, partition columns first, typed as in the
    catalog; a file lacking a column of the schema (a `runs` file of schema version 1) reads
    NULL there.

    The partition columns come from polars' Hive parsing, so a filter on them skips whole
    files, except when the lake's own path holds a `key=value` folder (`/data/run=x/lake`),
    which that parsing would read too: then they come from the manifests, file by file.
    """
    import polars as pl

    partitions = schema.TABLE_PARTITIONS[table]
    types = _polars_types(table)
    if not listed:
        return pl.LazyFrame(schema={c: types[c] for c in (*partitions, *names)})
    options: dict[str, Any] = {
        "schema": {n: types[n] for n in schema.TABLE_SCHEMAS[table].names},
        "missing_columns": "insert",
        "extra_columns": "ignore",
        "glob": False,  # a path is a path, never a pattern
    }
    paths = [str(path) for path, _ in listed]
    if "=" not in str(root):
        hive = {c: types[c] for c in partitions}
        frame = pl.scan_parquet(paths, hive_partitioning=True, hive_schema=hive, **options)
    else:
        frame = pl.scan_parquet(
            paths, hive_partitioning=False, include_file_paths=_FILE_COLUMN, **options
        )
        frame = frame.with_columns(
            pl.col(_FILE_COLUMN)
            .replace_strict({str(p): v[c] for p, v in listed}, return_dtype=types[c])
            .alias(c)
            for c in partitions
        )
    return frame.select(*partitions, *names)


def _scan_objects(
    table: str, listed: list[tuple[str, dict[str, Any]]], names: list[str], layout: ObjectLake
) -> pl.LazyFrame:
    """`_scan` for a lake on an object store: a pyarrow dataset over exactly the listed
    objects, read through the lake's fsspec filesystem, partition values from the manifests."""
    import polars as pl
    import pyarrow as pa
    import pyarrow.dataset as ds

    partitions = schema.TABLE_PARTITIONS[table]
    types = _polars_types(table)
    if not listed:
        return pl.LazyFrame(schema={c: types[c] for c in (*partitions, *names)})
    fields = [pa.field(c, schema.PARTITION_TYPES[c]) for c in partitions]
    dataset = ds.dataset(
        [layout.key(name) for name, _ in listed],
        schema=pa.schema([*schema.TABLE_SCHEMAS[table], *fields]),
        format="parquet",
        filesystem=layout.fs,
        partitioning=ds.partitioning(pa.schema(fields), flavor="hive"),
        partition_base_dir=f"{layout.base}/{table}",
    )
    return pl.scan_pyarrow_dataset(dataset).select(*partitions, *names)


def _polars_types(table: str) -> dict[str, Any]:
    """Column -> polars dtype of a table, partition columns included (from tokenlake.schema)."""
    import polars as pl
    import pyarrow as pa

    fields = [pa.field(c, schema.PARTITION_TYPES[c]) for c in schema.TABLE_PARTITIONS[table]]
    empty = pl.from_arrow(pa.schema([*fields, *schema.TABLE_SCHEMAS[table]]).empty_table())
    assert isinstance(empty, pl.DataFrame)
    return dict(empty.schema)
