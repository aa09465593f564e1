"""Dumps on an object store (`s3://bucket/dump`, any fsspec URL): the one owner of them.

Discovery, planning and fingerprints work on local paths (pipeline/tokenlake/read/dump.py,
`manifest.fingerprint`: name, size, mtime by stat). So `discover(url)` first brings the dump's
local stage up to date (pipeline/tokenlake/read/remote/remote_stage.py: sparse placeholders of the `.pt` and
trajectory objects, whole copies of the tokenizer and dashboard files), discovers the stage,
and gives each step the URL and its objects (`StepFiles.remote`).

A step's objects are downloaded just before it is read (`hydrated`, in the worker process or
Ray task that reads it) into a private folder next to the stage, and deleted after: disk use is
bounded by the steps in flight, and a placeholder is never parsed (another process staging or
extracting the same URL never swaps a file under a reader). A Ray task on another node
downloads into its own cache: it needs only the URL.

The run's `source_dir` is the URL, so any machine extracting it makes the same run;
`local_root` maps it back to a stage, `shown_path`/`urls_in`/`as_urls` name files by URL.
Nothing is ever written into the dump. Credentials and endpoint come from the environment
(`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, ...).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenlake.errors import DumpNotFoundError, PipelineError
from tokenlake.read.dump import Dump, RemoteFiles, StepFiles
from tokenlake.read.remote.remote_stage import (
    CACHE_VARIABLE,
    DumpLocation,
    RemoteObjectError,
    download,
    dump_name,
    filesystem,
    is_remote,
    private_folders,
    stage,
    stage_root,
    temporary_name,
)
from tokenlake.store.private_cache import PRIVATE_MODE, make_folders

if TYPE_CHECKING:
    from tokenlake.read import formats

__all__ = [
    "CACHE_VARIABLE",
    "RemoteObjectError",
    "as_urls",
    "OBJECT_STORE_SCHEMES",
    "discover",
    "dump_name",
    "hydrated",
    "is_object_store_url",
    "is_remote",
    "remote_dump_mark",
    "local_root",
    "shown_path",
    "stage",
    "stage_root",
    "urls_in",
]


def local_root(source_dir: str, *, refresh: bool = False) -> Path:
    """The local directory holding a run's `source_dir`: the directory itself, or the stage
    of a URL (listed again first with `refresh`: sources that vanished or changed show)."""
    if not is_remote(source_dir):
        return Path(source_dir)
    return stage(source_dir) if refresh else stage_root(source_dir)


def shown_path(source_dir: str, path: Path) -> str:
    """How a file of a run's dump is named to the user: its URL when the dump is remote."""
    if not is_remote(source_dir):
        return str(path)
    try:
        relative = path.relative_to(stage_root(source_dir)).as_posix()
    except ValueError:
        return str(path)
    return f"{source_dir.rstrip('/')}/{relative}"


def urls_in(source_dir: str, text: str) -> str:
    """A message about a run's dump with its stage's paths named by their URLs."""
    if not is_remote(source_dir):
        return text
    return text.replace(f"{stage_root(source_dir)}/", f"{source_dir.rstrip('/')}/")


def discover(location: DumpLocation, forced: str | None = None) -> Dump:
    """`formats.discover` for a directory or a URL (staged first; its steps carry the URL)."""
    # The format readers are imported when a dump is read: `verify` checks a run's sources
    # through this module's paths alone, and they cost it ~0.1 s of CPU.
    from tokenlake.read import formats

    if not is_remote(location):
        return formats.discover(Path(location), forced)
    url = str(location).rstrip("/")
    root = stage(url)
    try:
        listing = formats.discover(root, forced, _remote_loader(url, root))
    except DumpNotFoundError as exc:
        raise DumpNotFoundError(url, exc.reason) from None
    steps = tuple(replace(s, remote=_remote_files(url, s)) for s in listing.steps)
    ignored = tuple((shown_path(url, Path(p)), why) for p, why in listing.ignored)
    return replace(listing, steps=steps, ignored=ignored, url=url)


def _remote_loader(url: str, root: Path) -> formats.Loader:
    """Loads a staged `.pt` file of the dump by downloading its object first (a placeholder
    is never parsed): format detection's one look inside a rollout file."""

    def load(path: Path) -> Any:
        from tokenlake.read import pt

        info = path.stat()
        name = path.relative_to(root).as_posix()
        remote = RemoteFiles(url, ((name, info.st_size, info.st_mtime_ns),))
        with hydrated(StepFiles(0, True, path, root=root, remote=remote)) as read:
            return pt.load(read.rollout_file)

    return load


# Schemes that name one kind of store (Hadoop's `s3a://` and `s3n://` are S3 buckets too).
_STORE_FAMILIES = {"s3a": "s3", "s3n": "s3", "gcs": "gs", "abfs": "az", "abfss": "az"}
# The object stores a manifest's `source_dir` may name for `tokenlake verify` to list (with
# the user's credentials); it contacts no other kind of URL (http://, ftp://, ...).
OBJECT_STORE_SCHEMES = frozenset({"s3", "gs", "az", *_STORE_FAMILIES})


def store_location(url: str) -> tuple[str, str, tuple[str, ...]]:
    """(store family, bucket, key segments) of an object-store URL, for comparing locations:
    `s3a://b//run/` and `s3://b/run` are one place.

    Examples:
        >>> store_location("s3a://b//run/lake/")
        ('s3', 'b', ('run', 'lake'))
    """
    scheme, _, rest = url.partition("://")
    bucket, _, key = rest.partition("/")
    family = scheme.lower()
    return (
        _STORE_FAMILIES.get(family, family),
        bucket.lower(),
        tuple(part for part in key.split("/") if part not in ("", ".")),
    )


def is_object_store_url(location: str) -> bool:
    """Whether a location is a URL of an object store tokenlake lists (`s3://`, `gs://`, ...).

    Examples:
        >>> is_object_store_url("s3a://b/run"), is_object_store_url("http://127.0.0.1/x")
        (True, False)
    """
    return is_remote(location) and location.partition("://")[0].lower() in OBJECT_STORE_SCHEMES


def remote_dump_mark(url: str) -> str | None:
    """`formats.dump_mark` of an object-store prefix, from one listing of its top level (None
    as well when it holds nothing or cannot be listed)."""
    try:
        fs, base = filesystem(url)
        entries = fs.ls(base, detail=True, refresh=True)
    except (OSError, PipelineError):  # cannot be listed: nothing says it is a dump
        return None
    from tokenlake.read import formats

    return formats.dump_mark(
        (str(e["name"]).rstrip("/").rsplit("/", 1)[-1], e.get("type") == "directory")
        for e in entries
    )


def _remote_files(url: str, files: StepFiles) -> RemoteFiles:
    """The step's objects as the stage's placeholders say (as `manifest.fingerprint` sees)."""
    assert files.root is not None
    paths = files.paths
    trajectory = files.trajectory_file
    if trajectory is not None:
        paths.append(trajectory)
    objects = []
    for path in paths:
        info = path.stat()
        objects.append((path.relative_to(files.root).as_posix(), info.st_size, info.st_mtime_ns))
    return RemoteFiles(url, tuple(objects))


@contextmanager
def hydrated(files: StepFiles) -> Iterator[StepFiles]:
    """The step's files to read: for a remote step, its objects downloaded into a private
    folder (created wherever this runs: a Ray node needs only the URL), deleted afterwards."""
    remote = files.remote
    if remote is None:
        yield files
        return
    private = private_folders(stage_root(remote.url).parent) / temporary_name()
    try:
        fs, base = filesystem(remote.url)
        os.mkdir(private, PRIVATE_MODE)  # a new name: never one planted before
        for name, size, mtime_ns in remote.objects:
            make_folders(private, Path(name).parent)
            try:
                download(fs, f"{base}/{name}", private / name, size, f"{remote.url}/{name}")
            except RemoteObjectError as exc:
                assert files.root is not None
                raise RemoteObjectError(exc.url, exc.problem, files.root / name) from None
            # as listed: the reader judges a young file as one still being written
            os.utime(private / name, ns=(mtime_ns, mtime_ns))
        yield _moved(files, private)
    finally:
        shutil.rmtree(private, ignore_errors=True)


def _moved(files: StepFiles, private: Path) -> StepFiles:
    """The same step, its files under `private` (same relative names, so messages read the
    same once `as_urls` names the URL)."""
    assert files.root is not None

    def moved(path: Path) -> Path:
        return private / path.relative_to(files.root)  # type: ignore[arg-type]

    return replace(
        files,
        rollout_file=moved(files.rollout_file),
        train_files=tuple((rank, moved(path)) for rank, path in files.train_files),
        root=private,
        remote=None,
        unread=tuple(moved(path) for path in files.unread),
        duplicates=tuple(
            replace(duplicate, path=moved(duplicate.path), first=moved(duplicate.first))
            for duplicate in files.duplicates
        ),
    )


def as_urls(files: StepFiles, read: StepFiles, text: str) -> str:
    """A step's message with its local paths (stage, private folder) named by their URLs."""
    if files.remote is None:
        return text
    for root in {read.root, files.root}:
        if root is not None:
            text = text.replace(f"{root}/", f"{files.remote.url}/")
    return text
