"""What every store of a lake offers: the `Store` protocol, and the types it speaks in.

A store turns the names of pipeline/tokenlake/layout.py into storage: `LocalStore`
(pipeline/tokenlake/store/local.py, a directory) and `ObjectStore` (store/object.py, an
object-store prefix, committed without rename). `tokenlake.store.store_at` resolves a location
into one, once, at the edge; everything below takes the store.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tokenlake import schema

if TYPE_CHECKING:
    import polars as pl

# A writer of one file: given where to write and the pyarrow-usable filesystem (None: local).
FileWriter = Callable[[str, Any], None]


class RunListing(Protocol):
    """What a sweep needs of a run's manifest: its name and the files it lists."""

    @property
    def run(self) -> str: ...

    def files(self, table: str) -> list[str]: ...


@dataclass(frozen=True)
class ViewFile:
    """One `views/*.sql` of a lake as read: at most the limit asked for of its bytes, or why
    it could not be read."""

    shown: str  # how messages name it (its path or URL)
    stem: str
    content: bytes
    problem: str | None = None


class Store(Protocol):
    """A lake's storage: its files by the layout's relative names, its lock and its sweeps."""

    @property
    def location(self) -> Path | str:
        """Where the lake is, as messages show it and as `store_at` takes it back."""

    @property
    def filesystem(self) -> Any:
        """The pyarrow-usable filesystem of `url` names (None: the local one)."""

    def reading_filesystem(self) -> Any:
        """The filesystem DuckDB reads the lake's files through while a catalog is built
        (None: the local one)."""

    @property
    def catalog_name(self) -> str:
        """The catalog's name relative to the lake."""

    @property
    def local_catalog(self) -> Path | None:
        """The catalog's path when the lake is a local directory; None on an object store."""

    def url(self, relative: str) -> str:
        """The name DuckDB and pyarrow read a lake file by."""

    def label(self, relative: str) -> str:
        """How messages name a lake file."""

    def arrow_source(self, relative: str) -> tuple[str, Any]:
        """Where pyarrow reads a lake file: (path, filesystem)."""

    def exists(self, relative: str) -> bool: ...

    def read_bytes(self, relative: str, limit: int | None = None, what: str = "a file") -> bytes:
        """A lake file's bytes; with `limit`, at most that many of a regular file (else a
        BoundedReadError naming `what`)."""

    def put_bytes(self, relative: str, data: bytes, *, durable: bool = False, problem: str) -> None:
        """Write a whole small file (a manifest) in one atomic step."""

    def write_with(
        self, relative: str, write: FileWriter, *, problem: str = "cannot be written"
    ) -> None:
        """Write a file through `write(where, filesystem)`: never half a file under its name."""

    def publish_built(self, relative: str, build: Callable[[Path], None]) -> None:
        """Build a file locally (`build(path)`) and put it in place."""

    def delete(self, relatives: Iterable[str]) -> None:
        """Delete files the naming scheme made (uncommitted or superseded)."""

    def catalog_stamp(self) -> object:
        """What changes when the catalog is replaced (None when there is none)."""

    def scan(
        self, table: str, listed: list[tuple[str, dict[str, Any]]], names: list[str]
    ) -> pl.LazyFrame:
        """One polars LazyFrame over exactly the listed files ((name, partition values), in
        order), partition columns first, then `names`, typed as the catalog types them."""

    def manifest_runs(self) -> list[str]:
        """The runs that have a manifest, by name."""

    def read_user_views(self, limit: int) -> list[ViewFile]:
        """The user's `views/*.sql`, by name, each read once (at most `limit` bytes)."""

    def create(self) -> None: ...

    def is_lake(self) -> bool: ...

    def holds_folder(self, name: str) -> bool:
        """Whether the location holds a folder (an object prefix) of this name."""

    def require(self) -> Store:
        """This store, or a one-line LakeError saying why the location is not a lake (a dump is
        named as one by `tokenlake.store.require_lake`)."""

    def check_writable(self) -> None:
        """Refuse a lake location that is a file or holds folders not its own (overlap with
        a dump: `orchestrate.extract.check_apart`)."""

    def check_links(self, run: str) -> None:
        """Refuse the run if any of its folders or files is a symbolic link (local lakes)."""

    def check_lease(self) -> None:
        """Raise if this writer no longer holds the lake's lock (object stores' leases)."""

    def lock(self) -> AbstractContextManager[None]:
        """One writer per lake at a time; a second fails at once with a clear error."""

    def writer_busy(self) -> bool:
        """Whether another command holds the lake's writer lock now (an extraction, a tag, a
        drop): what a reader just read may be that command's work in flight."""

    def delete_unlisted(
        self, record: RunListing, tables: Sequence[str] = schema.LAKE_TABLES
    ) -> int:
        """Delete the run's files the naming scheme made that its manifest does not list (of
        `tables` only: `tag` writes only `runs` files, and need not list the others)."""

    def made_files(self) -> list[str]:
        """Every file of every run that the naming scheme made, whether a manifest lists it
        or not (leftovers of an interrupted extraction are among them)."""

    def delete_stale_temporaries(self) -> int:
        """Delete tokenlake's temporaries whose writer is gone."""
