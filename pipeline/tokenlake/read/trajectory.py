"""Conversations from `trajectory/{stem}.jsonl` (dump-format.md 2.7), matched to samples.

miles moves `metadata["messages"]` out of the rollout `.pt` into this sidecar, one line per
sample that recorded a conversation, in batch order. `sample_index` can repeat (eval datasets,
agentic siblings) and only some samples have a line, so a line is matched on everything it
carries (`sample_index`, `group_index`, `status`, `reward`, `prompt`), keeping the file's
order: it goes to a sample only when every order-keeping assignment of the index's lines puts
it there. An ambiguous line, or one no sample fits, is left out (NULL), never guessed.

Dumps written before the sidecar existed (2026-07-22), or with it disabled, keep the
conversation inside the `.pt` as `metadata["messages"]` (dump-format.md 2.2); a sample's own
list is read there when the sidecar gives it none.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from tokenlake import bounded
from tokenlake.errors import (
    SHOWN_PATH_CHARS,
    BoundedReadError,
    DumpFormatError,
    SampleValueError,
    shown,
)
from tokenlake.read.jsontext import to_json

# Keys a line shares with its sample; a key the line lacks does not constrain the match.
_MATCHED_KEYS = ("group_index", "status", "reward", "prompt")
# One sample's conversation: the longest contexts (1M tokens) are ~4 MB of text.
MAX_LINE_BYTES = 16 * bounded.MiB
# A step's conversations: 4096 samples of 256 KB each (a long agentic trace with tool output).
MAX_FILE_BYTES = 1 << 30


@dataclass(frozen=True)
class _Record:
    """What is kept of a line: its index, the values it is matched on (containers as their
    JSON text, so a line costs about its size in memory) and its conversation as JSON text."""

    index: int
    keys: dict[str, Any]
    messages: str


class _JsonText(str):
    """A matched value that is a list or an object, kept as its JSON text (keys sorted)."""


def messages_by_position(
    path: Path | None,
    samples: list[dict[str, Any]],
    warnings: list[str] | None = None,
    within: Path | None = None,
) -> list[str | None]:
    """Each sample's conversation as JSON text, or None (no line for it, ambiguous, no file,
    and no `metadata["messages"]` list in the sample).

    A file larger than `MAX_FILE_BYTES` or not a regular file is not read, and a line longer
    than `MAX_LINE_BYTES` is skipped: one line each in `warnings`, the step still lands.

    Examples:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     p = Path(d) / "0.jsonl"
        ...     _ = p.write_text('{"sample_index": 5, "messages": [{"role": "user"}]}\\n')
        ...     messages_by_position(p, [{"index": 4}, {"index": 5}])
        [None, '[{"role": "user"}]']
    """
    out = [_messages_in_sample(position, sample) for position, sample in enumerate(samples)]
    if path is None:
        return out
    positions: dict[int, list[int]] = defaultdict(list)
    for position, sample in enumerate(samples):
        index = sample.get("index")
        if isinstance(index, int | np.integer) and not isinstance(index, bool | np.bool_):
            positions[int(index)].append(position)
    for index, records in _records_by_index(path, positions, warnings, within).items():
        candidates = positions[index]
        fits = [[_fits(r.keys, samples[p]) for p in candidates] for r in records]
        for line, slot in enumerate(forced_slots(fits)):
            if slot is not None:
                out[candidates[slot]] = records[line].messages
    return out


def _messages_in_sample(position: int, sample: dict[str, Any]) -> str | None:
    """`metadata["messages"]` as JSON text when it is a list (the sidecar's `messages`), else
    None; beyond the bounds of `jsontext.to_json`, the sample's `SampleValueError`."""
    metadata = sample.get("metadata")
    messages = metadata.get("messages") if isinstance(metadata, dict) else None
    if not isinstance(messages, list):
        return None
    try:
        return to_json(messages, "metadata.messages")
    except SampleValueError as exc:
        exc.position = position
        raise


def _records_by_index(
    path: Path,
    positions: dict[int, list[int]],
    warnings: list[str] | None,
    within: Path | None = None,
) -> dict[int, list[_Record]]:
    """The lines that may go to a sample, by index. A line for an index no sample has is
    dropped at once, and so are all lines of an index with more lines than samples (no
    assignment exists), so at most one line per sample is kept."""
    kept: dict[int, list[_Record]] = defaultdict(list)
    overfull: set[int] = set()
    for line in read_records(path, warnings, within):
        index = line["sample_index"]
        if index not in positions or index in overfull:
            continue
        keys = {key: _kept(line[key]) for key in _MATCHED_KEYS if key in line}
        kept[index].append(_Record(index, keys, _json_text(line["messages"])))
        if len(kept[index]) > len(positions[index]):
            overfull.add(index)
            del kept[index]
    return kept


def read_records(
    path: Path, warnings: list[str] | None = None, within: Path | None = None
) -> Iterator[dict[str, Any]]:
    """The file's records, parsed one line at a time; a line that is not UTF-8 JSON with an
    integer `sample_index` and a `messages` list fails the step with one line naming the
    file and the line. Beyond the size bounds, or a link out of the dump `within`: a warning
    in `warnings`, and no record (see `messages_by_position`)."""
    notes = warnings if warnings is not None else []
    where = shown(path, SHOWN_PATH_CHARS)
    try:
        handle = bounded.open_regular(path, within=within)
    except BoundedReadError as exc:
        notes.append(f"`{where}` {exc.problem}; the step's conversations are NULL.")
        return
    with handle:
        size = os.fstat(handle.fileno()).st_size
        if size > MAX_FILE_BYTES:
            problem = bounded.too_large(path, size, MAX_FILE_BYTES, "a trajectory file").problem
            notes.append(f"`{where}` {problem}; the step's conversations are NULL.")
            return
        yield from _parse_lines(path, handle, size, notes)


def _parse_lines(path: Path, handle: Any, size: int, notes: list[str]) -> Iterator[dict[str, Any]]:
    long_lines = []
    for number, line in enumerate(bounded.lines(handle, 0, size, MAX_LINE_BYTES), start=1):
        if line.text is None:
            long_lines.append(number)
        elif line.text.strip():
            yield _record(path, number, line.text)
    if long_lines:
        numbers = ", ".join(str(n) for n in long_lines[:5]) + (
            ", ..." if len(long_lines) > 5 else ""
        )
        notes.append(
            f"`{shown(path, SHOWN_PATH_CHARS)}`: {len(long_lines)} line(s) longer than"
            f" {bounded.amount(MAX_LINE_BYTES)} skipped (line {numbers}); their samples'"
            " conversations are NULL."
        )


def _record(path: Path, number: int, raw: bytes) -> dict[str, Any]:
    try:
        record = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        why = f"byte {exc.start + 1} of the line is not UTF-8"
        _bad_line(path, number, f"{_index_hint(raw)}{why}")
    except RecursionError:
        _bad_line(path, number, "JSON nested too deeply to read")
    except ValueError as exc:
        _bad_line(path, number, str(exc))
    index = record.get("sample_index") if isinstance(record, dict) else None
    if not isinstance(index, int) or isinstance(index, bool):
        _bad_line(path, number, "no integer `sample_index`")
    if not isinstance(record.get("messages"), list):
        _bad_line(path, number, f"sample_index {index} has no `messages` list")
    return record


def _kept(value: Any) -> Any:
    """A line's matched value as kept: a list or object as its JSON text, others as they are."""
    if isinstance(value, list | dict):
        return _JsonText(json.dumps(value, sort_keys=True, ensure_ascii=False))
    return value


def _index_hint(raw: bytes) -> str:
    """`sample_index N: ` when a line that is not UTF-8 still says which sample it is for."""
    try:
        record = json.loads(raw.decode("utf-8", "replace"))
    except (ValueError, RecursionError):
        return ""
    index = record.get("sample_index") if isinstance(record, dict) else None
    return f"sample_index {index}: " if type(index) is int else ""


def _bad_line(path: Path, number: int, why: str) -> NoReturn:
    raise DumpFormatError(
        path, f"line {number} is not a trajectory record ({why}); delete or fix it"
    )


def _json_text(messages: list[Any]) -> str:
    """JSON text of a conversation; \\u escapes for lone surrogates, which UTF-8 (Parquet)
    cannot hold."""
    text = json.dumps(messages, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(messages)
    return text


def _fits(record: dict[str, Any], sample: dict[str, Any]) -> bool:
    """Whether everything the line carries agrees with the sample (dump-format.md 2.7); a key
    the sample lacks (older dumps) does not count against it."""
    for key in _MATCHED_KEYS:
        if key in record and key in sample and not _same(record[key], _line_value(key, sample)):
            return False
    return True


def _line_value(key: str, sample: dict[str, Any]) -> Any:
    """What miles writes into a line for this key of the sample."""
    value = sample.get(key)
    if key == "status" and value is not None:
        return str(getattr(value, "value", value))
    if key == "reward" and not isinstance(value, int | float):
        return None  # miles writes null for dict and other non-number rewards
    return value


def _same(line_value: Any, sample_value: Any) -> bool:
    """Equal as JSON would carry them (so a tuple equals a list, 1 equals 1.0)."""
    try:
        carried = json.loads(json.dumps(sample_value, allow_nan=True))
        if isinstance(line_value, _JsonText):
            return line_value == json.dumps(carried, sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        return False
    if isinstance(carried, float) and carried != carried:  # NaN reward written as NaN
        return isinstance(line_value, float) and line_value != line_value
    return bool(line_value == carried)


def forced_slots(fits: list[list[bool]]) -> list[int | None]:
    """For lines 0..k-1 and candidates 0..m-1 (`fits[line][candidate]`), the candidate each
    line must take in every order-keeping one-to-one assignment, or None when it could take
    several (ambiguous) or no assignment exists.

    The leftmost and the rightmost greedy assignments bound every line's feasible candidates,
    and both are feasible, so a line is forced exactly when the two agree.

    Examples:
        >>> forced_slots([[True, True]])  # one line, two fitting samples: ambiguous
        [None]
        >>> forced_slots([[True, True], [True, True]])  # two lines, two samples: in order
        [0, 1]
        >>> forced_slots([[False, True, True]])
        [None]
        >>> forced_slots([[True, False, True], [False, False, True]])
        [0, 2]
    """
    left = _greedy(fits, range(len(fits[0]) if fits else 0))
    right = _greedy([row[::-1] for row in fits[::-1]], range(len(fits[0]) if fits else 0))
    if left is None or right is None:
        return [None] * len(fits)
    width = len(fits[0])
    right = [width - 1 - slot for slot in right[::-1]]
    return [a if a == b else None for a, b in zip(left, right, strict=True)]


def _greedy(fits: list[list[bool]], candidates: range) -> list[int] | None:
    """Each line in order takes the first fitting candidate after the previous line's."""
    taken, start = [], 0
    for row in fits:
        slot = next((c for c in candidates[start:] if row[c]), None)
        if slot is None:
            return None
        taken.append(slot)
        start = slot + 1
    return taken
