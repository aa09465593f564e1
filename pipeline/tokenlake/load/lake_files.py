"""The lake's per-run side files: the `runs` row, the `vocab` table and the `metrics` table.

Names and storage come from the lake's store (`tokenlake.store.base.Store`); this module only
decides what the files hold.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenlake import __version__, bounded, schema, tags
from tokenlake.errors import SHOWN_PATH_CHARS, BoundedReadError, DumpFormatError, LakeError, shown
from tokenlake.layout import new_name
from tokenlake.load import write
from tokenlake.store import manifest, parquet
from tokenlake.store.base import Store
from tokenlake.store.local import LocalStore

if TYPE_CHECKING:  # imported where a file is read or written: `tokenlake tag` needs neither
    import duckdb
    import pyarrow as pa

log = logging.getLogger(__name__)

HEAD_BYTES = 4096  # bytes of a metrics stream fingerprinted to notice a rewrite
MAX_METRICS_FILES = 32  # past this many, a run's metrics files are merged into one


def write_run_row(
    store: Store,
    record: manifest.RunManifest,
    keep: dict[str, Any] | None = None,
    dump_format: str | None = None,
) -> list[str]:
    """Write the run's `runs` row under a fresh name and list it in the manifest record.

    Args:
        keep: The current row (`stored_run_row`): its metadata and `extracted_at` are kept
            and the dump is not read (`tokenlake tag`). Default: the metadata is read from
            the dump's `dashboard/meta.json` (its identity kept in `record.meta_source`).

    Returns:
        Warnings about a malformed meta.json (each names the file); never raises for one.
    """
    warnings: list[str] = []
    if keep is None:
        from tokenlake.read import dashboard
        from tokenlake.read.remote.remote_dump import local_root, urls_in

        meta, warnings = dashboard.read_run_meta(local_root(record.source_dir))
        warnings = [urls_in(record.source_dir, warning) for warning in warnings]
        record.meta_source = meta_source(record)
    else:
        meta = {n: keep.get(n) for n in schema.RUN_META_SCHEMA.names if n != schema.TAGS_JSON}
    row = {
        **_fresh_values(record),
        "extracted_at": (keep or {}).get("extracted_at") or datetime.now(timezone.utc),
        **meta,
        **format_columns(dump_format, keep),
    }
    table = schema.table_from_rows(schema.RUNS, [row])
    name = new_name(schema.RUNS, record.run, "run")
    metadata = write.file_metadata(schema.RUNS, record.run, record.source_dir)
    record.side_identities[name] = write.write_lake_file(store, name, schema.RUNS, table, metadata)
    record.runs_file = name
    return warnings


def _fresh_values(record: manifest.RunManifest) -> dict[str, Any]:
    """The `runs` values every write of the row sets anew: the others come from the dump, or
    are kept from the current row."""
    steps = record.steps.values()
    return {
        "source_dir": record.source_dir,
        "tool": f"{schema.TOOL_NAME} {__version__}",
        "schema_version": schema.SCHEMA_VERSION,
        "train_steps": sum(1 for s in steps if not s.evaluation),
        "eval_steps": sum(1 for s in steps if s.evaluation),
        schema.TAGS_JSON: tags.tags_json(record.tags),
    }


# A `runs` file of at most this many bytes is rewritten by `rewrite_run_row` (one row of run
# metadata: a few KiB; a larger one is rewritten by `write_run_row`).
REWRITTEN_BY_DUCKDB_BYTES = 1 << 20


def rewrite_run_row(
    con: duckdb.DuckDBPyConnection, store: LocalStore, record: manifest.RunManifest
) -> bool:
    """`write_run_row(store, record, keep=stored_run_row(store, record))` through DuckDB, which
    `tokenlake tag` has imported anyway, rather than pyarrow: the same row, file schema and
    metadata, without the ~0.15 s of CPU importing pyarrow costs.

    The current file is read by DuckDB from a private copy of its bytes, taken without
    following a link, and only where they are the file its manifest records (`footer_identity`)
    and a plain `runs` file: at most REWRITTEN_BY_DUCKDB_BYTES, one row, every column a `runs`
    column of its type, its footer declaring at most `parquet.decoded_bound` of its size
    decoded. Any other file, or one DuckDB cannot decode, is left to `write_run_row` (which
    reads it, or names what is wrong with it).

    Returns:
        Whether the row was written (the record then lists it).
    """
    if record.runs_file is None:
        return False
    recorded = record.side_identities.get(record.runs_file)
    data = _small_file_bytes(store, record.runs_file)
    if data is None or recorded is None or parquet.bytes_identity(data) != recorded:
        return False
    import duckdb

    try:
        with _private_copy(data) as copy:
            held = _plain_runs_columns(con, copy, len(data))
            if held is None:
                return False
            row_sql, parameters = _rewritten_row_sql(record, held)
            name = new_name(schema.RUNS, record.run, "run")
            metadata = write.file_metadata(schema.RUNS, record.run, record.source_dir)
            identity = write.write_runs_file_by_duckdb(
                con, store, name, row_sql, [*parameters, str(copy)], metadata
            )
    except (duckdb.Error, OSError):  # DuckDB could not read it, or no private copy was made
        return False
    record.side_identities[name] = identity
    record.runs_file = name
    return True


def _small_file_bytes(store: LocalStore, name: str) -> bytes | None:
    """The listed file's bytes, opened without following a link; None where it is not a
    regular file of at most REWRITTEN_BY_DUCKDB_BYTES, or cannot be read."""
    try:
        opened = store.open_listed(name)
    except (OSError, LakeError):
        return None
    if opened is None:
        return None
    descriptor, size = opened
    try:
        if size > REWRITTEN_BY_DUCKDB_BYTES:
            return None
        data = os.pread(descriptor, size + 1, 0)
    except OSError:
        return None
    finally:
        os.close(descriptor)
    return data if len(data) == size else None  # else it changed since it was opened


@contextmanager
def _private_copy(data: bytes) -> Iterator[Path]:
    """`data` in a new file only this user can write, removed afterwards: what DuckDB reads is
    the bytes checked, whatever happens to the lake's file meanwhile."""
    descriptor, path = tempfile.mkstemp(prefix="tokenlake-runs-", suffix=".parquet")
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
        yield Path(path)
    finally:
        os.unlink(path)


def _plain_runs_columns(con: duckdb.DuckDBPyConnection, copy: Path, size: int) -> set[str] | None:
    """The columns of the `runs` file `copy` (of `size` bytes), or None where it is not plain:
    not one row, columns that are not `runs` columns of their type, no base columns, or
    declaring more decoded bytes than `parquet.decoded_bound` allows."""
    where = [str(copy)]
    rows = con.execute("SELECT num_rows FROM parquet_file_metadata(?)", where).fetchall()
    declared = con.execute(
        "SELECT COALESCE(SUM(total_uncompressed_size), 0) FROM parquet_metadata(?)", where
    ).fetchall()
    if rows != [(1,)] or declared[0][0] > parquet.decoded_bound(size):
        return None
    described = con.execute(
        "DESCRIBE SELECT * FROM read_parquet(?, hive_partitioning = false)", where
    ).fetchall()
    held = {name: kind for name, kind, *_ in described}
    types = {c.name: c.duckdb_type for c in schema.RUNS_COLUMNS}
    plain = len(held) == len(described) and all(types.get(n) == k for n, k in held.items())
    based = all(c.name in held for c in schema.RUNS_BASE_COLUMNS)
    return set(held) if plain and based else None


def _rewritten_row_sql(record: manifest.RunManifest, held: set[str]) -> tuple[str, list[object]]:
    """The SELECT of the `runs` row `write_run_row` writes with `keep`, from the current file
    (its path the last parameter, for the caller to add) holding the columns `held`: fresh
    values as parameters, the others kept (NULL where the file predates them)."""
    fresh = _fresh_values(record)
    selected: list[str] = []
    parameters: list[object] = []
    for column in schema.RUNS_COLUMNS:
        if column.name in fresh:
            selected.append("?")
            parameters.append(fresh[column.name])
        elif column.name == "extracted_at":
            selected.append('COALESCE("extracted_at", ?)')
            parameters.append(datetime.now(timezone.utc))
        else:
            selected.append(f'"{column.name}"' if column.name in held else "NULL")
    columns = ", ".join(selected)
    return f"SELECT {columns} FROM read_parquet(?, hive_partitioning = false)", parameters


def forget_changed_side_files(store: Store, record: manifest.RunManifest) -> bool:
    """Make the next writes of the run's side files replace those that are missing, cannot be
    read or are not the files written (a stranger rewrote them, or their footers): a `runs`
    row is written with every publish, a `vocab` file once its tokenizer counts as unseen, the
    `metrics` once every stream is read again from the start.

    Returns:
        Whether any was found (the run must be published again).
    """
    changed = [name for name in record.side_files() if _not_as_written(store, record, name)]
    if record.vocab_file in changed:
        record.vocab_source = None
    if any(name in changed for name in record.metrics_files):
        record.metrics_files, record.metrics_sources = [], {}
    return bool(changed)


def _not_as_written(store: Store, record: manifest.RunManifest, name: str) -> bool:
    recorded = record.side_identities.get(name)
    try:
        if recorded is None:  # written before manifests recorded identities
            return not store.exists(name)
        return parquet.footer_identity(store, name) != recorded
    except parquet.UnreadableLakeFile:
        return True


def format_columns(dump_format: str | None, keep: dict[str, Any] | None) -> dict[str, Any]:
    """The `runs` format columns: of `dump_format`, else kept from the current row (NULL in
    a row written before they existed)."""
    if dump_format is None:
        return {name: (keep or {}).get(name) for name in schema.RUN_FORMAT_SCHEMA.names}
    from tokenlake.read import formats

    fmt = formats.FORMATS[dump_format]
    return {
        schema.FRAMEWORK: fmt.framework,
        schema.DUMP_FORMAT: fmt.name,
        schema.FORMAT_VERSION: fmt.version,
    }


def meta_source(record: manifest.RunManifest) -> manifest.SourceFile | None:
    """Identity (name, size, mtime) of the dump's `dashboard/meta.json`, None if absent."""
    from tokenlake.read import dashboard
    from tokenlake.read.dump import Dump
    from tokenlake.read.remote.remote_dump import local_root

    root = local_root(record.source_dir)
    path = Dump(root).dashboard_dir / dashboard.META_FILE
    try:
        return manifest.SourceFile.of(path, root) if path.is_file() else None
    except OSError:
        return None


def stored_run_row(store: Store, record: manifest.RunManifest) -> dict[str, Any]:
    """The run's current `runs` row as a dict (a file of schema version 1 lacks the metadata
    columns: absent keys), so it can be rewritten without reading the dump."""
    if record.runs_file is None:
        return {}
    recorded = record.side_identities.get(record.runs_file)
    try:
        changed = (
            None if recorded is None else parquet.identity_change(store, record.runs_file, recorded)
        )
        rows = parquet.read_rows(store, record.runs_file, 1)
    except parquet.UnreadableLakeFile as exc:
        raise LakeError(exc.path, f"cannot be read ({exc.reason}); extract the run again") from exc
    if changed is not None:  # its values would be written again as the run's own
        raise LakeError(store.url(record.runs_file), f"{changed}; extract the run again")
    return rows[0] if rows else {}


# ---------------------------------------------------------------------------------------------
# metrics
# ---------------------------------------------------------------------------------------------


def _head(path: Path, offset: int) -> str:
    """blake2b of the first `min(offset, HEAD_BYTES)` bytes of a metrics stream."""
    try:
        with bounded.open_regular(path) as handle:
            return hashlib.blake2b(handle.read(min(offset, HEAD_BYTES)), digest_size=16).hexdigest()
    except (OSError, BoundedReadError):
        return ""


def _rewritten(record: manifest.RunManifest, files: dict[str, Path]) -> list[str]:
    """Streams read before that are gone, or whose first bytes changed (rewritten in place)."""
    return [
        name
        for name, source in record.metrics_sources.items()
        if name not in files or _head(files[name], source.offset) != source.head
    ]


def refresh_metrics(store: Store, record: manifest.RunManifest) -> tuple[bool, list[str]]:
    """Read the lines the dump's metrics streams gained since the last extraction.

    New rows go into new `metrics` files listed in `record`, one per
    `dashboard.MAX_READ_BYTES` of lines (so memory stays bounded); the offsets move on (a
    half-written last line waits for later). A stream that shrank, was rewritten or removed
    makes every stream read again from byte 0 (the old files are then unlisted).

    Returns:
        Whether the record changed, and warnings (bad lines, skipped values, restarts).
    """
    from tokenlake.read import dashboard
    from tokenlake.read.dump import Dump
    from tokenlake.read.remote.remote_dump import local_root, urls_in

    root = local_root(record.source_dir)
    files = dashboard.metrics_files(root)
    gone = _rewritten(record, files)
    warnings = [
        f"`{shown(_stream_path(root, name), SHOWN_PATH_CHARS)}` was rewritten or removed"
        " since it was read; the run's metrics are read again from the start."
        for name in gone
    ]
    sources = {} if gone else dict(record.metrics_sources)
    changed, skipped = bool(gone and record.metrics_files), 0
    if gone:
        record.metrics_files = []
    while True:
        starts = {name: source.offset for name, source in sources.items()}
        long_lines = {name for name, source in sources.items() if source.inside_long}
        read = dashboard.read_metrics(root, starts, long_lines)
        if read.restarted:  # a stream shrank: nothing read before can be trusted
            changed, record.metrics_files = changed or bool(record.metrics_files), []
            read = dashboard.read_metrics(root, {})
        warnings += read.warnings
        skipped += read.skipped
        sources = {
            name: manifest.MetricsSource(
                offset, _head(files[name], offset), name in read.inside_long
            )
            for name, offset in read.offsets.items()
        }
        if read.table.num_rows:
            record.metrics_files.append(_write_metrics(store, record, read.table))
            changed = True
        if not read.more:
            break
    if skipped:  # named by the one stream read, else by the folder of miles' streams
        where = files[next(iter(files))] if len(files) == 1 else Dump(root).dashboard_dir
        warnings.append(
            f"`{shown(where, SHOWN_PATH_CHARS)}`: {skipped} non-numeric metric values skipped"
            " (strings, null, lists, objects, integers beyond float64)."
        )
    changed = changed or sources != record.metrics_sources
    record.metrics_sources = sources
    if len(record.metrics_files) > MAX_METRICS_FILES:
        record.metrics_files = [_merge_metrics(store, record)]
    return changed, [urls_in(record.source_dir, warning) for warning in warnings]


def _stream_path(root: Path, name: str) -> Path:
    """A metrics stream's file, from its name under `dashboard/` (prime-rl's `../metrics.jsonl`
    is beside `dashboard/`, which its dump does not have: the path must not pass through it).

    Examples:
        >>> str(_stream_path(Path("run"), "../metrics.jsonl"))
        'run/metrics.jsonl'
        >>> str(_stream_path(Path("run"), "metrics/20260101_00.jsonl"))
        'run/dashboard/metrics/20260101_00.jsonl'
    """
    from tokenlake.read.dump import Dump

    return Path(os.path.normpath(Dump(root).dashboard_dir / name))


def _write_metrics(store: Store, record: manifest.RunManifest, table: pa.Table) -> str:
    name = new_name(schema.METRICS, record.run, "metrics")
    metadata = write.file_metadata(schema.METRICS, record.run, record.source_dir)
    record.side_identities[name] = write.write_lake_file(
        store, name, schema.METRICS, table, metadata
    )
    return name


def _merge_metrics(store: Store, record: manifest.RunManifest) -> str:
    """One file for all of the run's metrics files (a long `--follow` writes one per round)."""
    import pyarrow as pa

    try:
        parts = [parquet.read_table(store, name) for name in record.metrics_files]
    except parquet.UnreadableLakeFile as exc:
        raise LakeError(store.location, f"metrics files cannot be merged ({exc.reason})") from exc
    merged = pa.concat_tables([p.replace_schema_metadata(None) for p in parts])
    return _write_metrics(store, record, merged)


# ---------------------------------------------------------------------------------------------
# vocab
# ---------------------------------------------------------------------------------------------


def refresh_vocab(
    store: Store, record: manifest.RunManifest
) -> tuple[bool, tuple[Path | str, str] | None]:
    """Write the run's `vocab` file when the dump's tokenizer is new or changed.

    A tokenizer that cannot be read is not an error: the run gets no vocab (token texts are
    NULL) and the warning is returned, once per version of the file.

    Returns:
        Whether the record changed, and (file, warning) if the tokenizer could not be read.
    """
    from tokenlake.read import dump, vocab
    from tokenlake.read.remote.remote_dump import local_root, shown_path

    root = local_root(record.source_dir)
    source = dump.Dump(root).tokenizer_file
    if source is None:
        changed = record.vocab_file is not None
        record.vocab_file, record.vocab_source = None, None
        return changed, None
    # Identified like every other source (name, size, mtime): no re-reading on each round.
    stamp = _tokenizer_stamp(source, root)
    if stamp == record.vocab_source and (
        record.vocab_file is None or store.exists(record.vocab_file)
    ):
        return False, None  # unchanged (a broken one was reported when it was first seen)
    try:
        table = vocab.vocab_table(source, within=root)
    except DumpFormatError as exc:
        changed = record.vocab_file is not None or record.vocab_source != stamp
        record.vocab_file, record.vocab_source = None, stamp
        shown_source = shown_path(record.source_dir, source)
        return changed, (shown_source, f"{exc.problem}; token texts are NULL until it is fixed")
    name = new_name(schema.VOCAB, record.run, "vocab")
    metadata = write.file_metadata(schema.VOCAB, record.run, shown_path(record.source_dir, source))
    record.side_identities[name] = write.write_lake_file(store, name, schema.VOCAB, table, metadata)
    record.vocab_file, record.vocab_source = name, stamp
    return True, None


def _tokenizer_stamp(source: Path, root: Path) -> manifest.SourceFile:
    """The tokenizer file's identity; a broken or looping link's is the link's own (its target
    cannot be stat'ed), so that the warning about it comes once, not on every round."""
    try:
        return manifest.SourceFile.of(source, root)
    except OSError:
        link = source.lstat()
        return manifest.SourceFile(str(source.relative_to(root)), link.st_size, link.st_mtime_ns)
