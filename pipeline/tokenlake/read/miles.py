"""miles' steps (and slime's train dump format 1, whose files are the same): a rollout file
`rollout_data/{rid}.pt` and one train file per rank, `train_data/{rid}_{rank}.pt` (dump-format.md
sections 2 to 4).

The rollout samples are checked (`validate.py`) before anything reads them; the rank files'
rows are joined to them and their TP/PP/CP layout resolved (`resolve.py`), giving the same
`StepRead` every format's reader gives.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from tokenlake.errors import DumpFormatError, shown
from tokenlake.read import dump, validate
from tokenlake.read.resolve import TrainFile, locate_rows, resolve_sample
from tokenlake.read.train_checks import raw_rewards
from tokenlake.steptypes import StepRead, TrainRow


def read_step(files: dump.StepFiles) -> StepRead:
    """A miles (or slime format 1) step: its rollout file and its rank files, joined."""
    rollout = dump.load_rollout(files.rollout_file, files.rollout_id)
    samples: list[dict[str, Any]] = rollout["samples"]
    checked = validate.check_samples(files.rollout_file, samples)  # before anything reads them
    train_files = [
        TrainFile(rank, path, dump.load_train(path, files.rollout_id, rank))
        for rank, path in files.train_files
    ]
    train_rows = resolve_train_rows(files.rollout_file, samples, train_files)
    return StepRead(
        samples, checked, train_rows, len(train_files), batch_metadata=rollout.get("metadata")
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
) -> list[float | None] | None:
    """The step's batch-global `raw_reward` (dump-format.md 3.4) as the lake holds it: every
    file that has one holds the same list, one entry per rollout sample; ranks that disagree
    are mixed dumps."""
    first: TrainFile | None = None
    first_raw: list[Any] = []
    rewards: list[float | None] = []
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
        if first is None:
            first, first_raw, rewards = train_file, list(raw), raw_rewards(train_file.path, raw)
        elif not _same_list(first_raw, list(raw)):
            _refuse_difference(train_file, raw_rewards(train_file.path, raw), first, rewards)
    return rewards if first is not None else None


def _same_list(ours: list[Any], theirs: list[Any]) -> bool:
    """Whether two lists are equal by one C-level comparison (False when it cannot tell)."""
    try:
        return bool(ours == theirs)
    except (ValueError, TypeError):  # an entry is an array
        return False


def _refuse_difference(
    train_file: TrainFile,
    theirs: list[float | None],
    first: TrainFile,
    ours: list[float | None],
) -> None:
    """Fail the step at the first batch position whose rewards differ (NaN equals NaN)."""
    for position, (x, y) in enumerate(zip(ours, theirs, strict=True)):
        if x != y and not (x is not None and y is not None and math.isnan(x) and math.isnan(y)):
            raise DumpFormatError(
                train_file.path,
                f"`raw_reward` at batch position {position} is {shown(y)}, but {shown(x)} in"
                f" `{first.path.name}`; it is batch-global, every rank holds the same (mixed or"
                " corrupt dumps)",
            )
