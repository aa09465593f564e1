"""The lake's layout, owned in one place: the only module that builds paths inside a lake.

```
LAKE/_manifest/<run>.json                                  commit point of a run (manifest.py)
LAKE/_manifest/.tokenlake.lock                             one writer at a time
LAKE/tokenlake.duckdb                                      the catalog of views (catalog.py)
LAKE/{tokens,samples}/run=<run>/rollout_id=<rid>/{train,eval}-<hex8>.parquet
LAKE/runs/run=<run>/run-<hex8>.parquet, LAKE/vocab/run=<run>/vocab-<hex8>.parquet
LAKE/metrics/run=<run>/metrics-<hex8>.parquet              logged metrics, one file per new batch
LAKE/views/<name>.sql                                      user views (the user's, only read)
```

Every file is written by `atomic_write` (a temporary name `.tokenlake-<pid>-<hex8>.tmp`
that no other program uses, then `os.replace`), and the sweeps delete only names this scheme
made: a lake may share its folder with other files, and they are never touched.

A lake may also live on an object store (`s3://bucket/prefix`, any fsspec URL): `lake_at`
gives an `ObjectLake` (pipeline/load/object_lake.py) with the same layout and the same
methods, committed without rename. Modules outside these two use only what both offer:
relative names (`new_name`, `manifest_name`), `url`, `read_bytes`, `put_bytes`, `write_with`,
`publish_built`, `delete`, `exists`, `lock`, and the sweeps.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import secrets
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline import schema
from pipeline.errors import LakeError, UsageError, shown

if TYPE_CHECKING:
    from pipeline.load.manifest import RunManifest
    from pipeline.load.object_lake import ObjectLake

# Where a lake is: a directory, or the URL of an object-store prefix (`s3://bucket/lake`).
LakeRoot = Path | str
# A writer of one file: given where to write and the pyarrow-usable filesystem (None: local).
FileWriter = Callable[[str, Any], None]

log = logging.getLogger(__name__)

MANIFEST_DIR = "_manifest"
USER_VIEWS_DIR = "views"
LOCK_FILE = ".tokenlake.lock"
DUMP_MARKER = "rollout_data"  # a folder holding it is a dump, never a lake
# A run name is a file name (`<run>.json`, `run=<run>`); most file systems hold 255 bytes.
MAX_RUN_NAME_BYTES = 250

_FORBIDDEN_IN_RUN_NAME = re.compile(r"[/\\=%\x00-\x1f\x7f]")
# DuckDB expands these in a file path (a glob), so a run name holding one reads other files.
_GLOB_CHARACTERS = re.compile(r"[?*\[\]{}]")
# What `new_file` names, and temporary names of `atomic_write` (DuckDB adds `.wal`).
_DATA_FILE = re.compile(r"^(?:train|eval|run|vocab|metrics)(?:-[0-9a-f]{8})?\.parquet$")
_TEMPORARY = re.compile(r"^\.tokenlake-(\d+)-[0-9a-f]{8}\.tmp(?:\.wal)?$")
# Temporary names of tokenlake before 0.2: `.<catalog or data file>.<pid>.tmp`.
_OLD_TEMPORARY = re.compile(
    r"^\.(?:tokenlake\.duckdb|(?:train|eval|run|vocab)-[0-9a-f]{8}\.parquet)\.(\d+)\.tmp(?:\.wal)?$"
)


def check_run_name(name: str) -> str:
    """The one validation of a run name, for every command that takes one.

    A run name becomes a directory (`run=<name>`) and a file name (`<name>.json`), and
    appears in file paths DuckDB reads; quotes, spaces and unicode are fine.

    Examples:
        >>> check_run_name("qwen 'grpo' ü")
        "qwen 'grpo' ü"
    """
    quoted = shown(name, literal=False)
    if not name or name.startswith(".") or _FORBIDDEN_IN_RUN_NAME.search(name):
        raise UsageError(
            f"Run name `{quoted}` cannot be a partition directory: it must be non-empty,"
            " not start with `.`, and contain no `/`, `\\`, `=`, `%` or control characters."
            " Choose another with --run-name."
        )
    glob = _GLOB_CHARACTERS.search(name)
    if glob:
        raise UsageError(
            f"Run name `{quoted}` holds `{glob.group()}`, which DuckDB reads as a file"
            " pattern (`? * [ ] { }` are not allowed). Choose another with --run-name."
        )
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:  # a directory name in another encoding (surrogate escapes)
        raise UsageError(
            f"Run name `{quoted}` is not valid UTF-8 (the dump directory's name is in"
            " another encoding). Choose another with --run-name."
        ) from None
    if size > MAX_RUN_NAME_BYTES:
        raise UsageError(
            f"Run name `{quoted}` is {size} bytes long; the limit is"
            f" {MAX_RUN_NAME_BYTES} bytes (UTF-8), as it becomes a file name."
            " Choose another with --run-name."
        )
    return name


def temporary_path(folder: Path) -> Path:
    """A temporary name in `folder` that is unmistakably tokenlake's."""
    return folder / f".tokenlake-{os.getpid()}-{secrets.token_hex(4)}.tmp"


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


def partition_dir(table: str, run: str, rollout_id: int | None = None) -> str:
    """Relative directory of one partition.

    Examples:
        >>> partition_dir("tokens", "qwen", 3)
        'tokens/run=qwen/rollout_id=3'
        >>> partition_dir("runs", "qwen")
        'runs/run=qwen'
    """
    if schema.ROLLOUT_ID not in schema.TABLE_PARTITIONS[table]:
        return f"{table}/{schema.RUN}={run}"
    return f"{table}/{schema.RUN}={run}/{schema.ROLLOUT_ID}={rollout_id}"


def partition_patterns(table: str) -> dict[str, str]:
    """Partition column -> regular expression whose group 1 is its value in a file's path.

    Anchored at the path's end, on the lake's own layout only: the lake's location may hold
    `key=value` folders too (`/data/run=ghost/lake`), which must not count.

    Examples:
        >>> import re
        >>> path = "/x/run=ghost/lake/tokens/run=qwen/rollout_id=7/train-0a1b2c3d.parquet"
        >>> [re.search(p, path).group(1) for p in partition_patterns("tokens").values()]
        ['qwen', '7']
    """
    columns = schema.TABLE_PARTITIONS[table]
    segments = [f"{col}=([^/]*)" for col in columns]
    patterns = {}
    for i, col in enumerate(columns):
        parts = [
            seg if j == i else seg.replace("([^/]*)", "[^/]*") for j, seg in enumerate(segments)
        ]
        patterns[col] = "/" + "/".join(parts) + "/[^/]*$"
    return patterns


_URL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")


def is_url(location: LakeRoot) -> bool:
    """Whether a lake location names an object store (`s3://b/p`), not a local directory.

    `file://` URLs and plain paths are local.

    Examples:
        >>> is_url("s3://bucket/lake"), is_url("file:///tmp/lake"), is_url("lake")
        (True, False, False)
    """
    match = _URL.match(str(location)) if isinstance(location, str) else None
    return match is not None and match.group(1).lower() != "file"


def local_path(location: LakeRoot) -> Path:
    """A local lake location as a Path (`file:///x` is `/x`)."""
    text = str(location)
    return Path(text[len("file://") :] if text.lower().startswith("file://") else text)


def lake_at(location: LakeRoot | Lake | ObjectLake) -> Lake | ObjectLake:
    """The lake at a directory or an object-store URL (a lake object is returned as it is)."""
    if not isinstance(location, (str, Path)):
        return location
    if is_url(location):
        from pipeline.load.object_lake import ObjectLake

        return ObjectLake(str(location))
    return Lake(local_path(location))


def manifest_name(run: str) -> str:
    """Relative name of a run's manifest (the commit point)."""
    return f"{MANIFEST_DIR}/{check_run_name(run)}.json"


def new_name(
    table: str, run: str, stem: str, rollout_id: int | None = None, generation: str | None = None
) -> str:
    """A fresh relative file name in a partition (the manifest decides when it counts).

    `generation` (8 hex digits) names the files of one step alike; default: a new one.
    """
    folder = partition_dir(table, check_run_name(run), rollout_id)
    return f"{folder}/{stem}-{generation or secrets.token_hex(4)}.parquet"


def check_relative(relative: object) -> str:
    """A file name as a manifest lists it, or ValueError if it lies outside the lake."""
    if (
        not isinstance(relative, str)
        or Path(relative).is_absolute()
        or ".." in Path(relative).parts
    ):
        raise ValueError(f"it lists `{str(relative)[:80]}`, which lies outside the lake")
    return relative


def is_data_file(name: str) -> bool:
    """Whether a file name in a partition is one `new_name` makes."""
    return bool(_DATA_FILE.match(name))


class Lake:
    """A lake directory: where each of its files lives, and who may write them."""

    def __init__(self, root: Path | str) -> None:
        self.root = local_path(root).resolve()

    @property
    def location(self) -> Path:
        """Where the lake is, as messages show it and as `lake_at` takes it back."""
        return self.root

    @property
    def filesystem(self) -> None:
        """The pyarrow-usable filesystem of `url` names: None, the local one."""
        return None

    def url(self, relative: str) -> str:
        """The name DuckDB and pyarrow read a lake file by."""
        return str(self.file(relative))

    def arrow_source(self, relative: str) -> tuple[str, None]:
        """Where pyarrow reads a lake file: (path, filesystem)."""
        return str(self.file(relative)), None

    def exists(self, relative: str) -> bool:
        return self.file(relative).is_file()

    def read_bytes(self, relative: str) -> bytes:
        path = self.file(relative)
        try:
            return path.read_bytes()
        except OSError as exc:
            raise LakeError(path, f"cannot be read ({exc.strerror or exc})") from exc

    def put_bytes(self, relative: str, data: bytes, *, durable: bool = False, problem: str) -> None:
        """Write a whole small file (manifest): temporary name, fsync if `durable`, rename."""
        path = self.file(relative)
        path.parent.mkdir(parents=True, exist_ok=True)

        def write(tmp: Path) -> None:
            tmp.write_bytes(data)

        atomic_write(path, write, durable=durable, problem=problem)

    def write_with(
        self, relative: str, write: FileWriter, *, problem: str = "cannot be written"
    ) -> None:
        """Write a file through `write(where, filesystem)`: never half a file under its name."""
        path = self.file(relative)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LakeError(path, f"{problem} ({exc.strerror or exc})") from exc
        atomic_write(path, lambda tmp: write(str(tmp), None), problem=problem)

    def publish_built(self, relative: str, build: Callable[[Path], None]) -> None:
        """Build a file locally (`build(path)`, e.g. a DuckDB catalog) and put it in place."""
        atomic_write(self.file(relative), build)

    def delete(self, relatives: Iterable[str]) -> None:
        """Delete uncommitted files, and their partition folders if that leaves them empty."""
        for relative in relatives:
            path = self.file(relative)
            path.unlink(missing_ok=True)
            for folder in (path.parent, path.parent.parent):  # rollout_id=…, then run=…
                if "=" not in folder.name:  # only partition folders, never `_manifest/`
                    break
                try:
                    folder.rmdir()
                except OSError:  # not empty (other steps or runs live there): keep it
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
        return self.root / schema.CATALOG_FILE

    @property
    def user_views_dir(self) -> Path:
        """`LAKE/views/`: the user's own `*.sql` views, created after tokenlake's."""
        return self.root / USER_VIEWS_DIR

    def manifest_path(self, run: str) -> Path:
        return self.root / manifest_name(run)

    def manifest_paths(self) -> list[Path]:
        """Every run's manifest file, by name."""
        if not self.manifest_dir.is_dir():
            return []
        return sorted(p for p in self.manifest_dir.glob("*.json") if not p.name.startswith("."))

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

    def file(self, relative: str) -> Path:
        """The path of a file a manifest lists; refuses one outside the lake."""
        path = self.root / relative
        try:
            check_relative(relative)
        except ValueError:
            raise LakeError(path, "is listed by a manifest but lies outside the lake") from None
        return path

    @property
    def catalog_name(self) -> str:
        return schema.CATALOG_FILE

    def is_lake(self) -> bool:
        return self.manifest_dir.is_dir()

    def is_dump(self) -> bool:
        return (self.root / DUMP_MARKER).is_dir()

    def require(self) -> Lake:
        """This lake, or a one-line error saying why the directory is not one."""
        if self.root.exists() and not self.root.is_dir():
            raise LakeError(self.root, "is a file, not a lake directory")
        if self.is_dump():
            raise LakeError(
                self.root,
                f"is a miles dump (it has `{DUMP_MARKER}/`), not a lake; give the --lake"
                " directory of `tokenlake extract`",
            )
        if not self.is_lake():
            raise LakeError(
                self.root,
                f"is not a lake: it has no `{MANIFEST_DIR}/`; run `tokenlake extract` first",
            )
        return self

    def check_writable_for(self, dump_root: Path) -> None:
        """Refuse a lake that would write into the dump or into folders that are not its own."""
        if self.root == dump_root or dump_root in self.root.parents:
            raise LakeError(self.root, "is inside the dump directory; tokenlake never writes there")
        if self.root.exists() and not self.root.is_dir():
            raise LakeError(self.root, "is a file, not a directory; choose another --lake")
        own = [self.root / name for name in (*schema.TABLES, MANIFEST_DIR)]
        if any(dump_root == p or p in dump_root.parents for p in own):
            raise LakeError(
                self.root, f"would write into the dump `{dump_root}`; choose another --lake"
            )
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
        path = self.manifest_dir / LOCK_FILE
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            handle = open(path, "a")  # noqa: SIM115 - held for the whole extraction
        except OSError as exc:  # e.g. a read-only lake, or `_manifest` is a file
            where = f"`{exc.filename}`: " if exc.filename else ""
            raise LakeError(self.root, f"cannot be written ({where}{exc.strerror or exc})") from exc
        try:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError as exc:
                raise LakeError(
                    self.root,
                    "another tokenlake extraction is writing to it; wait for it to finish",
                ) from exc
            yield
        finally:
            handle.close()

    def catalog_is_stale(self) -> bool:
        """Whether some manifest is newer than the catalog (or there is no catalog)."""
        if not self.catalog_path.is_file():
            return True
        built = self.catalog_path.stat().st_mtime_ns
        return any(p.stat().st_mtime_ns >= built for p in self.manifest_paths())

    def delete_unlisted(self, record: RunManifest) -> int:
        """Delete the run's files, named by this scheme, that its manifest does not list.

        Safe only under `lock`: then no other writer has files in flight.
        """
        listed = {self.root / name for table in schema.TABLES for name in record.files(table)}
        deleted = 0
        for table in schema.TABLES:
            run_dir = self.root / table / f"{schema.RUN}={record.run}"
            if not run_dir.is_dir():
                continue
            for path in sorted(run_dir.rglob("*"), reverse=True):  # files before their folders
                if path.is_dir():
                    _remove_if_empty_partition(path)
                elif path not in listed and _made_here(path.name):
                    path.unlink()
                    deleted += 1
            _remove_if_empty_partition(run_dir)
        if deleted:
            log.info("deleted %d files of run %s that no manifest lists", deleted, record.run)
        return deleted

    def delete_stale_temporaries(self) -> int:
        """Delete tokenlake's temporary files whose writer (pid in the name) no longer runs."""
        deleted = 0
        for folder in (self.root, self.manifest_dir):
            if not folder.is_dir():
                continue
            for path in folder.iterdir():
                match = _TEMPORARY.match(path.name) or _OLD_TEMPORARY.match(path.name)
                if match and path.is_file() and not process_alive(int(match.group(1))):
                    path.unlink(missing_ok=True)
                    deleted += 1
        return deleted


def _made_here(name: str) -> bool:
    """Whether a file name in a partition is one this scheme makes (data or temporary)."""
    return bool(_DATA_FILE.match(name) or _TEMPORARY.match(name) or _OLD_TEMPORARY.match(name))


def _remove_if_empty_partition(path: Path) -> None:
    if "=" in path.name and not any(path.iterdir()):
        path.rmdir()


def process_alive(pid: object) -> bool:
    """Whether a process of this host runs (a pid that is not one counts as running: the
    safe answer for a sweep or a lock takeover).

    Examples:
        >>> process_alive(os.getpid()), process_alive("x")
        (True, True)
    """
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0 or pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. another user's process
        return True
    return True


def is_disk_full(exc: BaseException) -> bool:
    """Whether an error says the disk is full (DuckDB gives only text)."""
    return getattr(exc, "errno", None) == errno.ENOSPC or "No space left" in str(exc)
