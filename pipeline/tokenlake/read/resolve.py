"""Join a step's train files to its rollout samples and resolve TP/PP/CP layouts (section 4).

Samples are keyed by batch position (their place in the rollout dump), not by `Sample.index`,
because agentic siblings may share an index (section 8.10); train rows are matched by
`sample_indices` and, when an index is ambiguous, by exact token equality.

Every value read from a train file is checked where it is read: a wrong type is a
`DumpFormatError` naming the file, sample and field (the step's one-line failure); a
response-aligned array that does not fit the response is NULL and flags `alignment_failed`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tokenlake import schema
from tokenlake.errors import DumpFormatError
from tokenlake.read import cp_layout
from tokenlake.read.train_checks import (
    exact_int,
    flag_or_none,
    is_column,
    numbers,
    reward_or_none,
)
from tokenlake.read.validate import sample_label
from tokenlake.read.values import is_int
from tokenlake.steptypes import TrainRow


@dataclass(frozen=True)
class TrainFile:
    """One loaded rank file of a step."""

    rank: int
    path: Path
    data: dict[str, Any]

    @property
    def columns(self) -> dict[str, Any]:
        return self.data["rollout_data"]


@dataclass(frozen=True)
class Location:
    """Row `row` of train file `file` holds the sample."""

    file: TrainFile
    row: int

    def get(self, key: str) -> Any:
        return self.file.columns[key][self.row]

    def has(self, key: str) -> bool:
        column = self.file.columns.get(key)
        return column is not None and is_column(column) and self.row < len(column)


def locate_rows(
    samples: list[dict[str, Any]], files: Sequence[TrainFile]
) -> dict[int, list[Location]]:
    """Map each batch position to the train rows holding it, in ascending rank order.

    Files with identical rows (same `sample_indices`, `tokens` and `loss_masks`) are one DP
    shard (TP/PP/CP peers) and share one assignment. Positions are claimed across the step's
    shards, so siblings sharing an index and tokens on different shards get distinct samples.
    """
    by_index: dict[Any, list[int]] = {}
    for position, sample in enumerate(samples):
        by_index.setdefault(_index_key(sample.get("index")), []).append(position)
    claimed: set[int] = set()
    shards: dict[Any, list[int]] = {}
    located: dict[int, list[Location]] = {}
    for train_file in files:
        key = _shard_key(train_file, by_index)
        if key not in shards:
            shards[key] = _assign_shard(train_file, samples, by_index, claimed)
        for row, position in enumerate(shards[key]):
            located.setdefault(position, []).append(Location(train_file, row))
    return located


def _assign_shard(
    train_file: TrainFile,
    samples: list[dict[str, Any]],
    by_index: dict[Any, list[int]],
    claimed: set[int],
) -> list[int]:
    """The batch position of each row of one shard's file, claiming positions step-wide."""
    positions = []
    for row, raw_index in enumerate(train_file.columns["sample_indices"]):
        index = _row_index(raw_index, train_file.path, row)
        candidates = by_index.get(index)
        if not candidates:
            raise DumpFormatError(
                train_file.path,
                f"train row {row} refers to `sample_index` {index}, which is absent from"
                " the step's rollout dump (mixed or corrupt dumps)",
            )
        position = _pick_candidate(candidates, samples, Location(train_file, row), claimed)
        claimed.add(position)
        positions.append(position)
    return positions


def _shard_key(train_file: TrainFile, by_index: dict[Any, list[int]]) -> Any:
    """What every rank of one DP shard shares: its `sample_indices`; and, when an index is
    shared by several samples (siblings), a digest of its rows' tokens and masks too."""
    path, columns = train_file.path, train_file.columns
    indices = tuple(_row_index(i, path, row) for row, i in enumerate(columns["sample_indices"]))
    if all(len(by_index.get(i, ())) < 2 for i in indices):
        return indices
    digest = hashlib.blake2b(digest_size=16)
    for key in ("tokens", "loss_masks"):
        column = columns.get(key)
        for value in column if column is not None and is_column(column) else ():
            array = numbers(value, path, key)
            digest.update(f"{array.dtype}{array.shape}".encode())
            digest.update(np.ascontiguousarray(array).tobytes())
    return indices, digest.digest()


def _row_index(value: Any, path: Path, row: int) -> int | None:
    """A `sample_indices` entry: an integer, or None for samples without an index."""
    return None if value is None else exact_int(value, path, "sample_indices", f"train row {row}")


def _pick_candidate(
    candidates: list[int], samples: list[dict[str, Any]], loc: Location, claimed: set[int]
) -> int:
    """Among samples sharing an index (agentic siblings, 8.10), the first unclaimed one whose
    tokens equal the train row's; else the first unclaimed one."""
    if len(candidates) == 1:
        return candidates[0]
    free = [p for p in candidates if p not in claimed] or candidates
    train_tokens = numbers(loc.get("tokens"), loc.file.path, "tokens")
    for position in free:
        tokens = samples[position].get("tokens")
        if not isinstance(tokens, Sequence | np.ndarray):
            continue
        if len(tokens) == len(train_tokens) and np.array_equal(train_tokens, tokens):
            return position
    return free[0]


def _index_key(value: Any) -> Any:
    """A rollout sample's `index` as a join key (validated on the rollout side)."""
    return int(value) if is_int(value) else value


def resolve_sample(
    position: int,
    sample: dict[str, Any],
    locations: list[Location],
    raw_reward: Sequence[float | None] | None,
) -> TrainRow:
    """Resolve one sample's train side from all the rank rows holding it (section 4.7)."""
    first = locations[0]
    label = sample_label(position, sample)
    response_length, total_length = _agreed_lengths(locations, label)
    loss_mask = numbers(first.get("loss_masks"), first.file.path, "loss_masks", label)
    if loss_mask.ndim != 1 or len(loss_mask) != response_length:
        raise DumpFormatError(
            first.file.path,
            f"`loss_masks` has length {len(loss_mask)}; `response_lengths` says {response_length}",
            sample=label,
        )
    layout = resolve_cp(locations, total_length, response_length, label)
    return TrainRow(
        dumped_rank=first.file.rank,
        response_length=response_length,
        total_length=total_length,
        loss_mask=loss_mask,
        normalized_reward=(
            reward_or_none(first.get("rewards"), first.file.path, "rewards", label)
            if first.has("rewards")
            else None
        ),
        truncated=flag_or_none(first.get("truncated")) if first.has("truncated") else None,
        raw_reward=raw_reward[position] if raw_reward is not None else None,
        fields=layout.fields,
        alignment_failed=layout.failed,
        holes=layout.holes,
        response_tokens=_response_tokens(first, total_length, response_length, label),
    )


def _response_tokens(
    loc: Location, total_length: int, response_length: int, label: str
) -> np.ndarray | None:
    """The last R of the row's `tokens` (the tokens its values are of), or None when the row
    has none or they are not `total_lengths` long (nothing to compare them with)."""
    if not loc.has("tokens"):
        return None
    tokens = numbers(loc.get("tokens"), loc.file.path, "tokens", label)
    if tokens.ndim != 1 or len(tokens) != total_length:
        return None
    return tokens[total_length - response_length :]


def _agreed_lengths(locations: list[Location], label: str) -> tuple[int, int]:
    first = locations[0]
    expected = _lengths(first, label)
    for loc in locations[1:]:
        got = _lengths(loc, label)
        if got != expected:
            raise DumpFormatError(
                loc.file.path,
                f"(response_length, total_length) = {got} disagrees with {expected} in"
                f" `{first.file.path.name}` (mixed or corrupt dumps)",
                sample=label,
            )
    return expected


def _lengths(loc: Location, label: str) -> tuple[int, int]:
    """(R, T) of one train row: integers with 0 <= R <= T."""
    path = loc.file.path
    response = exact_int(loc.get("response_lengths"), path, "response_lengths", label)
    total = exact_int(loc.get("total_lengths"), path, "total_lengths", label)
    if not 0 <= response <= total:
        raise DumpFormatError(
            path,
            f"`response_lengths` is {response} and `total_lengths` {total};"
            " expected 0 <= response length <= total length",
            sample=label,
        )
    return response, total


@dataclass
class CpFields:
    """Every CP-sliced field as a full response array (or None) and how the layout went."""

    fields: dict[str, np.ndarray | None]
    failed: bool  # `alignment_failed`: some dumped field could not be placed on the response
    holes: np.ndarray | None  # bool [R], positions no CP rank stores; None when there are none


def resolve_cp_fields(
    locations: list[Location], total_length: int, response_length: int
) -> tuple[dict[str, np.ndarray | None], bool]:
    """Every CP-sliced field as a full response array (or None), and `alignment_failed`."""
    layout = resolve_cp(locations, total_length, response_length)
    return layout.fields, layout.failed


def resolve_cp(
    locations: list[Location], total_length: int, response_length: int, label: str | None = None
) -> CpFields:
    """Reassemble every CP-sliced field (sections 4.5, 4.6) and find the positions no rank
    stores; a field with such holes is kept, its holes are unknown and the sample flagged."""
    recorded = any("cp_rank" in loc.file.data for loc in locations)
    if recorded:
        cp_of, cp_size, failed = _recorded_cp_ranks(locations)
    else:
        cp_of, cp_size, failed = _inferred_cp_ranks(locations, total_length, response_length)
    padded = _padded_length(locations[0], label)
    lengths = (total_length, response_length, padded)
    fields: dict[str, np.ndarray | None] = {}
    for name in schema.CP_SLICED_FIELDS:
        holders = [loc for loc in locations if loc.has(name)]
        if not holders:
            fields[name] = None  # not dumped: null, and not an alignment failure
            continue
        full = _assemble_field(name, holders, cp_of, cp_size, lengths, label)
        fields[name] = full
        failed = failed or full is None
    holes = None
    if cp_size > 1 and any(v is not None for v in fields.values()):
        uncovered = cp_layout.uncovered(total_length, response_length, cp_size, padded)
        holes = uncovered if uncovered.any() else None
    return CpFields(fields, failed or holes is not None, holes)


def _recorded_cp_ranks(locations: list[Location]) -> tuple[dict[int, int], int, bool]:
    first = locations[0].file.data
    cp_size = int(first.get("cp_size") or 1)
    cp_of = {id(loc): int(loc.file.data.get("cp_rank") or 0) for loc in locations}
    complete = len(set(cp_of.values())) == cp_size
    return cp_of, cp_size, not complete


def _inferred_cp_ranks(
    locations: list[Location], total_length: int, response_length: int
) -> tuple[dict[int, int], int, bool]:
    """Legacy dumps: infer CP ranks from distinct `rollout_log_probs` slices (section 4.6)."""
    probe = schema.ROLLOUT_LOG_PROBS_FIELD
    holders = [loc for loc in locations if loc.has(probe)]
    if not holders:
        return {id(loc): 0 for loc in locations}, 1, False
    distinct: list[np.ndarray] = []
    cp_of: dict[int, int] = {}
    for loc in holders:
        values = numbers(loc.get(probe), loc.file.path, probe)
        for group, seen in enumerate(distinct):
            if seen.shape == values.shape and np.array_equal(seen, values, equal_nan=True):
                cp_of[id(loc)] = group
                break
        else:
            cp_of[id(loc)] = len(distinct)
            distinct.append(values)
    cp_size = len(distinct)
    if cp_size == 1:
        return cp_of, 1, False
    widths = [
        cp_layout.rank_width(total_length, response_length, s, cp_size) for s in range(cp_size)
    ]
    if any(v.ndim != 1 for v in distinct) or [len(v) for v in distinct] != widths:
        return {}, cp_size, True  # refused: no location is mapped
    if sum(widths) != response_length:
        return {}, cp_size, True
    return cp_of, cp_size, False


def _padded_length(first: Location, label: str | None) -> int | None:
    if first.file.data.get("qkv_format", "thd") != "bshd":
        return None
    if not first.has("max_seq_lens"):
        return None
    padded = exact_int(first.get("max_seq_lens"), first.file.path, "max_seq_lens", label)
    if padded < 1:
        raise DumpFormatError(
            first.file.path, f"`max_seq_lens` is {padded}; expected 1 or more", sample=label
        )
    return padded


def _assemble_field(
    name: str,
    holders: list[Location],
    cp_of: dict[int, int],
    cp_size: int,
    lengths: tuple[int, int, int | None],
    label: str | None,
) -> np.ndarray | None:
    """The full response array of one field; None when the slices do not fit the response."""
    total_length, response_length, padded = lengths
    slices: dict[int, np.ndarray] = {}
    for loc in holders:  # ascending rank: the first copy of each CP rank wins (TP dedupe)
        cp_rank = cp_of.get(id(loc))
        if cp_rank is not None and cp_rank not in slices:
            slices[cp_rank] = _float_slice(loc, name, label)
    if any(part.ndim != 1 for part in slices.values()):
        return None
    if cp_size == 1:
        full = slices.get(0)
    elif len(slices) != cp_size or sorted(slices) != list(range(cp_size)):
        return None  # (the count first: a forged `cp_size` of 2**40 builds no such list)
    else:
        ordered = [slices[s] for s in range(cp_size)]
        full = cp_layout.assemble(ordered, total_length, response_length, padded)
    if full is None or full.ndim != 1 or len(full) != response_length:
        return None
    return full


def _float_slice(loc: Location, name: str, label: str | None) -> np.ndarray:
    """One rank's slice of a CP-sliced field: floating point, or the step fails (an int64
    log-prob tensor would otherwise land as 0, 1, 2, ...)."""
    array = numbers(loc.get(name), loc.file.path, name, label)
    if array.dtype.kind != "f":
        raise DumpFormatError(
            loc.file.path,
            f"`{name}` holds {array.dtype} values; expected floating-point numbers",
            sample=label,
        )
    return array
