"""One step's `tokens` and `samples` tables, built in memory from what its format's reader gives
(`read/formats.py`, `read_step`: the samples checked, the train rows resolved), flattened
(flatten.py). Nothing here writes: orchestrate/step.py writes what this returns.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa

from tokenlake import schema
from tokenlake.errors import SampleValueError
from tokenlake.read import dump, formats, replay, tinker, trajectory, validate
from tokenlake.transform import flatten


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


def build_step_tables(files: dump.StepFiles) -> tuple[pa.Table, pa.Table, StepResult]:
    """The step's `tokens` and `samples` tables, in memory."""
    tokens, samples_table, result, _ = build_step(files, with_experts=False)
    return tokens, samples_table, result


def build_step(
    files: dump.StepFiles, with_experts: bool
) -> tuple[pa.Table, pa.Table, StepResult, pa.Table | None]:
    """The step's `tokens` and `samples` tables, and with `with_experts` its `experts`."""
    step = formats.read_step(files)
    samples, checked, train_rows = step.samples, step.checked, step.train_rows
    batch_is_tinker = tinker.is_tinker(step.batch_metadata)
    if batch_is_tinker:  # its rewards are 0.0 filler (read/tinker.py)
        train_rows = {
            p: replace(row, raw_reward=None, normalized_reward=None)
            for p, row in train_rows.items()
        }
    parts = []
    for position, arrays in enumerate(checked):
        placeholders = tinker.placeholder_fields(batch_is_tinker, samples[position])
        try:
            parts.append(flatten.sample_tokens(arrays, train_rows.get(position), placeholders))
        except SampleValueError as exc:  # e.g. versions too long to repeat on every token
            exc.position = position
            raise validate.located(exc, files.rollout_file, samples) from None
    indices = [None if s.get("index") is None else int(s["index"]) for s in samples]
    tokens = flatten.tokens_table(files.evaluation, indices, parts, files.rollout_id)
    warnings: list[str] = []
    try:
        messages = step.messages
        if messages is None:
            messages = trajectory.messages_by_position(
                files.trajectory_file, samples, warnings, within=files.dump.root
            )
        samples_table = flatten.samples_table(
            files.rollout_id,
            files.evaluation,
            samples,
            train_rows,
            step.train_files,
            messages,
            parts,
        )
    except SampleValueError as exc:  # raised where the value is read, which knows no file
        raise validate.located(exc, files.rollout_file, samples) from None
    samples_table = flatten.null_columns(samples_table, step.unknown)
    experts = _experts(files, samples, indices) if with_experts else None
    result = StepResult(
        rollout_id=files.rollout_id,
        evaluation=files.evaluation,
        samples=len(samples),
        tokens=tokens.num_rows,
        train_files=step.train_files,
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


def count_nonfinite(tokens: pa.Table) -> int:
    """NaN/inf values in the per-token float columns (kept in Parquet, reported to the user)."""
    return sum(
        _nonfinite(chunk)
        for name in schema.TOKEN_STAT_COLUMNS
        for chunk in tokens.column(name).chunks
        if chunk.null_count < len(chunk)  # not a field the dump lacks
    )


def _nonfinite(chunk: pa.Array) -> int:
    """NaN/inf values among the rows of a float32 chunk that are not NULL: the non-finite
    slots of its values buffer, then of those, the ones its validity bitmap marks valid (a
    NULL slot holds whatever value the flattener left there)."""
    values = np.frombuffer(chunk.buffers()[1], np.float32, len(chunk), chunk.offset * 4)
    rows = np.flatnonzero(~np.isfinite(values))
    if len(rows) and chunk.null_count:
        bitmap = np.frombuffer(chunk.buffers()[0], np.uint8)
        bit = rows + chunk.offset
        rows = rows[(bitmap[bit >> 3] >> (bit & 7)) & 1 == 1]
    return len(rows)
