"""Checks of the values tokenlake reads from train files (dump-format.md 3.1, 3.3).

A wrong type is a `DumpFormatError` naming the file, the field and (when known) the sample,
never a silent coercion: `int("2")`, `int(7.9)`, `float("1.5")` and an int64 log-prob tensor
cast to float would all land in the lake as if they were data.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tokenlake import schema
from tokenlake.errors import DumpFormatError, shown
from tokenlake.read.values import INT64_MAX, INT64_MIN, first_bool, is_int, scalar


def exact_int(value: Any, path: Path, field: str, sample: str | None = None) -> int:
    """An integer entry of a train column; anything else (str, float, bool) is an error."""
    value = scalar(value)
    if is_int(value):
        if INT64_MIN <= value <= INT64_MAX:  # a BIGINT; larger is no index or length any dump has
            return int(value)
        raise DumpFormatError(
            path, f"`{field}` is {shown(value)}; expected a 64-bit integer", sample=sample
        )
    what = f"{shown(value)} (a {type(value).__name__})"
    raise DumpFormatError(path, f"`{field}` is {what}; expected an integer", sample=sample)


def numbers(value: Any, path: Path, field: str, sample: str | None = None) -> np.ndarray:
    """A train array as numpy; strings, objects and ragged nests are an error."""
    try:
        array = np.asarray(value)
    except (ValueError, TypeError):
        array = np.asarray([], dtype=object)
    if array.dtype.kind not in "biuf":
        raise DumpFormatError(
            path,
            f"`{field}` holds {shown(value)}, not numbers",
            sample=sample,
        )
    refuse_a_bool_among_numbers(value, array, path, field, sample)
    return array


def refuse_a_bool_among_numbers(
    value: Any, array: np.ndarray, path: Path, field: str, sample: str | None = None
) -> None:
    """A list of numbers with a bool in it (numpy made it 1 or 0) is an error naming it."""
    entry = first_bool(value, array)
    if entry is not None:
        problem = f"`{field}` entry {entry} is {shown(value[entry])}, a bool among numbers"
        raise DumpFormatError(path, problem, sample=sample)


_REQUIRED = ("sample_indices", "response_lengths", "total_lengths", "tokens", "loss_masks")
_OPTIONAL = ("rewards", "truncated", "max_seq_lens", "raw_reward", *schema.CP_SLICED_FIELDS)


def is_column(value: Any) -> bool:
    if isinstance(value, np.ndarray):
        return value.ndim >= 1
    return isinstance(value, list | tuple)


def check_columns(path: Path, data: dict[str, Any]) -> None:
    """The columns tokenlake reads are lists (optional ones may be absent or None), and the CP
    header is integers: `cp_size` >= 1, 0 <= `cp_rank` < `cp_size` (dump-format.md 3.1, 3.3)."""
    columns = data["rollout_data"]
    for key in (*_REQUIRED, *_OPTIONAL):
        value = columns.get(key)
        if not is_column(value) and (value is not None or key in _REQUIRED):
            kind = "None" if value is None else f"of type `{type(value).__name__}`"
            raise DumpFormatError(
                path, f"column `{key}` is {kind}, not a list with one entry per row"
            )
    cp_size = data.get("cp_size")
    size = 1 if cp_size is None else exact_int(cp_size, path, "cp_size") or 1
    if size < 1:
        raise DumpFormatError(path, f"`cp_size` is {size}; expected 1 or more")
    if data.get("cp_rank") is not None:
        rank = exact_int(data["cp_rank"], path, "cp_rank")
        if not 0 <= rank < size:
            raise DumpFormatError(
                path, f"`cp_rank` is {rank}; expected 0..{size - 1} (`cp_size` {size})"
            )
    qkv_format = data.get("qkv_format")
    known = type(qkv_format) is str and qkv_format in _QKV_FORMATS  # exact type: no hostile `==`
    if size > 1 and qkv_format is not None and not known:
        raise DumpFormatError(
            path,
            f"`qkv_format` is {shown(qkv_format)}; tokenlake places the context-parallel slices"
            " of `thd` and `bshd` only",
        )


# The layouts whose CP slicing cp_layout.py knows (dump-format.md 4.4, 4.8); another one's
# slices would be placed as thd's, at the wrong positions.
_QKV_FORMATS = ("thd", "bshd")


def number_or_none(value: Any) -> float | None:
    """float() of a number; None for dicts, strings and other non-numbers (section 8.11)."""
    value = scalar(value)
    if isinstance(value, int | float | np.number | np.bool_):
        return float(value)
    return None


def reward_or_none(value: Any, path: Path, field: str, sample: str | None = None) -> float | None:
    """`number_or_none` of a train file's reward; an integer beyond float64 (`10**400`) is an
    error naming the file, as `Sample.reward` is on the rollout side."""
    try:
        return number_or_none(value)
    except OverflowError:
        problem = f"`{field}` is {shown(value)}, beyond the float64 range"
        raise DumpFormatError(path, problem, sample=sample) from None


def raw_rewards(path: Path, raw: Any) -> list[float | None]:
    """A batch-global `raw_reward` list as the lake's `raw_reward` holds it (non-numbers:
    NULL, section 8.11); an integer beyond float64 (`10**400`) is an error naming its entry."""
    rewards = []
    for position, value in enumerate(raw):
        try:
            rewards.append(number_or_none(value))
        except OverflowError:
            problem = f"`raw_reward` entry {position} is {shown(value)}, beyond the float64 range"
            raise DumpFormatError(path, problem) from None
    return rewards


def refuse_a_repeated_line(
    path: Path, seen: dict[int, int], key: int, number: int, what: str
) -> None:
    """A JSON-lines sample keyed by `key` (`what` names it and why it is unique): line `number`
    is recorded in `seen` as the key's, or, when an earlier line had it, the step fails (a line
    written twice would land as two samples)."""
    first = seen.setdefault(key, number)
    if first != number:
        raise DumpFormatError(path, what.format(key=key, first=first), sample=f"line {number}")


def flag_or_none(value: Any) -> bool | None:
    """A 0/1 flag (`truncated`); None when it is not an integer or bool (then status decides)."""
    value = scalar(value)
    if isinstance(value, int | np.integer | np.bool_):
        return bool(value)
    return None
