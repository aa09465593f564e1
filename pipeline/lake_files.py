"""The lake's per-run side files: the `runs` row and the `vocab` table.

Paths come from `pipeline.lake.Lake`; this module only decides what the files hold.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa

from pipeline import __version__, manifest, schema, write
from pipeline.errors import DumpFormatError
from pipeline.lake import Lake

log = logging.getLogger(__name__)


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
    layout = Lake(lake)
    path = layout.new_file(schema.RUNS, record.run, "run")
    metadata = write.file_metadata(schema.RUNS, record.run, record.source_dir)
    write.write_parquet(path, schema.RUNS, table, metadata)
    record.runs_file = layout.relative(path)


def refresh_vocab(lake: Path, record: manifest.RunManifest) -> tuple[bool, tuple[Path, str] | None]:
    """Write the run's `vocab` file when the dump's tokenizer is new or changed.

    A tokenizer that cannot be read is not an error: the run gets no vocab (token texts are
    NULL) and the warning is returned, once per version of the file.

    Returns:
        Whether the record changed, and (file, warning) if the tokenizer could not be read.
    """
    from pipeline import dump, vocab

    root = Path(record.source_dir)
    source = dump.Dump(root).tokenizer_file
    if source is None:
        changed = record.vocab_file is not None
        record.vocab_file, record.vocab_source = None, None
        return changed, None
    layout = Lake(lake)
    # Identified like every other source (name, size, mtime): no re-reading on each round.
    stamp = manifest.SourceFile.of(source, root)
    if stamp == record.vocab_source and (
        record.vocab_file is None or layout.file(record.vocab_file).is_file()
    ):
        return False, None  # unchanged (a broken one was reported when it was first seen)
    try:
        table = vocab.vocab_table(source)
    except DumpFormatError as exc:
        changed = record.vocab_file is not None or record.vocab_source != stamp
        record.vocab_file, record.vocab_source = None, stamp
        return changed, (source, f"{exc.problem}; token texts are NULL until it is fixed")
    path = layout.new_file(schema.VOCAB, record.run, "vocab")
    metadata = write.file_metadata(schema.VOCAB, record.run, str(source))
    write.write_parquet(path, schema.VOCAB, table, metadata)
    record.vocab_file, record.vocab_source = layout.relative(path), stamp
    return True, None
