"""The local stage of a dump on an object store (used through pipeline/tokenlake/read/remote/remote_dump.py).

`stage(url)` lists every object under the prefix once and mirrors what tokenlake reads into
`$TOKENLAKE_CACHE/dumps/<hash>/<name>/` (default `~/.cache/tokenlake`), a folder of ours,
never inside the lake or the dump:

- every object under `rollout_data/`, `train_data/`, `trajectory/` and prime-rl's
  `token_exports/` (and NeMo-RL's `train_data_step{N}.jsonl` / `val_data_step{N}.jsonl` at the
  top) becomes a *sparse placeholder*: an empty file truncated to the object's size, its mtime the object's
  LastModified to the second with a digest of its ETag below the second (`version_stamp_ns`);
  it costs no disk and is never read (a step's objects are downloaded apart,
  see `remote_dump.hydrated`);
- the side files the driver reads, `tokenizer/tokenizer.json`, `dashboard/meta.json` and the
  metrics streams (`dashboard/metrics.jsonl`, `dashboard/metrics/*.jsonl`, prime-rl's
  `metrics.jsonl` at the top), are downloaded whole (again only when their size or
  LastModified changed, as `.tokenlake-remote.json` in the stage records); every other object
  under `tokenizer/` and `dashboard/` (the dashboard viewer's Parquet caches, telemetry
  streams: GBs in a long run) is never read, so it is a placeholder too;
- whatever is no longer under the prefix is removed from the stage.

Every file appears by rename (temporary names `.tokenlake-<pid>-<hex8>.tmp`), so two processes
staging one URL never see half a file. Only LIST and GET on the prefix.

The cache root, `dumps/`, `dumps/<hash>/` and the stage are folders only the user can write
(pipeline/tokenlake/store/private_cache.py); one that is not is an error and is not touched. A
stage holding an entry tokenlake did not make (a link, a FIFO, another user's file, whatever
its recorded size, mtime or `.tokenlake-remote.json` claim) is not trusted: it is deleted and
staged again from the listing, with a warning.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import stat
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tokenlake import bounded
from tokenlake.errors import BoundedReadError, DumpNotFoundError, PipelineError
from tokenlake.layout import is_url, temporary_path
from tokenlake.processes import process_alive
from tokenlake.read.dump import (
    DASHBOARD_DIR,
    ROLLOUT_DIR,
    TOKENIZER_DIR,
    TOKENIZER_FILE,
    TRAIN_DIR,
    TRAJECTORY_DIR,
)
from tokenlake.read.nemo_rl import is_log_name
from tokenlake.read.prime_rl import EXPORT_DIR, METRICS_FILE
from tokenlake.store.private_cache import (
    CACHE_VARIABLE,
    cache_root,
    foreign_entry,
    make_folders,
    private_folder,
)

log = logging.getLogger(__name__)

STATE_FILE = ".tokenlake-remote.json"  # in the stage root: the URL and what was staged
MAX_STATE_BYTES = 64 << 20  # ~100 bytes per staged object
# read per step, downloaded then
PLACEHOLDER_DIRS = (ROLLOUT_DIR, TRAIN_DIR, TRAJECTORY_DIR, EXPORT_DIR)
COPIED_DIRS = (TOKENIZER_DIR, DASHBOARD_DIR)  # read by the driver: downloaded whole
_PRIVATE_PREFIX = ".tokenlake-"  # temporaries and private download folders
_TEMPORARY = re.compile(r"^\.tokenlake-([0-9]+)-[0-9a-f]{8}\.tmp\Z")  # as `temporary_path` names
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MICROSECOND = datetime.resolution  # timedelta(microseconds=1)
_SECOND_NS = 1_000_000_000

DumpLocation = Path | str


class RemoteObjectError(PipelineError):
    """A step's object cannot be downloaded, or changed between listing and download."""

    still_writing = True  # the message says what to do (step.input_error_text adds nothing)

    def __init__(self, url: str, problem: str, path: Path | str | None = None) -> None:
        self.url = url
        self.path = str(path or url)  # the step's local name for it: which rank is at fault
        self.problem = problem
        super().__init__(f"`{url}` {problem}")


def is_remote(location: DumpLocation) -> bool:
    """Whether a dump location is an object-store URL (`file://` and paths are local)."""
    return is_url(location)


def dump_name(location: DumpLocation) -> str:
    """The default run name: the dump's last path component (`s3://b/runs/qwen` → `qwen`).

    Examples:
        >>> dump_name("s3://bucket/runs/qwen/"), dump_name("s3://bucket")
        ('qwen', 'bucket')
    """
    if not is_remote(location):
        return Path(location).resolve().name
    return str(location).split("://", 1)[1].rstrip("/").rsplit("/", 1)[-1]


def stage_root(url: str) -> Path:
    """The stage of a dump URL: one folder per URL, named after its last component (so the
    default run name is the same as from the URL)."""
    url = url.rstrip("/")
    digest = hashlib.blake2b(url.encode("utf-8", "surrogateescape"), digest_size=8).hexdigest()
    name = dump_name(url)
    return cache_root() / "dumps" / digest / (name if name not in ("", ".", "..") else "dump")


def filesystem(url: str) -> tuple[Any, str]:
    """(fsspec filesystem, base key) of a dump URL; a missing s3fs names its extra."""
    import fsspec

    from tokenlake import extras

    if url.split("://", 1)[0].lower() in ("s3", "s3a"):
        extras.require("s3fs", "s3", f"A dump on S3 (`{url}`)")
    try:
        # A filesystem of its own: fsspec's shared instance keeps its listings (a later round
        # of --follow must see new objects) and the endpoint it was first made with.
        fs, base = fsspec.core.url_to_fs(url, skip_instance_cache=True)
    except (ImportError, ValueError) as exc:
        raise DumpNotFoundError(url, f"cannot be opened ({exc})") from exc
    return fs, str(base).rstrip("/")


def stage(url: str) -> Path:
    """List every object under the prefix once and bring the stage up to date; returns it."""
    url = url.rstrip("/")
    fs, base = filesystem(url)
    listed = _listing(fs, base, url)
    if not listed:
        raise DumpNotFoundError(url, "holds no objects (is the prefix right?)")
    root = stage_root(url)
    try:
        private_folders(root)
        _sweep_private(root.parent)
        _rebuild_if_foreign(root, url)
        staged = _update(fs, base, url, root, listed)
        _remove_unlisted(root, set(staged))
        _save_state(root, url, staged)
    except OSError as exc:  # the cache is read-only or full
        raise DumpNotFoundError(
            url,
            f"cannot be staged in `{root}` ({exc.strerror or exc}); set {CACHE_VARIABLE} to a"
            " writable folder",
        ) from None
    return root


def private_folders(folder: Path) -> Path:
    """The cache root and its folders down to `folder` (a stage, or its `dumps/<hash>/`),
    each one only the user can write (created so, or a CacheError); returns `folder`."""
    top = cache_root()
    private_folder(top, root=True)
    make = top
    for name in folder.relative_to(top).parts:
        make = private_folder(make / name)
    return folder


def _rebuild_if_foreign(root: Path, url: str) -> None:
    """A stage holding anything tokenlake did not make is emptied: staged again in full."""
    found = foreign_entry(root)
    if found is None:
        return
    name, what = found
    log.warning(
        "The stage `%s` of `%s` held `%s` (%s), which tokenlake did not make; staging it again",
        root,
        url,
        name,
        what,
    )
    shutil.rmtree(root)  # a checked folder of ours; rmtree never follows a link inside it
    private_folder(root)


def _update(
    fs: Any, base: str, url: str, root: Path, listed: dict[str, tuple[int, int]]
) -> dict[str, list[int]]:
    """Stage what changed since the last listing; returns what the stage now holds."""
    known = _load_state(root, url)
    staged: dict[str, list[int]] = {}
    for name, (size, mtime_ns) in sorted(listed.items()):
        target = root / name
        try:
            if known.get(name) != [size, mtime_ns] or not _same(target, size, mtime_ns):
                make_folders(root, Path(name).parent)
                placeholder = (
                    _read_per_step(name) or not _read_whole(name) or _too_large(name, size)
                )
                _stage_one(fs, f"{base}/{name}", target, size, mtime_ns, placeholder)
            staged[name] = [size, mtime_ns]
        except (OSError, RemoteObjectError) as exc:  # e.g. a name both a file and a folder
            log.warning("`%s/%s` is not staged: %s", url, name, exc)
    return staged


def _read_whole(name: str) -> bool:
    """A side file the driver reads (`tokenizer.json`, the dashboard's `meta.json` and metrics
    streams, prime-rl's metrics); the others under `tokenizer/` and `dashboard/` are never read.

    Examples:
        >>> [_read_whole(n) for n in ("dashboard/metrics/20260101_00.jsonl", "dashboard/cache/a")]
        [True, False]
    """
    from tokenlake.read import dashboard

    parts = name.split("/")
    return (
        name in (f"{TOKENIZER_DIR}/{TOKENIZER_FILE}", METRICS_FILE)
        or name
        in (f"{DASHBOARD_DIR}/{dashboard.META_FILE}", f"{DASHBOARD_DIR}/{dashboard.METRICS_FILE}")
        or (
            len(parts) == 3
            and parts[:2] == [DASHBOARD_DIR, dashboard.METRICS_PARTITION_DIR]
            and parts[2].endswith(".jsonl")
        )
    )


def _too_large(name: str, size: int) -> bool:
    """A copied file larger than its reader's bound: staged as a placeholder (never
    downloaded), which the reader refuses by its size with the usual line."""
    from tokenlake.read import dashboard, vocab

    limits = {
        f"{TOKENIZER_DIR}/{TOKENIZER_FILE}": vocab.MAX_TOKENIZER_BYTES,
        f"{DASHBOARD_DIR}/{dashboard.META_FILE}": dashboard.MAX_META_BYTES,
    }
    return size > limits.get(name, size)


def _listing(fs: Any, base: str, url: str) -> dict[str, tuple[int, int]]:
    """Name (relative to the prefix) → (size, mtime_ns) of the objects tokenlake reads."""
    fs.invalidate_cache()  # a live run changes: never trust a cached listing
    try:
        found = fs.find(base, detail=True)
    except FileNotFoundError:
        return {}
    except Exception as exc:  # noqa: BLE001 - s3fs/botocore raise more than OSError
        raise DumpNotFoundError(url, f"cannot be listed ({type(exc).__name__}: {exc})") from None
    listed = {}
    for key, info in found.items():
        name = str(key)[len(base) + 1 :] if str(key).startswith(f"{base}/") else ""
        if _wanted(name) and info.get("type", "file") == "file":
            listed[name] = (int(info.get("size") or 0), version_stamp_ns(info))
    return listed


def _wanted(name: str) -> bool:
    """An object under a folder tokenlake reads, with a name safe to mirror locally.

    Examples:
        >>> _wanted("rollout_data/1.pt"), _wanted("rollout_data/../../x"), _wanted("a/b")
        (True, False, False)
    """
    parts = name.split("/")
    return (
        (
            len(parts) >= 2
            and parts[0] in (*PLACEHOLDER_DIRS, *COPIED_DIRS)
            or is_log_name(name)
            or name == METRICS_FILE  # prime-rl's
        )
        and all(p not in ("", ".", "..") and "\\" not in p and "\x00" not in p for p in parts)
        and not parts[-1].startswith(_PRIVATE_PREFIX)
    )


def _read_per_step(name: str) -> bool:
    """A file a step reads (a placeholder until then): `.pt` files, trajectories, and
    NeMo-RL's logged batches at the top of the prefix."""
    return name.split("/", 1)[0] in PLACEHOLDER_DIRS or is_log_name(name)


def version_stamp_ns(info: dict[str, Any]) -> int:
    """The staged file's mtime: the object's LastModified to the second, and below the second
    a digest of its ETag when the store gives one.

    S3 lists LastModified to the second, so an object rewritten within the second it was
    listed in would keep its stamp and pass as unchanged; its ETag (the content's MD5 for a
    plain upload) changes with the bytes. The fingerprint (name, size, mtime) then sees it.

    Examples:
        >>> listed = {"LastModified": datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)}
        >>> first = version_stamp_ns({**listed, "ETag": '"a"'})
        >>> second = version_stamp_ns({**listed, "ETag": '"b"'})
        >>> first // 10**9 == second // 10**9 == version_stamp_ns(listed) // 10**9, first != second
        (True, True)
    """
    modified = _mtime_ns(info)
    tag = info.get("ETag") or info.get("etag")
    if not tag:
        return modified
    digest = hashlib.blake2b(str(tag).encode(), digest_size=8).digest()
    return modified - modified % _SECOND_NS + int.from_bytes(digest, "big") % _SECOND_NS


def _mtime_ns(info: dict[str, Any]) -> int:
    """LastModified (S3), else `mtime`/`created` (other fsspec stores), in ns since 1970."""
    stamp = info.get("LastModified") or info.get("mtime") or info.get("created") or 0
    if isinstance(stamp, datetime):
        aware = stamp if stamp.tzinfo else stamp.replace(tzinfo=timezone.utc)
        return (aware - _EPOCH) // _MICROSECOND * 1000
    try:
        return int(float(stamp) * 1_000_000_000)
    except (TypeError, ValueError):
        return 0


def _same(path: Path, size: int, mtime_ns: int) -> bool:
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and (info.st_size, info.st_mtime_ns) == (size, mtime_ns)


def _stage_one(
    fs: Any, key: str, target: Path, size: int, mtime_ns: int, placeholder: bool
) -> None:
    """A placeholder (`.pt`, trajectories) or a whole copy (tokenizer, dashboard)."""
    temporary = target.parent / temporary_name()
    try:
        if placeholder:
            with open(temporary, "wb", opener=_new_file) as handle:
                handle.truncate(size)  # sparse: no block is allocated
        else:
            download(fs, key, temporary, size)
        os.utime(temporary, ns=(mtime_ns, mtime_ns))
        os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)


def _new_file(path: str, flags: int) -> int:
    """A file that did not exist, never opened through a link."""
    return os.open(path, flags | os.O_EXCL | os.O_NOFOLLOW, 0o600)


def _remove_unlisted(root: Path, listed: set[str]) -> None:
    """The stage is ours: anything in it that is not (or no longer) listed goes."""
    for folder, _, names in os.walk(root):  # never into a link (and none is left by now)
        for name in names:
            path = Path(folder) / name
            relative = path.relative_to(root).as_posix()
            if relative != STATE_FILE and relative not in listed and not _in_use(name):
                path.unlink(missing_ok=True)


def _load_state(root: Path, url: str) -> dict[str, list[int]]:
    try:
        raw = bounded.read_file(root / STATE_FILE, MAX_STATE_BYTES, "a stage state", follow=False)
        state = bounded.loads(raw, 8)
        files = state["files"] if state.get("url") == url else {}
        return {str(k): list(v) for k, v in files.items()}
    except (BoundedReadError, ValueError, TypeError, KeyError, AttributeError):
        return {}  # a missing or damaged state only costs downloads


def _save_state(root: Path, url: str, staged: dict[str, list[int]]) -> None:
    temporary = root / temporary_name()
    temporary.write_text(json.dumps({"url": url, "files": staged}, sort_keys=True))
    os.replace(temporary, root / STATE_FILE)


def temporary_name() -> str:
    """The lake's temporary-name scheme (`.tokenlake-<pid>-<hex8>.tmp`): a name no staged
    object has (`_wanted` refuses them) and `_in_use` recognises."""
    return temporary_path(Path()).name


def _in_use(name: str) -> bool:
    """A temporary name of a live process (another extraction staging the same URL).

    Examples:
        >>> _in_use(temporary_name()), _in_use("0.pt")
        (True, False)
    """
    match = _TEMPORARY.match(name)
    return match is not None and process_alive(int(match.group(1)))


def _sweep_private(folder: Path) -> None:
    """Private download folders of processes that are gone (killed mid-step), in a checked
    folder of ours; a link of that name is removed, never followed."""
    for path in folder.glob(f"{_PRIVATE_PREFIX}*"):
        if _in_use(path.name):
            continue
        if stat.S_ISDIR(os.lstat(path).st_mode):
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def download(fs: Any, key: str, target: Path, size: int, shown: str | None = None) -> None:
    """GET one object; one line naming its URL when that fails or its size changed."""
    where = shown or key
    try:
        fs.get_file(key, str(target))  # a new name in a folder of ours
        got = target.stat().st_size
    except FileNotFoundError:
        raise RemoteObjectError(
            where, "no longer exists. Extract again to pick up the current files."
        ) from None
    except Exception as exc:  # noqa: BLE001 - s3fs/botocore raise more than OSError
        raise RemoteObjectError(
            where,
            f"cannot be downloaded ({type(exc).__name__}: {exc}). Extract again once it is"
            " readable.",
        ) from None
    if got != size:
        raise RemoteObjectError(
            where,
            f"changed while it was read ({size:,} bytes listed, {got:,} downloaded); extract"
            " again.",
        )
