"""Which of the manifests' steps and side files a catalog serves: a planted symbolic link, or
a file that is no longer the one its manifest records (`store.parquet.footer_identity`; on an
object store, its listed size), takes only what it touches out of the views, with one warning
line, never the whole lake (docs/security.md, "What a lake writer can make a reader
believe"): a step whose token or sample file is affected is left out; a step whose rollup file
is affected is served from its tokens, as a step without rollups is; a changed `runs`, `vocab`
or `metrics` file is left out alone."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tokenlake import schema
from tokenlake.errors import LakeError
from tokenlake.store import manifest, parquet
from tokenlake.store.base import Store

_FROM_TOKENS = "rollups not served, its views read its tokens"


def served_records(
    store: Store, records: list[manifest.RunManifest], listing: Any = None
) -> tuple[list[manifest.RunManifest], list[str]]:
    """`records` without the steps, rollups and side files the views must not read, and one
    line for each run or step affected.

    Args:
        listing: On an object store, the filesystem `Store.reading_filesystem` listed the
            lake's folders with: each file's size is compared with its identity's from that
            listing (no request per file). None: an object store's files are not compared.
    """
    served: list[manifest.RunManifest] = []
    problems: list[str] = []
    for record in records:
        steps, left_out, no_rollups = _served_steps(store, record, listing)
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
        side_problem = _without_unservable_side_files(store, copy, listing)
        if side_problem is not None:
            problems.append(f"run `{record.run}`: {side_problem}")
        served.append(copy)
    return served, problems


def _served_steps(
    store: Store, record: manifest.RunManifest, listing: Any
) -> tuple[dict[str, manifest.StepRecord], dict[str, str], dict[str, str]]:
    """The run's steps as served; the steps left out and the steps served without their
    rollups, each with why."""
    steps, left_out, no_rollups = {}, {}, {}
    for key, step in record.steps.items():
        own = {t: n for t, n in step.files.items() if t not in schema.ROLLUP_TABLES}
        problem = _files_problem(store, own, step.identities, listing)
        if problem is not None:
            left_out[key] = problem
            continue
        rollups = {t: n for t, n in step.files.items() if t in schema.ROLLUP_TABLES}
        rollup_problem = _files_problem(store, rollups, step.identities, listing)
        if rollup_problem is not None:  # its views read its tokens, as without rollups
            no_rollups[key] = rollup_problem
            step = replace(step, files=own, rollup_version="", rollup_settings={})
        steps[key] = step
    return steps, left_out, no_rollups


def _files_problem(
    store: Store, files: dict[str, str], identities: dict[str, str], listing: Any
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
            if recorded is not None and _changed(store, name, recorded, listing):
                return (
                    f"`{name}` is not the file its manifest records (its size or footer"
                    " changed); `tokenlake verify LAKE` names it"
                )
        except parquet.UnreadableLakeFile as exc:
            if store.exists(name):
                return exc.refusal(name) or str(exc)
            # gone: superseded by a commit since the manifests were read, which each reader
            # handles by reading them again (or names as missing)
        except LakeError as exc:
            return str(exc)
    return None


def _changed(store: Store, name: str, recorded: str, listing: Any) -> bool:
    """Whether the file `name` is not the one whose identity is `recorded`.

    A local footer costs ~50 us to read. On an object store a footer is two requests per file
    for every command, so there only the size is compared, as the listing the catalog build
    makes anyway gave it; `verify` compares footers.
    """
    if store.local_catalog is not None:
        return parquet.footer_identity(store, name) != recorded
    if listing is None:
        return False
    found = listing.info(store.url(name))  # from the listing's cache: no request
    if found.get("type") != "file":  # not listed: gone, as a reader finds it anyway
        return False
    return int(found["size"]) != int(recorded.split(":")[0])


def _without_unservable_side_files(
    store: Store, record: manifest.RunManifest, listing: Any
) -> str | None:
    """Leave out of `record` (a copy) the `runs`, `vocab` and `metrics` files that must not be
    read (reached through a link, or not the file written); returns why, if any was."""
    problems = []
    identities = record.side_identities

    def problem(name: str) -> str | None:
        return _files_problem(store, {name: name}, identities, listing)

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
