"""Reconcile a lake with its manifests and its sources (`tokenlake verify`).

Checks, per extracted step: both files exist and hold the recorded row counts; every sample of
the step is present once; token rows = the sum of the samples' response lengths; the checksum
of token ids and masks matches; and the dump's source files are unchanged since extraction.
And once per lake: the catalog opens and holds every view.
"""

from __future__ import annotations

import errno
import os
import stat
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from tokenlake import __version__, schema
from tokenlake.errors import (
    NO_FILE_ERRNOS,
    SHOWN_PATH_CHARS,
    LakeError,
    PipelineError,
    UsageError,
    shown,
)
from tokenlake.layout import check_relative, check_run_name, is_url, relative_parts
from tokenlake.serve import catalog, catalog_cache, rollups
from tokenlake.store import manifest, parquet, passed_checks, require_lake
from tokenlake.store.base import Store
from tokenlake.store.local import LocalStore, walked_once
from tokenlake.store.passed_checks import PassedChecks
from tokenlake.terminal import plural


@dataclass(frozen=True)
class Problem:
    """One mismatch between the lake and what it should be (`run` empty: the whole lake's)."""

    run: str
    step: str
    message: str

    def __str__(self) -> str:
        if not self.run:
            return self.message
        return f"run `{self.run}` step {self.step}: {self.message}"


def verify_lake(
    store: Store, run: str | None = None, deep: bool = False
) -> tuple[int, list[Problem]]:
    """Check every (or one) run of the lake; with `deep`, also compute each step's rollups
    from its tokens and compare them with the stored ones.

    Returns:
        The number of steps checked and the problems found (empty when consistent).
    """
    require_lake(store)  # else a mistyped path would "pass"
    if run is not None:
        check_run_name(run)
    # The catalog's check reads the manifests too; the leftovers' walk, the folders the
    # links' check walks.
    with manifest.parsed_once(), walked_once():
        return _verify_lake(store, run, deep)


def _verify_lake(store: Store, run: str | None, deep: bool) -> tuple[int, list[Problem]]:
    records = manifest.load_all(store)
    runs = records
    if run is not None:
        runs = [r for r in runs if r.run == run]
        if not runs:
            raise LakeError(str(store), f"has no run `{run}`")
    problems: list[Problem] = []
    checked = 0
    passed = _passed_checks(store, deep)
    for record in runs:
        try:  # never read through a planted link (`tokens/run=x -> /other/lake/...`)
            store.check_links(record.run)
        except LakeError as exc:
            problems.append(Problem("", "", f"run `{record.run}`: not checked: {exc}"))
            continue
        except UsageError:  # a run name tokenlake never makes: each file read is checked alone
            pass
        root, unchecked = _dump_root(record)
        if unchecked is not None:
            problems.append(
                Problem("", "", f"run `{record.run}`: sources not checked: {unchecked}")
            )
        for key, step in sorted(record.steps.items(), key=lambda kv: (kv[1].rollout_id, kv[0])):
            checked += 1
            found = check_step(store, record, step, root, deep, passed)
            problems += [Problem(record.run, key, m) for m in found]
        side = check_side_files(store, record)
        problems += [Problem("", "", f"run `{record.run}`: {m}") for m in side]
    if passed is not None:
        passed.save(keep_others=run is not None)
    problems += [Problem("", "", leftover_text(n)) for n in _leftovers(store, records, run)]
    if runs or store.exists(store.catalog_name):  # a catalog may outlive the last run
        broken = catalog.catalog_problem(store)
        if broken is not None:
            problems.append(Problem("", "", broken))
    if problems and _written_meanwhile(store, records):
        raise LakeError(
            str(store),
            f"another tokenlake command (an extraction, a tag, a drop) wrote to it while verify"
            f" read it, so the {plural(len(problems), 'problem')} seen may be its work in"
            " flight; run verify again once it has finished",
        )
    return checked, problems


def _passed_checks(store: Store, deep: bool) -> PassedChecks | None:
    """The user's record of the steps of this lake whose content checks passed (None: not
    used; `--deep` reads every file whole, and an object store's files are not read whole)."""
    if deep or not isinstance(store, LocalStore):
        return None
    return PassedChecks(catalog_cache.lake_folder(store), _checking_code())


def _checking_code() -> bytes:
    """The digest of the code a step's content check depends on (a kept pass of other code
    does not count): this module, the file reader, the checksum, the schemas, and the
    versions of tokenlake and the libraries that decode."""
    return passed_checks.code_digest(
        (__version__, pa.__version__, np.__version__),
        (__file__, parquet.__file__, manifest.__file__, schema.__file__),
    )


def _written_meanwhile(store: Store, records: list[manifest.RunManifest]) -> bool:
    """Whether a writer holds the lake's lock now, or committed other manifests than `records`
    since verify read them: files of steps in flight are listed by no manifest yet, and those a
    commit replaced are deleted after it."""
    return store.writer_busy() or catalog.changed_since(store, records)


def leftover_text(name: str) -> str:
    """The line for a lake file no manifest lists.

    Examples:
        >>> leftover_text("tokens/run=a/rollout_id=3/train-0a1b2c3d.parquet")
        'file `tokens/run=a/rollout_id=3/train-0a1b2c3d.parquet` is not listed in any manifest: left by an interrupted extraction, drop or tag; `tokenlake extract` sweeps it'
    """
    return (
        f"file `{shown(name, SHOWN_PATH_CHARS, literal=False)}` is not listed in any manifest:"
        " left by an interrupted extraction, drop or tag; `tokenlake extract` sweeps it"
    )


def _leftovers(store: Store, records: list[manifest.RunManifest], run: str | None) -> list[str]:
    """The lake's files no manifest of `records` (every run's) lists, of `run` only when
    given. Files a running extraction is writing are among them until it commits them."""
    names = manifest.leftovers(store, records)
    if run is None:
        return names
    return [name for name in names if f"/{schema.RUN}={run}/" in name]


def _dump_root(record: manifest.RunManifest) -> tuple[Path | None, str | None]:
    """Where the run's dump is read, or why its sources are not checked.

    The manifest names the dump (`source_dir`), so verify contacts only a directory or an
    object store tokenlake lists (`remote_dump.OBJECT_STORE_SCHEMES`), never another kind of
    URL: a manifest must not make it send requests elsewhere.
    """
    source = record.source_dir
    if not is_url(source):
        return Path(source), None
    # Only a dump on an object store needs remote staging (and the format readers it imports,
    # ~0.05 s of a small lake's verify).
    from tokenlake.read.remote.remote_dump import is_object_store_url, local_root

    if not is_object_store_url(source):
        # A location: shown whole, as the user must find which dump the manifest names.
        return None, (
            f"its dump `{shown(source, SHOWN_PATH_CHARS, literal=False)}` is neither a directory"
            " nor an object-store URL (s3://, gs://, az://); verify contacts nothing else"
        )
    try:  # a dump on an object store: listed afresh, into its stage
        return local_root(source, refresh=True), None
    except PipelineError as exc:  # cannot be listed, or holds nothing any more
        return None, str(exc)


def check_step(
    store: Store,
    record: manifest.RunManifest,
    step: manifest.StepRecord,
    root: Path | None = None,
    deep: bool = False,
    passed: PassedChecks | None = None,
) -> list[str]:
    """The problems of one step (empty list when it is consistent).

    Args:
        root: Where the run's dump is read (`remote_dump.local_root`); None: not checked
            when the dump is on an object store that could not be listed.
        deep: Also compute the step's rollups from its tokens and compare.
        passed: The steps whose content checks passed before: one whose step files' bytes
            and manifest record are those of a kept pass is not decoded again; one that
            passes now is recorded.
    """
    unlisted = [table for table in (schema.TOKENS, schema.SAMPLES) if table not in step.files]
    if unlisted:  # every step tokenlake writes has both files, of rows or none
        return [f"lists no `{table}` file; extract the run again" for table in unlisted]
    with ExitStack() as closing:  # each file opened once, for all its checks
        opened = {}
        for table, name in step.files.items():
            lake_file = parquet.LakeFile.open(store, name)
            if lake_file is not None:
                opened[table] = closing.enter_context(lake_file)
        missing = [name for table, name in step.files.items() if table not in opened]
        if missing:
            return [f"file `{name}` is missing" for name in missing]
        if root is None and not is_url(record.source_dir):
            root = Path(record.source_dir)
        problems = [] if root is None else _check_sources(record.source_dir, root, step)
        key = None if passed is None else _passed_key(step, opened, passed.code)
        known = passed is not None and key is not None and passed.passed(key)
        tables, failed, altered = _read_step_files(store, step, opened, deep, known)
    if failed:
        return problems + failed + altered
    if known:  # its step files' content passed these checks before
        return problems or altered
    found = _content_problems(step, tables)
    if not found and key is not None and passed is not None:
        passed.add(key)
    problems += found
    if deep and not problems:
        problems += _check_rollups(record.run, step, tables)
    return problems or altered


def _content_problems(step: manifest.StepRecord, tables: dict[str, pa.Table]) -> list[str]:
    """How a step's token and sample rows differ from its manifest record and each other."""
    problems = []
    tokens, samples = tables[schema.TOKENS], tables[schema.SAMPLES]
    if samples.num_rows != step.samples:
        problems.append(f"`samples` has {samples.num_rows} rows; extracted {step.samples}")
    positions = samples.column(schema.BATCH_POSITION).to_numpy()
    if not np.array_equal(np.sort(positions), np.arange(len(positions))):
        problems.append("`samples` batch positions are not 0..n-1 exactly once")
    expected_tokens = _token_rows_of(samples)
    if tokens.num_rows != expected_tokens:
        problems.append(
            f"`tokens` has {tokens.num_rows} rows; the samples' response lengths sum to"
            f" {expected_tokens}"
        )
    if tokens.num_rows != step.tokens:
        problems.append(f"`tokens` has {tokens.num_rows} rows; extracted {step.tokens}")
    if manifest.tokens_checksum(tokens) != step.checksum:
        problems.append("token ids or loss masks differ from what was extracted (checksum)")
    for table in (schema.TOKENS, schema.SAMPLES):
        other = _other_kind(step, table, tables[table])
        if other is not None:
            problems.append(other)
    return problems


def _other_kind(step: manifest.StepRecord, table: str, rows: pa.Table) -> str | None:
    """The problem of a step file holding rows whose `evaluation` is not the step's, or None.

    Readers serve a row with the flag it holds: a training step's files listed again (copied)
    as its evaluation step's served the training step's rows twice. A NULL flag counts too.
    """
    other = sum(
        int(np.count_nonzero(chunk.to_numpy(zero_copy_only=False) != step.evaluation))
        for chunk in rows.column(schema.EVALUATION).chunks
    )
    if not other:
        return None
    theirs, ours = (
        ("a training", "evaluation") if step.evaluation else ("an evaluation", "training")
    )
    return (
        f"`{table}` has {other} rows of {theirs} step (`evaluation`"
        f" {str(not step.evaluation).lower()}), not of this {ours} step; extract the run again"
    )


def _passed_key(
    step: manifest.StepRecord, opened: dict[str, parquet.LakeFile], code: bytes
) -> str | None:
    """The key of the step's content check in the record of passed ones: the checking code,
    the step's manifest record, and the whole bytes of its step files, each as written (None
    when one is not, has no recorded identity, or is not read whole: it is checked in full)."""
    tables = [table for table in schema.STEP_TABLES if table in step.files]
    contents = []
    for table in tables:
        lake_file = opened[table]
        if not _as_written(step, table, lake_file):
            return None
        content = lake_file.contents()
        if content is None:
            return None
        contents.append(content)
    record = [step.schema_version, step.evaluation, step.samples, step.tokens, step.checksum]
    record += [value for table in tables for value in (table, step.identities[table])]
    return passed_checks.step_key(code, record, contents)


def _read_step_files(
    store: Store,
    step: manifest.StepRecord,
    opened: dict[str, parquet.LakeFile],
    deep: bool,
    known: bool = False,
) -> tuple[dict[str, pa.Table], list[str], list[str]]:
    """The rows verify checks of each of a step's opened files, by table; the problems of the
    files whose checks fail before their rows; and those of the files that pass every check
    but are not as written. `known`: the step files' content passed before (as written: their
    rows are not read)."""
    tables: dict[str, pa.Table] = {}
    failed: list[str] = []
    altered: list[str] = []
    for table, lake_file in opened.items():
        name = lake_file.name
        try:
            written = not deep and _as_written(step, table, lake_file)
            if written and (known or table not in schema.STEP_TABLES):
                continue  # a rollup file as written: only --deep compares its rows
            if written:  # only the columns checked below are decoded
                declared, read = lake_file.read_columns(_READ_COLUMNS.get(table, ()))
                changed = None
            else:
                read = lake_file.read_table()
                declared = read.schema
                changed = _changed_since_written(step, table, lake_file)
                if changed is None and deep:
                    changed = parquet.statistics_disagreement(store, name, read)
        except parquet.UnreadableLakeFile as exc:  # truncated, overwritten, or refused by the OS
            failed.append(_unreadable_file(name, exc, table))
            continue
        unlike = columns_difference(table, declared, step)
        if unlike is not None:  # another program's file under tokenlake's name
            failed.append(
                f"file `{name}` does not hold the columns of `{table}`: {unlike};"
                f" {_WAY_OUT[_kind(table)]}"
            )
            continue
        if changed is not None:  # what readers count is no longer what was committed
            altered.append(f"file `{name}` {changed}; {_WAY_OUT[_kind(table)]}")
        tables[table] = read
    return tables, failed, altered


def _as_written(step: manifest.StepRecord, table: str, lake_file: parquet.LakeFile) -> bool:
    """True when the file's size and footer are those its manifest recorded as written: its
    columns and row counts are the ones tokenlake wrote, and what is left to check is in its
    pages (a step file's token ids and masks, by their checksum; a rollup's rows, by
    `--deep`). False also for a file that cannot be read, named below by its reader."""
    if table not in step.identities:
        return False
    try:
        return _changed_since_written(step, table, lake_file) is None
    except parquet.UnreadableLakeFile:  # named by the reader's own words, below
        return False


def _changed_since_written(
    step: manifest.StepRecord, table: str, lake_file: parquet.LakeFile
) -> str | None:
    """How a file differs from what its manifest records of it as written (None: the same, or
    a step written before manifests recorded identities)."""
    recorded = step.identities.get(table)
    return None if recorded is None else lake_file.identity_change(recorded)


def check_side_files(store: Store, record: manifest.RunManifest) -> list[str]:
    """The problems of a run's `runs`, `vocab` and `metrics` files: missing, unreadable, or
    not the file written (those written before manifests recorded their identities are only
    looked for). The next extraction writes them again."""
    problems = []
    for name in record.side_files():
        if not store.exists(name):
            problems.append(f"file `{name}` is missing; {_WAY_OUT['side']}")
            continue
        recorded = record.side_identities.get(name)
        try:
            changed = None if recorded is None else parquet.identity_change(store, name, recorded)
        except parquet.UnreadableLakeFile as exc:
            refused = exc.refusal(name)
            problems.append(
                f"file {refused}"
                if refused is not None
                else f"file `{name}` cannot be read ({exc.reason}); {_WAY_OUT['side']}"
            )
            continue
        if changed is not None:
            problems.append(f"file `{name}` {changed}; {_WAY_OUT['side']}")
    return problems


def _token_rows_of(samples: pa.Table) -> int:
    """How many `tokens` rows the samples make: the sum of their response lengths, where a
    NULL length (a sample logged without tokens: NeMo-RL's validation lines) makes none."""
    lengths = samples.column(schema.RESPONSE_LENGTH).to_pylist()  # a step's samples: few
    return sum(length for length in lengths if length is not None)


def _unreadable_file(name: str, exc: parquet.UnreadableLakeFile, table: str) -> str:
    """The problem line of a step's file that cannot be read: the OS refusing it (its fix,
    never a deletion of a good file), or a damaged file (extract skips a step whose files
    exist and sources are unchanged: delete it first)."""
    refused = exc.refusal(name)
    if refused is not None:
        return f"file {refused}"
    return f"file `{name}` cannot be read ({exc.reason}); {_WAY_OUT[_kind(table)]}"


_WAY_OUT = {
    "step": "delete it and extract again",
    "side": "extract the run again",
    "rollup": "`tokenlake views LAKE --recompute` computes the rollups again",
}
# The columns verify reads from a step's files of any schema version.
_READ_COLUMNS = {
    schema.TOKENS: (schema.TOKEN_ID, schema.LOSS_MASK, schema.EVALUATION),
    schema.SAMPLES: (schema.BATCH_POSITION, schema.RESPONSE_LENGTH, schema.EVALUATION),
}


def _kind(table: str) -> str:
    return "step" if table in schema.STEP_TABLES else "rollup"


def columns_difference(table: str, found: pa.Schema, step: manifest.StepRecord) -> str | None:
    """How a step's file of `table` differs in its columns from what tokenlake writes there
    (None: the same names and types, in any order). A file written by another schema version,
    or rollups of other SQL (which no view reads), need only the columns verify reads.

    Examples:
        >>> step = manifest.StepRecord(0, False, [], {}, 0, 0, 0, "", schema.SCHEMA_VERSION)
        >>> columns_difference("samples", pa.schema([("x", pa.string())]), step)
        '`evaluation` is missing'
        >>> older = manifest.StepRecord(0, False, [], {}, 0, 0, 0, "", schema_version=1)
        >>> columns_difference("tokens", pa.schema([("token_id", pa.int64())]), older)
        '`loss_mask` is missing'
    """
    expected = _written_schema(table, step)
    if expected is None:
        needed = _READ_COLUMNS.get(table, ())
        missing = [c for c in needed if c not in found.names]
        return f"`{missing[0]}` is missing" if missing else None
    if found.equals(expected):  # as written, in the same order: no field to look at
        return None
    have = {f.name: f.type for f in found}
    for field in expected:
        if field.name not in have:
            return f"`{field.name}` is missing"
        if have[field.name] != field.type:
            return f"`{field.name}` is {have[field.name]}, not {field.type}"
    written = set(expected.names)  # `names` is a new list at each call
    extra = [n for n in found.names if n not in written]
    if extra:
        return f"it has `{shown(extra[0], literal=False)}`, which `{table}` has not"
    return None


def _written_schema(table: str, step: manifest.StepRecord) -> pa.Schema | None:
    """The columns this tokenlake writes to a step's file of `table`; None when the file was
    written by another schema version or SQL."""
    if table in schema.STEP_TABLES:
        current = step.schema_version == schema.SCHEMA_VERSION
        return schema.TABLE_SCHEMAS[table] if current else None
    if table in rollups.rollup_names() and step.rollup_version == rollups.rollup_version():
        return rollups.rollup_schema(table)
    return None


def _check_rollups(run: str, step: manifest.StepRecord, tables: dict[str, pa.Table]) -> list[str]:
    """The step's stored rollups against the rollups of its tokens and samples."""
    if not rollups.is_current(step, rollups.default_settings_digests()):
        return [
            "has no rollups of this tokenlake version (the views read its tokens);"
            " `tokenlake views LAKE` computes them"
        ]
    computed = rollups.compute_step(
        tables[schema.TOKENS], tables[schema.SAMPLES], run, step.rollout_id
    )
    problems = []
    for name, rows in computed.tables.items():
        found = rollups.differences(name, tables[name], rows)
        if found is not None:
            problems.append(
                f"rollup `{name}` differs from its tokens: {found}; {_WAY_OUT['rollup']}"
            )
    return problems


def _shown_source(source_dir: str, path: Path) -> str:
    """A source file as the user knows it: a remote dump's object by its URL."""
    if not is_url(source_dir):
        return str(path)
    from tokenlake.read.remote.remote_dump import shown_path

    return shown_path(source_dir, path)


def _check_sources(source_dir: str, root: Path, step: manifest.StepRecord) -> list[str]:
    problems = []
    for source in step.sources:
        try:
            check_relative(source.name)  # verify looks only inside the dump
        except ValueError:
            problems.append(f"source `{shown(source.name, literal=False)}` lies outside its dump")
            continue
        change = _source_change(root, source)
        if change is not None:
            named = _shown_source(source_dir, root / source.name)
            named = shown(named, SHOWN_PATH_CHARS, literal=False)
            problems.append(f"source `{named}` {change}")
    return problems


_NO_FILE_NAME = "cannot be the name of a file ({why}); extract again"


def _source_change(root: Path, source: manifest.SourceFile) -> str | None:
    """How a dump file differs from the one extracted (None: the same name, size and time),
    by one `stat` of it (a step's sources are checked at every verify)."""
    try:
        found = os.stat(f"{root}/{source.name}")
    except ValueError:  # a NUL byte: the manifest, which anyone may write, names no file
        return _NO_FILE_NAME.format(why="it holds a NUL byte")
    except OSError as exc:
        if exc.errno in NO_FILE_ERRNOS:
            return "no longer exists"  # as `Path.is_file` takes these
        if exc.errno == errno.ENAMETOOLONG:
            return _NO_FILE_NAME.format(why="the path is longer than the system allows")
        raise
    if not stat.S_ISREG(found.st_mode):
        return "no longer exists"
    # `SourceFile.of` records the name as the path gives it back: `a//b` reads `a/b`.
    as_recorded = "/".join(relative_parts(source.name)) or "."
    current = manifest.SourceFile(as_recorded, found.st_size, found.st_mtime_ns)
    return None if current == source else "changed since extraction; extract again"
