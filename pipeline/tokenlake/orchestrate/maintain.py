"""Commands that change a lake without reading a dump: `tokenlake tag` and `tokenlake views`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from tokenlake import schema, tags
from tokenlake.errors import LakeError
from tokenlake.load import lake_files
from tokenlake.processes import crash_point
from tokenlake.serve import catalog, rollups
from tokenlake.store import manifest, parquet, require_lake
from tokenlake.store.base import Store
from tokenlake.store.local import LocalStore
from tokenlake.threads import sigint_held

if TYPE_CHECKING:  # `tokenlake views` reads step files with it; `tokenlake tag` never needs it
    import pyarrow as pa


@dataclass(frozen=True)
class TagResult:
    """What `tokenlake tag` did."""

    tags: dict[str, str]  # the run's tags after the change
    warnings: tuple[str, ...]  # user views the rebuilt catalog skipped, one line each


@dataclass(frozen=True)
class ViewsResult:
    """What `tokenlake views` did."""

    catalog: Path | str  # the rebuilt catalog's path or URL
    rollups_computed: int  # steps that got new rollups, computed from their token files
    # User views skipped, steps whose rollups could not be computed: one line each.
    warnings: tuple[str, ...]


def tag_run(
    store: Store,
    run: str,
    set_tags: dict[str, str],
    remove: Iterable[str] = (),
) -> TagResult:
    """Change a run's tags without reading its dump: runs row, manifest, catalog, under the
    writer lock. Returns the run's tags after the change and the catalog's warnings.

    Each step leaves a consistent lake (a new runs row is unlisted until the manifest, the
    commit point, lists it; readers follow the manifest until the catalog is rebuilt), so a
    kill at any point is repaired by tagging again; a Ctrl-C is raised once the tag is whole.

    Raises:
        LakeError: Not a lake, no such run, or another writer holds the lake.
        UsageError: A bad key, or a key both set and removed.
    """
    store = require_lake(store)
    warnings: list[str] = []
    with store.lock(), contextlib.ExitStack() as opened:
        record = manifest.load_manifest(store, run)
        if record is None:
            runs = ", ".join(f"`{name}`" for name in store.manifest_runs()) or "none"
            raise LakeError(store.location, f"has no run `{run}` (runs: {runs})")
        store.delete_stale_temporaries()  # of a command killed earlier
        # The record as it was: a tag changes only its tags, `runs_file` and `side_identities`
        # (its steps, ~10 ms to copy deep on 100 steps, stay as they are).
        before = replace(
            record, tags=dict(record.tags), side_identities=dict(record.side_identities)
        )
        record.tags = tags.change_tags(record.tags, set_tags, remove)
        # Written whole or not at all: a Ctrl-C from here is raised once the tag is committed
        # and its catalog rebuilt (a few tenths of a second), not between its files.
        opened.enter_context(sigint_held())
        # A local lake's `runs` row and catalogs are rewritten through one in-memory DuckDB,
        # which then spares importing pyarrow (docs/performance.md).
        con, rewritten = None, False
        if isinstance(store, LocalStore):
            con = opened.enter_context(catalog.scratch_connection(store))
            rewritten = lake_files.rewrite_run_row(con, store, record)
        if not rewritten:
            keep = lake_files.stored_run_row(store, record)
            lake_files.write_run_row(store, record, keep=keep)
        crash_point("tag:row")
        manifest.save_manifest(store, record)
        crash_point("tag:manifest")
        catalog.build_catalog_after_tag(store, before, record, warnings, con)
        crash_point("tag:catalog")
        store.delete_unlisted(record, (schema.RUNS,))  # a tag writes no other table's files
    return TagResult(record.tags, tuple(warnings))


def rebuild_views(store: Store, recompute: bool = False) -> ViewsResult:
    """Compute the rollups steps lack (written by an older tokenlake, or with other
    drift_settings defaults; with `recompute`, every step's) from their token files, then
    rebuild the catalog from the manifests, under the writer lock.

    Never in a dump or a stray folder (`require`), never while an extraction writes the lake,
    nor under another program holding the catalog for writing; a catalog half-built by a
    killed command is swept first.
    """
    store = require_lake(store)
    warnings: list[str] = []
    with store.lock():
        catalog.refuse_if_held(store)
        store.delete_stale_temporaries()
        records = manifest.load_all(store)
        counts = {r.run: refresh_rollups(store, r, recompute, warnings) for r in records}
        refreshed = [r for r in records if counts[r.run]]
        with sigint_held():  # a Ctrl-C from here waits for the catalog and the sweep
            for record in refreshed:
                manifest.save_manifest(store, record)  # the commit point of its new rollups
            where = catalog.build_catalog(store, warnings)
            for record in refreshed:
                store.delete_unlisted(record)  # the rollups they replace
        return ViewsResult(where, sum(counts.values()), tuple(warnings))


def refresh_rollups(
    store: Store,
    record: manifest.RunManifest,
    every: bool = False,
    warnings: list[str] | None = None,
) -> int:
    """Compute and write the rollups of the run's steps that lack current ones (`every`: of
    all its steps), from the step's own token and sample files (never the dump), and point the
    record at them; the caller saves the manifest. Returns how many steps got new rollups.

    A step whose files were written by an older schema reads the columns added since as NULL,
    as the views do; its next extraction rewrites it. A step whose files cannot be read keeps
    the rollups it had (the views read its tokens if it has none) and is one line in
    `warnings` (None: raised); the other steps get theirs.
    """
    # The step writer imports the dump readers, which `tokenlake tag` never needs.
    from tokenlake.orchestrate.step import write_step_files

    current = rollups.default_settings_digests()
    refreshed = 0
    for step in record.steps.values():
        if not every and rollups.is_current(step, current):
            continue
        try:
            tables = {t: _read_step_table(store, step, t) for t in (schema.TOKENS, schema.SAMPLES)}
        except LakeError as exc:
            if warnings is None:
                raise
            warnings.append(f"run `{record.run}` step {step.key}: rollups not computed: {exc}")
            continue
        computed = rollups.compute_step(
            tables[schema.TOKENS], tables[schema.SAMPLES], record.run, step.rollout_id
        )
        written: dict[str, str] = {}
        identities: dict[str, str] = {}
        where = (
            step.rollout_id,
            step.evaluation,
            f"{schema.TOKENS}: {step.files.get(schema.TOKENS)}",
        )
        try:
            write_step_files(
                store, record.run, where, list(computed.tables.items()), written, identities
            )
        except BaseException:
            store.delete(written.values())  # half a step's rollups must not linger
            raise
        step.files.update(written)
        step.identities.update(identities)
        step.rollup_version, step.rollup_settings = computed.version, computed.settings
        refreshed += 1
    return refreshed


def _read_step_table(store: Store, step: manifest.StepRecord, table: str) -> pa.Table:
    """One table of a committed step, as its current schema (columns added since its schema
    version read NULL).

    Raises:
        LakeError: The file cannot be read.
    """
    import pyarrow as pa

    name = step.files.get(table)
    if name is None:  # a step without rows of the table: none to roll up
        return schema.TABLE_SCHEMAS[table].empty_table()
    try:
        recorded = step.tokens if table == schema.TOKENS else step.samples  # never more rows
        rows = parquet.read_table(store, name, recorded)
    except parquet.UnreadableLakeFile as exc:
        raise LakeError(exc.path, f"cannot be read ({exc.reason}); extract the run again") from exc
    wanted = schema.TABLE_SCHEMAS[table]
    for field in wanted:
        if field.name not in rows.column_names:
            rows = rows.append_column(field.name, pa.nulls(rows.num_rows, field.type))
    try:
        return rows.select(wanted.names).cast(wanted)
    except (pa.ArrowException, ValueError) as exc:
        raise LakeError(store.url(name), f"does not hold the `{table}` columns ({exc})") from exc
