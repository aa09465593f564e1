"""Extract a dump directory into the lake: discover → load → resolve → flatten → write → catalog.

Memory is bounded by one step: a step's files are loaded, turned into two tables, written, and
dropped before the next step is read.
"""

from __future__ import annotations

import logging
import re
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from pipeline import catalog, dump, flatten, schema, write
from pipeline.errors import LakeError, PipelineError, UsageError
from pipeline.resolve import TrainFile, TrainRow, locate_rows, resolve_sample

log = logging.getLogger(__name__)

_FORBIDDEN_IN_RUN_NAME = re.compile(r"[/\\=%\x00-\x1f]")


@dataclass(frozen=True)
class StepResult:
    """What one rollout file became."""

    rollout_id: int
    evaluation: bool
    samples: int
    tokens: int
    train_files: int
    samples_with_train_row: int
    nonfinite_values: int


@dataclass
class ExtractSummary:
    """What an extraction did; the CLI prints it."""

    run: str
    lake: Path
    steps: list[StepResult] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)  # (step label, error message)
    ignored_files: list[Path] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.steps)

    @property
    def samples(self) -> int:
        return sum(s.samples for s in self.steps)


ProgressCallback = Callable[[StepResult], None]


def check_run_name(name: str) -> str:
    """A run name must be usable as a Hive partition value; quotes and unicode are fine.

    Examples:
        >>> check_run_name("qwen 'grpo' ü")
        "qwen 'grpo' ü"
    """
    if not name or name.startswith(".") or _FORBIDDEN_IN_RUN_NAME.search(name):
        raise UsageError(
            f"Run name `{name}` cannot be a partition directory: it must be non-empty, not start"
            " with `.`, and contain no `/`, `\\`, `=`, `%` or control characters."
            " Choose another with --run-name."
        )
    return name


def extract_run(
    dump_dir: Path,
    lake: Path,
    run_name: str | None = None,
    *,
    steps: Iterable[int] | None = None,
    strict: bool = False,
    progress: ProgressCallback | None = None,
) -> ExtractSummary:
    """Extract a miles dump directory into `lake` and rebuild the catalog.

    Re-extracting a run replaces that run's data and nothing else. With `steps`, only those
    steps are (re)extracted and the run's other steps are kept.

    Args:
        dump_dir: The `--dump-details` directory (read only).
        lake: The lake root; created if missing.
        run_name: The run's name in the lake; default: the dump directory's base name.
        steps: Step ids to extract (train and eval files of those steps); default: all.
        strict: Re-raise the first step error instead of recording it and going on.
        progress: Called after each step is written.

    Returns:
        What was written, and which steps failed with which message.
    """
    started = time.perf_counter()
    listing = dump.discover(dump_dir)
    run = check_run_name(run_name if run_name is not None else listing.root.name)
    lake = _prepare_lake(lake, listing.root)
    wanted = set(steps) if steps is not None else None
    selected = [s for s in listing.steps if wanted is None or s.rollout_id in wanted]
    summary = ExtractSummary(run=run, lake=lake, ignored_files=list(listing.ignored))
    for files in selected:
        try:
            result = extract_step(files, lake, run)
        except PipelineError as exc:
            if strict:
                raise
            summary.failed.append((files.label, str(exc)))
            log.error("step %s skipped: %s", files.label, exc)
            continue
        summary.steps.append(result)
        if progress is not None:
            progress(result)
    if wanted is None:
        _remove_stale_partitions(lake, run, {(s.rollout_id, s.evaluation) for s in selected})
    _write_run_row(lake, run, listing.root)
    catalog.build_catalog(lake)
    summary.seconds = time.perf_counter() - started
    return summary


def _prepare_lake(lake: Path, dump_root: Path) -> Path:
    lake = lake.resolve()
    if lake == dump_root or dump_root in lake.parents:
        raise LakeError(lake, "is inside the dump directory; tokenlake never writes there")
    try:
        lake.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise LakeError(lake, f"cannot be created ({exc.strerror or exc})") from exc
    return lake


def extract_step(files: dump.StepFiles, lake: Path, run: str) -> StepResult:
    """Load, resolve, flatten and write one rollout file (and its train files)."""
    rollout = dump.load_rollout(files.rollout_file, files.rollout_id)
    samples: list[dict[str, Any]] = rollout["samples"]
    train_files = [
        TrainFile(rank, path, dump.load_train(path, rank)) for rank, path in files.train_files
    ]
    train_rows = resolve_train_rows(files.rollout_file, samples, train_files)
    parts = [
        flatten.sample_tokens(files.rollout_file, position, sample, train_rows.get(position))
        for position, sample in enumerate(samples)
    ]
    indices = [None if s.get("index") is None else int(s["index"]) for s in samples]
    tokens = flatten.tokens_table(files.evaluation, indices, parts)
    sample_rows = flatten.samples_table(files.rollout_id, files.evaluation, samples, train_rows)
    source = str(files.rollout_file)
    stem = schema.EVAL_STEM if files.evaluation else schema.TRAIN_STEM
    for table, data in ((schema.TOKENS, tokens), (schema.SAMPLES, sample_rows)):
        path = lake / schema.partition_dir(table, run, files.rollout_id) / f"{stem}.parquet"
        write.write_parquet(path, table, data, write.file_metadata(table, run, source))
    return StepResult(
        rollout_id=files.rollout_id,
        evaluation=files.evaluation,
        samples=len(samples),
        tokens=tokens.num_rows,
        train_files=len(train_files),
        samples_with_train_row=len(train_rows),
        nonfinite_values=count_nonfinite(tokens),
    )


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
            raise dump.DumpFormatError(
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


def _remove_stale_partitions(lake: Path, run: str, kept: set[tuple[int, bool]]) -> None:
    """Drop this run's steps that the dump no longer has (and nothing of other runs)."""
    for table in (schema.TOKENS, schema.SAMPLES):
        run_dir = lake / table / f"{schema.RUN}={run}"
        if not run_dir.is_dir():
            continue
        for step_dir in run_dir.iterdir():
            rid_text = step_dir.name.partition("=")[2]
            if not rid_text.isdigit():
                continue
            for stem, evaluation in ((schema.TRAIN_STEM, False), (schema.EVAL_STEM, True)):
                if (int(rid_text), evaluation) not in kept:
                    (step_dir / f"{stem}.parquet").unlink(missing_ok=True)
            if not any(step_dir.iterdir()):
                shutil.rmtree(step_dir)


def _write_run_row(lake: Path, run: str, source: Path) -> None:
    from pipeline import __version__

    samples_dir = lake / schema.SAMPLES / f"{schema.RUN}={run}"
    train = len(list(samples_dir.glob(f"*/{schema.TRAIN_STEM}.parquet")))
    evals = len(list(samples_dir.glob(f"*/{schema.EVAL_STEM}.parquet")))
    row = {
        "source_dir": str(source),
        "extracted_at": datetime.now(timezone.utc),
        "tool": f"{schema.TOOL_NAME} {__version__}",
        "schema_version": schema.SCHEMA_VERSION,
        "train_steps": train,
        "eval_steps": evals,
    }
    table = pa.Table.from_pylist([row], schema=schema.RUNS_SCHEMA)
    path = lake / schema.partition_dir(schema.RUNS, run) / "run.parquet"
    write.write_parquet(
        path, schema.RUNS, table, write.file_metadata(schema.RUNS, run, str(source))
    )
