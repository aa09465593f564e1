"""prime-rl's token exports: `token_exports/step_{N}/rank_{R}.jsonl` and `metrics.jsonl`.

With `trainer.enable_token_export = true`, prime-rl's trainer (`TokenExporter`,
`src/prime_rl/trainer/rl/token_export.py`, schema version 1) writes one JSON object per line,
one line per exported sample, into `OUTPUT_DIR/token_exports/step_{N}/rank_{R}.jsonl` (R the
world rank; with context parallelism only each CP group's first rank writes), and an empty
`STABLE` in the step folder once every rank has flushed the step. docs/frameworks.md has the
mapping; in short:

- a line is a sample, keyed by (step, rank, `export_sequence_idx`); its aligned per-token lists
  (`token_ids`, `loss_mask`, `inference_logprobs`, `trainer_logprobs`, ...) cover the whole
  sequence, padding already cut off. The samples of a step are its rank files' lines, by rank
  then line: that is their batch position;
- the prompt is what precedes the first token with `loss_mask` true (the engine-sampled
  tokens); the response, the lake's rows, is everything from there on, tool observations
  included (their mask false);
- `inference_logprobs` and `advantages` are 0.0 placeholders off the sampled tokens: masked,
  so NULL; a `null` (prime-rl writes non-finite values so) is NULL, never a number;
- the tokens that count for drift are those prime-rl's mismatch statistics count: the loss
  mask, and where the micro-batch has weight streams also `rl_weights != 0` or
  `ref_kl_weights != 0`. On the others (cross-entropy-only tokens, whose inference log-probs
  are not this policy's engine's) `rollout_log_prob`, hence `lp_diff`, is NULL;
- the weight streams and the DPPO masks land in `rl_weight`, `ce_weight`, `ref_kl_weight`,
  `dppo_masked*`; an all-`null` list (no such stream, a pure cross-entropy micro-batch) is
  NULL. The ratio fields (`log_importance_ratio`, `mismatch_kl`, ...) are derived from the two
  log-probs: the lake derives them from `lp_diff`, with the same sign, so their text is checked
  as JSON but never parsed into values.

Older exports (schema version 1 all along) are read too: from 2026-06-11 to 2026-08-08
(prime-rl 941019f2e .. 289562d2e) a line also names its `export_step` (the step folder it is
in: a multi-run trainer exported each run's own step there, while `step` is the trainer's) and
its `run_id`; until 2026-06-27 (0be5ac452) a line has no weight streams but a `training_mode`
(`rl`, `opd` or `sft`: an `sft` line's tokens are not sampled by this policy, so none counts
for drift, as prime-rl's mismatch statistics skip it) and a per-token `rewards`, the sample's
reward repeated (`null` without one): the sample's `reward`.

Until 2026-06-10 (prime-rl badd2b0fe .. 941019f2e) the trainer wrote no `STABLE` at all: it
wrote each step's rank file whole, closing it when the rank began the next step. A folder
without `STABLE` whose lines are of that writer (a `training_mode`, no `export_step`) is
complete when a later step folder holds a file of each of its ranks; the newest such folder is
judged by its files settling (`read.completeness`), then lands marked incomplete: nothing tells
whether its run ended there or is still writing it.

A step folder without `STABLE` is otherwise still being written: it is not listed as a step
("not yet", among the ignored files), so no step lands half; extracting again (or `--follow`,
which lists the run again each round) picks it up once `STABLE` is there. `STABLE` is the
step's first file, so its fingerprint covers it. No group index, weight version or truncation
flag is exported, nor (since 2026-06-27) a reward: NULL.

Lines are streamed one at a time (`bounded.lines`): a line longer than `MAX_LINE_BYTES`, a rank
file larger than `MAX_FILE_BYTES`, a line nested deeper than `MAX_DEPTH`, or one that is not a
JSON object of the expected types fails the step with one line naming the file and the line.
A line's long lists of numbers and bools come as the arrays `np.asarray` would make of them
(`jsonarrays`).

`metrics.jsonl` (prime-rl's `FileMonitor`, one `{"step", "time", name: value, ...}` per step)
becomes the run's `metrics` rows (`tracking_payload`, read by read/dashboard.py).
"""

from __future__ import annotations

import os
import re
import stat
import time
from collections.abc import Iterator
from dataclasses import replace
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
    shown,
)
from tokenlake.read import dump, jsonarrays, pt, validate
from tokenlake.read.train_checks import (
    exact_int,
    refuse_a_bool_among_numbers,
    refuse_a_repeated_line,
)
from tokenlake.read.values import INT64_MAX
from tokenlake.steptypes import ListArray, StepRead, TrainRow

EXPORT_DIR = "token_exports"
STABLE = "STABLE"
_REPEATED_SEQUENCE = (
    "`export_sequence_idx` {key} is line {first}'s too; prime-rl exports each sequence once"
)
METRICS_FILE = "metrics.jsonl"
SCHEMA_VERSION = 1
STEP_DIR = re.compile(r"^step_([0-9]+)\Z")
RANK_FILE = re.compile(r"^rank_([0-9]+)\.jsonl\Z")
# One sample's line holds ~17 values per token, ~200 bytes per token, so 256 MiB is a sequence
# of about 1.3 million tokens; a longer line fails its step. Parsing one line takes about 3
# times its size for the moment it is parsed.
MAX_LINE_BYTES = 256 << 20
# One rank's exports of one step: 16 GiB is about 80 million tokens; a larger file fails its
# step. What a step keeps of its files (numpy arrays, the token ids) is less than their size.
MAX_FILE_BYTES = 16 << 30
MAX_DEPTH = 4  # {"token_ids": [1, 2]} nests 2 deep
# prime-rl exports no truncation flag: unknown, never false.
_NOT_EXPORTED = ("truncated",)
NOT_YET = f"not yet: it has no `{STABLE}`, prime-rl is still writing the step"
UNMARKED = (
    f"prime-rl wrote no `{STABLE}` before 2026-06-11 and no later step shows this newest one"
    " finished"
)
# The start of a line of the writer before `STABLE` (2026-05-21 .. 2026-06-10): its keys come
# before `token_ids`, in this much of the line.
_HEAD_BYTES = 64 << 10
_FLOATS = ("advantages", "inference_logprobs", "trainer_logprobs", "entropy")
_WEIGHTS = ("rl_weights", "ce_weights", "ref_kl_weights")
_FLAGS = ("is_masked", "is_masked_high", "is_masked_low")
_KEYS = ("micro_step", "micro_sequence_idx", "export_sequence_idx")
# prime-rl's `TrainingMode` of the lines written before 2026-06-27 (module docstring); its
# `sft` lines are not policy-sampled, so their engine log-probs are no drift.
_TRAINING_MODES = ("rl", "opd", "sft")
_NOT_SAMPLED = "sft"
# The per-token lists, which a line's reading may give as arrays (`jsonarrays`).
_WANTED = tuple(
    (key,)
    for key in ("token_ids", "position_ids", "loss_mask", "rewards", *_FLOATS, *_WEIGHTS, *_FLAGS)
)
# The ratio fields, which the lake derives from the two log-probs (module docstring): checked
# as JSON, never parsed into values, and left out of a line's record.
_UNREAD = ("log_importance_ratio", "importance_ratio", "mismatch_kl", "prob_delta")


def export_files(root: Path) -> int:
    """How many `token_exports/step_{N}/rank_{R}.jsonl` names a directory holds (the layout
    `read/formats.py` recognises prime-rl by)."""
    exports = root / EXPORT_DIR
    if not exports.is_dir():
        return 0
    return sum(
        1
        for step in exports.iterdir()
        if STEP_DIR.match(step.name) and step.is_dir()
        for path in step.iterdir()
        if RANK_FILE.match(path.name)
    )


def discover(root: Path) -> dump.Dump:
    """The run's steps: each `token_exports/step_{N}` holding rank files is training step N,
    its `STABLE` marker as the step's first file and its rank files as its train files."""
    steps: dict[int, dump.StepFiles] = {}
    ignored: list[tuple[Path | str, str]] = []
    named: dict[int, frozenset[int]] = {}  # step -> the ranks its folder has a file of
    exports = root / EXPORT_DIR
    for folder in sorted(exports.iterdir()) if exports.is_dir() else ():
        match = STEP_DIR.match(folder.name)
        if match is None or not folder.is_dir() or folder.is_symlink():
            ignored.append((folder, "not a `step_{N}` folder of prime-rl's token exports"))
            continue
        if int(match.group(1)) > INT64_MAX:
            ignored.append((folder, f"its step exceeds the largest step id ({INT64_MAX})"))
            continue
        rid = int(match.group(1))
        names = _rank_names(folder)
        named[rid] = named.get(rid, frozenset()) | frozenset(names)
        stable = folder / STABLE
        odd = _not_a_marker(stable)
        if odd is not None:
            ignored.append((folder, odd))
            continue
        marked = _is_regular(stable)
        if not marked and not _before_stable(names):  # not yet: never read half a step
            ignored.append((folder, NOT_YET))
            continue
        ranks, duplicates = _rank_files(root, folder, ignored)
        if not ranks:
            ignored.append((folder, "holds no `rank_{R}.jsonl` file"))
            continue
        first = stable if marked else ranks[min(ranks)]
        duplicate = dump.duplicate_name(steps.get(rid), first)
        if duplicate is not None:  # `step_01` beside `step_1`: the step fails, the others land
            steps[rid] = dump.with_duplicate(steps[rid], duplicate)
            continue
        steps[rid] = dump.StepFiles(
            rid,
            False,
            first,
            tuple(sorted(ranks.items())),
            root=root,
            format="prime-rl",
            duplicates=duplicates,
        )
    for rid, files in steps.items():
        if files.rollout_file.name != STABLE and not _finished(files, named):
            steps[rid] = replace(files, unmarked=UNMARKED)
    ordered = sorted(steps.values(), key=lambda s: s.rollout_id)
    return dump.Dump(root, tuple(ordered), tuple(sorted(ignored)))


def _rank_names(folder: Path) -> dict[int, Path]:
    """The step folder's `rank_{R}.jsonl` names by rank, whatever the files hold (of two
    names of one rank, the last by name)."""
    found = ((RANK_FILE.match(path.name), path) for path in sorted(folder.iterdir()))
    return {int(match.group(1)): path for match, path in found if match}


def _finished(files: dump.StepFiles, named: dict[int, frozenset[int]]) -> bool:
    """Whether a later step folder names a rank file of each of the step's ranks: the writer
    before `STABLE` closed a rank's file of a step when that rank began the next."""
    return any(later > files.rollout_id and files.ranks <= ranks for later, ranks in named.items())


def _before_stable(ranks: dict[int, Path]) -> bool:
    """Whether a folder without `STABLE`, of these rank files (`_rank_names`), was written by
    prime-rl before 2026-06-11, which never wrote one: the first line of its lowest rank file
    has a `training_mode` and no `export_step` among the keys before `token_ids` (its writer's
    keys, in its order)."""
    if not ranks:
        return False
    path = ranks[min(ranks)]
    try:
        with bounded.open_regular(path, follow=False) as handle:
            head = handle.read(_HEAD_BYTES)
    except (BoundedReadError, OSError):
        return False
    keys, found, _ = head.partition(b'"token_ids":')
    return bool(found) and b'"training_mode":' in keys and b'"export_step":' not in keys


def _is_regular(path: Path) -> bool:
    """A regular file, not a link (`STABLE` is an empty file prime-rl touches)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _not_a_marker(stable: Path) -> str | None:
    """Why a `STABLE` that is there is not prime-rl's marker (a folder, a link: no wait makes
    it one), or None (a file, or none yet)."""
    try:
        mode = os.lstat(stable).st_mode
    except OSError:
        return None
    kind = "a symbolic link" if stat.S_ISLNK(mode) else bounded.kind_of(mode)
    if kind is None:
        return None
    return f"its `{STABLE}` is {kind}, not the empty file prime-rl writes once every rank flushed the step"


def _rank_files(
    root: Path, folder: Path, ignored: list[tuple[Path | str, str]]
) -> tuple[dict[int, Path], tuple[dump.DuplicateName, ...]]:
    """The step folder's rank files, and the second names of a rank (`rank_01.jsonl` beside
    `rank_1.jsonl`), on which the step fails."""
    ranks: dict[int, Path] = {}
    duplicates: list[dump.DuplicateName] = []
    for path in sorted(folder.iterdir()):
        if path.name == STABLE:
            continue
        match = RANK_FILE.match(path.name)
        why = dump.not_a_dump_file(path, match, (1,), root)
        if match is None or why is not None:
            ignored.append((path, why or dump.NOT_A_DUMP_FILE))
            continue
        rank = int(match.group(1))
        duplicate = dump.duplicate_name(ranks.get(rank), path, "rank")
        if duplicate is not None:
            duplicates.append(duplicate)
            continue
        ranks[rank] = path
    return ranks, tuple(duplicates)


def read_step(files: dump.StepFiles) -> StepRead:
    """One complete step: every rank file's lines as samples and their train rows."""
    _require_stable(files)
    samples: list[dict[str, Any]] = []
    rows: dict[int, TrainRow] = {}
    for rank, path in files.train_files:
        exported: dict[int, int] = {}  # export_sequence_idx -> its line
        for number, record in _records(path):
            label = f"line {number}"
            sample, train = _sample(path, record, label, files.rollout_id, rank)
            key = record["export_sequence_idx"]  # (step, rank, it) keys a sample
            refuse_a_repeated_line(path, exported, key, number, _REPEATED_SEQUENCE)
            rows[len(samples)] = train
            samples.append(sample)
    checked = validate.check_samples(files.rollout_file, samples)
    messages: list[str | None] = [None] * len(samples)
    return StepRead(samples, checked, rows, len(files.train_files), messages, unknown=_NOT_EXPORTED)


def _require_stable(files: dump.StepFiles) -> None:
    """`STABLE` is still there (listing found it): every rank flushed the step (a step of
    the writer before `STABLE` has none to check)."""
    marker = files.rollout_file
    if marker.name == STABLE and not _is_regular(marker):
        raise DumpNotFoundError(marker.parent, f"lost its `{STABLE}` since it was listed")


def _records(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, JSON object) of each non-blank line, read one line at a time."""
    try:
        handle = bounded.open_regular(path)
    except BoundedReadError as exc:
        raise DumpNotFoundError(path, exc.problem) from None
    with handle:
        info = os.fstat(handle.fileno())
        size = info.st_size
        if size > MAX_FILE_BYTES:
            raise DumpFormatError(
                path,
                f"is {bounded.amount(size)}, more than {bounded.amount(MAX_FILE_BYTES)},"
                " tokenlake's bound for one rank's token exports of a step",
            )
        for number, line in enumerate(bounded.lines(handle, 0, size, MAX_LINE_BYTES), 1):
            label = f"line {number}"
            if line.text is None:
                raise DumpFormatError(
                    path,
                    f"is longer than {bounded.amount(MAX_LINE_BYTES)}, tokenlake's bound for"
                    " one sample's line",
                    sample=label,
                )
            if not line.complete and line.text.strip():
                raise _cut_short(path, label, info.st_mtime)
            if line.text.strip():
                yield (
                    number,
                    jsonarrays.object_line(path, line.text, label, MAX_DEPTH, _WANTED, _UNREAD),
                )


def _cut_short(path: Path, label: str, mtime: float) -> PipelineError:
    """A last line without its newline in a step marked complete: prime-rl writes each line
    whole before `STABLE`, so a young file is being rewritten (a resumed run re-running the
    step truncates it first: extract again later), an older one was cut short."""
    if time.time() - mtime < pt.FRESH_SECONDS:
        return DumpFileError(path, f"its last line ({label}) has no newline", still_writing=True)
    return DumpFormatError(path, "ends without a newline: the file was cut short", sample=label)


def _sample(
    path: Path, record: dict[str, Any], label: str, step: int, rank: int
) -> tuple[dict[str, Any], TrainRow]:
    """One line: the sample (miles' keys) and its train row."""
    _check_header(path, record, label, step, rank)
    tokens = _ints(path, record, "token_ids", label)
    n = len(tokens)
    if tokens.size and tokens.min() < 0:
        raise DumpFormatError(path, "`token_ids` holds a negative token id", sample=label)
    _ints(path, record, "position_ids", label, n)
    loss_mask = _bools(path, record, "loss_mask", label, n)
    assert loss_mask is not None  # `_bools` refuses nulls unless asked to allow them
    mode = _training_mode(path, record, label)
    values = {key: _floats(path, record, key, label, n) for key in _FLOATS}
    for key in _WEIGHTS:  # lines with a `training_mode` predate the weight streams
        absent = mode is not None and key not in record
        values[key] = None if absent else _floats(path, record, key, label, n)
    flags = {key: _bools(path, record, key, label, n, nullable=True) for key in _FLAGS}
    sampled = np.flatnonzero(loss_mask)
    prompt = int(sampled[0]) if sampled.size else n
    env_name = record.get("env_name")
    if env_name is not None and not isinstance(env_name, str):
        raise DumpFormatError(path, f"`env_name` is {shown(env_name)}, not a string", sample=label)
    sample = {
        "index": None,
        "tokens": tokens.tolist(),
        "response_length": n - prompt,
        "env_name": env_name,
        "reward": _reward(path, record, label, n),
        "metadata": {"rank": rank, **{key: record[key] for key in _KEYS}, **_run_keys(record)},
        "non_generation_time": None,
    }
    sampled_by_policy = mode != _NOT_SAMPLED
    train = _train_row(rank, prompt, loss_mask, values, flags, sampled_by_policy)
    return sample, train


def _training_mode(path: Path, record: dict[str, Any], label: str) -> str | None:
    """The line's `training_mode` (lines written before 2026-06-27), else None."""
    if "training_mode" not in record:
        return None
    mode = record["training_mode"]
    if mode not in _TRAINING_MODES or not isinstance(mode, str):
        raise DumpFormatError(
            path,
            f"`training_mode` is {shown(mode)}; prime-rl's are {', '.join(_TRAINING_MODES)}",
            sample=label,
        )
    return mode


def _reward(path: Path, record: dict[str, Any], label: str, n: int) -> float | None:
    """The sample's reward from the per-token `rewards` of lines written before 2026-06-27
    (the reward repeated; `null` everywhere without one); None when the line has none."""
    if "rewards" not in record:
        return None
    pair = _floats(path, record, "rewards", label, n)
    if pair is None:
        return None
    values, nulls = pair
    given = values[~nulls]
    if nulls.any() or (given.size and (given != given[0]).any()):
        raise DumpFormatError(
            path,
            "`rewards` differs between positions; prime-rl repeats the sample's reward on"
            " every token",
            sample=label,
        )
    return float(given[0]) if given.size else None


def _run_keys(record: dict[str, Any]) -> dict[str, Any]:
    """The trainer step and run of a line that names its `export_step` (2026-06-11 to
    2026-08-08): a multi-run trainer's step differs from the run's step, the folder's."""
    if "export_step" not in record:
        return {}
    return {"trainer_step": record["step"], "run_id": record.get("run_id")}


def _check_header(path: Path, record: dict[str, Any], label: str, step: int, rank: int) -> None:
    version = record.get("schema_version")
    if version != SCHEMA_VERSION or isinstance(version, bool):
        raise DumpFormatError(
            path,
            f"`schema_version` is {shown(version)}; tokenlake reads prime-rl's token export"
            f" schema {SCHEMA_VERSION}",
            sample=label,
        )
    # The folder's step is `export_step` where a line names one (the trainer's `step` may
    # differ, module docstring), else `step`.
    folder_key = "export_step" if "export_step" in record else "step"
    for key, want in ((folder_key, step), ("rank", rank)):
        got = exact_int(_required(path, record, key, label), path, key, label)
        if got != want:
            raise DumpFormatError(
                path,
                f"`{key}` is {got}, but the file is {key.removeprefix('export_')} {want}'s",
                sample=label,
            )
    for key in (*_KEYS, "step"):
        exact_int(_required(path, record, key, label), path, key, label)
    run_id = record.get("run_id")
    if run_id is not None and not isinstance(run_id, str):
        raise DumpFormatError(path, f"`run_id` is {shown(run_id)}, not a string", sample=label)


def _required(path: Path, record: dict[str, Any], key: str, label: str) -> Any:
    if key not in record:
        raise DumpFormatError(path, f"lacks `{key}`", sample=label)
    return record[key]


def _list(
    path: Path, record: dict[str, Any], key: str, label: str, n: int | None
) -> list[Any] | ListArray:
    """A per-token list: as JSON gives it, or as the array `np.asarray` makes of it
    (`jsonarrays`, which decodes only lists of one kind of value into arrays)."""
    values = _required(path, record, key, label)
    if not isinstance(values, list | ListArray):
        raise DumpFormatError(path, f"`{key}` is {shown(values)}, not a list", sample=label)
    if n is not None and len(values) != n:
        raise DumpFormatError(
            path, f"`{key}` has {len(values)} positions; `token_ids` has {n}", sample=label
        )
    return values


def _ints(
    path: Path, record: dict[str, Any], key: str, label: str, n: int | None = None
) -> np.ndarray:
    values = _list(path, record, key, label, n)
    array = np.asarray(values) if len(values) else np.zeros(0, dtype=np.int64)
    if array.ndim != 1 or array.dtype.kind not in "iu":
        raise DumpFormatError(path, f"`{key}` is not a flat list of integers", sample=label)
    refuse_a_bool_among_numbers(values, array, path, key, label)
    return array.astype(np.int64, copy=False)


def _floats(
    path: Path, record: dict[str, Any], key: str, label: str, n: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """(values, null positions) of a list of numbers and `null`s; None when every entry is
    `null` (prime-rl's way of writing a stream the micro-batch does not have)."""
    values = _list(path, record, key, label, n)
    if n and isinstance(values, list) and values.count(None) == n:
        return None  # `count` compares by identity first: no Python step per entry
    array = np.asarray(values) if n else np.zeros(0)
    if array.ndim == 1 and array.dtype.kind in "iuf":
        refuse_a_bool_among_numbers(values, array, path, key, label)
        return array.astype(np.float64, copy=False), np.zeros(n, dtype=bool)
    nulls = np.fromiter((v is None for v in values), dtype=bool, count=n)
    if n and nulls.all():
        return None
    numbers = all(
        v is None or (isinstance(v, int | float) and not isinstance(v, bool)) for v in values
    )
    if not numbers:
        raise DumpFormatError(path, f"`{key}` holds values that are not numbers", sample=label)
    try:
        filled = np.asarray([0.0 if v is None else v for v in values], dtype=np.float64)
    except OverflowError:
        raise DumpFormatError(
            path, f"`{key}` holds a number beyond float64", sample=label
        ) from None
    return filled, nulls


def _bools(
    path: Path, record: dict[str, Any], key: str, label: str, n: int, *, nullable: bool = False
) -> np.ndarray | None:
    """A list of bools; with `nullable`, `null`s allowed (as NaN in a float array, 1.0 for
    true) and None when every entry is `null`."""
    values = _list(path, record, key, label, n)
    array = _bool_array(values)
    if array is not None:
        return array.astype(np.float64) if nullable else array
    if nullable and all(v is None or isinstance(v, bool) for v in values):
        if all(v is None for v in values):
            return None
        return np.array([np.nan if v is None else float(v) for v in values], dtype=np.float64)
    allowed = "true, false or null" if nullable else "true or false"
    raise DumpFormatError(path, f"`{key}` holds values other than {allowed}", sample=label)


def _bool_array(values: list[Any] | ListArray) -> np.ndarray | None:
    """The entries as a bool array if every one is a bool, else None. Of JSON values,
    `np.asarray` makes a flat bool array of exactly the lists of bools (an int, a float or a
    `null` among them gives another dtype, a nested list another shape)."""
    if not len(values):
        return np.zeros(0, dtype=bool)
    try:
        array = np.asarray(values)
    except ValueError:  # ragged nested lists
        return None
    return array if array.ndim == 1 and array.dtype == bool else None


def _train_row(
    rank: int,
    prompt: int,
    loss_mask: np.ndarray,
    values: dict[str, tuple[np.ndarray, np.ndarray] | None],
    flags: dict[str, np.ndarray | None],
    sampled_by_policy: bool = True,
) -> TrainRow:
    n = len(loss_mask)
    covered = _drift_covered(loss_mask, values["rl_weights"], values["ref_kl_weights"])
    if not sampled_by_policy:
        covered = np.zeros_like(loss_mask)
    fields: dict[str, np.ndarray | None] = {}
    nulls: dict[str, np.ndarray] = {}
    names = {
        "inference_logprobs": "rollout_log_probs",
        "trainer_logprobs": "log_probs",
        "entropy": "entropy",
        "advantages": "advantages",
        **{key: key for key in _WEIGHTS},
    }
    for key, name in names.items():
        pair = values[key]
        if pair is None:
            fields[name] = None
            continue
        array, null = pair
        fields[name] = array[prompt:]
        if name == "rollout_log_probs":  # not this policy's engine's: no drift there
            null = null | ~covered
        if null[prompt:].any():
            nulls[name] = null[prompt:]
    for key, flag in flags.items():
        fields[key] = None if flag is None else flag[prompt:]
        if flag is not None and np.isnan(flag[prompt:]).any():
            nulls[key] = np.isnan(flag[prompt:])
    return TrainRow(
        dumped_rank=rank,
        response_length=n - prompt,
        total_length=n,
        loss_mask=loss_mask[prompt:].astype(np.int8),
        normalized_reward=None,
        truncated=None,
        raw_reward=None,
        fields=fields,
        alignment_failed=False,
        nulls=nulls,
    )


def _drift_covered(
    loss_mask: np.ndarray,
    rl: tuple[np.ndarray, np.ndarray] | None,
    ref_kl: tuple[np.ndarray, np.ndarray] | None,
) -> np.ndarray:
    """prime-rl's mismatch mask (train.py): the loss mask, and where the micro-batch has weight
    streams also an rl or ref_kl member (`weight != 0`; a non-finite weight, written `null`,
    is != 0 to torch too)."""
    if rl is None and ref_kl is None:
        return loss_mask
    sampled = loss_mask.copy() if rl is None else (rl[0] != 0) | rl[1]
    if ref_kl is not None:
        sampled |= (ref_kl[0] != 0) | ref_kl[1]
    return loss_mask & sampled


def tracking_payload(record: Any) -> Any:
    """A `metrics.jsonl` line of prime-rl's `FileMonitor` (`{"step", "time", name: value}`) as
    the tracking payload miles' metrics reader reads (`{"ts", "step_key", "step", "metrics"}`):
    the step is the trainer step, the `rollout_id` of `token_exports/step_{N}`, so it is logged
    on the `rollout/step` axis and joins the drift views as miles' does. Anything else is
    returned as it is (the reader then says why it is not a payload)."""
    if not isinstance(record, dict) or "metrics" in record:
        return record
    metrics = {k: v for k, v in record.items() if k not in ("step", "time")}
    return {
        "ts": record.get("time"),
        "step_key": "rollout/step",
        "step": record.get("step"),
        "metrics": metrics,
    }
