"""slime's train dump format 2: one `train_data/{rid}.pt` per step (docs/frameworks.md).

`{format_version: 2, rollout_id, rank, samples, dp_shards, raw_reward}`: `samples` holds one
dict per trained sample with `rollout_position` (its index in `rollout_data/{rid}.pt`, the
join key), `sample_index`, `data_parallel_rank` and every column at full length (slime
gathered the context-parallel slices before writing), so there is no TP/PP/CP resolution.
Each sample's columns become one train row, read by the same checks as a miles rank file's
(`read/resolve.py`, `resolve_sample`); the rollout side is miles' (`dump.load_rollout`).

`ref_entropy` is the exception slime leaves: it is not gathered over CP ranks, so with CP > 1
it holds CP rank 0's chunks only. Placed nowhere, it is NULL (not an alignment failure); at
full length (CP 1) it is kept.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tokenlake import schema
from tokenlake.errors import DumpFormatError, shown
from tokenlake.read import dump, pt, train_checks, validate
from tokenlake.read.resolve import Location, TrainFile, resolve_sample
from tokenlake.read.train_checks import exact_int, is_column
from tokenlake.steptypes import ListArray, StepRead, TrainRow

FORMAT_VERSION = 2
# The v2 sample keys that become the train row's columns, under miles' column names.
_COLUMNS = (
    "response_lengths",
    "total_lengths",
    "tokens",
    "loss_masks",
    "rewards",
    "truncated",
    *schema.CP_SLICED_FIELDS,
)
_REQUIRED = ("response_lengths", "total_lengths", "tokens", "loss_masks")
_NOT_GATHERED = "ref_entropy"  # CP-local in slime's format 2 (see the module docstring)


def read_step(files: dump.StepFiles) -> StepRead:
    """The step's rollout samples and, when its train file is there, their train rows."""
    rollout = dump.load_rollout(files.rollout_file, files.rollout_id)
    samples: list[dict[str, Any]] = rollout["samples"]
    checked = validate.check_samples(files.rollout_file, samples)
    rows: dict[int, TrainRow] = {}
    for _, path in files.train_files:
        rows = train_rows(path, load_train(path, files.rollout_id), samples)
    return StepRead(samples, checked, rows, len(files.train_files))


def load_train(path: Path, rollout_id: int) -> dict[str, Any]:
    """Load a format-2 train file and check its top-level structure."""
    data = pt.load(path)
    if not isinstance(data, dict):
        raise DumpFormatError(path, f"is {shown(data)}, not a slime train dump (a dict)")
    version = data.get("format_version")
    if type(version) is not int or version != FORMAT_VERSION:  # exact type: no hostile `==`
        raise DumpFormatError(
            path,
            f"has `format_version` {shown(version)}; tokenlake reads slime's per-step train"
            f" dumps of format version {FORMAT_VERSION}",
        )
    found = data.get("rollout_id")
    if type(found) is not int or found != rollout_id:
        raise DumpFormatError(
            path, f"holds `rollout_id` {shown(found)}, but its name says {rollout_id}"
        )
    for key in ("samples", "dp_shards"):
        if not isinstance(data.get(key), list):
            raise DumpFormatError(path, f"has no `{key}` list")
    return data


def train_rows(
    path: Path, data: dict[str, Any], samples: list[dict[str, Any]]
) -> dict[int, TrainRow]:
    """Batch position -> train row of every sample the file holds."""
    raw_reward = _raw_reward(path, data, len(samples))
    shard_ranks = _shard_ranks(path, data)
    placed: dict[int, Location] = {}
    for entry, train in enumerate(data["samples"]):
        position, dp_rank = _keys(path, entry, train, samples, placed)
        if dp_rank not in shard_ranks:
            raise DumpFormatError(
                path,
                f"`data_parallel_rank` {dp_rank} is in no `dp_shards` entry",
                sample=f"train sample {entry}",
            )
        placed[position] = Location(_one_row_file(path, shard_ranks[dp_rank], train, entry), 0)
    return {
        position: resolve_sample(position, samples[position], [location], raw_reward)
        for position, location in sorted(placed.items())
    }


def _one_row_file(path: Path, rank: int, train: dict[str, Any], entry: int) -> TrainFile:
    """One train sample as a one-row rank file (miles' column layout) of its shard's rank,
    checked as a rank file's columns are."""
    columns: dict[str, Any] = {"sample_indices": [train["sample_index"]]}
    label = f"train sample {entry}"
    for key in _COLUMNS:
        value = train.get(key)
        if key == _NOT_GATHERED and _is_cp_local(path, value, train, label):
            value = None
        if value is not None or key in _REQUIRED:
            columns[key] = [value]
    train_file = TrainFile(rank, path, {"rollout_data": columns})
    train_checks.check_columns(path, train_file.data)
    return train_file


def _keys(
    path: Path,
    entry: int,
    train: Any,
    samples: list[dict[str, Any]],
    placed: dict[int, Location],
) -> tuple[int, int]:
    """(rollout position, data-parallel rank) of one train sample, checked against the
    rollout dump: the position exists, is taken once, and holds the same `Sample.index`."""
    label = f"train sample {entry}"
    if not isinstance(train, dict):
        raise DumpFormatError(path, f"is {shown(train)}, not a dict", sample=label)
    for key in ("rollout_position", "sample_index", "data_parallel_rank"):
        if key not in train:
            raise DumpFormatError(path, f"lacks `{key}`", sample=label)
    position = exact_int(train["rollout_position"], path, "rollout_position", label)
    if not 0 <= position < len(samples):
        raise DumpFormatError(
            path,
            f"`rollout_position` {position} is outside the rollout dump's {len(samples)}"
            " samples (mixed or corrupt dumps)",
            sample=label,
        )
    if position in placed:
        raise DumpFormatError(path, f"`rollout_position` {position} is listed twice", sample=label)
    index = train["sample_index"]
    index = None if index is None else exact_int(index, path, "sample_index", label)
    expected = validate.optional_int64(samples[position].get("index"), "index")
    if index != expected:
        raise DumpFormatError(
            path,
            f"`sample_index` {index} differs from `index` {expected} of the rollout dump's"
            f" sample at position {position} (mixed or corrupt dumps)",
            sample=label,
        )
    _same_tokens(path, train, samples[position], position, label)
    return position, exact_int(train["data_parallel_rank"], path, "data_parallel_rank", label)


def _same_tokens(
    path: Path, train: dict[str, Any], sample: dict[str, Any], position: int, label: str
) -> None:
    """The train sample's `tokens` are the rollout sample's (same length: a media-expanded
    sequence differs in length, and the flattener handles it)."""
    if "tokens" not in train or not isinstance(sample.get("tokens"), list | ListArray):
        return  # a missing column fails in `resolve_sample`; rollout tokens are checked there
    ours = train_checks.numbers(train["tokens"], path, "tokens", label)
    theirs = sample["tokens"]
    if ours.ndim == 1 and len(ours) == len(theirs) and not np.array_equal(ours, theirs):
        raise DumpFormatError(
            path,
            f"`tokens` differ from those of the rollout dump's sample at position {position}"
            " (mixed or corrupt dumps)",
            sample=label,
        )


def _is_cp_local(path: Path, value: Any, train: dict[str, Any], label: str) -> bool:
    """Whether `ref_entropy` is a CP-local slice: a 1-D array not of the response's length."""
    if not is_column(value) or "response_lengths" not in train:
        return False
    return len(value) != exact_int(train["response_lengths"], path, "response_lengths", label)


def _shard_ranks(path: Path, data: dict[str, Any]) -> dict[int, int]:
    """Data-parallel rank -> the global rank slime gave that shard (`dumped_rank`); a shard
    listed twice is an error (either entry's rank could be meant)."""
    ranks: dict[int, int] = {}
    entries: dict[int, int] = {}  # data-parallel rank -> its dp_shards entry
    for entry, shard in enumerate(data["dp_shards"]):
        label = f"dp_shards entry {entry}"
        if not isinstance(shard, dict) or "data_parallel_rank" not in shard or "rank" not in shard:
            raise DumpFormatError(
                path, "is not a dict with `data_parallel_rank` and `rank`", sample=label
            )
        dp_rank = exact_int(shard["data_parallel_rank"], path, "data_parallel_rank", label)
        first = entries.setdefault(dp_rank, entry)
        if first != entry:
            raise DumpFormatError(
                path,
                f"`data_parallel_rank` {dp_rank} is dp_shards entry {first}'s too; slime lists"
                " each data-parallel shard once",
                sample=label,
            )
        ranks[dp_rank] = exact_int(shard["rank"], path, "rank", label)
    return ranks


def _raw_reward(path: Path, data: dict[str, Any], samples: int) -> list[float | None] | None:
    """The batch-global `raw_reward` (one per rollout position), or None if not dumped."""
    raw = data.get("raw_reward")
    if raw is None:
        return None
    if not isinstance(raw, list) or len(raw) != samples:
        size = f"{len(raw)} entries" if isinstance(raw, list) else shown(raw)
        raise DumpFormatError(
            path,
            f"`raw_reward` is {size}; expected one entry per rollout sample ({samples})",
        )
    return train_checks.raw_rewards(path, raw)
