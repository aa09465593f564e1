"""NVIDIA NeMo-RL's logged batches: `train_data_step{N}.jsonl`, `val_data_step{N}.jsonl`.

NeMo-RL's `Logger.log_batched_dict_as_jsonl` writes one line per sample of a step into the
run's log directory, each value wrapped in a one-entry list (a one-row slice of the batch),
plus the line number `idx`. Train lines hold the whole padded sequence and token-aligned
arrays (docs/frameworks.md has the mapping):

- `token_ids`, padded to the step's longest sequence; `input_lengths` L is the unpadded
  length, and nothing at or past L ever becomes a row;
- the prompt is what precedes the first token with `token_loss_mask` 1 (NeMo-RL sets it on
  exactly the generated tokens); the response, the lake's rows, is everything after it up to
  L, tool and environment tokens included (their mask 0);
- the loss mask is `token_loss_mask` times `sample_loss_mask` (0 takes the whole sample out of
  the loss: `remove_sample`), and 0 at position 0, which NeMo-RL's loss never reads;
- `generation_logprobs` is the engine's log-prob, `prev_logprobs` the trainer's, `advantages`
  the advantage at each position. `prev_logprobs` all 0.0 (NeMo-RL with
  `loss_fn.force_on_policy_ratio`, which never computes them) are placeholders: NULL, so
  `lp_diff` is NULL there.

No weight versions, group index, rank or truncation flag is logged: those columns are NULL.
Validation lines hold only `content` (the messages), `rewards` and `idx`: samples without
tokens. So do train lines NeMo-RL wrote before 2026-02-21 (f11f99c79; its async loop until
2026-03-01, 7684dc27c): `content`, `rewards`, `input_lengths` and the two log-prob arrays, but no
`token_ids`, `token_loss_mask`, `sample_loss_mask` or `advantages`. Without the token ids and
the mask nothing tells which positions are the response, so those log-probs are placed
nowhere: the samples land with their reward and messages, lengths and train rows unknown.
NeMo-RL's on-policy distillation logs its train lines so to this day, with `content` and
`input_lengths` only (`algorithms/distillation.py`): no reward either.

Lines are streamed one at a time (`bounded.lines`): a line longer than `MAX_LINE_BYTES` or
nested deeper than `MAX_DEPTH`, or not a JSON object of the expected types, fails the step
with one line naming the file and the line. A line's long lists of numbers and bools come as
the arrays `np.asarray` would make of them (`jsonarrays`).
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tokenlake import bounded
from tokenlake.errors import (
    BoundedReadError,
    DumpFileError,
    DumpFormatError,
    DumpNotFoundError,
    PipelineError,
    UnreadableError,
    shown,
)
from tokenlake.read import dump, jsonarrays, pt, validate
from tokenlake.read.jsontext import clean_text, to_json
from tokenlake.read.train_checks import exact_int, numbers, refuse_a_repeated_line
from tokenlake.steptypes import ListArray, StepRead, TrainRow

LOG_NAME = re.compile(r"^(train|val)_data_step([0-9]+)\.jsonl\Z")
# One sample's line: ~20 bytes per position for each of its five arrays, so 256 MiB is a
# sequence of about 2.5 million tokens; a longer line fails its step.
MAX_LINE_BYTES = 256 << 20
_REPEATED_IDX = "`idx` {key} is line {first}'s too; NeMo-RL logs each sample of a batch once"
MAX_DEPTH = 8  # {"content": [[{"role": ...}]]} nests 4 deep
# NeMo-RL logs no truncation: unknown, never false.
_NOT_LOGGED = ("truncated",)
# Validation lines hold no tokens either: their lengths are unknown, not 0.
_NOT_IN_VALIDATION = (
    *_NOT_LOGGED,
    "response_length",
    "total_length",
    "prompt_length",
    "prompt_token_ids",
)
_ARRAYS = ("token_ids", "token_loss_mask", "generation_logprobs", "prev_logprobs", "advantages")
# The train line's keys NeMo-RL added on 2026-02-21 (module docstring): a line with none of
# them is an older line, without tokens.
_SINCE_2026_02 = ("token_ids", "token_loss_mask", "sample_loss_mask", "advantages")
# Each array is the one entry of its list, which a line's reading may give as an array.
_WANTED = tuple((key, 0) for key in _ARRAYS)


def is_log_name(name: str) -> bool:
    """Whether a file name is one of NeMo-RL's logged batches.

    Examples:
        >>> is_log_name("train_data_step3.jsonl"), is_log_name("train_data_3.jsonl")
        (True, False)
    """
    return LOG_NAME.match(name) is not None


def discover(root: Path) -> dump.Dump:
    """The log directory's steps: `train_data_step{N}.jsonl` as training step N and
    `val_data_step{N}.jsonl` as evaluation step N."""
    steps: dict[tuple[int, bool], dump.StepFiles] = {}
    ignored: list[tuple[Path | str, str]] = []
    for path in dump.listed(root):
        match = LOG_NAME.match(path.name)
        if match is None:
            continue
        why = dump.not_a_dump_file(path, match, (2,), root)
        if why is not None:
            ignored.append((path, why))
            continue
        rid, evaluation = int(match.group(2)), match.group(1) == "val"
        duplicate = dump.duplicate_name(steps.get((rid, evaluation)), path)
        if duplicate is not None:  # the step fails on it, the others land
            steps[rid, evaluation] = dump.with_duplicate(steps[rid, evaluation], duplicate)
            continue
        steps[rid, evaluation] = dump.StepFiles(rid, evaluation, path, root=root, format="nemo-rl")
    ordered = sorted(steps.values(), key=lambda s: (s.rollout_id, s.evaluation))
    return dump.Dump(root, tuple(ordered), tuple(sorted(ignored)))


def read_step(files: dump.StepFiles) -> StepRead:
    """One logged batch as samples and (train lines) their train rows."""
    path = files.rollout_file
    samples: list[dict[str, Any]] = []
    messages: list[str | None] = []
    rows: dict[int, TrainRow] = {}
    logged: dict[int, int] = {}  # idx -> its line
    tokenless: list[bool] = []  # per train line: an older line without tokens
    for number, record in _records(path):
        label = f"line {number}"
        if not files.evaluation:
            tokenless.append(_without_tokens(path, record, label, tokenless))
        read = _val_line if files.evaluation else _tokenless_line if tokenless[-1] else _train_line
        sample, train = read(path, record, label)
        if sample["index"] is not None:  # `idx`: its place in the batch, logged in one go
            refuse_a_repeated_line(path, logged, sample["index"], number, _REPEATED_IDX)
        if train is not None:
            rows[len(samples)] = train
        messages.append(to_json(record["content"][0], "content") if "content" in record else None)
        samples.append(sample)
    checked = validate.check_samples(path, samples)
    if files.evaluation or any(tokenless):
        return StepRead(samples, checked, rows, 0, messages, unknown=_NOT_IN_VALIDATION)
    return StepRead(samples, checked, rows, 1, messages, unknown=_NOT_LOGGED)


def _without_tokens(path: Path, record: dict[str, Any], label: str, earlier: list[bool]) -> bool:
    """Whether a train line is one of NeMo-RL's older lines without tokens (module
    docstring); a step whose lines differ in this is refused (one writer logs one shape)."""
    without = not any(key in record for key in _SINCE_2026_02)
    if earlier and earlier[0] != without:
        this, first = ("lacks", "has") if without else ("has", "lacks")
        raise DumpFormatError(
            path,
            f"{this} `token_ids` while line 1 {first} it; NeMo-RL logs every line of a step"
            " with the same keys",
            sample=label,
        )
    if without:  # the keys it still has, as an older (or a distillation) line holds them
        exact_int(_one(path, record, "input_lengths", label), path, "input_lengths", label)
        for key in ("generation_logprobs", "prev_logprobs"):
            if key in record and not isinstance(_one(path, record, key, label), list | ListArray):
                raise DumpFormatError(path, f"`{key}` is not a list", sample=label)
    return without


def _records(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, JSON object) of each non-blank line, read one line at a time."""
    try:
        handle = bounded.open_regular(path)
    except UnreadableError:
        raise  # the OS refused it: its own line and fix
    except BoundedReadError as exc:
        raise DumpNotFoundError(path, exc.problem) from None
    with handle:
        info = os.fstat(handle.fileno())
        for number, line in enumerate(bounded.lines(handle, 0, info.st_size, MAX_LINE_BYTES), 1):
            label = f"line {number}"
            if not line.complete and (line.text is None or line.text.strip()):
                raise _cut_short(path, label, info.st_mtime)
            if line.text is None:
                raise DumpFormatError(
                    path,
                    f"is longer than {bounded.amount(MAX_LINE_BYTES)}, tokenlake's bound for"
                    " one sample's line",
                    sample=label,
                )
            if line.text.strip():
                yield number, jsonarrays.object_line(path, line.text, label, MAX_DEPTH, _WANTED)


def _cut_short(path: Path, label: str, mtime: float) -> PipelineError:
    """A last line without its newline: NeMo-RL ends every line with one, so the file is
    still being written (a young file: extract again later) or was cut short."""
    if time.time() - mtime < pt.FRESH_SECONDS:
        return DumpFileError(path, f"its last line ({label}) has no newline", still_writing=True)
    return DumpFormatError(path, "ends without a newline: the file was cut short", sample=label)


def _one(path: Path, record: dict[str, Any], key: str, label: str) -> Any:
    """A logged value: the one entry of the list NeMo-RL wraps each value in."""
    if key not in record:
        raise DumpFormatError(path, f"lacks `{key}`", sample=label)
    value = record[key]
    if not isinstance(value, list) or len(value) != 1:
        raise DumpFormatError(
            path,
            f"`{key}` is {shown(value)}; NeMo-RL logs each value as a list of one entry",
            sample=label,
        )
    return value[0]


def _train_line(path: Path, record: dict[str, Any], label: str) -> tuple[dict[str, Any], TrainRow]:
    """One train line: the sample (miles' keys) and its train row."""
    arrays = {key: _array(path, record, key, label) for key in _ARRAYS}
    padded = len(arrays["token_ids"])
    for key, values in arrays.items():
        if len(values) != padded:
            raise DumpFormatError(
                path, f"`{key}` has {len(values)} positions; `token_ids` has {padded}", sample=label
            )
    length = exact_int(_one(path, record, "input_lengths", label), path, "input_lengths", label)
    if not 0 <= length <= padded:
        raise DumpFormatError(
            path, f"`input_lengths` is {length}; the line has {padded} positions", sample=label
        )
    in_loss = _sample_in_loss(path, record, label)
    generated = np.flatnonzero(arrays["token_loss_mask"][:length] != 0)
    prompt = int(generated[0]) if generated.size else length
    mask = (arrays["token_loss_mask"][:length] != 0) & in_loss
    mask[0:1] = False  # NeMo-RL's loss starts at position 1
    content = _content(path, record, label)
    sample = {
        "index": _idx(path, record, label),
        "tokens": arrays["token_ids"][:length].tolist(),
        "response_length": length - prompt,
        "reward": _reward(path, record, label),
        "remove_sample": not in_loss,
        "prompt": content[0] if content else None,
        "response": "".join(content[1:]) if content else None,
        "non_generation_time": None,
    }
    train = _train_row(arrays, prompt, length, mask[prompt:])
    return sample, train


def _train_row(
    arrays: dict[str, np.ndarray], prompt: int, length: int, mask: np.ndarray
) -> TrainRow:
    def response(key: str) -> np.ndarray:
        # as logged: the lake's float32 is made where every reader's values are (flatten)
        return arrays[key][prompt:length]

    placeholders = not np.any(arrays["prev_logprobs"][:length])
    fields: dict[str, np.ndarray | None] = {
        "rollout_log_probs": response("generation_logprobs"),
        "log_probs": None if placeholders else response("prev_logprobs"),
        "ref_log_probs": None,
        "entropy": None,
        "ref_entropy": None,
        "advantages": response("advantages"),
        "returns": None,
    }
    return TrainRow(
        dumped_rank=None,
        response_length=length - prompt,
        total_length=length,
        loss_mask=mask.astype(np.int8),
        normalized_reward=None,
        truncated=None,
        raw_reward=None,
        fields=fields,
        alignment_failed=False,
    )


def _tokenless_line(path: Path, record: dict[str, Any], label: str) -> tuple[dict[str, Any], None]:
    """A train line of before 2026-02-21, or of on-policy distillation: messages (the prompt
    first) and reward (distillation logs none), no tokens."""
    content = _content(path, record, label)
    sample = {
        "index": _idx(path, record, label),
        "reward": _reward(path, record, label) if "rewards" in record else None,
        "prompt": content[0] if content else None,
        "response": "".join(content[1:]) if content else None,
        "non_generation_time": None,
    }
    return sample, None


def _val_line(path: Path, record: dict[str, Any], label: str) -> tuple[dict[str, Any], None]:
    """One validation line: messages and reward, no tokens."""
    messages = _one(path, record, "content", label)
    if not isinstance(messages, list):
        raise DumpFormatError(path, f"`content` is {shown(messages)}, not a list", sample=label)
    sample = {
        "index": _idx(path, record, label),
        "reward": _reward(path, record, label),
        "prompt": messages,
        "non_generation_time": None,
    }
    return sample, None


def _array(path: Path, record: dict[str, Any], key: str, label: str) -> np.ndarray:
    values = _one(path, record, key, label)
    if not isinstance(values, list | ListArray):  # a ListArray: `jsonarrays` decoded the list
        raise DumpFormatError(path, f"`{key}` is {shown(values)}, not a list", sample=label)
    array = numbers(values, path, key, label) if len(values) else np.zeros(0)
    if array.ndim != 1:
        raise DumpFormatError(path, f"`{key}` is not a flat list of numbers", sample=label)
    if key == "token_ids" and array.dtype.kind not in "iu":
        raise DumpFormatError(path, "`token_ids` holds numbers that are not integers", sample=label)
    if key == "token_ids" and array.size and array.min() < 0:
        raise DumpFormatError(path, "`token_ids` holds a negative token id", sample=label)
    if key == "token_loss_mask" and not ((array == 0) | (array == 1)).all():
        raise DumpFormatError(
            path, "`token_loss_mask` holds values other than 0 and 1", sample=label
        )
    return array


def _sample_in_loss(path: Path, record: dict[str, Any], label: str) -> bool:
    value = _one(path, record, "sample_loss_mask", label)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise DumpFormatError(
            path, f"`sample_loss_mask` is {shown(value)}, not a finite number", sample=label
        )
    return value != 0


def _reward(path: Path, record: dict[str, Any], label: str) -> Any:
    value = _one(path, record, "rewards", label)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise DumpFormatError(path, f"`rewards` is {shown(value)}, not a number", sample=label)
    return value


def _idx(path: Path, record: dict[str, Any], label: str) -> int | None:
    value = record.get("idx")
    return None if value is None else exact_int(value, path, "idx", label)


def _content(path: Path, record: dict[str, Any], label: str) -> list[str]:
    """The message texts of a train line (prompt first): strings, or `{role, content}`
    messages as validation lines hold them; absent: none."""
    if "content" not in record:
        return []
    messages = _one(path, record, "content", label)
    if not isinstance(messages, list):
        raise DumpFormatError(path, f"`content` is {shown(messages)}, not a list", sample=label)
    texts = []
    for entry, message in enumerate(messages):
        text = message.get("content") if isinstance(message, dict) else message
        if not isinstance(text, str):
            raise DumpFormatError(
                path,
                f"`content` entry {entry} is {shown(message)}, not a message text",
                sample=label,
            )
        texts.append(clean_text(text))
    return texts
