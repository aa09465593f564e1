"""A reader's private catalog, kept and opened again while nothing it was built from changed.

Every reading command builds the lake's views into a private file (`catalog.connect`), which
costs about a third of a small command's CPU. The file is kept in the user's cache,
`$TOKENLAKE_CACHE/catalogs/<lake>/<key>/tokenlake.duckdb` (folders of mode 0700, checked as
pipeline/tokenlake/store/private_cache.py checks them), under a key that digests everything the
build read: the lake's location, every run manifest (as parsed, so exactly what the views
list), the user's view files, tokenlake's SQL and the modules that write views, tokenlake's
and DuckDB's versions. A later command with the same key opens that file read-only.

Nothing a stranger can write is ever run: the file is one this user's tokenlake built, in a
folder only this user can write (one that is not is never used: the command builds its views
afresh as before). A lake's older keys are deleted when a newer one is kept, and the catalogs
of all but the MAX_LAKES lakes used last (about 0.5 MB each), and folders of builds whose
process is gone. Beside a lake's keys, one line of what the last check that found the lake's
own catalog file healthy saw (`remember_healthy`), compared, never run, by the next check.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

from tokenlake import __version__, bounded, layout
from tokenlake.errors import BoundedReadError, CacheError, LakeError
from tokenlake.processes import process_alive
from tokenlake.serve import kept_rows, rollups, sql_views, user_view_check, user_views
from tokenlake.serve.served import KnownFooters
from tokenlake.store import manifest
from tokenlake.store.base import Store, ViewFile
from tokenlake.store.local import atomic_write
from tokenlake.store.private_cache import cache_root, forget_least_used, private_folder

log = logging.getLogger(__name__)

FOLDER = "catalogs"
_FORMAT = "1"  # of the key: a new one when what it digests changes
_PROBLEMS = "problems.txt"  # the lines the build printed, printed again by each reuse
_BUILDING = ".building-"
MAX_LAKES = 64  # lakes whose catalogs are kept, the ones used last
# Beside a lake's keys: the line of the last check that found the lake's own catalog file
# healthy (`remember_healthy`); never run, only compared.
_HEALTHY = "healthy-catalog.txt"
_HEALTHY_BYTES = 512
# Beside a lake's keys: the footer identities its last reader found (`remember_footers`),
# about 150 bytes a file: a lake of more than ~200,000 files keeps none.
_FOOTERS = "footers.json"
MAX_FOOTERS_BYTES = 32 << 20


def catalog_key(
    store: Store,
    records: Sequence[manifest.RunManifest],
    views: Sequence[ViewFile],
    builder: Path,
) -> str:
    """The digest of what a private catalog of the lake is built from (`builder`: the source
    of the module that builds it)."""
    import duckdb

    digest = hashlib.blake2b(digest_size=16)
    for part in (
        _FORMAT,
        __version__,
        duckdb.__version__,
        rollups.rollup_version(),
        store.location,
    ):
        digest.update(f"{part}\0".encode("utf-8", "surrogatepass"))
    for module in (rollups, sql_views, user_views, user_view_check, layout, kept_rows):
        digest.update(Path(str(module.__file__)).read_bytes())
    digest.update(builder.read_bytes())
    for record in records:
        digest.update(manifest.manifest_bytes(record))
    for view in views:
        digest.update(f"\0{view.stem}\0{view.problem}\0".encode("utf-8", "surrogatepass"))
        digest.update(view.content)
    return digest.hexdigest()


def lake_folder(store: Store) -> Path | None:
    """The cache folder of this lake's private catalogs, or None where there is no private
    one (the cache root is not a folder only this user can write)."""
    name = hashlib.blake2b(str(store.location).encode("utf-8", "surrogatepass"), digest_size=16)
    try:
        top = private_folder(cache_root(), root=True)
        folder = private_folder(private_folder(top / FOLDER) / name.hexdigest())
        os.utime(folder)  # used now: the lakes used last are the ones kept
        return folder
    except (CacheError, OSError) as exc:
        log.info("private catalogs are not kept: %s", exc)
        return None


def cached(folder: Path, key: str) -> tuple[Path, list[str]] | None:
    """The kept catalog of `key` and the lines its build printed, if there is one."""
    path = folder / key / layout.CATALOG_FILE
    if not path.is_file() or path.is_symlink():
        return None
    # Never through a link. Gone when another command of the user kept a newer key of the lake
    # (the lake changed, or another tokenlake version read it) and deleted this one since.
    try:
        handle = os.open(folder / key / _PROBLEMS, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(handle, "rb") as file:
        text = file.read().decode("utf-8", "replace")
    return path, [line for line in text.split("\n") if line]


def keep(
    folder: Path,
    key: str,
    build: Callable[[Path], list[str]],
    unchanged: Callable[[], bool],
) -> tuple[Path, list[str]]:
    """Build a catalog into a fresh folder and keep it under `key` if `unchanged()` still
    holds once it is built (else it serves this command only: `discard_unkept`); delete the
    lake's other keys. Returns its path and the lines the build printed."""
    building = folder / f"{_BUILDING}{os.getpid()}-{secrets.token_hex(4)}"
    try:
        os.mkdir(building, 0o700)
    except FileNotFoundError:  # another command of the user forgot the lake since it was used
        os.mkdir(private_folder(folder) / building.name, 0o700)
    try:
        problems = build(building / layout.CATALOG_FILE)
        (building / _PROBLEMS).write_text("".join(f"{p}\n" for p in problems), encoding="utf-8")
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    if not unchanged():  # the lake changed during the build: the key does not describe it
        return building / layout.CATALOG_FILE, problems
    try:
        _rename_into(building, folder / key)
    except OSError:  # another command kept the same key first (the same views)
        return building / layout.CATALOG_FILE, problems
    for entry in os.scandir(folder):
        # folders only: the healthy check's line is a file (and so is its write in progress)
        if entry.name != key and entry.is_dir(follow_symlinks=False) and _finished_with(entry.name):
            shutil.rmtree(entry.path, ignore_errors=True)
    forget_least_used(folder.parent, MAX_LAKES)
    return folder / key / layout.CATALOG_FILE, problems


def _rename_into(building: Path, key: Path) -> None:
    """Rename the build `building` to the key's folder `key`. A folder of that name that holds
    no kept catalog is what another command's deletion of the key left while a third one still
    wrote in it (a tokenlake version that keeps another key deletes this one): it is deleted,
    else no catalog of the key would ever be kept again.

    Raises:
        OSError: The key is kept already (by another command, with the same views).
    """
    try:
        os.rename(building, key)
    except OSError:
        if cached(key.parent, key.name) is not None:
            raise
        shutil.rmtree(key, ignore_errors=True)
        os.rename(building, key)


def _finished_with(name: str) -> bool:
    """Whether a lake's entry is an older key, or the build of a process that is gone."""
    if not name.startswith(_BUILDING):
        return True
    pid = name[len(_BUILDING) :].partition("-")[0]
    return pid.isdigit() and not process_alive(int(pid))


def is_kept(path: Path) -> bool:
    """Whether a catalog `keep` returned is kept under its key (else it serves one command)."""
    return not path.parent.name.startswith(_BUILDING)


def discard_unkept(path: Path) -> None:
    """Delete a catalog built for one command (its open connection keeps the file alive)."""
    if not is_kept(path):
        shutil.rmtree(path.parent, ignore_errors=True)


def recorded_healthy(store: Store) -> str | None:
    """The line `remember_healthy` kept for the lake, or None (none kept, no private cache)."""
    folder = lake_folder(store)
    if folder is None:
        return None
    try:  # never through a link, and no more than a line's bytes
        handle = os.open(folder / _HEALTHY, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(handle, "rb") as file:
        return file.read(_HEALTHY_BYTES).decode("utf-8", "replace")


def remember_healthy(store: Store, line: str) -> None:
    """Keep `line` (what a check that found the lake's catalog file healthy saw) for the next
    check to compare with (written whole, then renamed into place)."""
    folder = lake_folder(store)
    if folder is None or len(line.encode()) > _HEALTHY_BYTES:
        return
    try:
        atomic_write(folder / _HEALTHY, lambda temporary: _write_line(temporary, line))
    except LakeError as exc:
        log.info("the catalog's check is not kept: %s", exc)


def _write_line(path: Path, line: str) -> None:
    path.write_text(line, encoding="utf-8")


def known_footers(folder: Path) -> KnownFooters:
    """The footer identities the lake's last reader found (`remember_footers`), by each file's
    `lstat` identity then; none when there are none or they cannot be read whole."""
    try:  # never through a link; an object of lists of two strings
        text = bounded.read_file(folder / _FOOTERS, MAX_FOOTERS_BYTES, "kept footers", follow=False)
        found = bounded.loads(text, max_depth=2)
    except (BoundedReadError, ValueError):
        return KnownFooters()
    if not isinstance(found, dict):
        return KnownFooters()
    kept = {
        name: (pair[0], pair[1])
        for name, pair in found.items()
        if isinstance(pair, list) and len(pair) == 2 and all(isinstance(p, str) for p in pair)
    }
    return KnownFooters(kept)


def remember_footers(folder: Path, footers: KnownFooters) -> None:
    """Keep what this reader found for the next (written whole, then renamed into place),
    unless it is what was kept."""
    if footers.found == footers.kept:
        return
    text = json.dumps({name: list(pair) for name, pair in footers.found.items()})
    if len(text) > MAX_FOOTERS_BYTES:  # more than the next reader reads
        return
    try:
        atomic_write(folder / _FOOTERS, lambda temporary: _write_line(temporary, text))
    except LakeError as exc:
        log.info("the lake's footers are not kept: %s", exc)
