"""Extract one rollout file (and its train files) into two staged Parquet files.

Runs in a worker process when extraction is parallel, so everything it returns is plain,
picklable data; errors come back as text instead of exceptions.
"""

from __future__ import annotations

import secrets
import traceback
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from tokenlake import schema
from tokenlake.errors import (
    DumpFormatError,
    DumpNotFoundError,
    LakeError,
    PipelineError,
    SampleValueError,
    shown,
)
from tokenlake.load import manifest, write
from tokenlake.load.lake import LakeRoot, lake_at, new_name
from tokenlake.read import dump, remote_dump, replay, tinker, trajectory, validate
from tokenlake.transform import flatten
from tokenlake.transform.resolve import TrainFile, TrainRow, locate_rows, resolve_sample

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

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


@dataclass(frozen=True)
class StepResult:
    """What one rollout file became."""

    rollout_id: int
    evaluation: bool
    samples: int
    tokens: int
    train_files: int
    nonfinite_values: int
    # One line each: a sidecar of the step beyond its size bounds (its values are NULL).
    warnings: tuple[str, ...] = ()


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


def extract_step(
    files: dump.StepFiles, lake: LakeRoot, run: str, status: StepStatus
) -> StepOutcome:
    """Load, resolve, flatten and write one step; never raises (except on Ctrl-C).

    Bad input or a bad lake is reported in the outcome, and so is any other exception: that
    is a tokenlake bug, and it must cost this step only, never the whole extraction.
    """
    try:
        return _extract_step(files, lake, run, status)
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
        `d/rollout_data/3.pt`: unexpected ZeroDivisionError('division by zero') at <doctest tokenlake.transform.step.bug_text[1]>:2 in <module>. This is a tokenlake bug: please report it with this line and `tokenlake --version`.
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


def _extract_step(
    files: dump.StepFiles, lake: LakeRoot, run: str, status: StepStatus
) -> StepOutcome:
    read = files  # a dump on an object store: the step's objects, downloaded while read
    try:
        with remote_dump.hydrated(files) as read:
            # Fingerprint before reading: a file that changes while it is read looks changed
            # later (a remote step's: as listed, before the download).
            sources = _fingerprint(files)
            tokens, samples_table, result, experts = _build(read, files.with_experts)
        warnings = tuple(remote_dump.as_urls(files, read, w) for w in result.warnings)
        result = replace(result, warnings=warnings)
    except PipelineError as exc:
        text = remote_dump.as_urls(files, read, input_error_text(read, exc))
        return StepOutcome(files.label, status, error=text)
    except OSError as exc:  # a file vanished or became unreadable between listing and reading
        text = f"`{exc.filename}`: {exc.strerror}. Extract again once the file is readable."
        return StepOutcome(files.label, status, error=remote_dump.as_urls(files, read, text))
    try:
        written = _write_step(files, lake, run, tokens, samples_table, experts)
    except LakeError as exc:
        return StepOutcome(files.label, status, lake_error=(exc.path, exc.problem))
    except OSError as exc:  # e.g. a partition directory cannot be created
        problem = f"cannot be written ({exc.strerror or exc})"
        return StepOutcome(files.label, status, lake_error=(str(exc.filename or lake), problem))
    record = manifest.StepRecord(
        rollout_id=files.rollout_id,
        evaluation=files.evaluation,
        sources=sources,
        files=written,
        samples=result.samples,
        tokens=result.tokens,
        train_files=result.train_files,
        checksum=manifest.tokens_checksum(tokens),
        schema_version=schema.SCHEMA_VERSION,
    )
    return StepOutcome(files.label, status, result=result, record=record)


def _fingerprint(files: dump.StepFiles) -> list[manifest.SourceFile]:
    """The step's source identities; a remote step's come with it (a Ray node elsewhere has
    no stage), equal to what `manifest.fingerprint` reads from the stage's placeholders."""
    if files.remote is None:
        return manifest.fingerprint(files)
    return [manifest.SourceFile(*source) for source in files.remote.objects]


def input_error_text(files: dump.StepFiles, exc: PipelineError) -> str:
    """The one-line reason a step is skipped: the rank when a train file is at fault, the
    error (file, sample), and what to do.

    Examples:
        >>> step = dump.StepFiles(3, False, Path("d/rollout_data/3.pt"), ((1, Path("d/train_data/3_1.pt")),))
        >>> input_error_text(step, DumpFormatError("d/train_data/3_1.pt", "bad"))
        'rank 1: `d/train_data/3_1.pt`: bad. Replace or remove the file, then extract again.'
    """
    path = getattr(exc, "path", None)
    rank = next((r for r, p in files.train_files if str(p) == path), None)
    where = f"rank {rank}: " if rank is not None else ""
    text = str(exc).rstrip(".")
    if isinstance(exc, DumpNotFoundError):  # deleted between listing and reading
        return f"{where}{text}. Extract again to pick up the current files."
    if getattr(exc, "still_writing", False):  # its message already says "extract again later"
        return f"{where}{text}."
    return f"{where}{text}. Replace or remove the file, then extract again."


def _write_step(
    files: dump.StepFiles,
    lake: LakeRoot,
    run: str,
    tokens: pa.Table,
    samples_table: pa.Table,
    experts: pa.Table | None = None,
) -> dict[str, str]:
    """Write the step's files under fresh names; returns table -> name relative to the lake."""
    layout = lake_at(lake)
    stem = schema.EVAL_STEM if files.evaluation else schema.TRAIN_STEM
    generation = secrets.token_hex(4)  # fresh names: the manifest decides when they count
    written: dict[str, str] = {}
    tables = [(schema.TOKENS, tokens), (schema.SAMPLES, samples_table)]
    if experts is not None:
        tables.append((schema.EXPERTS, experts))
    try:
        for table, data in tables:
            written[table] = new_name(table, run, stem, files.rollout_id, generation)
            metadata = write.file_metadata(table, run, _source_name(files))
            write.write_lake_file(layout, written[table], table, data, metadata)
    except BaseException:
        layout.delete(written.values())  # half a step must not linger (full or read-only lake)
        raise
    return written


def _source_name(files: dump.StepFiles) -> str:
    """The rollout file as Parquet metadata records it: its URL for a remote dump."""
    text = str(files.rollout_file)
    return remote_dump.as_urls(files, files, text)


def build_step_tables(files: dump.StepFiles) -> tuple[pa.Table, pa.Table, StepResult]:
    """The step's `tokens` and `samples` tables, in memory."""
    tokens, samples_table, result, _ = _build(files, with_experts=False)
    return tokens, samples_table, result


def _build(
    files: dump.StepFiles, with_experts: bool
) -> tuple[pa.Table, pa.Table, StepResult, pa.Table | None]:
    """The step's `tokens` and `samples` tables, and with `with_experts` its `experts`."""
    rollout = dump.load_rollout(files.rollout_file, files.rollout_id)
    samples: list[dict[str, Any]] = rollout["samples"]
    checked = validate.check_samples(files.rollout_file, samples)  # before anything reads them
    train_files = [
        TrainFile(rank, path, dump.load_train(path, rank)) for rank, path in files.train_files
    ]
    train_rows = resolve_train_rows(files.rollout_file, samples, train_files)
    batch_is_tinker = tinker.is_tinker(rollout.get("metadata"))
    if batch_is_tinker:  # its rewards are 0.0 filler (read/tinker.py)
        train_rows = {
            p: replace(row, raw_reward=None, normalized_reward=None)
            for p, row in train_rows.items()
        }
    parts = [
        flatten.sample_tokens(
            arrays,
            train_rows.get(position),
            tinker.placeholder_fields(batch_is_tinker, samples[position]),
        )
        for position, arrays in enumerate(checked)
    ]
    indices = [None if s.get("index") is None else int(s["index"]) for s in samples]
    tokens = flatten.tokens_table(files.evaluation, indices, parts, files.rollout_id)
    warnings: list[str] = []
    try:
        messages = trajectory.messages_by_position(files.trajectory_file, samples, warnings)
        samples_table = flatten.samples_table(
            files.rollout_id,
            files.evaluation,
            samples,
            train_rows,
            len(train_files),
            messages,
            parts,
        )
    except SampleValueError as exc:  # raised where the value is read, which knows no file
        raise validate.located(exc, files.rollout_file, samples) from None
    experts = _experts(files, samples, indices) if with_experts else None
    result = StepResult(
        rollout_id=files.rollout_id,
        evaluation=files.evaluation,
        samples=len(samples),
        tokens=tokens.num_rows,
        train_files=len(train_files),
        nonfinite_values=count_nonfinite(tokens),
        warnings=tuple(warnings),
    )
    return tokens, samples_table, result, experts


def _experts(files: dump.StepFiles, samples: list[dict[str, Any]], indices: list) -> pa.Table:
    """The step's `experts` rows (routing replay); a bad array is the step's one-line error."""
    arrays = []
    for position, sample in enumerate(samples):
        try:
            arrays.append(replay.replay_arrays(sample))
        except SampleValueError as exc:
            exc.position = position
            raise validate.located(exc, files.rollout_file, samples) from None
    return flatten.experts_table(files.evaluation, indices, arrays)


def resolve_train_rows(
    rollout_path: Path, samples: list[dict[str, Any]], train_files: list[TrainFile]
) -> dict[int, TrainRow]:
    """Batch position → resolved train row, for every sample some train file holds."""
    if not train_files:
        return {}
    raw_reward = _raw_reward(rollout_path, samples, train_files)
    located = locate_rows(samples, train_files)
    return {
        position: resolve_sample(position, samples[position], locations, raw_reward)
        for position, locations in sorted(located.items())
    }


def _raw_reward(
    rollout_path: Path, samples: list[dict[str, Any]], train_files: list[TrainFile]
) -> list[Any] | None:
    for train_file in train_files:
        raw = train_file.columns.get("raw_reward")
        if raw is None:
            continue
        if len(raw) != len(samples):
            raise DumpFormatError(
                train_file.path,
                f"`raw_reward` has {len(raw)} entries but `{rollout_path.name}` has"
                f" {len(samples)} samples (it is batch-global)",
            )
        return list(raw)
    return None


def count_nonfinite(tokens: pa.Table) -> int:
    """NaN/inf values in the per-token float columns (kept in Parquet, reported to the user)."""
    total = 0
    for column in schema.TOKEN_STAT_COLUMNS:
        values = tokens.column(column).fill_null(0.0).to_numpy()
        total += int(np.count_nonzero(~np.isfinite(values)))
    return total
