"""Which dump format a directory holds (from its layout), and which reader reads its steps.

| format | framework | layout |
|---|---|---|
| `miles` | miles | `rollout_data/{rid}.pt`, `train_data/{rid}_{rank}.pt`; rollout files with a top-level `metadata`, or `dashboard/`, `dashboard_columns/`, `trajectory/` |
| `slime-v1` | slime, train dump format 1 | the same names, none of miles' own folders, rollout files without `metadata` |
| `slime-v2` | slime, train dump format 2 | `rollout_data/{rid}.pt`, `train_data/{rid}.pt` |
| `nemo-rl` | NVIDIA NeMo-RL | `train_data_step{N}.jsonl`, `val_data_step{N}.jsonl` |
| `prime-rl` | prime-rl | `token_exports/step_{N}/rank_{R}.jsonl` (and `STABLE`) |

Telling miles from slime format 1, whose file names are the same, needs one look inside: the
smallest rollout file is loaded (by the same allow-listed reader as every step's) to see
whether it has miles' top-level `metadata`. A directory holding two layouts at once, or none,
is refused with one line naming what was found; `--format` forces a format (train files of
another layout then fail their steps, see `dump.unread_train_error`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tokenlake.errors import DumpNotFoundError, UsageError, shown
from tokenlake.read import dump, miles, nemo_rl, prime_rl, pt, slime_v2
from tokenlake.steptypes import StepRead


@dataclass(frozen=True)
class Format:
    """A dump format tokenlake reads: its `--format` name and what `runs` records."""

    name: str
    framework: str  # `runs.framework`
    version: int | None  # `runs.format_version`: the framework's train dump format, if numbered
    title: str  # how messages name it


MILES = Format("miles", "miles", None, "miles")
SLIME_V1 = Format("slime-v1", "slime", 1, "slime (train dump format 1)")
SLIME_V2 = Format("slime-v2", "slime", 2, "slime (train dump format 2)")
NEMO_RL = Format("nemo-rl", "nemo-rl", None, "NeMo-RL")
PRIME_RL = Format("prime-rl", "prime-rl", None, "prime-rl")
FORMATS: dict[str, Format] = {f.name: f for f in (MILES, SLIME_V1, SLIME_V2, NEMO_RL, PRIME_RL)}
# Folders only miles writes (dump-format.md section 1).
MILES_FOLDERS = (dump.DASHBOARD_DIR, "dashboard_columns", dump.TRAJECTORY_DIR)

Loader = Callable[[Path], Any]  # loads a `.pt` file of the dump (a remote one: downloaded)


# Each format's reader of one step; miles' reads slime format 1 too (their files are the same).
STEP_READERS: dict[str, Callable[[dump.StepFiles], StepRead]] = {
    MILES.name: miles.read_step,
    SLIME_V1.name: miles.read_step,
    SLIME_V2.name: slime_v2.read_step,
    NEMO_RL.name: nemo_rl.read_step,
    PRIME_RL.name: prime_rl.read_step,
}


def read_step(files: dump.StepFiles) -> StepRead:
    """One step, read by its format's reader; a second name of one of its files fails the step
    (`dump.duplicate_name_error`), and so do train files of a layout its format does not read
    (`dump.unread_train_error`), never a silent rollout-only step."""
    refusal = dump.duplicate_name_error(files) or dump.unread_train_error(files)
    if refusal is not None:
        raise refusal
    return STEP_READERS[files.format](files)


@dataclass(frozen=True)
class Layout:
    """What a directory holds that tells the formats apart."""

    rollout_dir: bool
    per_rank: int  # train_data/{rid}_{rank}.pt
    per_step: int  # train_data/{rid}.pt
    logs: int  # NeMo-RL's *_data_step{N}.jsonl
    miles_folders: tuple[str, ...]
    exports: int = 0  # prime-rl's token_exports/step_{N}/rank_{R}.jsonl

    def found(self) -> str:
        """The layouts found, as a message lists them."""
        parts = []
        if self.rollout_dir:
            parts.append(f"a `{dump.ROLLOUT_DIR}/` directory (miles, slime)")
        if self.per_rank:
            parts.append(
                f"{self.per_rank} per-rank train file(s) `{dump.TRAIN_DIR}/{{rid}}_{{rank}}.pt`"
                " (miles, slime format 1)"
            )
        if self.per_step:
            parts.append(
                f"{self.per_step} per-step train file(s) `{dump.TRAIN_DIR}/{{rid}}.pt`"
                " (slime format 2)"
            )
        if self.logs:
            parts.append(f"{self.logs} NeMo-RL log file(s) `train_data_step{{N}}.jsonl`")
        if self.exports:
            parts.append(
                f"{self.exports} prime-rl token export file(s)"
                f" `{prime_rl.EXPORT_DIR}/step_{{N}}/rank_{{R}}.jsonl`"
            )
        return " and ".join(parts)


def dump_mark(entries: Iterable[tuple[str, bool]]) -> str | None:
    """What makes a folder a dump, from its entries (name, whether a folder), as a message
    names it; None: nothing does (detection needs one of these to read a folder at all).

    Examples:
        >>> dump_mark([("notes", True), ("rollout_data", True)])
        'miles, slime: it holds `rollout_data/`'
        >>> dump_mark([("train_data_step3.jsonl", False)]), dump_mark([("rollout_data", False)])
        ('NeMo-RL: it holds `train_data_step3.jsonl`', None)
        >>> dump_mark([("metrics.jsonl", False), ("token_exports", True)])
        'prime-rl: it holds `token_exports/`'
    """
    for name, is_folder in sorted(entries):  # the same line whatever the listing's order
        if is_folder and name == dump.ROLLOUT_DIR:
            return f"miles, slime: it holds `{dump.ROLLOUT_DIR}/`"
        if not is_folder and nemo_rl.is_log_name(name):
            return f"NeMo-RL: it holds `{shown(name, literal=False)}`"
        if is_folder and name == prime_rl.EXPORT_DIR:
            return f"prime-rl: it holds `{prime_rl.EXPORT_DIR}/`"
    return None


def local_dump_mark(folder: Path) -> str | None:
    """`dump_mark` of a local folder (None as well when it is missing or cannot be listed)."""
    try:
        with os.scandir(folder) as entries:
            return dump_mark((e.name, e.is_dir()) for e in entries)
    except OSError:
        return None


def layout_of(root: Path) -> Layout:
    """The directory's layout, from one listing of it and of its `train_data/` (a folder the
    OS refuses to list is an UnreadableError, never a layout without it)."""
    top = dump.listed(root)  # first: an unsearchable root fails here, with its own line
    train_dir = root / dump.TRAIN_DIR
    names = [p.name for p in dump.listed(train_dir)] if train_dir.is_dir() else []
    return Layout(
        rollout_dir=(root / dump.ROLLOUT_DIR).is_dir(),
        per_rank=sum(1 for n in names if dump._TRAIN_NAME.match(n)),
        per_step=sum(1 for n in names if dump._TRAIN_STEP_NAME.match(n)),
        logs=sum(1 for p in top if nemo_rl.is_log_name(p.name)),
        miles_folders=tuple(f for f in MILES_FOLDERS if (root / f).is_dir()),
        exports=prime_rl.export_files(root),
    )


def discover(dump_dir: Path, forced: str | None = None, load: Loader = pt.load) -> dump.Dump:
    """List a dump's steps in its format (detected, or `forced`); `Dump.format` says which."""
    root = dump.checked_root(dump_dir)
    fmt = FORMATS[forced] if forced is not None else detect(dump_dir, root, load)
    if fmt is NEMO_RL:
        listing = nemo_rl.discover(root)
    elif fmt is PRIME_RL:
        listing = prime_rl.discover(root)
    else:
        listing = dump.discover(root, fmt.name, per_step_train=fmt is SLIME_V2)
    return replace(listing, root=root, format=fmt.name)


def parse_format(name: str | None) -> str | None:
    """A `--format` value, checked."""
    if name is None or name in FORMATS:
        return name
    names = ", ".join(f"`{n}`" for n in FORMATS)
    raise UsageError(f"--format {shown(name)} is not a format tokenlake reads ({names}).")


def detect(dump_dir: Path, root: Path, load: Loader = pt.load) -> Format:
    """The format of the directory's layout; an unrecognised or mixed one is an error."""
    found = layout_of(root)
    pt_based = found.rollout_dir or found.per_rank or found.per_step
    layouts = sum(1 for kind in (pt_based, found.logs, found.exports) if kind)
    if layouts > 1 or found.per_rank and found.per_step:
        raise DumpNotFoundError(
            dump_dir,
            f"mixes dump layouts: it holds {found.found()}; give --format to read one of them",
        )
    if found.logs:
        return NEMO_RL
    if found.exports:
        return PRIME_RL
    if not found.rollout_dir:
        raise DumpNotFoundError(
            dump_dir,
            f"is not a dump tokenlake reads: it has no `{dump.ROLLOUT_DIR}/` directory (miles,"
            " slime), no `train_data_step{N}.jsonl` (NeMo-RL) and no"
            f" `{prime_rl.EXPORT_DIR}/step_{{N}}/rank_{{R}}.jsonl` (prime-rl)"
            + (f"; it holds {found.found()}" if pt_based else ""),
        )
    if found.per_step:
        return SLIME_V2
    if found.miles_folders or _has_miles_metadata(root, load):
        return MILES
    return SLIME_V1


def _has_miles_metadata(root: Path, load: Loader) -> bool:
    """Whether the dump's smallest rollout file has miles' top-level `metadata` (every miles
    rollout file since 2026-07-10; never slime's). A dump without a readable rollout file
    reads as miles: the files are the same, and each step reports its own problem."""
    candidates = []
    for path in dump.listed(root / dump.ROLLOUT_DIR):
        match = dump._ROLLOUT_NAME.match(path.name)
        if dump.not_a_dump_file(path, match, (2,), root) is None:
            candidates.append((path.stat().st_size, path.name, path))
    if not candidates:
        return True
    try:
        data = load(min(candidates)[2])
    except Exception:  # noqa: BLE001 - any unreadable file: its step says why, not detection
        return True
    return not isinstance(data, dict) or "metadata" in data
