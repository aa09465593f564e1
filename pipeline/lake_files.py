"""Housekeeping of the lake directory: the writer lock, the `runs` row, and removal of files
that no manifest lists (superseded generations, leftovers of a crash).
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa

from pipeline import __version__, manifest, schema, write
from pipeline.errors import LakeError

log = logging.getLogger(__name__)

LOCK_FILE = ".tokenlake.lock"


@contextmanager
def lake_lock(lake: Path) -> Iterator[None]:
    """One writer per lake at a time; a second extraction fails at once with a clear error."""
    path = lake / manifest.MANIFEST_DIR / LOCK_FILE
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path, "a")  # noqa: SIM115 - held for the whole extraction
    except OSError as exc:  # e.g. a read-only lake, or `_manifest` is a file
        where = f"`{exc.filename}`: " if exc.filename else ""
        raise LakeError(lake, f"cannot be written ({where}{exc.strerror or exc})") from exc
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise LakeError(
                lake, "another tokenlake extraction is writing to it; wait for it to finish"
            ) from exc
        yield
    finally:
        handle.close()


def write_run_row(lake: Path, record: manifest.RunManifest) -> None:
    """Write the run's `runs` row under a fresh name and list it in the manifest record."""
    steps = record.steps.values()
    row = {
        "source_dir": record.source_dir,
        "extracted_at": datetime.now(timezone.utc),
        "tool": f"{schema.TOOL_NAME} {__version__}",
        "schema_version": schema.SCHEMA_VERSION,
        "train_steps": sum(1 for s in steps if not s.evaluation),
        "eval_steps": sum(1 for s in steps if s.evaluation),
    }
    table = pa.Table.from_pylist([row], schema=schema.RUNS_SCHEMA)
    relative = f"{schema.partition_dir(schema.RUNS, record.run)}/run-{secrets.token_hex(4)}.parquet"
    metadata = write.file_metadata(schema.RUNS, record.run, record.source_dir)
    write.write_parquet(lake / relative, schema.RUNS, table, metadata)
    record.runs_file = relative


def refresh_vocab(lake: Path, record: manifest.RunManifest) -> bool:
    """Write the run's `vocab` file when the dump's tokenizer is new or changed.

    Returns:
        Whether the record changed (a vocab written, or dropped because the tokenizer is gone).
    """
    from pipeline import vocab

    root = Path(record.source_dir)
    source = vocab.tokenizer_file(root)
    if source is None:
        changed = record.vocab_file is not None
        record.vocab_file, record.vocab_source = None, None
        return changed
    # Identified like every other source (name, size, mtime): no re-reading on each round.
    stamp = manifest.SourceFile.of(source, root)
    if stamp == record.vocab_source and record.vocab_file and (lake / record.vocab_file).is_file():
        return False
    name = f"vocab-{secrets.token_hex(4)}.parquet"
    relative = f"{schema.partition_dir(schema.VOCAB, record.run)}/{name}"
    metadata = write.file_metadata(schema.VOCAB, record.run, str(source))
    write.write_parquet(lake / relative, schema.VOCAB, vocab.vocab_table(source), metadata)
    record.vocab_file, record.vocab_source = relative, stamp
    return True


def delete_unlisted(lake: Path, record: manifest.RunManifest) -> int:
    """Delete the run's files that its manifest does not list; returns how many.

    Safe only under `lake_lock`: then no other writer has files in flight.
    """
    listed = {lake / name for table in schema.TABLES for name in record.files(table)}
    deleted = 0
    for table in schema.TABLES:
        run_dir = lake / table / f"{schema.RUN}={record.run}"
        if not run_dir.is_dir():
            continue
        for path in sorted(run_dir.rglob("*"), reverse=True):  # files before their folders
            if path.is_dir():
                if not any(path.iterdir()):
                    path.rmdir()
            elif path not in listed:
                path.unlink()
                deleted += 1
        if not any(run_dir.iterdir()):
            run_dir.rmdir()
    if deleted:
        log.info("deleted %d files of run %s that no manifest lists", deleted, record.run)
    return deleted


# Temporary names of the catalog and of manifests: `.<name>.<pid>.tmp` (and DuckDB's `.wal`).
_TEMPORARY = re.compile(r"^\..+\.(\d+)\.tmp(\.wal)?$")


def delete_stale_temporaries(lake: Path) -> int:
    """Delete temporary catalog and manifest files left by killed processes; returns how many.

    A file whose writer (the pid in its name) still runs is kept: `tokenlake views` builds the
    catalog without taking the lake lock.
    """
    deleted = 0
    for folder in (lake, lake / manifest.MANIFEST_DIR):
        if not folder.is_dir():
            continue
        for path in folder.iterdir():
            match = _TEMPORARY.match(path.name)
            if match and path.is_file() and not _process_alive(int(match.group(1))):
                path.unlink(missing_ok=True)
                deleted += 1
    return deleted


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
