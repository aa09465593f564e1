"""Build the DuckDB catalog `LAKE/tokenlake.duckdb`: base views over the Parquet files, then
every view under `sql/`, each after the inputs its header declares. This is the only module
that creates or opens the catalog file; the readers (query.py, audit.py, report_data.py) import
duckdb only to query the connection `connect` gives them (through `query.connect_reader`).

The base views list the Parquet files that the run manifests name (pipeline/tokenlake/store/manifest.py),
with absolute paths, so the catalog works from any working directory, shows only committed
files, and a path with quotes cannot break or inject into the SQL. The partition columns are
parsed from the end of each path by the lake's layout: DuckDB's own Hive parsing reads every
`key=value` of the whole path, so a lake under `/data/run=ghost/lake` would read as run
`ghost`. The catalog is rebuilt by every extract, so the lists stay current.

The catalog also records a digest of the file lists it was built from (`listed_digest`). A
command killed between changing a manifest and rebuilding the catalog (`drop`, `tag`, an
extraction) leaves a catalog that lists other files than the manifests: `verify` reports it
and the next extraction rebuilds it. tokenlake's own readers never read the file: `connect`
builds the same views for each command from the manifests.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from tokenlake import layout, schema
from tokenlake.errors import CacheError, LakeError, ctrl_c_from_duckdb
from tokenlake.processes import crash_point, process_alive
from tokenlake.serve import catalog_cache, kept_rows, rollups
from tokenlake.serve.served import served_records
from tokenlake.serve.sql_views import (
    base_view_sql,
    create_sql_views,
    expected_views,
    iter_macro_files,
    quote_literal,
    redefine_sql_views,
)
from tokenlake.serve.user_views import create_user_views, iter_user_view_files
from tokenlake.store import is_dump, manifest, require_lake
from tokenlake.store.base import Store
from tokenlake.store.private_cache import private_folder
from tokenlake.threads import Background

if TYPE_CHECKING:
    import duckdb

log = logging.getLogger(__name__)


def table_files(store: Store, table: str) -> list[str]:
    """The Parquet files (paths or URLs) of one table that the runs' manifests list, by run
    then step."""
    return _listed_files(store, manifest.load_all(store), table)


def _listed_files(store: Store, records: list[manifest.RunManifest], table: str) -> list[str]:
    return [store.url(name) for run in records for name in run.files(table)]


def create_base_views(
    con: duckdb.DuckDBPyConnection, store: Store, records: list[manifest.RunManifest]
) -> None:
    """`tokens`, `samples`, `runs`, `vocab`, `metrics` over the Parquet files `records` (the
    lake's manifests, read once for the whole build) list."""
    older = any(
        step.schema_version < schema.SCHEMA_VERSION
        for record in records
        for step in record.steps.values()
    )  # a lake written by an older tokenlake, not extracted again yet
    for table in schema.TABLES:
        sql = base_view_sql(table, _listed_files(store, records, table), older)
        con.execute(f"CREATE OR REPLACE VIEW {table} AS {sql}")
    con.execute(f"CREATE OR REPLACE MACRO {INCOMPLETE_STEPS}() AS TABLE {incomplete_sql(records)}")


def step_view_queries(
    store: Store,
    records: list[manifest.RunManifest],
    run: str,
    rollout_id: int,
    evaluation: bool,
    settled: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Name -> query of each base view and stored rollup over one step's files only (and its
    run's `runs`, `vocab` and `metrics` files): created as a connection's TEMP views, they
    shadow the catalog's own inside every view, so a page about one step plans over its files
    rather than over every file of the lake. Empty when `records` (the lake's served
    manifests) have no such step. `settled`: as `rollups.catalog_views` takes it.
    """
    return steps_view_queries(store, records, {(run, rollout_id, evaluation)}, settled)


def steps_view_queries(
    store: Store,
    records: list[manifest.RunManifest],
    chosen: Collection[tuple[str, int, bool]],
    settled: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """`step_view_queries` over several steps, each `(run, rollout_id, evaluation)`: the base
    views and stored rollups over those steps' files only (and their runs' side files). Empty
    when `records` have none of them."""
    ones = []
    for record in records:
        steps = {
            step.key: step
            for step in record.steps.values()
            if (record.run, step.rollout_id, step.evaluation) in chosen
        }
        if steps:
            ones.append(replace(record, steps=steps))
    if not ones:
        return {}
    older = any(s.schema_version < schema.SCHEMA_VERSION for r in ones for s in r.steps.values())
    queries = {
        table: base_view_sql(table, _listed_files(store, ones, table), older)
        for table in schema.TABLES
    }
    stored = rollups.catalog_views(
        [step for one in ones for step in one.steps.values()],
        {name: _listed_files(store, ones, name) for name in schema.ROLLUP_TABLES},
        settled,
    )
    return {**queries, **stored.queries}


# The table macro listing the steps extracted although their files were incomplete (their
# manifests' `incomplete`): a macro, so the catalog still holds views only.
INCOMPLETE_STEPS = "incomplete_steps"


def incomplete_sql(records: list[manifest.RunManifest]) -> str:
    """A query of one row per step marked incomplete: `run`, `rollout_id`, `missing` (the
    manifest's text, as literals: a manifest's text never becomes SQL).

    Examples:
        >>> incomplete_sql([])
        'SELECT CAST(NULL AS VARCHAR) AS run, CAST(NULL AS BIGINT) AS rollout_id, CAST(NULL AS VARCHAR) AS missing WHERE false'
    """
    rows = [
        f"({quote_literal(record.run)}, {int(step.rollout_id)}, {quote_literal(step.incomplete)})"
        for record in records
        for step in sorted(record.steps.values(), key=lambda step: step.rollout_id)
        if step.incomplete is not None and not step.evaluation
    ]
    if not rows:
        return (
            "SELECT CAST(NULL AS VARCHAR) AS run, CAST(NULL AS BIGINT) AS rollout_id,"
            " CAST(NULL AS VARCHAR) AS missing WHERE false"
        )
    return (
        "SELECT CAST(run AS VARCHAR) AS run, CAST(rollout_id AS BIGINT) AS rollout_id,"
        f" CAST(missing AS VARCHAR) AS missing FROM (VALUES {', '.join(rows)})"
        " AS marked(run, rollout_id, missing)"
    )


def missing_views(con: duckdb.DuckDBPyConnection, database: str | None = None) -> list[str]:
    """The views every catalog holds that `con`'s databases (or its attached `database`) lack."""
    listed = con.execute(
        "SELECT view_name FROM system.main.duckdb_views() WHERE ? IS NULL OR database_name = ?",
        [database, database],
    ).fetchall()
    present = {row[0] for row in listed}
    return [name for name in expected_views() if name not in present]


def build_catalog(
    store: Store, warnings: list[str] | None = None, ahead: CatalogAhead | None = None
) -> Path | str:
    """(Re)build `LAKE/tokenlake.duckdb`; replaced atomically so readers never see half of it
    (on an object store: built locally, then uploaded in one PUT).

    The new file is checked before it replaces the old one: written out in full (no
    write-ahead log left) and holding every view. A full disk or another failure is a
    LakeError and leaves the old catalog in place. A broken user view (`LAKE/views/`) is
    skipped: one line each appended to `warnings`, or logged when no list is given.

    With `ahead` (an extraction's `CatalogAhead`), the views it made are completed rather than
    made again; if making them failed, the catalog is built in full.

    Returns:
        The path (or URL) of the catalog file.
    """
    problems: list[str] = []
    made = None if ahead is None else ahead.taken()

    store.publish_built(
        store.catalog_name, lambda tmp: _write_catalog(tmp, store, problems, made=made)
    )
    if store.local_catalog is not None:  # tokenlake leaves no log: one is another program's
        foreign_log(store.local_catalog).unlink(missing_ok=True)
    if warnings is None:
        for problem in problems:
            log.warning("%s", problem)
    else:
        warnings.extend(problems)
    where = store.local_catalog or store.url(store.catalog_name)
    log.info("catalog %s rebuilt", where)
    return where


@contextlib.contextmanager
def scratch_connection(store: Store) -> Iterator[duckdb.DuckDBPyConnection]:
    """An in-memory DuckDB for a command's work on files (`tokenlake tag`: its `runs` row and
    both catalogs it changes): a database opened by `duckdb.connect` costs ~30 ms of CPU before
    it holds anything, once per command rather than per file.

    Raises:
        LakeError: DuckDB cannot start (named as the lake's catalog).
    """
    import duckdb

    try:
        con = duckdb.connect()
    except duckdb.Error as exc:
        raise _catalog_error(store, exc) from exc
    with con:
        yield con


def build_catalog_after_tag(
    store: Store,
    before: manifest.RunManifest,
    saved: manifest.RunManifest,
    warnings: list[str],
    con: duckdb.DuckDBPyConnection | None = None,
) -> Path | str:
    """Rebuild the lake's catalog after `tokenlake tag` rewrote one run's `runs` file
    (`before`: that run's manifest until then, `saved`: the one it saved, not read again), as
    this user's private catalog of the lake as it is now (kept for the next command,
    `_connect_private_build`), then put a copy in place.

    Where this user keeps a private catalog of the lake as it was (built by `_write_catalog`
    from the same manifests, in a folder only this user can write) and its build printed
    nothing, the new one is that file with its `runs` view and its record of the listed files
    replaced: the views a rebuild would create, without creating the other ~50 again.
    Otherwise (no such catalog, a file left out) a full build. A lake on an object store, or
    without a private cache: `build_catalog`. `con`: the command's `scratch_connection`, if it
    has one.
    """
    catalog_file = store.local_catalog
    folder = None if catalog_file is None else catalog_cache.lake_folder(store)
    if catalog_file is None or folder is None:
        return build_catalog(store, warnings)
    views = iter_user_view_files(store)
    after = [
        saved if run == saved.run else manifest.load_listed(store, run)
        for run in store.manifest_runs()
    ]
    footers = catalog_cache.known_footers(folder)
    served, unserved = served_records(store, after, footers=footers)
    catalog_cache.remember_footers(folder, footers)
    kept = None
    if not unserved:
        # Every file is served, and the tagged run's `runs` file of before was checked as it
        # was read: the lake as it was is served whole too (a wrong guess only misses the
        # kept catalog; what a kept catalog holds is its key's state).
        was = [before if record.run == before.run else record for record in served]
        key_was = catalog_cache.catalog_key(store, was, views, Path(__file__))
        kept = catalog_cache.cached(folder, key_was)

    def build(path: Path) -> list[str]:
        if kept is not None and not kept[1]:
            held: contextlib.AbstractContextManager[duckdb.DuckDBPyConnection] = (
                contextlib.nullcontext(con) if con is not None else scratch_connection(store)
            )
            with held as scratch:
                _write_runs_views(kept[0], path, store, served, after, scratch)
            return []
        lines: list[str] = []
        _write_catalog(path, store, lines, after)
        return lines

    def unchanged() -> bool:
        return iter_user_view_files(store) == views

    key = catalog_cache.catalog_key(store, served, views, Path(__file__))
    built, problems = catalog_cache.keep(folder, key, build, unchanged)

    def publish(tmp: Path) -> None:
        shutil.copyfile(built, tmp)

    store.publish_built(store.catalog_name, publish)
    catalog_cache.discard_unkept(built)
    foreign_log(catalog_file).unlink(missing_ok=True)
    warnings.extend(problems)
    log.info("catalog %s rebuilt", catalog_file)
    return catalog_file


def _write_runs_views(
    kept: Path,
    path: Path,
    store: Store,
    served: list[manifest.RunManifest],
    records: list[manifest.RunManifest],
    con: duckdb.DuckDBPyConnection,
) -> None:
    """Into `path`, the kept catalog `kept` with the `runs` view over the `runs` files the
    `served` manifests list and the digest of what `records` list, as `_write_catalog` makes
    them, checked as it checks a build. Beside it, the kept copy of `kept` with the lake's rows
    (serve/kept_rows.py) changed alike: a tag rewrites only the `runs` file, so the rows are
    those of the same files, and the next reader does not copy them again (where there is no
    such copy, or it cannot be made, the next reader copies the rows). The kept rows of views
    that audits read, some of which read the `runs` row, are dropped from it, for the next
    reader to compute.

    Both files are changed through the in-memory DuckDB `con` (`scratch_connection`), each
    attached in turn.

    Raises:
        LakeError: The new catalog cannot be written or lacks views.
    """
    import duckdb

    older = any(
        step.schema_version < schema.SCHEMA_VERSION
        for record in served
        for step in record.steps.values()
    )
    runs_sql = base_view_sql(schema.RUNS, _listed_files(store, served, schema.RUNS), older)
    digest = _digest_of(records)
    rows = kept_rows.copied(kept)
    try:
        shutil.copyfile(kept, path)
        _replace_runs_view(con, path, runs_sql, digest, _catalog_url(store))
    except duckdb.Error as exc:
        raise _catalog_error(store, exc) from exc
    if rows is None:
        return
    try:
        into = private_folder(path.parent / kept_rows.FOLDER) / path.name
        shutil.copyfile(rows, into)
        _replace_runs_view(con, into, runs_sql, digest, str(into), kept_rows.forget_views_sql)
        kept_rows.forget_views(into)
    except (duckdb.Error, LakeError, CacheError, OSError) as exc:
        log.info("the lake's kept rows are not carried over: %s", exc)
        shutil.rmtree(path.parent / kept_rows.FOLDER, ignore_errors=True)


# The alias a catalog file is attached under while `_replace_runs_view` changes it.
_CHANGED = "tokenlake_changed"


def _replace_runs_view(
    con: duckdb.DuckDBPyConnection,
    path: Path,
    runs_sql: str,
    digest: str,
    named: str,
    also: Callable[[str], str] | None = None,
) -> None:
    """In the catalog file `path`, attached to `con`: the `runs` view as `runs_sql` and the
    listed files' `digest` (and the statement `also` gives for the attached database's name),
    written in full, then attached again read-only to check it holds every view.

    Raises:
        LakeError: (naming the catalog as `named`) DuckDB could not fold its log into the
            file, or views are missing.
        duckdb.Error: DuckDB failed.
    """
    target = quote_literal(str(path))
    con.execute(f"ATTACH {target} AS {_CHANGED} (STORAGE_VERSION '{_STORAGE_VERSION}')")
    try:
        con.execute(f"CREATE OR REPLACE VIEW {_CHANGED}.main.{schema.RUNS} AS {runs_sql}")
        _record_listed(con, digest, f"{_CHANGED}.main.")
        if also is not None:
            con.execute(also(_CHANGED))
        con.execute(f"CHECKPOINT {_CHANGED}")
    finally:
        con.execute(f"DETACH {_CHANGED}")
    if Path(f"{path}.wal").exists():  # DuckDB could not fold its log into the file
        raise LakeError(named, "catalog could not be written in full")
    con.execute(f"ATTACH {target} AS {_CHANGED} (READ_ONLY)")
    try:
        missing = missing_views(con, _CHANGED)
    finally:
        con.execute(f"DETACH {_CHANGED}")
    if missing:
        names = ", ".join(f"`{v}`" for v in missing)
        raise LakeError(named, f"catalog lacks views {names} after its build")


def _catalog_url(store: Store) -> str:
    return store.url(store.catalog_name)


def create_all_views(
    con: duckdb.DuckDBPyConnection, store: Store, records: list[manifest.RunManifest]
) -> list[str]:
    """Base views over the files `records` list, macros, tokenlake's views (the rollups over
    their stored files where every step has current ones) and the user's; returns one line for
    steps without current rollups, then the skipped user views."""
    with ctrl_c_from_duckdb():
        return _create_all_views(con, store, records)


def _create_all_views(
    con: duckdb.DuckDBPyConnection,
    store: Store,
    records: list[manifest.RunManifest],
    made_ahead: bool = False,
) -> list[str]:
    """Every view of the catalog `con` over the files `records` list, the rollups over their
    stored files where every step has current ones, and the user's views; returns the lines of
    what is not served. `made_ahead`: `con` already holds the macros and the views of `sql/`
    (`CatalogAhead`), so only the base views and the rollups' views are made."""
    reading = store.reading_filesystem()
    if reading is not None:  # an object store: DuckDB reads it through fsspec
        con.register_filesystem(reading)
    records, unserved = served_records(store, records, reading)
    stored = _stored_rollups(store, records)
    # tokenlake's own objects in few transactions: a catalog file commits (writes its log)
    # after each statement otherwise, ~100 times a build. The base views and macros in one,
    # committed for the second connection that makes half of each layer of views; then a
    # transaction a layer and connection. The user views follow one by one, since a failed
    # statement ends a transaction and a user view that fails is skipped alone.
    con.execute("BEGIN TRANSACTION")
    create_base_views(con, store, records)
    if made_ahead:
        redefine_sql_views(con, stored.queries)
        con.execute("COMMIT")
    else:
        for path in iter_macro_files():
            con.execute(path.read_text(encoding="utf-8"))
        con.execute("COMMIT")
        create_sql_views(con, stored.queries)
    problems = [*unserved, stored.problem] if stored.problem else unserved
    return problems + create_user_views(con, store)


def _stored_rollups(store: Store, records: list[manifest.RunManifest]) -> rollups.CatalogRollups:
    return rollups.catalog_views(
        [step for record in records for step in record.steps.values()],
        {name: _listed_files(store, records, name) for name in schema.ROLLUP_TABLES},
    )


class CatalogAhead:
    """A catalog's views made ahead, in a thread, while an extraction reads and writes its
    steps: every view of `sql/` from its file, over base views that list no file (typed as
    the schema says), in a private temporary folder. At publish (`build_catalog(store,
    ahead=...)`) the same connection gives it the base views and stored rollups over the files
    the manifests then list, the user's views and the digest: what a full build makes, since a
    view binds the views it reads when it is queried (tests/serve/test_catalog_ahead.py
    compares both). Binding the views is most of a build (~0.15 s of the example's ~0.2 s);
    DuckDB does it without the GIL, on the core the steps leave free.
    """

    def __init__(self, store: Store) -> None:
        _sweep_stale_ahead_folders()
        self._folder = Path(
            tempfile.mkdtemp(prefix=f"{_AHEAD_PREFIX}{_pid_namespace()}-{os.getpid()}-")
        )
        self._made: tuple[duckdb.DuckDBPyConnection, Path] | None = None
        self._background = Background(lambda: self._make(store), "tokenlake-catalog-ahead")

    def _make(self, store: Store) -> None:
        path = self._folder / "catalog.duckdb"
        try:
            self._made = (_make_ahead(path, store), path)
        except Exception:  # noqa: BLE001 - the full build at publish then fails with its error
            self._made = None

    def taken(self) -> tuple[duckdb.DuckDBPyConnection, Path] | None:
        """The open connection to the catalog made ahead, and its file, once made (None:
        making it failed, or it was taken). Whoever takes it closes it."""
        self._background.wait()
        made, self._made = self._made, None
        return made

    def discard(self) -> None:
        """Wait for the thread, then close what was not taken and delete the folder."""
        made = self.taken()
        if made is not None:
            made[0].close()
        shutil.rmtree(self._folder, ignore_errors=True)


# The folders of catalogs made ahead, in the system's temporary folder:
# `<prefix><pid namespace>-<pid>-<random>`.
_AHEAD_PREFIX = "tokenlake-catalog-"
_AHEAD_FOLDER = re.compile(rf"^{_AHEAD_PREFIX}([0-9]+)-([0-9]+)-[a-z0-9_]+\Z")


def _pid_namespace() -> int:
    """The inode of this process's pid namespace (0 where the OS does not say): a pid names a
    process only within it, and containers that share a temporary folder have their own."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _sweep_stale_ahead_folders() -> None:
    """Delete the folders of catalogs made ahead by this user's processes that are gone (an
    extraction killed with SIGKILL cannot delete its own); never a link, nor another user's,
    nor one made in another pid namespace (whose pids this process cannot judge)."""
    root = Path(tempfile.gettempdir())
    try:
        entries = list(os.scandir(root))
    except OSError:
        return
    namespace = _pid_namespace()
    for entry in entries:
        match = _AHEAD_FOLDER.match(entry.name)
        if match is None or int(match.group(1)) != namespace or process_alive(int(match.group(2))):
            continue
        try:
            if (
                entry.is_dir(follow_symlinks=False)
                and entry.stat(follow_symlinks=False).st_uid == os.getuid()
            ):
                shutil.rmtree(entry.path, ignore_errors=True)
        except OSError:
            continue


def _make_ahead(path: Path, store: Store) -> duckdb.DuckDBPyConnection:
    """A connection to a new catalog file `path` holding the base views over no file, the
    macros and every view of `sql/`."""
    import duckdb

    con = duckdb.connect(str(path), config={"storage_compatibility_version": _STORAGE_VERSION})
    try:
        con.execute("BEGIN TRANSACTION")
        create_base_views(con, store, [])
        for macro in iter_macro_files():
            con.execute(macro.read_text(encoding="utf-8"))
        con.execute("COMMIT")
        create_sql_views(con)
    except BaseException:
        con.close()
        raise
    return con


# How a catalog records the digest of the file lists it was built from: a macro, like the
# views' own, so the catalog still holds views only (what BI tools list).
_BUILT_FROM = "tokenlake_listed_digest"


def listed_digest(store: Store) -> str:
    """blake2b of every file the lake's manifests list, by run and table (relative names, so
    a moved lake has the same digest).

    Raises:
        LakeError: A manifest is damaged or cannot be read.
    """
    return _digest_of(manifest.load_all(store))


def _digest_of(records: list[manifest.RunManifest]) -> str:
    digest = hashlib.blake2b(digest_size=16)
    for record in records:
        for table in schema.LAKE_TABLES:
            for name in record.files(table):
                line = f"{record.run}\0{table}\0{name}\n"
                digest.update(line.encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


def _record_listed(con: duckdb.DuckDBPyConnection, digest: str, where: str = "") -> None:
    """The digest recorded in the catalog `con` writes (`where`: `db.schema.` of an attached
    one)."""
    con.execute(f"CREATE OR REPLACE MACRO {where}{_BUILT_FROM}() AS {quote_literal(digest)}")


def recorded_digest(con: duckdb.DuckDBPyConnection) -> str | None:
    """The digest a catalog recorded when it was built (None: it recorded none), read from the
    macro's definition, never by running it (the file may be anybody's)."""
    rows = con.execute(
        "SELECT macro_definition FROM system.main.duckdb_functions()"
        " WHERE function_name = ? AND function_type = 'macro'",
        [_BUILT_FROM],
    ).fetchall()
    if len(rows) != 1 or not _DIGEST_LITERAL.fullmatch(str(rows[0][0])):
        return None
    return str(rows[0][0])[1:-1]


_DIGEST_LITERAL = re.compile(r"'[0-9a-f]{32}'")


# Storage format 1.0: DuckDB clients from 1.0 on can open the file (it holds only views);
# reading the views needs 1.2 (docs/bi.md, tests/serve/test_duckdb_oldest.py).
_STORAGE_VERSION = "v1.0.0"


def _write_catalog(
    tmp: Path,
    store: Store,
    problems: list[str],
    records: list[manifest.RunManifest] | None = None,
    made: tuple[duckdb.DuckDBPyConnection, Path] | None = None,
) -> None:
    """Build the catalog into `tmp` from `records` (default: the manifests, read now); with
    `made`, by completing the catalog `CatalogAhead` made (its connection and file)."""

    def fill(con: duckdb.DuckDBPyConnection) -> list[manifest.RunManifest]:
        # Read once: the views and the digest recorded agree.
        found = manifest.load_all(store) if records is None else records
        with ctrl_c_from_duckdb():
            problems[:] = _create_all_views(con, store, found, made_ahead=made is not None)
        return found

    _fill_catalog(tmp, store, fill, made)
    crash_point("catalog:built")  # built in full, not yet in place


def _fill_catalog(
    tmp: Path,
    store: Store,
    fill: Callable[[duckdb.DuckDBPyConnection], list[manifest.RunManifest]],
    opened: tuple[duckdb.DuckDBPyConnection, Path] | None = None,
) -> None:
    """Open the catalog file `tmp`, let `fill` create its views (it returns the manifests they
    list, whose digest the catalog records), write it whole and check it holds every view.
    `opened`: a connection to a catalog file elsewhere (`CatalogAhead`'s) that `fill` fills
    instead, closed here; once written whole that file is copied to `tmp`.

    Raises:
        LakeError: DuckDB failed, could not fold its log into the file, or views are missing.
    """
    import duckdb

    try:
        if opened is None:
            con = duckdb.connect(
                str(tmp), config={"storage_compatibility_version": _STORAGE_VERSION}
            )
            written = tmp
        else:
            con, written = opened
        try:
            _record_listed(con, _digest_of(fill(con)))
            con.execute("CHECKPOINT")  # write everything into the file now, errors included
        finally:
            con.close()
        if Path(f"{written}.wal").exists():  # DuckDB could not fold its log into the file
            raise LakeError(_catalog_url(store), "catalog could not be written in full")
        if written != tmp:
            try:
                shutil.copyfile(written, tmp)
            except OSError as exc:  # told as DuckDB's own write there is (a full disk)
                raise _catalog_error(store, exc) from exc
        with duckdb.connect(str(tmp), read_only=True) as check:
            missing = missing_views(check)
    except duckdb.Error as exc:
        raise _catalog_error(store, exc) from exc
    if missing:
        raise LakeError(
            _catalog_url(store),
            f"catalog lacks views {', '.join(f'`{v}`' for v in missing)} after its build",
        )


def _catalog_error(store: Store, exc: Exception) -> LakeError:
    """One line for a DuckDB failure while building the catalog."""
    text = str(exc)
    if "No space left" in text:
        return LakeError(
            _catalog_url(store),
            "catalog cannot be written (No space left on device); free space, then run"
            " `tokenlake views LAKE`",
        )
    if "No files found" in text or "No such file" in text:
        return LakeError(
            str(store),
            "a Parquet file vanished while the catalog was built (an extraction running?);"
            " run `tokenlake views LAKE` once it has finished",
        )
    first = text.splitlines()[0] if text else type(exc).__name__
    return LakeError(_catalog_url(store), f"catalog cannot be built ({first[:300]})")


def connect(store: Store) -> duckdb.DuckDBPyConnection:
    """A read-only connection with every view of the lake, built now from its manifests, `sql/`
    and its checked user views: tokenlake's readers never run what the catalog file holds.

    Whoever may write a shared lake's folder may replace `tokenlake.duckdb` with a database of
    their own (views that read the reader's files, macros that shadow built-ins); the file is
    for other DuckDB clients and BI tools (docs/security.md). Built afresh, the connection also
    always lists exactly the files the manifests name, wherever the lake has moved, whoever
    holds the file open. A local lake's views are built into a private temporary file (so the
    connection is read-only, as the catalog file's would be); a lake on an object store gets
    them in memory and reads its objects through fsspec (no DuckDB extension needed).

    Raises:
        LakeError: Not a lake, or no catalog yet (nothing was extracted).
    """
    catalog = store.local_catalog
    if catalog is None:  # an object store: readers never download its catalog
        return _connect_in_memory(require_lake(store))
    if not catalog.is_file():
        if not catalog.parent.is_dir() or is_dump(store):
            require_lake(store)  # says what the path is instead
        raise LakeError(
            str(store), f"has no `{layout.CATALOG_FILE}`; run `tokenlake extract` first"
        )
    return _connect_private_build(require_lake(store))


def _connect_private_build(store: Store) -> duckdb.DuckDBPyConnection:
    """The lake's catalog built into a private file, opened read-only: the views
    `LAKE/tokenlake.duckdb` would hold, in a database named `tokenlake` as there. The file is
    kept in the user's cache and opened again while the manifests, the user views and
    tokenlake's SQL are unchanged (pipeline/tokenlake/serve/catalog_cache.py).

    Another command of the user may commit new manifests meanwhile (an extraction landing a
    step, a tag, `views --recompute`) and delete the files they replace: a build that then
    fails (a file it lists is gone) is made again from the manifests as they are now, up to
    READ_ATTEMPTS builds in all."""
    records = manifest.load_all(store)
    attempts = READ_ATTEMPTS
    while True:
        try:
            con, problems = _connect_to_views_of(store, records)
            break
        except LakeError:
            attempts -= 1
            if attempts == 0 or not changed_since(store, records):
                raise
            records = manifest.load_all(store)
    for problem in problems:
        log.warning("%s", problem)
    return con


# How many times a reader reads the lake when, each time, another command of the user (an
# extraction landing steps, a tag) commits new manifests and deletes files it was reading:
# under a stress of tags and extractions every second or so, a reader overtaken once in about
# twenty was overtaken twice in a row; past this it fails with the last attempt's line.
READ_ATTEMPTS = 4


def changed_since(store: Store, records: list[manifest.RunManifest]) -> bool:
    """Whether the lake's manifests list other files than `records` now: another command of
    the user (an extraction, a tag) committed new ones, and deletes the files they replace."""
    try:
        return listed_digest(store) != _digest_of(records)
    except LakeError:
        return False


def changed_since_built(con: duckdb.DuckDBPyConnection, store: Store) -> bool:
    """Whether the lake's manifests list other files than those the catalog `con` reads was
    built from (`connect`): another command of the user committed new ones since, and deletes
    the files they replace."""
    import duckdb

    try:
        built_from = recorded_digest(con)
        return built_from is not None and built_from != listed_digest(store)
    except (duckdb.Error, LakeError):
        return False


def _connect_to_views_of(
    store: Store, records: list[manifest.RunManifest]
) -> tuple[duckdb.DuckDBPyConnection, list[str]]:
    """A read-only connection to the views of the manifests `records`, in a private file (kept
    or built for this command), and the lines its build printed.

    Raises:
        LakeError: The views cannot be built (a file they list vanished, among others).
    """
    import duckdb

    views = iter_user_view_files(store)
    folder = catalog_cache.lake_folder(store)
    if folder is None:  # no private cache: built for this command only
        con, problems = _connect_built_for_this_command(store, records)
    else:
        # Keyed on what may be served now, not only on the manifests: a file changed or
        # linked since a kept build was made is left out of a new one (serve/served.py).
        footers = catalog_cache.known_footers(folder)
        served, _ = served_records(store, records, footers=footers)
        catalog_cache.remember_footers(folder, footers)
        key = catalog_cache.catalog_key(store, served, views, Path(__file__))
        kept = catalog_cache.cached(folder, key)
        if kept is None:

            def build(path: Path) -> list[str]:
                lines: list[str] = []
                _write_catalog(path, store, lines, records)
                return lines

            def unchanged() -> bool:  # the build read the user views again
                return iter_user_view_files(store) == views

            kept = catalog_cache.keep(folder, key, build, unchanged)
        path, problems = kept
        if catalog_cache.is_kept(path):  # the lake is as the key says: its rows may be kept too
            path = kept_rows.with_rows(path, store, served)
        try:
            con = duckdb.connect(str(path), read_only=True, config=reader_config(served))
        except duckdb.Error:
            if path.exists():
                raise
            # Another command of the user kept a newer key of the lake (the lake changed, or
            # another tokenlake version read it) and deleted this one meanwhile.
            con, problems = _connect_built_for_this_command(store, records)
        else:
            catalog_cache.discard_unkept(path)
    return con, problems


def _connect_built_for_this_command(
    store: Store, records: list[manifest.RunManifest]
) -> tuple[duckdb.DuckDBPyConnection, list[str]]:
    """The lake's catalog built into a temporary file, opened read-only (the open connection
    keeps the file alive once its name is gone), and the lines its build printed."""
    import duckdb

    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="tokenlake-") as temporary:
        built = Path(temporary) / layout.CATALOG_FILE
        _write_catalog(built, store, problems, records)
        con = duckdb.connect(str(built), read_only=True, config=reader_config(records))
    return con, problems


# A lake of fewer token rows than this (one row group of a tokens file, load/write.py's
# ROW_GROUP_SIZE) is read by DuckDB on one thread: its queries' work is a few milliseconds,
# less than what a second thread costs to start and hand work to. Measured on a busy 2-core
# machine (docs/performance.md, issue 34): `audit` on the example lake (4,079 tokens) and on
# one of 100 small steps (6,338) took 10-30 ms less CPU (median of 12) with one thread than
# with DuckDB's default of one a core, and no more wall time.
ONE_THREAD_TOKENS = 1 << 17


def reader_config(
    records: list[manifest.RunManifest],
) -> dict[str, str | bool | int | float | list[str]]:
    """DuckDB's settings for a reader of the lake `records` describe: one thread on a small
    lake (ONE_THREAD_TOKENS), else DuckDB's defaults."""
    tokens = sum(step.tokens for record in records for step in record.steps.values())
    return {"threads": 1} if tokens < ONE_THREAD_TOKENS else {}


_LOCK_HOLDER = re.compile(r"Conflicting lock is held in (.*?) \(PID (\d+)\)")


def foreign_log(catalog_file: Path) -> Path:
    """Where DuckDB keeps a write-ahead log for the catalog. tokenlake never leaves one (it
    checkpoints every build); one there was written by another program that opened the catalog
    for writing, and DuckDB would replay it into every reader's view of the catalog."""
    return catalog_file.with_name(f"{catalog_file.name}.wal")


def has_foreign_log(store: Store) -> bool:
    """Whether another program's write-ahead log lies beside a local lake's catalog."""
    catalog = store.local_catalog
    return catalog is not None and os.path.lexists(foreign_log(catalog))


def _open_file(path: Path) -> duckdb.DuckDBPyConnection:
    """The catalog file opened read-only to check it (never to query it): locked down, since
    anybody who may write the lake may have written it, so nothing it holds can read a file,
    load an extension or change a setting. With another program's write-ahead log beside it,
    a private copy of the file (views only, small) is opened instead."""
    if not os.path.lexists(foreign_log(path)):
        return _locked_down(path)
    _raise_if_held(path)  # the writer may still be there: then the line that names it
    log.warning(
        "ignored `%s` beside the catalog (another program's changes; tokenlake writes none); %s",
        foreign_log(path).name,
        _removal_advice(path.parent),
    )
    with tempfile.TemporaryDirectory(prefix="tokenlake-") as folder:
        copy = Path(folder) / path.name
        shutil.copyfile(path, copy)
        return _locked_down(copy)  # the open file outlives its name


def _removal_advice(folder: Path) -> str:
    """Who can remove a foreign log: this user (`tokenlake views`), or, on a lake folder this
    user may not write, its owner."""
    if os.access(folder, os.W_OK):
        return "`tokenlake views LAKE` removes it"
    return (
        "the lake is read-only to you: whoever writes it can remove it with `tokenlake views LAKE`"
    )


def _locked_down(path: Path) -> duckdb.DuckDBPyConnection:
    import duckdb

    con = duckdb.connect(
        str(path),
        read_only=True,
        config={"autoload_known_extensions": False, "autoinstall_known_extensions": False},
    )
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
    return con


def refuse_if_held(store: Store) -> None:
    """Raise the line `query` gives if another program holds the catalog open for writing.

    Rebuilding the catalog under such a program would leave its write-ahead log beside the new
    file, so the extraction stops before it reads anything. A damaged catalog passes: the
    rebuild replaces it.

    Raises:
        LakeError: Another program holds the catalog for writing (its name and PID).
    """
    import duckdb

    catalog = store.local_catalog
    if catalog is None or not catalog.is_file():
        return
    try:
        _raise_if_held(catalog)
    except duckdb.Error as exc:
        raise _open_error(catalog, exc) from exc


def _raise_if_held(path: Path) -> None:
    """Re-raise DuckDB's lock error if a writer holds the file; any other failure to open it
    (a damaged file, a log that does not fit it) is left to whoever opens or rebuilds it."""
    import duckdb

    try:
        duckdb.connect(str(path), read_only=True).close()
    except duckdb.Error as exc:
        if "Could not set lock" in str(exc):
            raise


def _connect_in_memory(store: Store) -> duckdb.DuckDBPyConnection:
    import duckdb

    con = duckdb.connect()
    try:
        for problem in create_all_views(con, store, manifest.load_all(store)):
            log.warning("%s", problem)
    except duckdb.Error as exc:
        con.close()
        raise _catalog_error(store, exc) from exc
    except BaseException:
        con.close()
        raise
    return con


def _open_error(path: Path, exc: Exception) -> LakeError:
    """Why a local lake's catalog file cannot be opened, and what to do."""
    text = str(exc)
    if "Could not set lock" in text:
        holder = _LOCK_HOLDER.search(text)
        who = f"{holder.group(1)} (PID {holder.group(2)})" if holder else "another program"
        return LakeError(
            path,
            f"is open for writing in {who}; close it there, or open the catalog read-only"
            f" (`duckdb -readonly {path}`)",
        )
    first = text.splitlines()[0] if text else type(exc).__name__
    return LakeError(
        path, f"catalog cannot be opened ({first[:300]}); run `tokenlake views LAKE` to rebuild it"
    )


def catalog_problem(store: Store) -> str | None:
    """Why the lake's catalog is unusable (cannot be opened, lacks views) or out of date
    (lists other files than the manifests), or None.

    Raises:
        LakeError: A manifest is damaged or cannot be read.
    """
    rebuild = "run `tokenlake views LAKE` or extract again"
    if not store.exists(store.catalog_name):
        return f"catalog `{layout.CATALOG_FILE}` is missing; {rebuild}"
    current = listed_digest(store)
    if store.local_catalog is not None:
        return _local_file_problem(store, store.local_catalog, rebuild, current)
    with tempfile.TemporaryDirectory(prefix="tokenlake-") as folder:  # a copy to open
        copy = Path(folder) / layout.CATALOG_FILE
        copy.write_bytes(store.read_bytes(store.catalog_name))
        return _file_problem(copy, rebuild, current)


# The catalog files last found healthy in this process, each with its file's identity and
# the manifests' digest then: a follower checks the catalog every round, and opening it costs
# about 50 ms; any write to the file or rename over it changes its identity (ctime included).
_HEALTHY: dict[str, tuple[tuple[int, ...], str]] = {}


def _identity(path: Path) -> tuple[int, ...] | None:
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _local_file_problem(store: Store, path: Path, rebuild: str, current: str) -> str | None:
    """`_file_problem`, kept across commands: a check that finds the lake's catalog file
    healthy keeps a line of what it saw in the user's private cache (catalog_cache.py), and a
    later one that sees the same is done without DuckDB (whose import and the file's opening
    are ~0.15 s of a small lake's `verify`)."""
    seen = _healthy_line(path, current)
    if seen is not None and catalog_cache.recorded_healthy(store) == seen:
        return None
    problem = _file_problem(path, rebuild, current)
    identity = _identity(path)
    if problem is None and seen is not None and _HEALTHY.get(str(path)) == (identity, current):
        if _healthy_line(path, current) == seen:  # unchanged during the check
            catalog_cache.remember_healthy(store, seen)
    return problem


def _healthy_line(path: Path, current: str) -> str | None:
    """What makes the catalog file's check come out the same: the file's identity (a write or
    a rename over it changes its inode or ctime, which no writer of the lake can set back),
    the manifests' digest, the views a catalog must hold and this checker's code, and
    DuckDB's own file (another DuckDB might not open it). None: not to be kept (no such file,
    or another program's log beside it, about which each check warns)."""
    from importlib.util import find_spec

    identity = _identity(path)
    engine = find_spec("_duckdb")
    if identity is None or engine is None or engine.origin is None:
        return None
    if os.path.lexists(foreign_log(path)):
        return None
    try:
        engine_file = os.stat(engine.origin)
    except OSError:
        return None
    digest = hashlib.blake2b(Path(__file__).read_bytes(), digest_size=16)
    digest.update("\0".join(expected_views()).encode())
    digest.update(f"{engine.origin}\0{engine_file.st_size}\0{engine_file.st_mtime_ns}".encode())
    return " ".join([*map(str, identity), current, digest.hexdigest()])


def _file_problem(path: Path, rebuild: str, current: str) -> str | None:
    identity = _identity(path)
    if identity is not None and _HEALTHY.get(str(path)) == (identity, current):
        return None
    checked, problem = _opened_file_problem(path, rebuild, current)
    if checked and problem is None and identity is not None and _identity(path) == identity:
        _HEALTHY[str(path)] = (identity, current)
    return problem


def _opened_file_problem(path: Path, rebuild: str, current: str) -> tuple[bool, str | None]:
    """Whether the file could be checked, and its problem."""
    import duckdb

    try:
        with _open_file(path) as con:
            missing = missing_views(con)
            recorded = recorded_digest(con)
    except duckdb.Error as exc:
        if "Could not set lock" in str(exc):
            return False, None  # a client holds it for writing: not checkable, nor broken
        first = str(exc).splitlines()[0][:200]
        return True, f"catalog `{layout.CATALOG_FILE}` cannot be opened ({first}); {rebuild}"
    return True, _contents_problem(missing, recorded, current, rebuild)


def _contents_problem(
    missing: list[str], recorded: str | None, current: str, rebuild: str
) -> str | None:
    if missing:
        names = ", ".join(f"`{v}`" for v in missing[:5]) + (" ..." if len(missing) > 5 else "")
        return f"catalog `{layout.CATALOG_FILE}` lacks views {names}; {rebuild}"
    if recorded is None:
        return f"catalog `{layout.CATALOG_FILE}` does not record which files it lists; {rebuild}"
    if recorded != current:
        return (
            f"catalog `{layout.CATALOG_FILE}` lists other files than the manifests (a command"
            f" was interrupted before rebuilding it); {rebuild}"
        )
    return None
