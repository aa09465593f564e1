"""A reader's kept catalog with the rows of the lake's samples and stored rollups in it.

On a lake of many small steps a reader's views open one samples file and one file per rollup
a step (`step_stats` alone reads about 300 files on a lake of 100 steps), which costs more
than the rows they hold. So beside a kept private catalog (serve/catalog_cache.py), a reader
keeps a copy of it whose `samples` and rollup views read tables of those rows, copied once
from the files: `<key>/rows/tokenlake.duckdb`, with the tables in the schema `tokenlake_rows`.
Its views have the names, columns and rows of the catalog's; the key of the folder digests
everything the rows were copied from (the manifests as served, whose file identities the
reader compared with the files: serve/served.py; tokenlake's SQL and these modules), so a
change anywhere gives another key, and the rows are copied again.

A rollup that depends on `drift_settings` keeps the catalog's guard (`rollups.guarded`): its
rows are read while the session's settings give the digest they were computed with, else the
rollup is computed from the tokens, so a `--set` override never reads them. The file is one
this user's tokenlake wrote, in a folder only this user can write; nothing a stranger wrote is
run. Lakes whose files to copy exceed COPY_LIMIT keep the views over the files (their
per-file cost is small beside their rows').

The copy also keeps the rows of the views the audits cost most to compute (SHARED_VIEWS), with
the rows under the catalog's own `drift_settings`, in the schema `tokenlake_views`: `audit`
without `--set` reads them instead of computing them again (binding and planning
`drift_steps` alone is ~40 ms of CPU). `tokenlake tag` drops them from the copy it carries
over (its new `runs` row is read by some) and marks it (`forget_views`); the next reader
computes them into a new copy, renamed over it.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from tokenlake import schema
from tokenlake.errors import CacheError, LakeError
from tokenlake.serve import rollups
from tokenlake.serve.sql_views import base_view_sql
from tokenlake.store import manifest, parquet
from tokenlake.store.base import Store
from tokenlake.store.private_cache import private_folder

if TYPE_CHECKING:
    import duckdb

log = logging.getLogger(__name__)

FOLDER = "rows"  # in a kept catalog's key folder
SCHEMA = "tokenlake_rows"  # of the copied tables
VIEWS_SCHEMA = "tokenlake_views"  # of the kept rows of SHARED_VIEWS
_LACKS_VIEWS = "lacks-views"  # beside a copy without them: the next reader computes them
# Views several audits read, each of a row per step or group (or per suspect token row, normally
# none): computed once per run of the audits (serve/audit.py), not once per audit, and kept
# here under the catalog's own settings; and `step_stats`, which one audit reads, whose many
# columns cost ~12 ms of CPU to bind and compute in a fresh process.
SHARED_VIEWS = ("drift_steps", "drift_step_checks", "audit_tokens", "group_stats", "step_stats")
COPY_LIMIT = 64 * 2**20  # of the Parquet files copied; a larger lake copies none
_BUILDING = ".building-"


def plan(served: list[manifest.RunManifest]) -> dict[str, str] | None:
    """Per rollup that depends on `drift_settings`, the digest of the settings the served
    steps' rows were computed under; None where no rows are copied: a step without current
    rollups or file identities, rollups computed under different settings across steps (the
    catalog reads their tokens), or too many bytes."""
    steps = [step for record in served for step in record.steps.values()]
    if not steps or not all(_copyable(step) for step in steps):
        return None
    copied = sum(
        parquet.identity_size(step.identities[table]) for step in steps for table in _tables()
    )
    if copied > COPY_LIMIT:
        return None
    digests = {}
    for name in rollups.rollup_names():
        found = {step.rollup_settings.get(name) for step in steps}
        if len(found) > 1:
            return None
        digest = found.pop()
        if rollups.settings_of(name) and digest is not None:
            digests[name] = digest
    return digests


def _tables() -> tuple[str, ...]:
    return (schema.SAMPLES, *rollups.rollup_names())


def _copyable(step: manifest.StepRecord) -> bool:
    return rollups.has_this_sql(step) and all(
        table in step.files and table in step.identities for table in _tables()
    )


def copy_queries(
    store: Store, served: list[manifest.RunManifest], digests: dict[str, str]
) -> dict[str, str]:
    """Per table copied, the query its rows are copied by: the catalog's own queries over the
    served files (a rollup's without its guard: its rows are those its files hold)."""
    steps = [step for record in served for step in record.steps.values()]
    files = {
        name: [store.url(n) for record in served for n in record.files(name)] for name in _tables()
    }
    older = any(step.schema_version < schema.SCHEMA_VERSION for step in steps)
    stored = rollups.catalog_views(steps, files, settled=digests)
    if stored.problem is not None or set(stored.queries) != set(rollups.rollup_names()):
        raise LakeError(str(store), "its rollups are not all stored")
    return {
        schema.SAMPLES: base_view_sql(schema.SAMPLES, files[schema.SAMPLES], older),
        **stored.queries,
    }


def copied(catalog: Path) -> Path | None:
    """The copy of the kept catalog `catalog` with the lake's rows in it, if there is one."""
    path = catalog.parent / FOLDER / catalog.name
    return path if path.is_file() and not path.is_symlink() else None


def with_rows(catalog: Path, store: Store, served: list[manifest.RunManifest]) -> Path:
    """The kept catalog `catalog` (in its key folder) with the served manifests' rows copied
    in, made now unless it is there; `catalog` itself where no rows are copied (`plan`) or
    they cannot be."""
    digests = plan(served)
    if digests is None:
        return catalog
    kept = copied(catalog)
    if kept is not None:
        if (kept.parent / _LACKS_VIEWS).exists():
            _add_shared_views(kept)
        return kept
    top = catalog.parent / FOLDER
    path = top / catalog.name
    try:
        private_folder(top)
        building = private_folder(top / f"{_BUILDING}{os.getpid()}-{secrets.token_hex(4)}")
        try:
            shutil.copyfile(catalog, building / catalog.name)
            _copy_rows(building / catalog.name, copy_queries(store, served, digests), digests)
            os.rename(building / catalog.name, path)
        finally:
            shutil.rmtree(building, ignore_errors=True)
    except (OSError, LakeError, CacheError) as exc:
        log.info("the lake's rows are not kept: %s", exc)
        return catalog
    return path


def _copy_rows(path: Path, queries: dict[str, str], digests: dict[str, str]) -> None:
    """Into the catalog file `path`: each query's rows as a table of `SCHEMA`, and the view of
    its name over that table (guarded as the catalog guards it), written in full."""
    import duckdb

    try:
        con = duckdb.connect(str(path))
        try:
            con.execute("BEGIN TRANSACTION")
            con.execute(f"CREATE SCHEMA {SCHEMA}")
            for table, query in queries.items():
                con.execute(f"CREATE TABLE {SCHEMA}.{table} AS {query}")
                rows = f"SELECT * FROM {SCHEMA}.{table}"
                if table in digests:
                    rows = rollups.guarded(table, rows, digests[table])
                con.execute(f"CREATE OR REPLACE VIEW {table} AS {rows}")
            con.execute("COMMIT")
            _keep_shared_views(con)
            con.execute("CHECKPOINT")
        finally:
            con.close()
    except duckdb.Error as exc:
        raise LakeError(path, f"rows cannot be copied ({str(exc).splitlines()[0][:300]})") from exc
    if Path(f"{path}.wal").exists():  # DuckDB could not fold its log into the file
        raise LakeError(path, "rows could not be written in full")


def _keep_shared_views(con: duckdb.DuckDBPyConnection) -> None:
    """Each of SHARED_VIEWS' rows, over the rows just copied and under the catalog's own
    `drift_settings`, as a table of VIEWS_SCHEMA. A view that cannot be computed is left out:
    the audit that reads it computes it, and fails with its own name."""
    import duckdb

    con.execute(f"CREATE SCHEMA {VIEWS_SCHEMA}")
    for view in SHARED_VIEWS:
        try:
            con.execute(f"CREATE TABLE {VIEWS_SCHEMA}.{view} AS FROM main.{view}")
        except duckdb.Error:
            continue


def kept_views(con: duckdb.DuckDBPyConnection) -> set[str]:
    """Those of SHARED_VIEWS whose rows the reader's catalog `con` keeps in VIEWS_SCHEMA (none
    in a catalog without kept rows, or in the copy a tag carried over)."""
    listed = con.execute(
        "SELECT table_name FROM duckdb_tables()"
        " WHERE database_name = current_database() AND schema_name = ?",
        [VIEWS_SCHEMA],
    ).fetchall()
    return {name for (name,) in listed if name in SHARED_VIEWS}


def forget_views_sql(database: str) -> str:
    """The statement that drops the kept rows of SHARED_VIEWS from the catalog attached as
    `database`: what a tag's new `runs` row changes (`forget_views` marks the file)."""
    return f"DROP SCHEMA IF EXISTS {database}.{VIEWS_SCHEMA} CASCADE"


def forget_views(copy: Path) -> None:
    """Mark the copy `copy`, whose kept rows of SHARED_VIEWS were dropped, for the next reader
    to compute them (`with_rows`)."""
    os.close(os.open(copy.parent / _LACKS_VIEWS, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600))


def _add_shared_views(copy: Path) -> None:
    """The copy `copy` with SHARED_VIEWS' rows computed in, made beside it and renamed over it
    (other readers may hold it open); left as it is, still marked, where that fails."""
    import duckdb

    try:
        building = private_folder(copy.parent / f"{_BUILDING}{os.getpid()}-{secrets.token_hex(4)}")
        try:
            shutil.copyfile(copy, building / copy.name)
            with duckdb.connect(str(building / copy.name)) as con:
                _keep_shared_views(con)
                con.execute("CHECKPOINT")
            if Path(f"{building / copy.name}.wal").exists():
                raise LakeError(copy, "rows could not be written in full")
            os.rename(building / copy.name, copy)
            (copy.parent / _LACKS_VIEWS).unlink(missing_ok=True)
        finally:
            shutil.rmtree(building, ignore_errors=True)
    except (OSError, LakeError, CacheError, duckdb.Error) as exc:
        log.info("the rows of the views audits read are not kept: %s", exc)
