"""A local lake's folders, walked without following a symbolic link (used by store/local.py).

A shared lake's writer can plant a link (`tokens/run=x -> /other/lake/tokens/run=y`). Paths
are checked component by component with `lstat` before tokenlake reads or writes them
(`refuse_links`), and deletions walk folders opened with `O_NOFOLLOW` (`opened`) and remove
names relative to them (`unlink_in`, `rmdir_in`), so a folder swapped for a link mid-sweep is
not entered either; verify reaches a run's files likewise, from the run's opened folders
(`folder_in`). Each link found is one LakeError naming it (`link_error`).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from operator import attrgetter
from pathlib import Path, PurePosixPath

from tokenlake.errors import NO_FILE_ERRNOS, SHOWN_PATH_CHARS, LakeError, UnreadableError, shown
from tokenlake.layout import is_partition_folder, made_here

# A folder opened without following a link: a sweep walks only what it opened this way.
_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NAME = attrgetter("name")


def link_error(root: Path, relative: str) -> LakeError:
    """The one line for a link found inside the lake at `root`."""
    name = shown(PurePosixPath(relative), SHOWN_PATH_CHARS)
    return LakeError(
        root,
        f"`{name}` is a symbolic link; tokenlake never follows a link inside a lake. Remove"
        " the link (what it points to is not touched)",
    )


def refuse_links(root: Path, parts: Sequence[str]) -> None:
    """A LakeError naming the first of `root/p0`, `root/p0/p1`, … that is a link."""
    # Joined as text, not as Path objects: a reader checks every file of the lake (its parts
    # as `PurePosixPath.parts` gives them: none empty), and pathlib cost most of that.
    path = str(root)
    for depth, name in enumerate(parts, 1):
        path = f"{path}/{name}"
        try:
            info = os.lstat(path)
        except OSError:  # missing (or unreadable): nothing below it is reached
            return
        if stat.S_ISLNK(info.st_mode):
            raise link_error(root, "/".join(parts[:depth]))


def refuse_links_in(root: Path, folder: int, where: str, depth: int) -> None:
    """No entry of an opened folder (`where` in the lake), nor of its `rollout_id=<n>`
    folders down to `depth` levels, is a link."""
    for entry in entries(folder):
        if entry.is_symlink():
            raise link_error(root, f"{where}/{entry.name}")
        if depth > 1 and entry.is_dir(follow_symlinks=False) and is_partition_folder(entry.name):
            inner = _open_in(folder, entry.name)
            if inner is not None:
                try:
                    refuse_links_in(root, inner, f"{where}/{entry.name}", depth - 1)
                finally:
                    os.close(inner)


def make_folders(root: Path, parts: Iterable[str]) -> None:
    """Create `root/p0/p1/…` as needed, never through a link (OSError as `mkdir` raises it,
    LakeError for a link)."""
    root.mkdir(parents=True, exist_ok=True)  # the user's path: followed as given
    path, walked = root, list[str]()
    for name in parts:
        path, walked = path / name, [*walked, name]
        try:
            path.mkdir()
        except FileExistsError:
            if stat.S_ISLNK(os.lstat(path).st_mode):
                raise link_error(root, "/".join(walked)) from None
            if not path.is_dir():
                raise


@contextmanager
def opened(root: Path, parts: Iterable[str]) -> Iterator[list[int]]:
    """`root`, then its folders `p0`, `p0/p1`, … opened without following a link, as far as
    they exist (none: no lake yet); closed afterwards. A LakeError for a link."""
    try:
        folders = [os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)]
    except (FileNotFoundError, NotADirectoryError):
        folders = []
    try:
        walked: list[str] = []
        for name in parts if folders else ():
            walked.append(name)
            try:
                folders.append(os.open(name, _FOLDER_FLAGS, dir_fd=folders[-1]))
            except OSError as exc:
                # a link gives ELOOP, or ENOTDIR (Linux checks O_DIRECTORY first)
                if exc.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(folders[-1], name):
                    raise link_error(root, "/".join(walked)) from None
                if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                    break
                raise UnreadableError(root.joinpath(*walked), exc, "opened") from None
        yield folders
    finally:
        for descriptor in folders:
            os.close(descriptor)


@contextmanager
def opened_in(folder: int, name: str) -> Iterator[int | None]:
    """A subfolder opened without following a link (None: gone, or it is a link now)."""
    inner = _open_in(folder, name)
    try:
        yield inner
    finally:
        if inner is not None:
            os.close(inner)


def _open_in(folder: int, name: str) -> int | None:
    """`opened_in` for the walks over every step folder, where a context manager's own cost
    was a fifth of theirs: the caller closes it."""
    try:
        return os.open(name, _FOLDER_FLAGS, dir_fd=folder)
    except OSError:
        return None


def sweep_run(folder: int, where: str, listed: set[str]) -> int:
    """Delete the scheme's regular files not in `listed` in a run's opened folder (`where`
    in the lake) and in its `rollout_id=<n>` folders, then those folders if empty; other
    folders are never entered. Returns how many files were deleted."""
    deleted = 0
    for entry in entries(folder):
        name = f"{where}/{entry.name}"
        if entry.is_dir(follow_symlinks=False) and is_partition_folder(entry.name):
            with opened_in(folder, entry.name) as step:
                if step is not None:
                    deleted += sweep_run(step, name, listed)
            rmdir_in(folder, entry.name)
        elif entry.is_file(follow_symlinks=False) and made_here(entry.name) and name not in listed:
            deleted += unlink_in(folder, entry.name)
    return deleted


def made_files(folder: int, where: str, links_of: Path | None = None, depth: int = 2) -> list[str]:
    """Names in the lake of the scheme's regular files in a run's opened folder (`where` in
    the lake) and in its `rollout_id=<n>` folders; other folders are never entered.

    With `links_of` (the lake's root), a link among the entries is a LakeError, as
    `refuse_links_in` of the folder to `depth` levels: one walk both lists a run's files and
    refuses its links.
    """
    found = []
    for entry in entries(folder):
        name = f"{where}/{entry.name}"
        if links_of is not None and depth > 0 and entry.is_symlink():
            raise link_error(links_of, name)
        if entry.is_dir(follow_symlinks=False) and is_partition_folder(entry.name):
            step = _open_in(folder, entry.name)
            if step is not None:
                try:
                    found += made_files(step, name, links_of, depth - 1)
                finally:
                    os.close(step)
        elif entry.is_file(follow_symlinks=False) and made_here(entry.name):
            found.append(name)
    return found


def entries(folder: int) -> list[os.DirEntry[str]]:
    """The entries of an opened folder, by name."""
    with os.scandir(folder) as found:
        return sorted(found, key=_NAME)


def unlink_in(folder: int, name: str) -> int:
    """Remove a name in an opened folder (a link itself, never its target); 1 if it was there."""
    try:
        os.unlink(name, dir_fd=folder)
    except FileNotFoundError:
        return 0
    return 1


def rmdir_in(folder: int, name: str) -> bool:
    """Remove an empty folder in an opened folder; False if it is not empty (or gone)."""
    try:
        os.rmdir(name, dir_fd=folder)
    except OSError:  # not empty (other steps or runs live there): keep it
        return False
    return True


# A step folder opened only to look its files up (O_PATH where the OS has it: search
# permission is all it needs, as for a path through it), never through a link.
_LOOKUP_FLAGS = os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_PATH", os.O_RDONLY)


def folder_in(root: Path, folder: int, parts: Sequence[str]) -> int | None:
    """The folder `parts` of the lake at `root`, opened in its opened parent `folder` for
    looking up its files (None: not there, or not a folder); the caller closes it.

    Raises:
        LakeError: It is a symbolic link.
        OSError: The OS refuses it.
    """
    name = parts[-1]
    try:
        return os.open(name, _LOOKUP_FLAGS, dir_fd=folder)
    except OSError as exc:
        # a link gives ELOOP, or ENOTDIR (Linux checks O_DIRECTORY first)
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(folder, name):
            raise link_error(root, "/".join(parts)) from None
        if exc.errno in NO_FILE_ERRNOS:
            return None
        raise


def _is_link(folder: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode)
    except OSError:
        return False
