"""Folders only the user can write: tokenlake's cache, where remote dumps are staged.

The cache (`cache_root`: `$TOKENLAKE_CACHE`; remote dumps are staged in it by
pipeline/tokenlake/read/remote/remote_stage.py, the report keeps its assets there) may sit where
others can write, such as a shared scratch disk. Whatever tokenlake later reads, overwrites or
deletes there must be what it made itself, so:

- the cache root and every folder tokenlake makes in it are created with mode 0700
  (`os.mkdir` with that mode: a umask only removes bits) and then checked with `lstat`: a real
  directory (never a link), owned by the user, that neither the group nor others may write.
  Anything else is one `CacheError` naming the folder and what to do, and nothing in it is
  touched. Inside such a folder nobody else can create, replace or rename an entry.
- `foreign_entry` finds, in a stage, an entry tokenlake did not make (a link, a FIFO, a file
  of another user): the stage is then not trusted (remote_stage.py rebuilds it).
- `make_folders` creates folders below a checked one, never through a link.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from tokenlake.errors import SHOWN_PATH_CHARS, CacheError, shown

CACHE_VARIABLE = "TOKENLAKE_CACHE"
PRIVATE_MODE = 0o700
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


def cache_root() -> Path:
    """The cache, where stages live: `$TOKENLAKE_CACHE`, else `$XDG_CACHE_HOME/tokenlake`, else
    `~/.cache/tokenlake`."""
    configured = os.environ.get(CACHE_VARIABLE)
    if configured:
        return Path(configured)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "tokenlake"


def private_folder(path: Path, *, root: bool = False) -> Path:
    """`path` as a folder only the user can write: created with mode 0700 if missing, else
    checked; a CacheError if it is not one.

    Args:
        root: The cache root itself (the user's choice: the advice is another
            `$TOKENLAKE_CACHE`); else a folder tokenlake makes in it (the advice is to remove
            it: tokenlake makes it again).
    """
    if root:
        path.parent.mkdir(parents=True, exist_ok=True)  # e.g. `~/.cache`: not tokenlake's
    try:
        os.mkdir(path, PRIVATE_MODE)
    except FileExistsError:
        pass
    problem = _not_private(os.lstat(path))
    if problem is not None:
        raise CacheError(path, f"{problem}; {_advice(path, problem, root)}")
    return path


def _not_private(info: os.stat_result) -> str | None:
    """Why a folder's `lstat` is not that of a folder only the user can write (None: it is)."""
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link, not a folder tokenlake made"
    if not stat.S_ISDIR(info.st_mode):
        return "is not a folder"
    if info.st_uid != os.getuid():
        return f"belongs to uid {info.st_uid}, not to you (uid {os.getuid()})"
    if info.st_mode & _OTHERS_WRITE:
        return f"may be written by others (mode {stat.S_IMODE(info.st_mode):04o})"
    return None


def _advice(path: Path, problem: str, root: bool) -> str:
    if not root:
        return "remove it (tokenlake makes it again), then extract again"
    own = f"set {CACHE_VARIABLE} to a folder only you can write (tokenlake creates it)"
    if problem.startswith("may be written"):
        return f"run `chmod go-w {shown(path, SHOWN_PATH_CHARS)}` or {own}"
    return own


def make_folders(top: Path, relative: Path) -> Path:
    """`top/relative` and the folders on the way, with mode 0700, never through a link
    (`top` is a checked private folder); returns it. OSError (ELOOP) on a link."""
    path = top
    for name in relative.parts:
        path = path / name
        try:
            os.mkdir(path, PRIVATE_MODE)
        except FileExistsError:
            if not stat.S_ISDIR(os.lstat(path).st_mode):  # a link, or a file of that name
                raise
    return path


def foreign_entry(top: Path) -> tuple[str, str] | None:
    """The first entry below `top` that tokenlake did not make, as (relative name, what it
    is): anything but a regular file or folder of the user's. Links are not followed."""
    pending = [top]
    while pending:
        folder = pending.pop()
        with os.scandir(folder) as listed:
            entries = sorted(listed, key=lambda entry: entry.name)  # the same one named each time
            for entry in entries:
                info = entry.stat(follow_symlinks=False)
                what = _foreign(info)
                if what is not None:
                    return Path(entry.path).relative_to(top).as_posix(), what
                if stat.S_ISDIR(info.st_mode):
                    pending.append(Path(entry.path))
    return None


def _foreign(info: os.stat_result) -> str | None:
    if stat.S_ISLNK(info.st_mode):
        return "a symbolic link"
    if not (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode)):
        return "not a regular file or folder"
    if info.st_uid != os.getuid():
        return f"owned by uid {info.st_uid}"
    return None


def forget_least_used(top: Path, keep: int) -> None:
    """Delete all but the `keep` folders of `top` touched last (a lake's folder is touched
    when it is used), never through a link. Other commands of the user may be forgetting the
    same folders at the same moment: one gone before it is looked at is skipped."""
    with os.scandir(top) as listed:
        folders = [entry for entry in listed if entry.is_dir(follow_symlinks=False)]
    touched: list[tuple[int, str]] = []
    for entry in folders:
        try:
            touched.append((entry.stat(follow_symlinks=False).st_mtime_ns, entry.path))
        except FileNotFoundError:
            continue
    touched.sort(reverse=True)
    for _, path in touched[keep:]:
        shutil.rmtree(path, ignore_errors=True)
