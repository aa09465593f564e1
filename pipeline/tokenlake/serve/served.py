"""Which of the manifests' steps and side files a catalog serves: a planted symbolic link, or
a file that is no longer the one its manifest records (`store.parquet.footer_identity`; on an
object store, its listed size), takes only what it touches out of the views, with one warning
line, never the whole lake (docs/security.md, "What a lake writer can make a reader
believe"): a step whose token or sample file is affected is left out; a step whose rollup file
is affected is served from its tokens, as a step without rollups is; a changed `runs`, `vocab`
or `metrics` file is left out alone."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field, replace
from typing import Any

from tokenlake import schema
from tokenlake.errors import LakeError
from tokenlake.store import manifest, parquet
from tokenlake.store.base import Store
from tokenlake.store.local import LocalStore

_FROM_TOKENS = "rollups not served, its views read its tokens"


@dataclass
class KnownFooters:
    """Footer identities of a local lake's files read before, each with the file's `lstat`
    identity then (device, inode, size, mtime, ctime: a write or a rename over the file changes
    its inode or ctime, which no writer of the lake can set back), so an unchanged file's footer
    is not read again. `kept`: what an earlier command found (serve/catalog_cache.py keeps it
    in the user's private cache); `found`: what this one found, for the next.
    """

    kept: dict[str, tuple[str, str]] = field(default_factory=dict)
    found: dict[str, tuple[str, str]] = field(default_factory=dict)
    _folders: set[str] = field(default_factory=set)  # checked in this pass: no links

    def identity(self, store: LocalStore, name: str) -> str:
        """`parquet.footer_identity` of the file `name`, read only if it changed since kept.

        Raises:
            LakeError: The name lies outside the lake, or a folder on its way is a link
                (`UnreadableLakeFile`: the file itself is one, or cannot be read).
        """
        info = self._regular_file(store, name)
        if info is None:  # anything but a plain file in plain folders: refused as it always was
            return parquet.footer_identity(store, name)
        seen = f"{info.st_dev} {info.st_ino} {info.st_size} {info.st_mtime_ns} {info.st_ctime_ns}"
        kept = self.kept.get(name)
        identity = kept[1] if kept is not None and kept[0] == seen else None
        if identity is None:
            identity = parquet.footer_identity(store, name)
        self.found[name] = (seen, identity)
        return identity

    def _regular_file(self, store: LocalStore, name: str) -> os.stat_result | None:
        """The `lstat` of the lake file `name` when it is a regular file reached through
        folders that are no links (each folder checked once a pass), else None."""
        parts = name.split("/")
        if name.startswith("/") or ".." in parts:
            return None
        path = str(store.root)
        try:
            for part in parts[:-1]:
                path = os.path.join(path, part)
                if path not in self._folders:
                    if not stat.S_ISDIR(os.lstat(path).st_mode):
                        return None
                    self._folders.add(path)
            info = os.lstat(os.path.join(path, parts[-1]))
        except OSError:
            return None
        return info if stat.S_ISREG(info.st_mode) else None


def served_records(
    store: Store,
    records: list[manifest.RunManifest],
    listing: Any = None,
    footers: KnownFooters | None = None,
) -> tuple[list[manifest.RunManifest], list[str]]:
    """`records` without the steps, rollups and side files the views must not read, and one
    line for each run or step affected.

    Args:
        listing: On an object store, the filesystem `Store.reading_filesystem` listed the
            lake's folders with: each file's size is compared with its identity's from that
            listing (no request per file). None: an object store's files are not compared.
        footers: A local lake's footer identities read before (`KnownFooters`): an unchanged
            file's footer is not read again.
    """
    served: list[manifest.RunManifest] = []
    problems: list[str] = []
    for record in records:
        steps, left_out, no_rollups = _served_steps(store, record, listing, footers)
        if left_out and not steps:  # e.g. a link at the run's folder: every step alike
            problems.append(f"run `{record.run}`: not served: {next(iter(left_out.values()))}")
            continue
        problems += [
            f"run `{record.run}` step {key}: not served: {p}" for key, p in left_out.items()
        ]
        if no_rollups and len(no_rollups) == len(steps):  # e.g. a link at `rollups/`
            problems.append(
                f"run `{record.run}`: {_FROM_TOKENS}: {next(iter(no_rollups.values()))}"
            )
        else:
            problems += [
                f"run `{record.run}` step {k}: {_FROM_TOKENS}: {p}" for k, p in no_rollups.items()
            ]
        copy = replace(record, steps=steps, metrics_files=list(record.metrics_files))
        side_problem = _without_unservable_side_files(store, copy, listing, footers)
        if side_problem is not None:
            problems.append(f"run `{record.run}`: {side_problem}")
        served.append(copy)
    return served, problems


def _served_steps(
    store: Store, record: manifest.RunManifest, listing: Any, footers: KnownFooters | None
) -> tuple[dict[str, manifest.StepRecord], dict[str, str], dict[str, str]]:
    """The run's steps as served; the steps left out and the steps served without their
    rollups, each with why."""
    steps, left_out, no_rollups = {}, {}, {}
    for key, step in record.steps.items():
        own = {t: n for t, n in step.files.items() if t not in schema.ROLLUP_TABLES}
        problem = _files_problem(store, record.run, own, step.identities, listing, footers)
        if problem is not None:
            left_out[key] = problem
            continue
        rollups = {t: n for t, n in step.files.items() if t in schema.ROLLUP_TABLES}
        rollup_problem = _files_problem(
            store, record.run, rollups, step.identities, listing, footers
        )
        if rollup_problem is not None:  # its views read its tokens, as without rollups
            no_rollups[key] = rollup_problem
            step = replace(step, files=own, rollup_version="", rollup_settings={})
        steps[key] = step
    return steps, left_out, no_rollups


def _files_problem(
    store: Store,
    run: str,
    files: dict[str, str],
    identities: dict[str, str],
    listing: Any,
    footers: KnownFooters | None = None,
) -> str | None:
    """Why some of `files` (key -> name; `identities` by the same keys) must not be read
    (None: they may)."""
    for key, name in files.items():
        try:
            recorded = identities.get(key)
            # A local lake refuses a name reached through a link: `url`, or reading its
            # footer, which `_changed` does for a local file with an identity (once a file).
            if recorded is None or store.local_catalog is None:
                store.url(name)
            if recorded is not None and _changed(store, name, recorded, listing, footers):
                return (
                    f"`{name}` is not the file its manifest records (its size or footer"
                    " changed); `tokenlake verify LAKE` names it"
                )
        except parquet.UnreadableLakeFile as exc:
            if store.exists(name):
                return exc.refusal(name) or str(exc)
            if _still_listed(store, run, name):
                return f"`{name}` is missing; `tokenlake verify LAKE` names it"
            # gone: superseded by a commit since the manifests were read, which each reader
            # handles by reading them again
        except LakeError as exc:
            return str(exc)
    return None


def _still_listed(store: Store, run: str, name: str) -> bool:
    """Whether the run's manifest, read now, still lists the file `name` found missing: a
    writer commits a manifest before it deletes the files that one no longer lists, so a file
    missing while its manifest lists it is damage (deleted by hand or by another program),
    not a commit this reader was overtaken by."""
    try:
        record = manifest.load_listed(store, run)
    except LakeError:  # replaced or damaged meanwhile: the reader reads the manifests again
        return False
    return name in record.side_files() or any(
        name in step.files.values() for step in record.steps.values()
    )


def _changed(
    store: Store, name: str, recorded: str, listing: Any, footers: KnownFooters | None
) -> bool:
    """Whether the file `name` is not the one whose identity is `recorded`.

    A local footer costs ~50 us to read. On an object store a footer is two requests per file
    for every command, so there only the size is compared, as the listing the catalog build
    makes anyway gave it; `verify` compares footers.
    """
    if store.local_catalog is not None:
        if footers is not None and isinstance(store, LocalStore):
            return footers.identity(store, name) != recorded
        return parquet.footer_identity(store, name) != recorded
    if listing is None:
        return False
    found = listing.info(store.url(name))  # from the listing's cache: no request
    if found.get("type") != "file":  # not listed: gone, as a reader finds it anyway
        return False
    return int(found["size"]) != parquet.identity_size(recorded)


def _without_unservable_side_files(
    store: Store, record: manifest.RunManifest, listing: Any, footers: KnownFooters | None
) -> str | None:
    """Leave out of `record` (a copy) the `runs`, `vocab` and `metrics` files that must not be
    read (reached through a link, or not the file written); returns why, if any was."""
    problems = []
    identities = record.side_identities

    def problem(name: str) -> str | None:
        return _files_problem(store, record.run, {name: name}, identities, listing, footers)

    if record.runs_file is not None and (found := problem(record.runs_file)):
        record.runs_file = None
        problems.append(found)
    if record.vocab_file is not None and (found := problem(record.vocab_file)):
        record.vocab_file = None
        problems.append(found)
    metrics = [(name, problem(name)) for name in record.metrics_files]
    record.metrics_files = [name for name, found in metrics if found is None]
    problems += [found for _, found in metrics if found is not None]
    return f"side files not served: {problems[0]}" if problems else None
