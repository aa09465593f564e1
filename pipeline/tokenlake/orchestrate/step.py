"""One step's job: read its files, build its tables (transform/tables.py), write them to the
lake under fresh names (load/write.py), and say what became of it.

Runs in a worker process when extraction is parallel, so everything it returns is plain,
picklable data; errors come back as text instead of exceptions.
"""

from __future__ import annotations

import secrets
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa

from tokenlake import schema
from tokenlake.errors import (
    DumpNotFoundError,
    LakeError,
    PipelineError,
    UnreadableError,
    shown,
)
from tokenlake.layout import new_name
from tokenlake.load import write
from tokenlake.processes import crash_point
from tokenlake.read import completeness, dump
from tokenlake.read.remote import remote_dump
from tokenlake.serve import rollups
from tokenlake.store import manifest
from tokenlake.store.base import Store
from tokenlake.transform.tables import StepResult, build_step

BUG_HINT = "This is a tokenlake bug: please report it with this line and `tokenlake --version`."


class StepStatus(str, Enum):
    """What an extraction did with a step; the CLI's summary counts them in this order."""

    NEW = "new"
    UPDATED = "updated"
    UNCHANGED = "unchanged"
    REMOVED = "removed"
    SKIPPED = "skipped"

    def __str__(self) -> str:  # "new", also in f-strings on every Python version
        return self.value

    def __repr__(self) -> str:  # `summary.counts` prints as {'new': 4, ...}
        return repr(self.value)

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


@dataclass(frozen=True)
class StepOutcome:
    """A written step (result and manifest record) or the reason it could not be."""

    label: str
    status: StepStatus  # NEW or UPDATED: as planned
    result: StepResult | None = None
    record: manifest.StepRecord | None = None
    error: str | None = None
    # (path, problem) when the lake could not be written: fatal for the whole extraction,
    # unlike `error` (bad input: only this step is skipped). Plain data: it crosses processes.
    lake_error: tuple[str, str] | None = None


def extract_step(files: dump.StepFiles, store: Store, run: str, status: StepStatus) -> StepOutcome:
    """Load, resolve, flatten and write one step; never raises (except on Ctrl-C).

    Bad input or a bad lake is reported in the outcome, and so is any other exception: that
    is a tokenlake bug, and it must cost this step only, never the whole extraction.
    """
    return extract_steps([(files, status)], store, run)[0]


def extract_steps(
    batch: Sequence[tuple[dump.StepFiles, StepStatus]], store: Store, run: str
) -> list[StepOutcome]:
    """`extract_step` for a batch of small steps, one outcome each, in order: each step is
    read and built, the rollups of those built are computed together (`rollups.compute_steps`:
    one set of queries instead of one a step), then each is written.

    Each step fails alone, as in `extract_step`: a step whose files are bad, or whose rows the
    rollups cannot be computed from together with the others', costs only itself (the
    rollups of the others are then computed one step at a time).
    """
    rollups.prepare_step_connection()  # made while the steps are read
    outcomes: dict[int, StepOutcome] = {}
    built: list[tuple[int, _Built]] = []
    for index, (files, status) in enumerate(batch):
        step = _caught(files, status, _build, files, status)
        if isinstance(step, StepOutcome):
            outcomes[index] = step
        else:
            built.append((index, step))
    together = _rollups_together([step for _, step in built], run)
    for (index, step), step_rollups in zip(built, together, strict=True):
        outcomes[index] = _caught(
            step.files, step.status, _write_built, step, store, run, step_rollups
        )
    return [outcomes[index] for index in range(len(batch))]


_T = TypeVar("_T")


def _caught(
    files: dump.StepFiles, status: StepStatus, work: Callable[..., _T], *args: Any
) -> _T | StepOutcome:
    """`work(*args)`, or the step's outcome for an exception tokenlake did not expect (a bug
    costs this step only)."""
    try:
        return work(*args)
    except Exception as exc:  # noqa: BLE001 - a bug in one step must not take down the run
        return StepOutcome(
            files.label, status, error=remote_dump.as_urls(files, files, bug_text(files, exc))
        )


def bug_text(files: dump.StepFiles, exc: BaseException) -> str:
    """The one-line failure of a step that raised an exception tokenlake did not expect.

    Examples:
        >>> step = dump.StepFiles(3, False, Path("d/rollout_data/3.pt"))
        >>> try:
        ...     1 / 0
        ... except ZeroDivisionError as exc:
        ...     print(bug_text(step, exc))
        `d/rollout_data/3.pt`: unexpected ZeroDivisionError('division by zero') at <doctest tokenlake.orchestrate.step.bug_text[1]>:2 in <module>. This is a tokenlake bug: please report it with this line and `tokenlake --version`.
    """
    where = ""
    frames = traceback.extract_tb(exc.__traceback__)
    if frames:  # the innermost frame: where it happened, for the bug report
        frame = frames[-1]
        where = f" at {Path(frame.filename).name}:{frame.lineno} in {frame.name}"
    return (
        f"`{files.rollout_file}`: unexpected {type(exc).__name__}({shown(_text_of(exc))}){where}."
        f" {BUG_HINT}"
    )


def worker_died_text(files: dump.StepFiles) -> str:
    """The one-line failure of a step whose worker process died, even when run alone."""
    text = (
        f"`{files.rollout_file}`: the worker process extracting this step died, also when"
        " retried alone (killed, out of memory, or crashed). Unless it was killed on purpose,"
        f" t{BUG_HINT[1:]}"
    )
    return remote_dump.as_urls(files, files, text)  # a remote dump's file by its URL


def _text_of(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # noqa: BLE001 - e.g. its argument is an int too long to print
        return "?"


@dataclass(frozen=True)
class _Built:
    """A step read and built, not yet written."""

    files: dump.StepFiles
    status: StepStatus
    sources: list[manifest.SourceFile]
    tokens: pa.Table
    samples: pa.Table
    result: StepResult
    experts: pa.Table | None


def _build(files: dump.StepFiles, status: StepStatus) -> _Built | StepOutcome:
    """Read and build one step's tables, or the outcome of a step whose input is bad."""
    read = files  # a dump on an object store: the step's objects, downloaded while read
    try:
        with remote_dump.hydrated(files) as read:
            # Fingerprint before reading: a file that changes while it is read looks changed
            # later (a remote step's: as listed, before the download).
            sources = _fingerprint(files)
            tokens, samples_table, result, experts = build_step(read, files.with_experts)
        warnings = tuple(remote_dump.as_urls(files, read, w) for w in result.warnings)
        if files.unsettled is not None and not completeness.covers_every_sample(samples_table):
            missing = completeness.uncovered(samples_table)
            return StepOutcome(files.label, status, error=not_yet_text(missing, files.unsettled))
        if (
            files.incomplete is not None
            and files.unmarked is None  # a step's own samples cannot tell it finished
            and completeness.covers_every_sample(samples_table)
        ):
            files = replace(files, incomplete=None)  # another rank layout, every sample there
        if files.incomplete is not None:
            warnings += (incomplete_text(files.label, files.incomplete),)
        result = replace(result, warnings=warnings)
    except PipelineError as exc:
        text = remote_dump.as_urls(files, read, input_error_text(read, exc))
        return StepOutcome(files.label, status, error=text)
    except OSError as exc:  # a file vanished or became unreadable between listing and reading
        refused = UnreadableError(exc.filename or files.rollout_file, exc)
        text = remote_dump.as_urls(files, read, input_error_text(read, refused))
        return StepOutcome(files.label, status, error=text)
    return _Built(files, status, sources, tokens, samples_table, result, experts)


def _rollups_together(steps: Sequence[_Built], run: str) -> list[rollups.StepRollups | None]:
    """The rollups of the built steps computed together; None for each (computed one step at a
    time when written) when they cannot be, so that a failure lands on its own step."""
    if len(steps) < 2:
        return [None] * len(steps)
    tables = [rollups.StepTables(s.tokens, s.samples, s.files.rollout_id) for s in steps]
    try:
        return list(rollups.compute_steps(tables, run))
    except Exception:  # noqa: BLE001 - e.g. tables of two schemas: each step alone says why
        return [None] * len(steps)


def _write_built(
    step: _Built, store: Store, run: str, step_rollups: rollups.StepRollups | None
) -> StepOutcome:
    """Write a built step's files (its rollups computed now unless given) and its record."""
    files, status, tokens, samples_table = step.files, step.status, step.tokens, step.samples
    if step_rollups is None:
        step_rollups = rollups.compute_step(tokens, samples_table, run, files.rollout_id)
    try:
        written, identities = _write_step(
            files, store, run, tokens, samples_table, step.experts, step_rollups
        )
    except LakeError as exc:
        return StepOutcome(files.label, status, lake_error=(exc.path, exc.problem))
    except OSError as exc:  # e.g. a partition directory cannot be created
        problem = f"cannot be written ({exc.strerror or exc})"
        return StepOutcome(files.label, status, lake_error=(str(exc.filename or store), problem))
    result = step.result
    record = manifest.StepRecord(
        rollout_id=files.rollout_id,
        evaluation=files.evaluation,
        sources=step.sources,
        files=written,
        samples=result.samples,
        tokens=result.tokens,
        train_files=result.train_files,
        checksum=manifest.tokens_checksum(tokens),
        schema_version=schema.SCHEMA_VERSION,
        rollup_version=step_rollups.version,
        rollup_settings=step_rollups.settings,
        incomplete=files.incomplete,
        identities=identities,
    )
    return StepOutcome(files.label, status, result=result, record=record)


def incomplete_text(label: str, missing: str) -> str:
    """The warning of a step extracted although its files are incomplete (they settled).

    Examples:
        >>> incomplete_text("1", "ranks 1-3 of ranks 0-3 have no train file")
        'Step 1 is incomplete: ranks 1-3 of ranks 0-3 have no train file; its files no longer change, so it is extracted as it is and marked incomplete (`tokenlake audit`: incomplete_steps)'
    """
    return (
        f"Step {label} is incomplete: {missing}; its files no longer change, so it is extracted"
        " as it is and marked incomplete (`tokenlake audit`: incomplete_steps)"
    )


def not_yet_text(missing: str, settle: float) -> str:
    """The reason an incomplete step whose files still change is not extracted yet.

    Examples:
        >>> not_yet_text("rank 1 of ranks 0-1 has no train file", 30)
        'not yet complete: rank 1 of ranks 0-1 has no train file, and its files changed less than 30 s ago; extract again once they are written'
    """
    return (
        f"not yet complete: {missing}, and its files changed less than {settle:g} s ago;"
        " extract again once they are written"
    )


def _fingerprint(files: dump.StepFiles) -> list[manifest.SourceFile]:
    """The step's source identities; a remote step's come with it (a Ray node elsewhere has
    no stage), equal to what `manifest.fingerprint` reads from the stage's placeholders."""
    if files.remote is None:
        return dump.fingerprint(files)
    return [manifest.SourceFile(*source) for source in files.remote.objects]


def input_error_text(files: dump.StepFiles, exc: PipelineError) -> str:
    """The one-line reason a step is skipped: the rank when a train file is at fault, the
    error (file, sample), and what to do.

    Examples:
        >>> step = dump.StepFiles(3, False, Path("d/rollout_data/3.pt"), ((1, Path("d/train_data/3_1.pt")),))
        >>> from tokenlake.errors import DumpFormatError
        >>> input_error_text(step, DumpFormatError("d/train_data/3_1.pt", "bad"))
        'rank 1: `d/train_data/3_1.pt`: bad. Replace or remove the file, then extract again.'
    """
    path = getattr(exc, "path", None)
    # a per-rank file only: slime's one per-step train file is listed as rank 0
    rank = next(
        (r for r, p in files.train_files if str(p) == path and dump.rank_of(str(p)) is not None),
        None,
    )
    where = f"rank {rank}: " if rank is not None else ""
    text = str(exc).rstrip(".")
    if isinstance(exc, UnreadableError):  # the OS refused it: its fix, never "remove"
        return f"{where}{text}, then extract again."
    if isinstance(exc, DumpNotFoundError):  # deleted between listing and reading
        return f"{where}{text}. Extract again to pick up the current files."
    if getattr(exc, "still_writing", False):  # its message already says "extract again later"
        return f"{where}{text}."
    return f"{where}{text}. Replace or remove the file, then extract again."


def _write_step(
    files: dump.StepFiles,
    store: Store,
    run: str,
    tokens: pa.Table,
    samples_table: pa.Table,
    experts: pa.Table | None,
    step_rollups: rollups.StepRollups,
) -> tuple[dict[str, str], dict[str, str]]:
    """Write the step's files (its tables, then its rollups) under fresh names; returns
    table -> name relative to the lake, and table -> the file's identity as written."""
    written: dict[str, str] = {}
    identities: dict[str, str] = {}
    tables: list[tuple[str, pa.Table]] = [(schema.TOKENS, tokens), (schema.SAMPLES, samples_table)]
    if experts is not None:
        tables.append((schema.EXPERTS, experts))
    tables += list(step_rollups.tables.items())
    try:
        where = (files.rollout_id, files.evaluation, _source_name(files))
        write_step_files(store, run, where, tables, written, identities)
    except BaseException:
        store.delete(written.values())  # half a step must not linger (full or read-only lake)
        raise
    return written, identities


def write_step_files(
    store: Store,
    run: str,
    step: tuple[int, bool, str],
    tables: list[tuple[str, pa.Table]],
    written: dict[str, str],
    identities: dict[str, str],
) -> None:
    """Write each (table, rows) of one step (rollout_id, evaluation, the source its files'
    metadata names) under fresh names of one generation, recording each name in `written` as
    soon as it exists (so a failure can delete what was written), and its identity as written
    in `identities`."""
    rollout_id, evaluation, source = step
    stem = schema.EVAL_STEM if evaluation else schema.TRAIN_STEM
    generation = secrets.token_hex(4)  # fresh names: the manifest decides when they count
    for table, data in tables:
        written[table] = new_name(table, run, stem, rollout_id, generation)
        metadata = write.file_metadata(table, run, source)
        table_schema = rollups.rollup_schema(table) if table in schema.ROLLUP_TABLES else None
        identities[table] = write.write_lake_file(
            store, written[table], table, data, metadata, table_schema
        )
        crash_point("step:file-written")  # in the middle of a step: some of its files written


def _source_name(files: dump.StepFiles) -> str:
    """The rollout file as Parquet metadata records it: its URL for a remote dump."""
    text = str(files.rollout_file)
    return remote_dump.as_urls(files, files, text)
