"""A lake on an object store (`s3://bucket/prefix`, or any URL fsspec resolves).

Same layout as a local lake (pipeline/tokenlake/layout.py names every file), another commit protocol,
because an object store has no rename and no file lock:

- Parquet objects are written under fresh names (`new_name`): an object appears whole when
  its upload completes, or not at all, and no manifest lists it before then.
- The run manifest is one PUT: the single atomic write that commits a step.
- The catalog is built in a local temporary file and uploaded in one PUT.
- Objects the naming scheme made that no manifest lists are swept after each commit round.
- One writer at a time: `_manifest/.tokenlake.lock` is created with a conditional PUT
  (`If-None-Match: *`, fsspec's exclusive `xb` mode) and holds its holder and a lease that a
  thread renews (`If-Match` on its own ETag). A lock whose lease ran out, or whose holder was
  a process on this host that is gone, is taken over by another conditional PUT; a writer
  that lost its lease stops before its next commit. A store without conditional writes is
  refused for writing, with the reason. (The lock: pipeline/tokenlake/store/object_lock.py.)

Credentials and endpoint come from the environment the store's library reads
(`AWS_ACCESS_KEY_ID`, `AWS_ENDPOINT_URL`, ...), never from the command line.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from tokenlake import bounded, schema
from tokenlake.errors import LakeError
from tokenlake.layout import (
    CATALOG_FILE,
    LOCK_FILE,
    MANIFEST_DIR,
    TOP_LEVEL_DIRS,
    USER_VIEWS_DIR,
    check_relative,
    is_data_file,
    is_partition_folder,
    is_run_folder,
    table_dir,
)
from tokenlake.store.base import FileWriter, RunListing, ViewFile

if TYPE_CHECKING:
    import polars as pl

log = logging.getLogger(__name__)


class ObjectStore:
    """A lake under an object-store prefix: where each object lives, and who may write."""

    def __init__(self, url: str) -> None:
        from tokenlake import extras

        self.location = url.rstrip("/")
        if self.location.split("://", 1)[0].lower() in ("s3", "s3a"):
            extras.require("s3fs", "s3", f"A lake on S3 (`{self.location}`)")
        try:
            self.fs, base = _filesystem(self.location)
        except (ImportError, ValueError) as exc:  # e.g. s3fs not installed, unknown protocol
            raise LakeError(self.location, f"cannot be opened ({exc})") from exc
        self.base = str(base).rstrip("/")
        self._scheme = self.location.split("://", 1)[0]
        self._given = url

    def __str__(self) -> str:  # as the user gave it: messages name the lake so
        return self._given

    def __repr__(self) -> str:
        return f"ObjectStore({self.location!r})"

    def __reduce__(self) -> tuple[type[ObjectStore], tuple[str]]:
        """Pickled as the URL it was opened with, so a worker process (a pool's, a Ray task's)
        opens its own filesystem: a filesystem's connections and caches are this process's."""
        return ObjectStore, (self._given,)

    # -- names -----------------------------------------------------------------------------

    @property
    def filesystem(self) -> Any:
        return self.fs

    def reading_filesystem(self) -> Any:
        """A filesystem of its own for DuckDB's reads while a catalog is built, its listing
        cache filled by one listing per table folder (1,000 objects a request): binding a view
        over N objects then asks the store for no HEAD per object and view (measured: 9 per
        object and command on the test lake). Its own, because the lake's filesystem must not
        answer a lock's or a manifest's HEAD from a listing."""
        fs, _ = _filesystem(self.location, shared=False)
        for table in schema.LAKE_TABLES:
            try:
                fs.find(f"{self.base}/{table_dir(table)}")
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise self.error(table_dir(table), "cannot be listed", exc) from exc
        return fs

    @property
    def catalog_name(self) -> str:
        return CATALOG_FILE

    @property
    def local_catalog(self) -> None:
        """None: the catalog is an object, which readers never open (they build their own)."""
        return None

    def key(self, relative: str) -> str:
        """The object's key in the filesystem (`bucket/prefix/relative`)."""
        try:
            check_relative(relative)
        except ValueError:
            raise LakeError(
                f"{self.location}/{relative}", "is listed by a manifest but lies outside the lake"
            ) from None
        return f"{self.base}/{relative}"

    def url(self, relative: str) -> str:
        return f"{self._scheme}://{self.key(relative)}"

    def label(self, relative: str) -> str:
        """How messages name a lake object."""
        return self.url(relative)

    # -- reading ---------------------------------------------------------------------------

    def arrow_source(self, relative: str) -> tuple[str, Any]:
        """Where pyarrow reads a lake object: (key, filesystem)."""
        return self.key(relative), self.fs

    def exists(self, relative: str) -> bool:
        try:
            return bool(self.fs.isfile(self.key(relative)))
        except OSError as exc:
            raise self.error(relative, "cannot be read", exc) from exc

    def read_bytes(self, relative: str, limit: int | None = None, what: str = "a file") -> bytes:
        """An object's bytes; with `limit`, at most `limit` bytes (`what` names the object),
        else a BoundedReadError (its size is asked first, and at most `limit` + 1 bytes are
        fetched in case it grew)."""
        key = self.key(relative)
        try:
            if limit is None:
                return bytes(self.fs.cat_file(key))
            size = int(self.fs.size(key))
            if size > limit:
                raise bounded.too_large(self.url(relative), size, limit, what)
            data = bytes(self.fs.cat_file(key, start=0, end=limit + 1))
            if len(data) > limit:
                raise bounded.too_large(self.url(relative), len(data), limit, what)
            return data
        except FileNotFoundError as exc:
            raise LakeError(self.url(relative), "does not exist") from exc
        except OSError as exc:
            raise self.error(relative, "cannot be read", exc) from exc

    def _list(self, relative_dir: str) -> list[str]:
        """Relative names of every object under a folder (no caching: others write too)."""
        self.fs.invalidate_cache()
        prefix = f"{self.base}/{relative_dir}".rstrip("/")
        try:
            keys = self.fs.find(prefix)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise self.error(relative_dir, "cannot be listed", exc) from exc
        return sorted(str(k)[len(self.base) + 1 :] for k in keys)

    def manifest_runs(self) -> list[str]:
        names = self._list(MANIFEST_DIR)  # direct children only: `_manifest/<run>.json`
        stems = [n.split("/", 1)[1] for n in names if n.endswith(".json") and n.count("/") == 1]
        return sorted(s[: -len(".json")] for s in stems if not s.startswith("."))

    def catalog_stamp(self) -> object:
        """What changes when the catalog is replaced: its ETag (None when there is none)."""
        try:
            self.fs.invalidate_cache()
            return self.fs.info(self.key(self.catalog_name)).get("ETag")
        except OSError:
            return None

    def scan(
        self, table: str, listed: list[tuple[str, dict[str, Any]]], names: list[str]
    ) -> pl.LazyFrame:
        """One LazyFrame over exactly the listed objects: a pyarrow dataset read through the
        lake's fsspec filesystem, partition values from the manifests."""
        import polars as pl
        import pyarrow as pa
        import pyarrow.dataset as ds

        partitions = schema.TABLE_PARTITIONS[table]
        types = schema.polars_types(table)
        if not listed:
            return pl.LazyFrame(schema={c: types[c] for c in (*partitions, *names)})
        fields = [pa.field(c, schema.PARTITION_TYPES[c]) for c in partitions]
        dataset = ds.dataset(
            [self.key(name) for name, _ in listed],
            schema=pa.schema([*schema.TABLE_SCHEMAS[table], *fields]),
            format="parquet",
            filesystem=self.fs,
            partitioning=ds.partitioning(pa.schema(fields), flavor="hive"),
            partition_base_dir=f"{self.base}/{table}",
        )
        return pl.scan_pyarrow_dataset(dataset).select(*partitions, *names)

    def read_user_views(self, limit: int) -> list[ViewFile]:
        """The user's `views/*.sql`, by name, each at most `limit` bytes of it."""
        names = [n for n in self._list(USER_VIEWS_DIR) if n.endswith(".sql") and n.count("/") == 1]
        files = []
        for name in names:
            if not name.startswith(f"{USER_VIEWS_DIR}/"):
                continue
            try:
                content, problem = self.read_head(name, limit), None
            except LakeError as exc:  # `does not exist`, `cannot be read (...)`
                content, problem = b"", f"it {exc.problem}"
            files.append(ViewFile(self.url(name), PurePosixPath(name).stem, content, problem))
        return files

    def read_head(self, relative: str, limit: int) -> bytes:
        """At most the first `limit` bytes of an object: an object that is larger (or grew
        since it was listed) costs no more memory than that."""
        try:
            return bytes(self.fs.cat_file(self.key(relative), start=0, end=limit))
        except FileNotFoundError as exc:
            raise LakeError(self.url(relative), "does not exist") from exc
        except OSError as exc:
            raise self.error(relative, "cannot be read", exc) from exc

    def size(self, relative: str) -> int:
        return int(self.fs.size(self.key(relative)))

    def is_lake(self) -> bool:
        """A prefix with a manifest, a writer lock or a catalog (all its runs dropped)."""
        return (
            bool(self.manifest_runs())
            or self.exists(f"{MANIFEST_DIR}/{LOCK_FILE}")
            or self.exists(self.catalog_name)
        )

    def holds_folder(self, name: str) -> bool:
        return bool(self._list(name)[:1])

    def require(self) -> ObjectStore:
        """This lake, or a one-line error saying why the prefix is not one."""
        if not self.is_lake():
            raise LakeError(
                self.location,
                f"is not a lake: it has no `{MANIFEST_DIR}/` and no `{self.catalog_name}`;"
                " run `tokenlake extract` first",
            )
        return self

    def check_writable(self) -> None:
        """Refuse a prefix that holds folders a lake writes but is not a lake."""
        if self.is_lake():
            return
        for name in TOP_LEVEL_DIRS[:-1]:  # the manifest folder: is_lake said there is none
            if self._list(name)[:1]:
                raise LakeError(
                    self.location,
                    f"is not a lake but holds `{name}`, where the lake would write;"
                    " choose another --lake",
                )

    def create(self) -> None:
        """Nothing to make: an object store has no folders."""

    # -- writing ---------------------------------------------------------------------------

    def put_bytes(self, relative: str, data: bytes, *, durable: bool = False, problem: str) -> None:
        """One PUT: the object is replaced whole (the manifest's commit)."""
        del durable  # a completed PUT is durable
        self.check_lease()
        try:
            self.fs.pipe_file(self.key(relative), data)
        except OSError as exc:
            raise self.error(relative, problem, exc) from exc

    def write_with(
        self, relative: str, write: FileWriter, *, problem: str = "cannot be written"
    ) -> None:
        """Write an object under a fresh name: it appears when its upload completes."""
        try:
            write(self.key(relative), self.fs)
        except OSError as exc:
            self.delete([relative])
            raise self.error(relative, problem, exc) from exc

    def publish_built(self, relative: str, build: Callable[[Path], None]) -> None:
        """Build a file in a local temporary folder, then upload it in one PUT."""
        with tempfile.TemporaryDirectory(prefix="tokenlake-") as folder:
            local = Path(folder) / Path(relative).name
            build(local)
            self.check_lease()
            try:
                self.fs.put_file(str(local), self.key(relative))
            except OSError as exc:
                raise self.error(relative, "cannot be written", exc) from exc

    def delete(self, relatives: Iterable[str]) -> None:
        for relative in relatives:
            try:
                self.fs.rm_file(self.key(relative))
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.warning("%s", self.error(relative, "cannot be deleted", exc))

    def check_links(self, run: str) -> None:
        """Nothing to check: an object store has no symbolic links."""

    def delete_unlisted(
        self, record: RunListing, tables: Sequence[str] = schema.LAKE_TABLES
    ) -> int:
        """Delete the run's objects, named by this scheme, that its manifest does not list."""
        listed = {name for table in schema.LAKE_TABLES for name in record.files(table)}
        doomed = [
            name
            for table in tables
            for name in self._list(f"{table_dir(table)}/{schema.RUN}={record.run}")
            if name not in listed and is_data_file(name.rsplit("/", 1)[-1])
        ]
        self.delete(doomed)
        if doomed:
            log.info("deleted %d objects of run %s that no manifest lists", len(doomed), record.run)
        return len(doomed)

    def made_files(self) -> list[str]:
        """Every object of a run that the naming scheme made, listed or not: data files in
        each table's `run=<name>` folders and their `rollout_id=<n>` folders."""
        found = []
        for table in schema.LAKE_TABLES:
            folder = table_dir(table)
            for name in self._list(folder):
                parts = name[len(folder) + 1 :].split("/")
                in_partition = len(parts) == 2 or (
                    len(parts) == 3 and is_partition_folder(parts[1])
                )
                if in_partition and is_run_folder(parts[0]) and is_data_file(parts[-1]):
                    found.append(name)
        return found

    def delete_stale_temporaries(self) -> int:
        """None are made: objects are written under their final, fresh names. (An upload
        cut short leaves an incomplete multipart upload, which the store's lifecycle rule
        `AbortIncompleteMultipartUpload` removes: docs/scale.md.)"""
        return 0

    def error(self, relative: str, problem: str, exc: BaseException) -> LakeError:
        """The LakeError of a failed operation on one object (its URL, the store's reason)."""
        text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        return LakeError(f"{self.location}/{relative}", f"{problem} ({text[:300]})")

    # -- the writer lock -------------------------------------------------------------------

    @contextmanager
    def lock(self) -> Iterator[None]:
        """One writer per lake at a time, by conditional PUT; a second one fails at once."""
        from tokenlake.store.object_lock import held_lock

        with held_lock(self, f"{MANIFEST_DIR}/{LOCK_FILE}"):
            yield

    def writer_busy(self) -> bool:
        """Whether another writer's lease on the lake's lock runs now."""
        from tokenlake.store.object_lock import lease_running

        return lease_running(self, f"{MANIFEST_DIR}/{LOCK_FILE}")

    def check_lease(self) -> None:
        """Raise if this process's writer lock on the lake was lost (its lease ran out)."""
        from tokenlake.store.object_lock import check_held

        check_held(self.location)


# Filesystems by (URL's protocol and bucket, credential environment): fsspec caches instances
# by their arguments only, so a changed AWS_ENDPOINT_URL or key (a notebook, a test) would
# otherwise keep talking to the old endpoint.
_FILESYSTEMS: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {}
_CREDENTIAL_PREFIXES = ("AWS_", "GOOGLE_", "GCS", "AZURE_", "FSSPEC_")


def _filesystem(url: str, shared: bool = True) -> tuple[Any, str]:
    import fsspec

    if not shared:
        filesystem, base = fsspec.core.url_to_fs(url, skip_instance_cache=True)
        return filesystem, str(base)
    environment = tuple(
        sorted((k, v) for k, v in os.environ.items() if k.startswith(_CREDENTIAL_PREFIXES))
    )
    protocol, _, rest = url.partition("://")
    key = (f"{protocol}://{rest.split('/', 1)[0]}", environment)
    filesystem = _FILESYSTEMS.get(key)
    if filesystem is None:
        filesystem, base = fsspec.core.url_to_fs(url, skip_instance_cache=True)
        _FILESYSTEMS[key] = filesystem
        return filesystem, str(base)
    return filesystem, str(filesystem._strip_protocol(url))
