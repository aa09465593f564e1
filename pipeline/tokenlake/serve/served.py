"""Which of the manifests' steps a catalog serves: a planted symbolic link, or a local file
that is no longer the one its manifest records (`store.parquet.footer_identity`), takes only
what it touches out of the views, with one warning line, never the whole lake
(docs/security.md, "What a lake writer can make a reader believe"): a step whose token or
sample file is affected is left out; a step whose rollup file is affected is served from its
tokens, as a step without rollups is."""

from __future__ import annotations

from dataclasses import replace

from tokenlake import schema
from tokenlake.errors import LakeError
from tokenlake.store import manifest, parquet
from tokenlake.store.base import Store

_FROM_TOKENS = "rollups not served, its views read its tokens"


def served_records(
    store: Store, records: list[manifest.RunManifest]
) -> tuple[list[manifest.RunManifest], list[str]]:
    """`records` without the steps, rollups and side files the views must not read, and one
    line for each run or step affected."""
    served: list[manifest.RunManifest] = []
    problems: list[str] = []
    for record in records:
        steps, left_out, no_rollups = _served_steps(store, record)
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
        side_problem = _without_unreadable_side_files(store, copy)
        if side_problem is not None:
            problems.append(f"run `{record.run}`: {side_problem}")
        served.append(copy)
    return served, problems


def _served_steps(
    store: Store, record: manifest.RunManifest
) -> tuple[dict[str, manifest.StepRecord], dict[str, str], dict[str, str]]:
    """The run's steps as served; the steps left out and the steps served without their
    rollups, each with why."""
    steps, left_out, no_rollups = {}, {}, {}
    for key, step in record.steps.items():
        own = {t: n for t, n in step.files.items() if t not in schema.ROLLUP_TABLES}
        problem = _files_problem(store, step, own)
        if problem is not None:
            left_out[key] = problem
            continue
        rollups = {t: n for t, n in step.files.items() if t in schema.ROLLUP_TABLES}
        rollup_problem = _files_problem(store, step, rollups)
        if rollup_problem is not None:  # its views read its tokens, as without rollups
            no_rollups[key] = rollup_problem
            step = replace(step, files=own, rollup_version="", rollup_settings={})
        steps[key] = step
    return steps, left_out, no_rollups


def _files_problem(store: Store, step: manifest.StepRecord, files: dict[str, str]) -> str | None:
    """Why some of a step's `files` must not be read (None: they may)."""
    for table, name in files.items():
        try:
            recorded = step.identities.get(table)
            # Locally a footer costs ~50 us to check; on an object store two requests per file
            # for every command, so there `verify` alone compares them.
            # A local lake refuses a name reached through a link: `url`, or reading its footer.
            if recorded is None or store.local_catalog is None:
                store.url(name)
            elif parquet.footer_identity(store, name) != recorded:
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


def _without_unreadable_side_files(store: Store, record: manifest.RunManifest) -> str | None:
    """Leave out of `record` (a copy) the `runs`, `vocab` and `metrics` files that must not be
    read; returns why, if any was."""
    problems = []
    if record.runs_file is not None and (found := _link_problem(store, record.runs_file)):
        record.runs_file = None
        problems.append(found)
    if record.vocab_file is not None and (found := _link_problem(store, record.vocab_file)):
        record.vocab_file = None
        problems.append(found)
    metrics = [(name, _link_problem(store, name)) for name in record.metrics_files]
    record.metrics_files = [name for name, found in metrics if found is None]
    problems += [found for _, found in metrics if found is not None]
    return f"side files not served: {problems[0]}" if problems else None


def _link_problem(store: Store, name: str) -> str | None:
    try:
        store.url(name)
    except LakeError as exc:
        return str(exc)
    return None
