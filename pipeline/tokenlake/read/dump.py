"""Discover and load a miles `--dump-details` directory (dump-format.md section 1).

The dump's layout has one owner: `Dump` (built once by `discover`, then passed down) and the
`StepFiles` it lists know where rollout, train, trajectory, tokenizer and dashboard files live
and how steps and ranks are named; other modules ask them for paths.

Reading only: nothing here ever writes into the dump directory.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Container
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tokenlake import bounded
from tokenlake.errors import (
    DumpFileError,
    DumpFormatError,
    DumpNotFoundError,
    UnreadableError,
    UsageError,
    shown,
)
from tokenlake.layout import ROLLOUT_DIR, step_label
from tokenlake.steps import INT64_MAX
from tokenlake.store import manifest

log = logging.getLogger(__name__)

TRAIN_DIR = "train_data"
TRAJECTORY_DIR = "trajectory"  # {label}.jsonl: the conversation of each sample (optional)
TOKENIZER_DIR = "tokenizer"
TOKENIZER_FILE = "tokenizer.json"
DASHBOARD_DIR = "dashboard"  # miles' dashboard telemetry (see pipeline/tokenlake/read/dashboard.py)
_ROLLOUT_NAME = re.compile(r"^(eval_)?([0-9]+)\.pt\Z")
_TRAIN_NAME = re.compile(r"^([0-9]+)_([0-9]+)\.pt\Z")
# slime's one train file per step (its train dump format 2, pipeline/tokenlake/read/slime_v2.py)
_TRAIN_STEP_NAME = re.compile(r"^([0-9]+)\.pt\Z")
NOT_A_DUMP_FILE = "not a rollout or train dump file name"


def rank_of(name: str) -> int | None:
    """The rank in a train file's name (`train_data/3_1.pt` → 1); None for any other file.

    Examples:
        >>> rank_of("train_data/3_1.pt"), rank_of("rollout_data/3.pt")
        (1, None)
    """
    path = Path(name)
    match = _TRAIN_NAME.match(path.name)
    return int(match.group(2)) if match and path.parent.name == TRAIN_DIR else None


@dataclass(frozen=True)
class Dump:
    """A dump directory: where each kind of file lives, and (from `discover`) its steps."""

    root: Path
    steps: tuple[StepFiles, ...] = ()
    # (path, why) of files that are not extracted (a dump on an object store: their URLs)
    ignored: tuple[tuple[Path | str, str], ...] = field(default=())
    # A dump on an object store: its URL; `root` is then its local stage
    # (pipeline/tokenlake/read/remote/remote_dump.py).
    url: str | None = None
    # The format its steps are read in (`read/formats.py`): `miles`, `slime-v2`, ...
    format: str = "miles"

    @property
    def source(self) -> str:
        """The dump as the lake records it (`source_dir`): its URL, else its directory."""
        return self.url if self.url is not None else str(self.root)

    @property
    def rollout_dir(self) -> Path:
        return self.root / ROLLOUT_DIR

    @property
    def train_dir(self) -> Path:
        return self.root / TRAIN_DIR

    @property
    def dashboard_dir(self) -> Path:
        return self.root / DASHBOARD_DIR

    @property
    def tokenizer_file(self) -> Path | None:
        """`tokenizer/tokenizer.json`, if the dump has one: also a folder, a FIFO, a device or
        a broken link by that name, which `vocab.vocab_table` refuses in a warning rather than
        passing it over as if the dump had saved no tokenizer. None when nothing is there."""
        path = self.root / TOKENIZER_DIR / TOKENIZER_FILE
        return path if os.path.lexists(path) else None

    def trajectory_file(self, label: str) -> Path | None:
        """The step's `trajectory/{label}.jsonl`, if the dump has one (a folder or a FIFO by
        that name too: `trajectory.read_records` warns of it, rather than passing it over as
        if the step had no conversations)."""
        path = self.root / TRAJECTORY_DIR / f"{label}.jsonl"
        return path if path.exists() else None


@dataclass(frozen=True)
class RemoteFiles:
    """A step of a dump on an object store: the dump's URL and the step's objects to download
    (name relative to the dump, size, mtime_ns as listed), in `manifest.fingerprint` order."""

    url: str
    objects: tuple[tuple[str, int, int], ...]


@dataclass(frozen=True)
class DuplicateName:
    """A second file name for one step or rank (`01.pt` beside `1.pt`)."""

    path: Path
    first: Path  # the name listed first, which the step would otherwise read
    what: str  # "step", "rank", "step and rank"


@dataclass(frozen=True)
class StepFiles:
    """The files of one rollout dump: its rollout file and (training steps) its rank files."""

    rollout_id: int
    evaluation: bool
    rollout_file: Path
    # (global rank, path), ascending rank. Always empty for evaluation files.
    train_files: tuple[tuple[int, Path], ...] = ()
    # The dump the files belong to; `discover` sets it (default: the rollout file's dump).
    root: Path | None = None
    # On an object store: what to download before reading (pipeline/tokenlake/read/remote/remote_dump.py).
    remote: RemoteFiles | None = None
    # The dump format that reads the step (`read/formats.py` names them); `miles` reads the
    # rank files above, `slime-v2` one per-step train file (given as rank 0).
    format: str = "miles"
    # Train files of this step in a layout its format does not read: the step fails on them
    # rather than landing as rollout-only (`unread_train_error`).
    unread: tuple[Path, ...] = ()
    # Also extract the routing-replay arrays into the `experts` table (--with-experts).
    with_experts: bool = False
    # Files that name this step (or one of its ranks) a second time (`01.pt` beside `1.pt`):
    # either could be meant, so the step fails on them (`duplicate_name_error`) while the
    # dump's other steps land.
    duplicates: tuple[DuplicateName, ...] = ()
    # What the step's files lack, settled (`read.completeness`): it lands marked incomplete.
    incomplete: str | None = None
    # A training step whose rank set no other step tells, while its files still change
    # (`read.completeness.unjudged`): the settle seconds. It lands only if its train files
    # hold every sample; else it is not yet complete.
    unsettled: float | None = None
    # A step of a format that marks complete steps, written before its framework marked them
    # (prime-rl before 2026-06-11), that no later step shows finished: why. It is judged by its
    # files settling (`read.completeness.step_missing`): then it lands marked incomplete.
    unmarked: str | None = None

    def __post_init__(self) -> None:
        if self.root is None:  # rollout files live in ROOT/rollout_data/
            object.__setattr__(self, "root", self.rollout_file.parent.parent)

    @property
    def label(self) -> str:
        """`eval_3` or `3`, as in the file name."""
        return step_label(self.rollout_id, self.evaluation)

    @property
    def dump(self) -> Dump:
        assert self.root is not None  # set in __post_init__
        return Dump(self.root)

    @property
    def ranks(self) -> frozenset[int]:
        return frozenset(rank for rank, _ in self.train_files)

    @property
    def paths(self) -> list[Path]:
        """The rollout file, then the train files (and any its format does not read), each
        once (a prime-rl step without `STABLE` names its first rank file as its first file)."""
        listed = [
            self.rollout_file,
            *(path for _, path in self.train_files),
            *self.unread,
            *(duplicate.path for duplicate in self.duplicates),
        ]
        return list(dict.fromkeys(listed))

    @property
    def trajectory_file(self) -> Path | None:
        return self.dump.trajectory_file(self.label)


def discover(dump_dir: Path, format: str = "miles", per_step_train: bool = False) -> Dump:
    """List the rollout and train files of a dump, ordered by step (train before eval).

    `format` is recorded on every step; with `per_step_train` the train files are slime's
    `train_data/{rid}.pt` (one per step), else `train_data/{rid}_{rank}.pt`. A train file
    named for a step in the other layout is kept in that step's `unread`.

    Files in `rollout_data/` or `train_data/` whose names do not follow the format (or that are
    not regular files, or whose step id exceeds int64) are skipped and reported in `ignored`
    (the reference reader crashes on them). Two names for one step (`1.pt` and `01.pt`) fail
    that step (`duplicate_name_error`): either could be meant.
    """
    root = checked_root(dump_dir)
    rollout_dir = Dump(root).rollout_dir
    if not rollout_dir.is_dir():
        raise DumpNotFoundError(
            dump_dir, f"is not a miles dump: it has no `{ROLLOUT_DIR}/` directory"
        )
    train, unread, duplicates, ignored = _list_train_files(root, per_step_train)
    steps: dict[tuple[int, bool], StepFiles] = {}
    for path in listed(rollout_dir):
        match = _ROLLOUT_NAME.match(path.name)
        why = not_a_dump_file(path, match, (2,), root)
        if why is not None:
            ignored.append((path, why))
            continue
        assert match is not None
        rid, evaluation = int(match.group(2)), match.group(1) is not None
        duplicate = duplicate_name(steps.get((rid, evaluation)), path)
        if duplicate is not None:
            steps[rid, evaluation] = with_duplicate(steps[rid, evaluation], duplicate)
            continue
        ranks = () if evaluation else tuple(sorted(train.pop(rid, {}).items()))
        others = () if evaluation else tuple(unread.pop(rid, ()))
        twice = () if evaluation else tuple(duplicates.pop(rid, ()))
        steps[rid, evaluation] = StepFiles(
            rid, evaluation, path, ranks, root, format=format, unread=others, duplicates=twice
        )
    for rid, by_rank in train.items():  # train files without a rollout file cannot be joined
        why = f"step {rid} has no `{ROLLOUT_DIR}/{rid}.pt` to join it to"
        ignored.extend((path, why) for _, path in sorted(by_rank.items()))
        ignored.extend((duplicate.path, why) for duplicate in duplicates.pop(rid, ()))
    for rid, paths in unread.items():
        ignored.extend((path, f"step {rid} has no `{ROLLOUT_DIR}/{rid}.pt`") for path in paths)
    ordered = sorted(steps.values(), key=lambda s: (s.rollout_id, s.evaluation))
    return Dump(root, tuple(ordered), tuple(sorted(ignored)), format=format)


def checked_root(dump_dir: Path) -> Path:
    """The dump directory, resolved: it exists, is a directory, and its path is UTF-8."""
    root = dump_dir.resolve()
    try:
        root.stat()
    except FileNotFoundError:
        raise DumpNotFoundError(dump_dir, "does not exist") from None
    except OSError as exc:  # a folder above it is not searchable
        raise UnreadableError(dump_dir, exc) from None
    if not root.is_dir():
        raise DumpNotFoundError(dump_dir, "is not a directory")
    _require_utf8(dump_dir, root)
    return root


def _require_utf8(dump_dir: Path, root: Path) -> None:
    """The dump's path is recorded in the lake (manifest, Parquet metadata) as UTF-8 text."""
    try:
        str(root).encode("utf-8")
    except UnicodeEncodeError:
        raise DumpNotFoundError(
            dump_dir,
            "has a path that is not valid UTF-8 (a latin-1 name?); tokenlake records the dump's"
            " path in the lake as text: rename the directory (e.g. `convmv -f latin1 -t utf8`)",
        ) from None


def not_a_dump_file(
    path: Path, match: re.Match[str] | None, groups: tuple[int, ...], root: Path
) -> str | None:
    """Why `path` is not extracted, or None for a dump file (a regular file inside the dump
    `root`, ids in int64)."""
    if match is None:
        return NOT_A_DUMP_FILE
    if path.is_symlink() and not path.exists():
        return "is a broken symbolic link"
    kind = _file_kind(path)
    if kind is not None:
        return f"is {kind}, not a regular file"
    outside = bounded.linked_out(path, root)
    if outside is not None:
        return outside
    for group in groups:
        if int(match.group(group)) > INT64_MAX:
            return f"its id {match.group(group)[:40]} exceeds the largest step id or rank ({INT64_MAX})"
    return None


def _file_kind(path: Path) -> str | None:
    """`a FIFO`, `a directory`, ... for anything but a regular file (following links)."""
    try:
        return bounded.kind_of(path.stat().st_mode)
    except FileNotFoundError:  # a dangling link, or gone since the listing
        return "a name whose file does not exist"
    except OSError as exc:  # never ignore a file the OS hides: the step would lack it
        raise UnreadableError(path, exc) from None


def listed(folder: Path) -> list[Path]:
    """The entries of one of the dump's folders, sorted; the OS refusing to list it is an
    UnreadableError naming the folder and the fix."""
    try:
        return sorted(folder.iterdir())
    except OSError as exc:
        raise UnreadableError(folder, exc, "listed") from None


def duplicate_name(
    earlier: StepFiles | Path | None, path: Path, what: str = "step"
) -> DuplicateName | None:
    """A second name for one step or rank (`1.pt`, `01.pt`), or None for the first."""
    if earlier is None:
        return None
    first = earlier.rollout_file if isinstance(earlier, StepFiles) else earlier
    return DuplicateName(path, first, what)


def with_duplicate(files: StepFiles, duplicate: DuplicateName) -> StepFiles:
    """The step, failing on one more name of it."""
    return replace(files, duplicates=(*files.duplicates, duplicate))


def duplicate_name_error(files: StepFiles) -> DumpFormatError | None:
    """The step's failure when a file names it (or one of its ranks) a second time: refuse
    rather than pick one."""
    if not files.duplicates:
        return None
    duplicate = files.duplicates[0]
    first = duplicate.first
    return DumpFormatError(
        duplicate.path,
        f"names the same {duplicate.what} as `{first.parent.name}/{first.name}`; which one is"
        " meant is ambiguous: remove or rename one of them",
    )


_TrainListing = tuple[
    dict[int, dict[int, Path]],
    dict[int, list[Path]],
    dict[int, list[DuplicateName]],
    list[tuple[Path | str, str]],
]


def _list_train_files(root: Path, per_step: bool = False) -> _TrainListing:
    """(step → rank → file, step → files of the other layout, step → second names of its
    files, ignored) of the dump's `train_data/`; a per-step file is listed as rank 0."""
    train_dir = Dump(root).train_dir
    by_step: dict[int, dict[int, Path]] = {}
    unread: dict[int, list[Path]] = {}
    duplicates: dict[int, list[DuplicateName]] = {}
    ignored: list[tuple[Path | str, str]] = []
    if not train_dir.is_dir():
        return by_step, unread, duplicates, ignored
    read, other = (_TRAIN_STEP_NAME, _TRAIN_NAME) if per_step else (_TRAIN_NAME, _TRAIN_STEP_NAME)
    for path in listed(train_dir):
        match = read.match(path.name)
        foreign = None if match else other.match(path.name)
        if foreign is not None and not_a_dump_file(path, foreign, (1,), root) is None:
            unread.setdefault(int(foreign.group(1)), []).append(path)
            continue
        why = not_a_dump_file(path, match, (1,) if per_step else (1, 2), root)
        if why is not None:
            ignored.append((path, why))
            continue
        assert match is not None
        ranks = by_step.setdefault(int(match.group(1)), {})
        rank = 0 if per_step else int(match.group(2))
        duplicate = duplicate_name(ranks.get(rank), path, "step" if per_step else "step and rank")
        if duplicate is not None:
            duplicates.setdefault(int(match.group(1)), []).append(duplicate)
            continue
        ranks[rank] = path
    return by_step, unread, duplicates, ignored


def unread_train_error(files: StepFiles) -> DumpFormatError | None:
    """The step's failure when a train file of it is in a layout its format does not read."""
    if not files.unread:
        return None
    path = files.unread[0]
    layout = "per-step" if _TRAIN_STEP_NAME.match(path.name) else "per-rank"
    return DumpFormatError(
        path,
        f"is a {layout} train file of step {files.rollout_id}, which the {files.format} format"
        " does not read; extract with the matching --format (or without --format to detect it)",
    )


def select_steps(dump: Dump, steps: Container[int] | None) -> tuple[StepFiles, ...]:
    """The dump's steps that `steps` selects; selecting none is an error listing the steps."""
    if steps is None:
        return dump.steps
    chosen = tuple(s for s in dump.steps if s.rollout_id in steps)
    if not chosen:
        raise UsageError(
            f"--steps `{steps}` selects no step of `{dump.source}`; {describe_steps(dump.steps)}."
        )
    return chosen


def describe_steps(steps: tuple[StepFiles, ...], limit: int = 12) -> str:
    """`its steps are 0-2, 5 and eval 0` (ranges, at most `limit` of each kind).

    Examples:
        >>> from pathlib import Path
        >>> files = [StepFiles(i, e, Path("x")) for i, e in [(0, 0), (1, 0), (2, 0), (5, 0), (0, 1)]]
        >>> describe_steps(tuple(files))
        'its steps are 0-2, 5 and eval 0'
    """
    if not steps:
        return "it has no steps"
    parts = []
    for evaluation in (False, True):
        ids = sorted(s.rollout_id for s in steps if s.evaluation == evaluation)
        ranges: list[list[int]] = []
        for rid in ids:
            if ranges and rid == ranges[-1][1] + 1:
                ranges[-1][1] = rid
            else:
                ranges.append([rid, rid])
        shown = [f"{lo}-{hi}" if hi > lo else str(lo) for lo, hi in ranges[:limit]]
        if len(ranges) > limit:
            shown.append(f"... ({len(ranges) - limit} more ranges)")
        if shown:
            parts.append(("eval " if evaluation else "") + ", ".join(shown))
    return "its steps are " + " and ".join(parts)


def load_rollout(path: Path, rollout_id: int) -> dict[str, Any]:
    """Load a rollout dump and check its top-level structure (section 2.1)."""
    from tokenlake.read import pt, validate  # the unpickler: only commands that read a dump

    # the per-token lists come as arrays (ListArray), decoded without a Python object each
    data = pt.load(path, arrays_under=("samples", validate.ARRAY_FIELDS))
    if not isinstance(data, dict) or not isinstance(data.get("samples"), list):
        raise DumpFormatError(path, "is not a rollout dump: it has no `samples` list")
    _check_named(path, data, "rollout_id", rollout_id)
    for position, sample in enumerate(data["samples"]):
        if not isinstance(sample, dict):
            raise DumpFormatError(
                path,
                f"sample is a {type(sample).__name__}, not a dict",
                sample=f"position {position}",
            )
        info = sample.get("spec_info")
        if isinstance(info, pt.SpecInfo):  # dumps of 2025-11 .. 2025-12 pickled the object
            sample["spec_info"] = info.to_dict()  # the later stages read today's dict
    data.setdefault("metadata", {})
    return data


def _check_named(path: Path, data: dict[str, Any], key: str, named: int) -> None:
    """The file's own `rollout_id` or `rank` is the one its name says: a file copied from
    another step or rank (mixed dumps) would otherwise land as this one's."""
    found = data.get(key)
    if type(found) is not int or found != named:  # exact type: a hostile `==` never runs
        raise DumpFormatError(path, f"holds `{key}` {shown(found)}, but its name says {named}")


def load_train(path: Path, rollout_id: int, rank: int) -> dict[str, Any]:
    """Load one rank's train dump and check its top-level structure (section 3.1)."""
    from tokenlake.read import pt, train_checks  # only commands that read a dump

    data = pt.load(path)
    if not isinstance(data, dict) or not isinstance(data.get("rollout_data"), dict):
        raise DumpFormatError(path, "is not a train dump: it has no `rollout_data` dict")
    _check_named(path, data, "rollout_id", rollout_id)
    _check_named(path, data, "rank", rank)
    columns = data["rollout_data"]
    for key in ("sample_indices", "response_lengths", "total_lengths", "tokens", "loss_masks"):
        if key not in columns:
            raise DumpFormatError(path, f"lacks the required column `{key}`")
    train_checks.check_columns(path, data)
    rows = len(columns["sample_indices"])
    for key in ("response_lengths", "total_lengths", "tokens", "loss_masks"):
        if len(columns[key]) != rows:
            raise DumpFormatError(
                path, f"column `{key}` has {len(columns[key])} rows; `sample_indices` has {rows}"
            )
    return data


__all__ = [
    "Dump",
    "DumpFileError",
    "StepFiles",
    "discover",
    "load_rollout",
    "load_train",
]


def fingerprint(files: StepFiles) -> list[manifest.SourceFile]:
    """The identity of a step's source files (name, size, modification time)."""
    paths = files.paths
    sidecar = files.trajectory_file
    if sidecar is not None:  # a rewritten conversation file re-extracts the step too
        paths.append(sidecar)
    return [manifest.SourceFile.of(path, files.dump.root) for path in paths]
