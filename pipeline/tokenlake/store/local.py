"""A lake in a local directory (or one every node mounts at the same path).

Names come from tokenlake/tokenlake/layout.py (the one owner of the layout); this class is where they
become paths: reading and writing files, the atomic write (temporary name, then rename), the
writer lock (flock on `_manifest/.tokenlake.lock`) and the sweeps of what the naming scheme made.
`store_at` gives it for a path, and `ObjectStore` (pipeline/tokenlake/store/object.py) for a URL; both
offer the same methods.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import stat
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from tokenlake import bounded, schema
from tokenlake.errors import NO_FILE_ERRNOS, LakeError, UnreadableError
from tokenlake.layout import (
    CATALOG_FILE,
    LOCK_FILE,
    MANIFEST_DIR,
    TOP_LEVEL_DIRS,
    USER_VIEWS_DIR,
    check_relative,
    is_run_folder,
    local_path,
    manifest_name,
    new_name,
    relative_parts,
    table_dir_parts,
    temporary_owner,
    temporary_path,
)
from tokenlake.processes import process_alive
from tokenlake.store import nofollow
from tokenlake.store.base import FileWriter, RunListing, ViewFile

if TYPE_CHECKING:
    import polars as pl

log = logging.getLogger(__name__)

# The lock never follows a link and never waits on a FIFO (which `open` would, for a writer).
_LOCK_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# A lake file is read likewise: a FIFO put in its place since it was checked never blocks.
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a directory",
    stat.S_IFCHR: "a device",
    stat.S_IFBLK: "a device",
}


class LocalStore:
    """A lake directory: where each of its files lives, and who may write them."""

    def __init__(self, root: Path | str) -> None:
        self.root = local_path(root).resolve()
        self._given = str(root)

    def __str__(self) -> str:  # as the user gave it: messages name the lake so
        return self._given

    def __repr__(self) -> str:
        return f"LocalStore({self._given!r})"

    @property
    def location(self) -> Path:
        """Where the lake is, as messages show it and as `store_at` takes it back."""
        return self.root

    @property
    def filesystem(self) -> None:
        """The pyarrow-usable filesystem of `url` names: None, the local one."""
        return None

    def reading_filesystem(self) -> None:
        """None: DuckDB reads a local lake's files itself."""
        return None

    def url(self, relative: str) -> str:
        """The name DuckDB and pyarrow read a lake file by."""
        return str(self.file(relative))

    def label(self, relative: str) -> str:
        """How messages name a lake file, whatever it is (a planted link included)."""
        return str(self.root / relative)

    def arrow_source(self, relative: str) -> tuple[str, None]:
        """Where pyarrow reads a lake file: (path, filesystem).

        Raises:
            OSError: Something other than a regular file is there (pyarrow would read a
                directory planted under a file's name as a dataset of whatever it holds).
        """
        path = self.file(relative)
        if path.exists() and not path.is_file():
            raise OSError(errno.EISDIR, "not a regular file", str(path))
        return str(path), None

    def exists(self, relative: str) -> bool:
        return self.file(relative).is_file()

    def open_listed(self, relative: str) -> tuple[int, int] | None:
        """A file a manifest lists, opened for reading (its descriptor and size): one walk of
        its folders and one open, never through a symbolic link. None where `exists` is False
        (nothing there, or not a regular file: a directory, a FIFO, a device is never opened).

        Within `walked_once`, a file of the run `check_links` walked last is opened from that
        run's folder as `check_links` opened it (never through a link): its step folder and
        itself are all that is left to look up.

        Raises:
            LakeError: It lies outside the lake, or a link is on its way (`file`).
            OSError: The OS refuses it (permission denied): its readers name it.
        """
        parts = self._listed_parts(relative)
        walk = _WALKED.get()
        held = None if walk is None or len(parts) < 3 else walk.held.get(tuple(parts[:-2]))
        if held is None or walk is None or walk.root is not self.root:  # by its path
            nofollow.refuse_links(self.root, parts[:-1])
            return self._open_file(f"{self.root}/{relative}", relative)
        folder = nofollow.folder_in(self.root, held, parts[:-1])
        if folder is None:
            return None
        try:
            return self._open_file(parts[-1], relative, folder)
        finally:
            os.close(folder)

    def _open_file(
        self, path: str, relative: str, folder: int | None = None
    ) -> tuple[int, int] | None:
        """`open_listed` of a file whose folders are checked: `path` (in `folder`, if given)."""
        try:
            mode = os.lstat(path, dir_fd=folder).st_mode
        except OSError as exc:
            if exc.errno in NO_FILE_ERRNOS:
                return None
            raise
        if stat.S_ISLNK(mode):
            raise nofollow.link_error(self.root, relative)
        if not stat.S_ISREG(mode):
            return None
        try:
            descriptor = os.open(path, _READ_FLAGS, dir_fd=folder)
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # made a link since: refused alike
                raise nofollow.link_error(self.root, relative) from None
            raise
        opened = os.fstat(descriptor)
        if not stat.S_ISREG(opened.st_mode):  # replaced since
            os.close(descriptor)
            return None
        return descriptor, opened.st_size

    def read_bytes(self, relative: str, limit: int | None = None, what: str = "a file") -> bytes:
        """A lake file's bytes; with `limit`, only a regular file tokenlake wrote (no symbolic
        link, FIFO or device) of at most `limit` bytes (`what` names it), else a
        BoundedReadError."""
        if limit is not None:  # a link, a FIFO, a device: the bounded reader's own line
            return bounded.read_file(self.file(relative, itself=False), limit, what, follow=False)
        path = self.file(relative)
        try:
            return path.read_bytes()
        except OSError as exc:
            raise LakeError(path, f"cannot be read ({exc.strerror or exc})") from exc

    def put_bytes(self, relative: str, data: bytes, *, durable: bool = False, problem: str) -> None:
        """Write a whole small file (manifest): temporary name, fsync if `durable`, rename (which
        replaces a planted link by the file, never writes through it)."""
        path = self.file(relative, itself=False)
        nofollow.make_folders(self.root, path.parent.relative_to(self.root).parts)

        def write(tmp: Path) -> None:
            tmp.write_bytes(data)

        atomic_write(path, write, durable=durable, problem=problem)

    def write_with(
        self, relative: str, write: FileWriter, *, problem: str = "cannot be written"
    ) -> None:
        """Write a file through `write(where, filesystem)`: never half a file under its name."""
        path = self.file(relative)
        try:
            nofollow.make_folders(self.root, path.parent.relative_to(self.root).parts)
        except OSError as exc:
            raise LakeError(path, f"{problem} ({exc.strerror or exc})") from exc
        atomic_write(path, lambda tmp: write(str(tmp), None), problem=problem)

    def publish_built(self, relative: str, build: Callable[[Path], None]) -> None:
        """Build a file locally (`build(path)`, e.g. a DuckDB catalog) and put it in place."""
        atomic_write(self.file(relative), build)

    def delete(self, relatives: Iterable[str]) -> None:
        """Delete uncommitted files, and their partition folders if that leaves them empty.

        Each file is removed relative to its folder, opened without following a link.
        """
        for relative in relatives:
            self.file(relative)  # outside the lake, or through a link: refused
            parts = PurePosixPath(relative).parts
            with nofollow.opened(self.root, parts[:-1]) as folders:
                if len(folders) < len(parts):
                    continue  # its folder is gone: so is the file
                nofollow.unlink_in(folders[-1], parts[-1])
                # rollout_id=…, then run=…; never `_manifest/` or a table folder
                for depth in range(len(parts) - 2, 0, -1):
                    gone = "=" in parts[depth] and nofollow.rmdir_in(folders[depth], parts[depth])
                    if not gone:
                        break

    def manifest_runs(self) -> list[str]:
        """The runs that have a manifest, by name."""
        return [p.stem for p in self.manifest_paths()]

    def create(self) -> None:
        """Make the lake's directory (a first extraction)."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LakeError(self.root, f"cannot be created ({exc.strerror or exc})") from exc

    def check_lease(self) -> None:
        """Nothing to check: a local lock (flock) cannot expire while its holder runs."""

    @property
    def manifest_dir(self) -> Path:
        return self.root / MANIFEST_DIR

    @property
    def catalog_path(self) -> Path:
        return self.root / CATALOG_FILE

    @property
    def local_catalog(self) -> Path:
        """The catalog's path: a local lake's catalog is a file readers can check."""
        return self.catalog_path

    @property
    def user_views_dir(self) -> Path:
        """`LAKE/views/`: the user's own `*.sql` views, created after tokenlake's."""
        return self.root / USER_VIEWS_DIR

    def manifest_path(self, run: str) -> Path:
        return self.root / manifest_name(run)

    def manifest_paths(self) -> list[Path]:
        """Every run's manifest file, by name."""
        try:  # never glob: it reads a folder the OS refuses as an empty one (no runs at all)
            with os.scandir(self.manifest_dir) as entries:
                names = [e.name for e in entries]
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            raise UnreadableError(self.manifest_dir, exc, "listed") from None
        chosen = (n for n in names if n.endswith(".json") and not n.startswith("."))
        return sorted(self.manifest_dir / name for name in chosen)

    def new_file(
        self,
        table: str,
        run: str,
        stem: str,
        rollout_id: int | None = None,
        generation: str | None = None,
    ) -> Path:
        """`new_name` as a path."""
        return self.root / new_name(table, run, stem, rollout_id, generation)

    def relative(self, path: Path) -> str:
        """How a manifest records a file of the lake."""
        return str(path.relative_to(self.root))

    def file(self, relative: str, *, itself: bool = True) -> Path:
        """The path of a file a manifest lists; refuses one outside the lake or reached
        through a symbolic link (with `itself` False, only its folders are checked: the
        caller judges the file itself)."""
        self._check_listed(relative, itself)
        return self.root / relative

    def _check_listed(self, relative: str, itself: bool) -> None:
        """`file` without the Path (LakeError)."""
        parts = self._listed_parts(relative)
        nofollow.refuse_links(self.root, parts if itself else parts[:-1])

    def _listed_parts(self, relative: str) -> list[str]:
        """The folders and file of a name a manifest lists (LakeError: outside the lake)."""
        try:
            check_relative(relative)
        except ValueError:
            raise LakeError(
                self.root / relative, "is listed by a manifest but lies outside the lake"
            ) from None
        return relative_parts(relative)

    def check_links(self, run: str) -> None:
        """Refuse the run if any folder or file of it in the lake is a symbolic link.

        Checked before a command writes, reads or deletes the run's files, so that nothing
        is done through a planted link (`tokens/run=x -> /other/lake/tokens/run=y`).
        """
        # The manifest's folder: a manifest that is itself a link is a damaged manifest, which
        # drop removes (the link, never what it points to).
        nofollow.refuse_links(self.root, PurePosixPath(manifest_name(run)).parts[:-1])
        walk = _WALKED.get()
        if walk is not None:
            walk.begin_run(self.root)
        for table in schema.LAKE_TABLES:
            run_dir = (*table_dir_parts(table), f"{schema.RUN}={run}")
            nofollow.refuse_links(self.root, run_dir)
            with nofollow.opened(self.root, run_dir) as folders:
                if len(folders) < len(run_dir) + 1:  # the root, then each part
                    continue
                where = "/".join(run_dir)
                if walk is None:
                    nofollow.refuse_links_in(self.root, folders[-1], where, depth=2)
                    continue
                made = nofollow.made_files(folders[-1], where, links_of=self.root)
                walk.keep(run_dir, made, folders[-1])

    @property
    def catalog_name(self) -> str:
        return CATALOG_FILE

    def catalog_stamp(self) -> object:
        """What changes when the catalog is replaced (None when there is none)."""
        try:
            stat = self.catalog_path.stat()
        except OSError:
            return None
        return (stat.st_ino, stat.st_mtime_ns)

    def scan(
        self, table: str, listed: list[tuple[str, dict[str, Any]]], names: list[str]
    ) -> pl.LazyFrame:
        """One LazyFrame over exactly the listed files (name, partition values)."""
        located = [(self.file(name), values) for name, values in listed]
        return _scan(table, located, names, self.root)

    def read_user_views(self, limit: int) -> list[ViewFile]:
        """The user's `views/*.sql`, by name, read through the folder's descriptor."""
        return _local_view_files(self.user_views_dir, limit)

    def is_lake(self) -> bool:
        return self.manifest_dir.is_dir()

    def holds_folder(self, name: str) -> bool:
        return (self.root / name).is_dir()

    def require(self) -> LocalStore:
        """This lake, or a one-line error saying why the directory is not one."""
        if self.root.exists() and not self.root.is_dir():
            raise LakeError(self.root, "is a file, not a lake directory")
        if not self.is_lake():
            raise LakeError(
                self.root,
                f"is not a lake: it has no `{MANIFEST_DIR}/`; run `tokenlake extract` first",
            )
        return self

    def check_writable(self) -> None:
        """Refuse a lake directory that is a file, or holds folders that are not its own."""
        if self.root.exists() and not self.root.is_dir():
            raise LakeError(self.root, "is a file, not a directory; choose another --lake")
        own = [self.root / name for name in TOP_LEVEL_DIRS]
        if self.root.is_dir() and not self.manifest_dir.exists():  # not a lake (yet)
            foreign = [p.name for p in own if p.exists()]
            if foreign:
                raise LakeError(
                    self.root,
                    f"is not a lake but holds `{foreign[0]}`, where the lake would write;"
                    " choose another --lake",
                )

    @contextmanager
    def lock(self) -> Iterator[None]:
        """One writer per lake at a time; a second one fails at once with a clear error."""
        try:
            nofollow.make_folders(self.root, (MANIFEST_DIR,))
            handle = open(self.manifest_dir / LOCK_FILE, "a", opener=_open_lock)  # noqa: SIM115
        except OSError as exc:  # e.g. a read-only lake, or `_manifest` is a file
            raise self._lock_error(exc) from exc
        try:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                raise self._lock_error(OSError(errno.EINVAL, "not a regular file"))
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError as exc:
                raise LakeError(
                    self.root,
                    "another tokenlake command (an extraction, a tag, a drop) is writing to it; wait for it to finish",
                ) from exc
            yield
        finally:
            handle.close()

    def writer_busy(self) -> bool:
        """Whether a writer holds the lock: a shared lock is asked for and released at once
        (it cannot be had while a writer holds the exclusive one). The lock file is never
        created, nor opened through a link."""
        try:
            descriptor = os.open(self.manifest_dir / LOCK_FILE, os.O_RDONLY | _LOCK_FLAGS)
        except OSError:  # no lock file: no writer ever took it
            return False
        try:
            if not stat.S_ISREG(os.fstat(descriptor).st_mode):
                return False
            try:
                fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            return False
        finally:
            os.close(descriptor)  # and with it the shared lock

    def _lock_error(self, exc: OSError) -> LakeError:
        """Why the lock file cannot be opened: a link or not a file (planted), or the OSError."""
        relative = f"{MANIFEST_DIR}/{LOCK_FILE}"
        try:
            mode = os.lstat(self.manifest_dir / LOCK_FILE).st_mode
        except OSError:
            mode = stat.S_IFREG
        if stat.S_ISLNK(mode):
            return nofollow.link_error(self.root, relative)
        if not stat.S_ISREG(mode):
            return LakeError(
                self.root,
                f"`{relative}` is {_KINDS.get(stat.S_IFMT(mode), 'not a file')}, not the lock"
                " file tokenlake makes (a regular file); remove it",
            )
        where = f"`{exc.filename}`: " if exc.filename else ""
        return LakeError(self.root, f"cannot be written ({where}{exc.strerror or exc})")

    def delete_unlisted(
        self, record: RunListing, tables: Sequence[str] = schema.LAKE_TABLES
    ) -> int:
        """Delete the run's files, named by this scheme, that its manifest does not list.

        Only regular files with the scheme's names, in the run's folder and its
        `rollout_id=<n>` folders, are deleted; links and other folders are never entered.
        Safe only under `lock`: then no other writer has files in flight.
        """
        listed = {
            str(PurePosixPath(name)) for table in schema.LAKE_TABLES for name in record.files(table)
        }
        deleted = 0
        for table in tables:
            run_name = f"{schema.RUN}={record.run}"
            run_dir = (*table_dir_parts(table), run_name)
            with nofollow.opened(self.root, run_dir) as folders:
                if len(folders) < len(run_dir) + 1:
                    continue
                deleted += nofollow.sweep_run(folders[-1], "/".join(run_dir), listed)
                nofollow.rmdir_in(folders[-2], run_name)
        if deleted:
            log.info("deleted %d files of run %s that no manifest lists", deleted, record.run)
        return deleted

    def made_files(self) -> list[str]:
        """Every file of a run that the naming scheme made, listed or not: regular files in
        each table's `run=<name>` folders and their `rollout_id=<n>` folders, never through a
        link. Within `walked_once`, a run folder `check_links` walked is not walked again."""
        found: list[str] = []
        for table in schema.LAKE_TABLES:
            parts = table_dir_parts(table)
            with nofollow.opened(self.root, parts) as folders:
                if len(folders) < len(parts) + 1:
                    continue
                for entry in nofollow.entries(folders[-1]):
                    if entry.is_dir(follow_symlinks=False) and is_run_folder(entry.name):
                        kept = walked_made_files(self.root, (*parts, entry.name))
                        if kept is not None:
                            found += kept
                            continue
                        with nofollow.opened_in(folders[-1], entry.name) as run_folder:
                            if run_folder is not None:
                                where = "/".join((*parts, entry.name))
                                found += nofollow.made_files(run_folder, where)
        return found

    def delete_stale_temporaries(self) -> int:
        """Delete tokenlake's temporary files whose writer (pid in the name) no longer runs."""
        deleted = 0
        for parts in ((), (MANIFEST_DIR,)):
            with nofollow.opened(self.root, parts) as folders:
                if len(folders) <= len(parts):
                    continue
                for entry in nofollow.entries(folders[-1]):
                    owner = temporary_owner(entry.name)
                    stale = owner is not None and not process_alive(owner)
                    if stale and entry.is_file(follow_symlinks=False):
                        deleted += nofollow.unlink_in(folders[-1], entry.name)
        return deleted


class _Walk:
    """What `check_links` found within `walked_once`: the files made in each run folder it
    walked (by its parts), and the last run's folders, held open for `open_listed`."""

    def __init__(self) -> None:
        self.root: Path | None = None  # the lake of the held folders
        self.made: dict[tuple[Path, tuple[str, ...]], list[str]] = {}
        self.held: dict[tuple[str, ...], int] = {}

    def begin_run(self, root: Path) -> None:
        """Close the previous run's folders: one run's are held at a time (a dozen
        descriptors, whatever the number of runs)."""
        self.release()
        self.root = root

    def keep(self, run_dir: tuple[str, ...], made: list[str], folder: int) -> None:
        assert self.root is not None
        self.made[(self.root, run_dir)] = made
        self.held[run_dir] = os.dup(folder)

    def release(self) -> None:
        for descriptor in self.held.values():
            os.close(descriptor)
        self.held.clear()


_WALKED: ContextVar[_Walk | None] = ContextVar("tokenlake_walked_runs", default=None)


@contextmanager
def walked_once() -> Iterator[None]:
    """Within it, each run's folders are walked once by a command that both refuses their
    links and lists the files made there (verify): `check_links` keeps the files it passed
    for `made_files`, and holds the run's folders, opened without following a link, for
    `open_listed` of its files until the next run's `check_links`."""
    walk = _Walk()
    token = _WALKED.set(walk)
    try:
        yield
    finally:
        _WALKED.reset(token)
        walk.release()


def walked_made_files(root: Path, run_dir: tuple[str, ...]) -> list[str] | None:
    """The files `check_links` found made in a run folder within `walked_once` (None: not
    walked)."""
    walk = _WALKED.get()
    return None if walk is None else walk.made.get((root, run_dir))


def _open_lock(path: str, flags: int) -> int:
    return os.open(path, flags | _LOCK_FLAGS, 0o666)


def atomic_write(
    target: Path,
    write: Callable[[Path], None],
    *,
    durable: bool = False,
    problem: str = "cannot be written",
) -> None:
    """Write `target` through `write(temporary)` then `os.replace`: never half a file.

    Args:
        target: The final path; its folder must exist.
        write: Writes the whole file at the path it is given.
        durable: fsync the file before the rename (the commit point: manifests).
        problem: How the LakeError raised on an OSError starts.
    """
    tmp = temporary_path(target.parent)
    try:
        write(tmp)
        if durable:
            descriptor = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
        os.replace(tmp, target)
    except OSError as exc:
        raise LakeError(target, f"{problem} ({exc.strerror or exc})") from exc
    finally:
        tmp.unlink(missing_ok=True)
        Path(f"{tmp}.wal").unlink(missing_ok=True)  # DuckDB's write-ahead log


def _local_view_files(folder: Path, limit: int) -> list[ViewFile]:
    """The folder's `*.sql` entries, read through the folder's descriptor: no symbolic link
    is followed (neither the folder nor a file), and a FIFO or device is never opened for
    reading, so nothing outside the folder is read and nothing hangs."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        descriptor = os.open(folder, flags)
    except OSError as exc:
        if folder.is_symlink():
            problem = "it is a symbolic link; user views are read only from a real folder"
            return [ViewFile(str(folder), "", b"", problem)]
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return []  # no folder of views
        return [ViewFile(str(folder), "", b"", f"it cannot be read ({exc.strerror})")]
    try:
        names = sorted(
            entry.name for entry in os.scandir(descriptor) if entry.name.endswith(".sql")
        )
        return [_read_local(folder, descriptor, name, limit) for name in names]
    finally:
        os.close(descriptor)


def _read_local(folder: Path, descriptor: int, name: str, limit: int) -> ViewFile:
    path, stem = str(folder / name), name[: -len(".sql")]
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        handle = os.open(name, flags, dir_fd=descriptor)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            problem = "it is a symbolic link; tokenlake reads only regular files in `views/`"
        else:
            problem = f"it cannot be read ({exc.strerror})"
        return ViewFile(path, stem, b"", problem)
    try:
        if not stat.S_ISREG(os.fstat(handle).st_mode):
            return ViewFile(path, stem, b"", "it is not a regular file")
        chunks, left = [], limit
        while left > 0 and (chunk := os.read(handle, min(left, 1 << 16))):
            chunks.append(chunk)
            left -= len(chunk)
        return ViewFile(path, stem, b"".join(chunks))
    except OSError as exc:
        return ViewFile(path, stem, b"", f"it cannot be read ({exc.strerror})")
    finally:
        os.close(handle)


_FILE_COLUMN = "__tokenlake_file"


def _scan(
    table: str, listed: list[tuple[Path, dict[str, Any]]], names: list[str], root: Path
) -> pl.LazyFrame:
    """One LazyFrame over exactly the listed files, partition columns first, typed as in the
    catalog; a file lacking a column of the schema (a `runs` file of schema version 1) reads
    NULL there.

    The partition columns come from polars' Hive parsing, so a filter on them skips whole
    files, except when the lake's own path holds a `key=value` folder (`/data/run=x/lake`),
    which that parsing would read too: then they come from the manifests, file by file.
    """
    import polars as pl

    partitions = schema.TABLE_PARTITIONS[table]
    types = schema.polars_types(table)
    if not listed:
        return pl.LazyFrame(schema={c: types[c] for c in (*partitions, *names)})
    options: dict[str, Any] = {
        "schema": {n: types[n] for n in schema.TABLE_SCHEMAS[table].names},
        "missing_columns": "insert",
        "extra_columns": "ignore",
        "glob": False,  # a path is a path, never a pattern
    }
    paths = [str(path) for path, _ in listed]
    if "=" not in str(root):
        hive = {c: types[c] for c in partitions}
        frame = pl.scan_parquet(paths, hive_partitioning=True, hive_schema=hive, **options)
    else:
        frame = pl.scan_parquet(
            paths, hive_partitioning=False, include_file_paths=_FILE_COLUMN, **options
        )
        frame = frame.with_columns(
            pl.col(_FILE_COLUMN)
            .replace_strict({str(p): v[c] for p, v in listed}, return_dtype=types[c])
            .alias(c)
            for c in partitions
        )
    return frame.select(*partitions, *names)
