"""Join a step's train files to its rollout samples and resolve TP/PP/CP layouts (section 4).

Samples are keyed by batch position (their place in the rollout dump), not by `Sample.index`,
because agentic siblings may share an index (section 8.10); train rows are matched by
`sample_indices` and, when an index is ambiguous, by exact token equality.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline import cp_layout, schema
from pipeline.errors import DumpFormatError


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
        return isinstance(column, Sequence | np.ndarray) and self.row < len(column)


@dataclass
class TrainRow:
    """The resolved train side of one sample."""

    dumped_rank: int
    response_length: int
    total_length: int
    loss_mask: np.ndarray  # int, length R (train side, authoritative)
    normalized_reward: float | None
    truncated: bool | None
    raw_reward: float | None
    fields: dict[str, np.ndarray | None]  # CP-sliced field -> full response array or None
    alignment_failed: bool


def sample_label(position: int, sample: dict[str, Any]) -> str:
    """How errors name a sample: its batch position and `Sample.index`."""
    return f"batch position {position}, sample_index {sample.get('index')}"


def locate_rows(
    samples: list[dict[str, Any]], files: Sequence[TrainFile]
) -> dict[int, list[Location]]:
    """Map each batch position to the train rows holding it, in ascending rank order."""
    by_index: dict[Any, list[int]] = {}
    for position, sample in enumerate(samples):
        by_index.setdefault(_as_int(sample.get("index")), []).append(position)
    located: dict[int, list[Location]] = {}
    for train_file in files:
        claimed: set[int] = set()  # a file holds each sample once: siblings get distinct rows
        for row, raw_index in enumerate(train_file.columns["sample_indices"]):
            index = _as_int(raw_index)
            candidates = by_index.get(index)
            if not candidates:
                raise DumpFormatError(
                    train_file.path,
                    f"train row {row} refers to `sample_index` {index}, which is absent from"
                    " the step's rollout dump (mixed or corrupt dumps)",
                )
            location = Location(train_file, row)
            position = _pick_candidate(candidates, samples, location, claimed)
            claimed.add(position)
            located.setdefault(position, []).append(location)
    return located


def _pick_candidate(
    candidates: list[int], samples: list[dict[str, Any]], loc: Location, claimed: set[int]
) -> int:
    """Among samples sharing an index (agentic siblings, 8.10), the first unclaimed one whose
    tokens equal the train row's; else the first unclaimed one."""
    if len(candidates) == 1:
        return candidates[0]
    free = [p for p in candidates if p not in claimed] or candidates
    train_tokens = np.asarray(loc.get("tokens"))
    for position in free:
        tokens = samples[position].get("tokens") or []
        if len(tokens) == len(train_tokens) and np.array_equal(train_tokens, tokens):
            return position
    return free[0]


def _as_int(value: Any) -> int | None:
    return None if value is None else int(value)


def resolve_sample(
    position: int,
    sample: dict[str, Any],
    locations: list[Location],
    raw_reward: Sequence[Any] | None,
) -> TrainRow:
    """Resolve one sample's train side from all the rank rows holding it (section 4.7)."""
    first = locations[0]
    label = sample_label(position, sample)
    response_length, total_length = _agreed_lengths(locations, label)
    loss_mask = np.asarray(first.get("loss_masks"))
    if loss_mask.ndim != 1 or len(loss_mask) != response_length:
        raise DumpFormatError(
            first.file.path,
            f"`loss_masks` has length {len(loss_mask)}; `response_lengths` says {response_length}",
            sample=label,
        )
    fields, failed = resolve_cp_fields(locations, total_length, response_length)
    return TrainRow(
        dumped_rank=first.file.rank,
        response_length=response_length,
        total_length=total_length,
        loss_mask=loss_mask,
        normalized_reward=_float_or_none(first.get("rewards")) if first.has("rewards") else None,
        truncated=bool(first.get("truncated")) if first.has("truncated") else None,
        raw_reward=_float_or_none(raw_reward[position]) if raw_reward is not None else None,
        fields=fields,
        alignment_failed=failed,
    )


def _agreed_lengths(locations: list[Location], label: str) -> tuple[int, int]:
    first = locations[0]
    expected = (int(first.get("response_lengths")), int(first.get("total_lengths")))
    for loc in locations[1:]:
        got = (int(loc.get("response_lengths")), int(loc.get("total_lengths")))
        if got != expected:
            raise DumpFormatError(
                loc.file.path,
                f"(response_length, total_length) = {got} disagrees with {expected} in"
                f" `{first.file.path.name}` (mixed or corrupt dumps)",
                sample=label,
            )
    return expected


def _float_or_none(value: Any) -> float | None:
    """float() of a number; None for dicts and other non-numbers (section 8.11)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def resolve_cp_fields(
    locations: list[Location], total_length: int, response_length: int
) -> tuple[dict[str, np.ndarray | None], bool]:
    """Every CP-sliced field as a full response array (or None), and `alignment_failed`."""
    recorded = any("cp_rank" in loc.file.data for loc in locations)
    if recorded:
        cp_of, cp_size, failed = _recorded_cp_ranks(locations)
    else:
        cp_of, cp_size, failed = _inferred_cp_ranks(locations, total_length, response_length)
    padded = _padded_length(locations[0])
    fields: dict[str, np.ndarray | None] = {}
    for name in schema.CP_SLICED_FIELDS:
        holders = [loc for loc in locations if loc.has(name)]
        if not holders:
            fields[name] = None  # not dumped: null, and not an alignment failure
            continue
        full = _assemble_field(
            name, holders, cp_of, cp_size, (total_length, response_length, padded)
        )
        fields[name] = full
        failed = failed or full is None
    return fields, failed


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
        values = np.asarray(loc.get(probe))
        for group, seen in enumerate(distinct):
            if len(seen) == len(values) and np.array_equal(seen, values, equal_nan=True):
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
    if sum(len(v) for v in distinct) != response_length or [len(v) for v in distinct] != widths:
        return {}, cp_size, True  # refused: no location is mapped
    return cp_of, cp_size, False


def _padded_length(first: Location) -> int | None:
    if first.file.data.get("qkv_format", "thd") != "bshd":
        return None
    if not first.has("max_seq_lens"):
        return None
    return int(first.get("max_seq_lens"))


def _assemble_field(
    name: str,
    holders: list[Location],
    cp_of: dict[int, int],
    cp_size: int,
    lengths: tuple[int, int, int | None],
) -> np.ndarray | None:
    total_length, response_length, padded = lengths
    slices: dict[int, np.ndarray] = {}
    for loc in holders:  # ascending rank: the first copy of each CP rank wins (TP dedupe)
        cp_rank = cp_of.get(id(loc))
        if cp_rank is not None and cp_rank not in slices:
            slices[cp_rank] = np.asarray(loc.get(name))
    if cp_size == 1:
        full = slices.get(0)
    elif sorted(slices) != list(range(cp_size)):
        return None
    else:
        ordered = [slices[s] for s in range(cp_size)]
        full = cp_layout.assemble(ordered, total_length, response_length, padded)
    if full is None or full.ndim != 1 or len(full) != response_length:
        return None
    return full
