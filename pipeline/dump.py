"""Discover and load a miles `--dump-details` directory (dump-format.md section 1).

Reading only: nothing here ever writes into the dump directory.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeline import ptread
from pipeline.errors import DumpFileError, DumpFormatError, DumpNotFoundError
from pipeline.ptzip import short

log = logging.getLogger(__name__)

ROLLOUT_DIR = "rollout_data"
TRAIN_DIR = "train_data"
_ROLLOUT_NAME = re.compile(r"^(eval_)?(\d+)\.pt$")
_TRAIN_NAME = re.compile(r"^(\d+)_(\d+)\.pt$")
NOT_A_DUMP_FILE = "not a rollout or train dump file name"


@dataclass(frozen=True)
class StepFiles:
    """The files of one rollout dump: its rollout file and (training steps) its rank files."""

    rollout_id: int
    evaluation: bool
    rollout_file: Path
    # (global rank, path), ascending rank. Always empty for evaluation files.
    train_files: tuple[tuple[int, Path], ...] = ()

    @property
    def label(self) -> str:
        """`eval_3` or `3`, as in the file name."""
        return f"eval_{self.rollout_id}" if self.evaluation else str(self.rollout_id)


@dataclass(frozen=True)
class DumpListing:
    """Everything extractable in a dump directory, plus files that were not understood."""

    root: Path
    steps: tuple[StepFiles, ...]
    # (path, why) of files that are not extracted
    ignored: tuple[tuple[Path, str], ...] = field(default=())


def discover(dump_dir: Path) -> DumpListing:
    """List the rollout and train files of a dump, ordered by step (train before eval).

    Files in `rollout_data/` or `train_data/` whose names do not follow the format are skipped
    and reported in `ignored` (the reference reader crashes on them).
    """
    root = dump_dir.resolve()
    if not root.exists():
        raise DumpNotFoundError(dump_dir, "does not exist")
    if not root.is_dir():
        raise DumpNotFoundError(dump_dir, "is not a directory")
    rollout_dir = root / ROLLOUT_DIR
    if not rollout_dir.is_dir():
        raise DumpNotFoundError(
            dump_dir, f"is not a miles dump: it has no `{ROLLOUT_DIR}/` directory"
        )
    train, ignored = _list_train_files(root / TRAIN_DIR)
    steps: list[StepFiles] = []
    for path in sorted(rollout_dir.iterdir()):
        match = _ROLLOUT_NAME.match(path.name)
        if match is None or not path.is_file():
            ignored.append((path, NOT_A_DUMP_FILE))
            continue
        rid, evaluation = int(match.group(2)), match.group(1) is not None
        ranks = () if evaluation else tuple(sorted(train.pop(rid, {}).items()))
        steps.append(StepFiles(rid, evaluation, path, ranks))
    for rid, by_rank in train.items():  # train files without a rollout file cannot be joined
        why = f"step {rid} has no `{ROLLOUT_DIR}/{rid}.pt` to join it to"
        ignored.extend((path, why) for _, path in sorted(by_rank.items()))
    steps.sort(key=lambda s: (s.rollout_id, s.evaluation))
    return DumpListing(root, tuple(steps), tuple(sorted(ignored)))


def _list_train_files(
    train_dir: Path,
) -> tuple[dict[int, dict[int, Path]], list[tuple[Path, str]]]:
    by_step: dict[int, dict[int, Path]] = {}
    ignored: list[tuple[Path, str]] = []
    if not train_dir.is_dir():
        return by_step, ignored
    for path in train_dir.iterdir():
        match = _TRAIN_NAME.match(path.name)
        if match is None or not path.is_file():
            ignored.append((path, NOT_A_DUMP_FILE))
            continue
        by_step.setdefault(int(match.group(1)), {})[int(match.group(2))] = path
    return by_step, ignored


def load_rollout(path: Path, rollout_id: int) -> dict[str, Any]:
    """Load a rollout dump and check its top-level structure (section 2.1)."""
    data = ptread.load(path)
    if not isinstance(data, dict) or not isinstance(data.get("samples"), list):
        raise DumpFormatError(path, "is not a rollout dump: it has no `samples` list")
    found = data.get("rollout_id")
    if type(found) is not int or found != rollout_id:  # exact type: a hostile `==` never runs
        raise DumpFormatError(
            path, f"holds `rollout_id` {short(found)}, but its name says {rollout_id}"
        )
    for position, sample in enumerate(data["samples"]):
        if not isinstance(sample, dict):
            raise DumpFormatError(
                path,
                f"sample is a {type(sample).__name__}, not a dict",
                sample=f"position {position}",
            )
    data.setdefault("metadata", {})
    return data


def load_train(path: Path, rank: int) -> dict[str, Any]:
    """Load one rank's train dump and check its top-level structure (section 3.1)."""
    data = ptread.load(path)
    if not isinstance(data, dict) or not isinstance(data.get("rollout_data"), dict):
        raise DumpFormatError(path, "is not a train dump: it has no `rollout_data` dict")
    columns = data["rollout_data"]
    for key in ("sample_indices", "response_lengths", "total_lengths", "tokens", "loss_masks"):
        if key not in columns:
            raise DumpFormatError(path, f"lacks the required column `{key}`")
        column = columns[key]
        scalar = isinstance(column, np.ndarray) and column.ndim == 0
        if type(column) not in (list, tuple, np.ndarray) or scalar:
            kind = "0-d tensor" if scalar else type(column).__name__
            raise DumpFormatError(path, f"column `{key}` is a {kind}, not a list or tensor")
    rows = len(columns["sample_indices"])
    for key in ("response_lengths", "total_lengths", "tokens", "loss_masks"):
        if len(columns[key]) != rows:
            raise DumpFormatError(
                path, f"column `{key}` has {len(columns[key])} rows; `sample_indices` has {rows}"
            )
    return data


__all__ = [
    "DumpFileError",
    "DumpListing",
    "StepFiles",
    "discover",
    "load_rollout",
    "load_train",
]
