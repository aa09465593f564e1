"""Rollups: the per-step partial aggregates that the views read instead of the tokens.

Each file of `sql/rollups/` defines one rollup as a view over the base views (its header gives
its grain, always within one step, its columns and the `drift_settings` it depends on). Two
things are done with that one definition, so every formula has one owner:

- At commit (`compute_step`), the rollup's rows for one step are computed by DuckDB from the
  step's tables while they are in memory, and stored beside the step (`LAKE/rollups/<name>/`,
  listed in the run manifest with the step's other files).
- The catalog (`catalog_views`) defines the rollup's name over those stored files when every
  step has them, computed by this tokenlake's SQL; otherwise the name keeps its definition over
  the tokens (slower, never stale) and the build says so in one line. A rollup that depends on
  `drift_settings` serves its stored rows only while the session's settings are the ones they
  were computed with; under other settings (a TEMP override, `--set`) the same name computes
  its rows from the tokens for that query.

docs/rollups.md describes what each holds and how they are kept current and checked.
"""

from __future__ import annotations

import hashlib
import math
import re
import threading
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING

from tokenlake import schema
from tokenlake.errors import LakeError, ctrl_c_from_duckdb
from tokenlake.layout import partition_patterns
from tokenlake.serve.sql_views import (
    base_view_sql,
    create_views_reading,
    documented_columns,
    iter_macro_files,
    iter_rollup_files,
    quote_literal,
    run_script,
    sql_dir,
    view_inputs,
    view_query,
    view_settings,
)
from tokenlake.threads import Background, wait_for

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

    from tokenlake.store.manifest import StepRecord

# The DuckDB types a rollup's header may give its columns (`schema.ARROW_TYPES` maps them).
_ROLLUP_TYPES = ("BOOLEAN", "INTEGER", "BIGINT", "DOUBLE", "VARCHAR")
# Every rollup's first two columns: the step, which its files' partition folders name.
_STEP_COLUMNS = (schema.RUN, schema.ROLLOUT_ID)


@dataclass(frozen=True)
class StepRollups:
    """One step's rollup rows (without `run` and `rollout_id`, which its folders name), the
    SQL digest they were computed with, and the settings digest of each that depends on
    `drift_settings`."""

    tables: dict[str, pa.Table]
    version: str
    settings: dict[str, str] = field(default_factory=dict)


@cache
def rollup_names() -> tuple[str, ...]:
    """The rollups `sql/rollups/` defines (`schema.ROLLUP_TABLES` names the same, in order);
    read once, as every step's commit asks."""
    return tuple(path.stem for path in iter_rollup_files())


@cache
def rollup_version() -> str:
    """The digest of every SQL file tokenlake runs (views, rollups, macros, audits) and of the
    schema version: rollups computed under another digest may hold other numbers, so they are
    served only under this one."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"schema {schema.SCHEMA_VERSION}\n".encode())
    root = sql_dir()
    for path in sorted(root.rglob("*.sql")):
        digest.update(f"{path.relative_to(root).as_posix()}\n".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


@cache
def _columns(name: str) -> tuple[tuple[str, str], ...]:
    """The rollup's columns as its header documents them (name, DuckDB type)."""
    path = sql_dir() / "rollups" / f"{name}.sql"
    columns = documented_columns(path)
    if tuple(c for c, _ in columns[:2]) != _STEP_COLUMNS:
        raise LakeError(path, "a rollup's first columns must be `run` and `rollout_id`")
    unknown = [(c, t) for c, t in columns if t not in _ROLLUP_TYPES]
    if unknown:
        raise LakeError(
            path, f"column `{unknown[0][0]}` has type {unknown[0][1]}, not one a rollup stores"
        )
    return tuple(columns)


def rollup_schema(name: str) -> pa.Schema:
    """The columns of a rollup's files: its documented columns after `run` and `rollout_id`."""
    import pyarrow as pa

    return pa.schema([pa.field(c, schema.ARROW_TYPES[t]) for c, t in _columns(name)[2:]])


@cache
def settings_of(name: str) -> tuple[str, ...]:
    """The `drift_settings` columns a rollup's rows depend on (its header's `Settings:`)."""
    path = sql_dir() / "rollups" / f"{name}.sql"
    settings = view_settings(path.read_text(encoding="utf-8"))
    if settings is None:
        raise LakeError(path, "has no `-- Settings:` line in its header")
    return settings


def settings_digest_sql(columns: Sequence[str]) -> str:
    """A SQL expression over `drift_settings`' columns: the digest of their values, the same
    at commit and in a query (each value as DuckDB writes it as text)."""
    values = ", ".join(f"COALESCE({column}::VARCHAR, 'NULL')" for column in columns)
    return f"md5(concat_ws('|', {values}))"


# ---------------------------------------------------------------------------------------------
# At commit: one step's rollups from its tables in memory
# ---------------------------------------------------------------------------------------------

_STEP_TOKENS = "tokenlake_step_tokens"
_STEP_SAMPLES = "tokenlake_step_samples"
_DRIFT_TOKENS = "drift_tokens"  # the view (sql/drift_tokens.sql) most rollups read
_TEACHER_TOKENS = "drift_teacher_tokens"  # sql/drift_teacher_tokens.sql
_local = threading.local()  # one connection per thread: steps run in threads and processes


def compute_step(tokens: pa.Table, samples: pa.Table, run: str, rollout_id: int) -> StepRollups:
    """Every rollup's rows for one step (a train step or an eval file), computed by the
    rollups' own SQL over the step's tables (without partition columns, as written).

    DuckDB runs single-threaded here: extraction already runs one step per worker.
    """
    return compute_steps([StepTables(tokens, samples, rollout_id)], run)[0]


@dataclass(frozen=True)
class StepTables:
    """One step's tables as written (without partition columns), and its rollout id."""

    tokens: pa.Table
    samples: pa.Table
    rollout_id: int


def compute_steps(steps: Sequence[StepTables], run: str) -> list[StepRollups]:
    """`compute_step` for several steps of one run at once: the ten queries run once over
    their tables together, and each step gets its own rows.

    A rollup's grain lies within one step, so a step's rows are the ones it gives alone, in
    the same order: DuckDB, single-threaded, reads the rows of each step in the same order and
    adds them up in it (tests/orchestrate/test_step_batches.py compares both, bit for bit). Most
    of a small step's rollup cost is DuckDB binding and planning the queries, paid here once
    for the steps together. Each step's rows carry its place in `steps` as their `rollout_id`,
    which the rollups use as a key only: a train step and its eval file, of one rollout id,
    are two steps here too.
    """
    con = _step_connection()
    with ctrl_c_from_duckdb():
        tables = _compute_steps(con, steps, run)
        settings = {
            name: _settings_digest(con, columns)
            for name in rollup_names()
            if (columns := settings_of(name))
        }
    version = rollup_version()
    return [StepRollups(each, version, dict(settings)) for each in tables]


_STEP_KEY = "tokenlake_step_key"  # the `rollout_id` of steps computed together: their place


def _compute_steps(
    con: duckdb.DuckDBPyConnection, steps: Sequence[StepTables], run: str
) -> list[dict[str, pa.Table]]:
    import pyarrow as pa

    if len(steps) == 1:  # the step is a constant: no column to add
        tokens, samples = steps[0].tokens, steps[0].samples
        rollout_id = f"{int(steps[0].rollout_id)}::BIGINT"
    else:
        tokens = pa.concat_tables([_keyed(step.tokens, key) for key, step in enumerate(steps)])
        samples = pa.concat_tables([_keyed(s.samples, key) for key, s in enumerate(steps)])
        rollout_id = _STEP_KEY
    con.register(_STEP_TOKENS, tokens)
    con.register(_STEP_SAMPLES, samples)
    try:
        keys = f"{quote_literal(run)}::VARCHAR AS {schema.RUN}, {rollout_id} AS {schema.ROLLOUT_ID}"
        rest = f"* EXCLUDE ({_STEP_KEY})" if len(steps) > 1 else "*"
        con.execute(
            f"CREATE OR REPLACE TEMP VIEW {schema.TOKENS} AS SELECT {keys}, {rest} FROM {_STEP_TOKENS}"
        )
        con.execute(
            f"CREATE OR REPLACE TEMP VIEW {schema.SAMPLES} AS SELECT {keys}, {rest} FROM {_STEP_SAMPLES}"
        )
        _materialise_drift_tokens(con, run, rollout_id, together=len(steps) > 1)
        empty: frozenset[str] = frozenset()
        if not _has_rows(con, f"temp.{_DRIFT_ROWS}"):
            empty |= drift_token_rollups()
        if not _has_teacher_log_probs(tokens) or not _has_rows(con, _TEACHER_TOKENS):
            empty |= teacher_token_rollups()  # most runs: no teacher log-probs
        computed = {
            name: _rows(con, name, len(steps) > 1) for name in rollup_names() if name not in empty
        }
    finally:
        con.execute(f"DROP VIEW IF EXISTS temp.{_DRIFT_TOKENS}")
        con.execute(f"DROP TABLE IF EXISTS temp.{_DRIFT_ROWS}")  # the steps' memory, freed
        con.unregister(_STEP_TOKENS)
        con.unregister(_STEP_SAMPLES)
    return [
        {
            name: rollup_schema(name).empty_table()
            if name in empty
            else _step_rows(name, computed[name], key, len(steps) > 1)
            for name in rollup_names()
        }
        for key in range(len(steps))
    ]


_DRIFT_ROWS = "tokenlake_step_drift_rows"  # drift_tokens' rows of the steps, computed once


def _materialise_drift_tokens(
    con: duckdb.DuckDBPyConnection, run: str, rollout_id: str, together: bool
) -> None:
    """Compute `drift_tokens` once for the steps (the per-token terms seven rollups read) into a
    TEMP table, shadowed by a TEMP view of the same name for every view of this connection.

    The table leaves out the columns that hold one value for every row (`run`; `rollout_id`
    of a lone step), which the view gives back as constants: the table is smaller to write
    (the run's strings were a fifth of it), and the rollups group and join on constant keys,
    which DuckDB does for less (13 % fewer instructions for a bench step's rollups,
    docs/performance.md). The rows, and their order, are the same.
    """
    constant = [schema.RUN] if together else [schema.RUN, schema.ROLLOUT_ID]
    con.execute(
        f"CREATE OR REPLACE TEMP TABLE {_DRIFT_ROWS} AS"
        f" SELECT * EXCLUDE ({', '.join(constant)}) FROM main.{_DRIFT_TOKENS}"
    )
    keys = f"{quote_literal(run)}::VARCHAR AS {schema.RUN}"
    if not together:
        keys += f", {rollout_id} AS {schema.ROLLOUT_ID}"
    con.execute(
        f"CREATE OR REPLACE TEMP VIEW {_DRIFT_TOKENS} AS SELECT {keys}, * FROM {_DRIFT_ROWS}"
    )


def _keyed(table: pa.Table, key: int) -> pa.Table:
    """A step's table with its key as a last column (the steps computed together)."""
    import numpy as np
    import pyarrow as pa

    return table.append_column(_STEP_KEY, pa.array(np.full(table.num_rows, key, np.int64)))


def _step_rows(name: str, rows: pa.Table, key: int, together: bool) -> pa.Table:
    """One step's rows of a rollup, as `_rows` gives them in the stored order; of several steps
    computed `together` (ordered by their key first): the slice whose `rollout_id` is the
    step's key, without that column."""
    if not together:
        return rows
    import numpy as np

    keys = rows.column(schema.ROLLOUT_ID).to_numpy()
    start, end = np.searchsorted(keys, [key, key + 1])
    return rows.slice(int(start), int(end - start)).drop_columns([schema.ROLLOUT_ID])


@cache
def _row_order(name: str) -> str:
    """The order a step's rows of a rollup are stored in, as an ORDER BY list: its rank column
    first where it has one (`k3_rank`, `outlier_rank`: the order its delta-encoded integers
    compress best in), then every column in its header's order, each ascending with NULLs
    last (NaN after every number, before NULL). A function of the step's rows alone, so the
    step's files are the same bytes whether its rollups were computed alone or with other
    steps': a hash aggregate gives its groups in an order that depends on all the rows it saw.
    """
    names = [column for column, _ in _columns(name)[2:]]
    ranks = [column for column in names if column.endswith("_rank")]
    ordered = [*ranks, *(column for column in names if column not in ranks)]
    return ", ".join(f"{column} ASC NULLS LAST" for column in ordered)


def _has_teacher_log_probs(tokens: pa.Table) -> bool:
    """Whether a token row has a teacher log-prob: without one `drift_teacher_tokens`, which
    keeps the rows with a finite one, is empty, as the column's null count tells without the
    scan of the tokens that counting the view's rows costs (5 ms a 600 k-token step)."""
    if schema.TEACHER_LOG_PROB not in tokens.column_names:
        return True  # the view says
    column = tokens.column(schema.TEACHER_LOG_PROB)
    return column.null_count < len(column)


def _has_rows(con: duckdb.DuckDBPyConnection, table: str) -> bool:
    rows = con.execute(f"SELECT count(*) FROM {table}").fetchall()
    return bool(rows[0][0])


@cache
def drift_token_rollups() -> frozenset[str]:
    """The rollups whose `Inputs:` are `drift_tokens` alone (with `drift_settings`): each has
    one row per key of at least one drift token, so none for a step without any (an eval
    file, a rollout-only step), whose commit then skips their SQL (tests/serve check it)."""
    return _reading_only(_DRIFT_TOKENS)


@cache
def teacher_token_rollups() -> frozenset[str]:
    """The rollups whose `Inputs:` are `drift_teacher_tokens` alone: none of their rows for a
    step without a finite teacher log-prob, whose commit skips their SQL likewise."""
    return _reading_only(_TEACHER_TOKENS)


def _reading_only(population: str) -> frozenset[str]:
    """The rollups that read one token population view and nothing else but the settings."""
    alone = {population, "drift_settings"}
    names = set()
    for path in iter_rollup_files():
        inputs = view_inputs(path.read_text(encoding="utf-8")) or ()
        if population in inputs and set(inputs) <= alone:
            names.add(path.stem)
    return frozenset(names)


def _settings_digest(con: duckdb.DuckDBPyConnection, columns: Sequence[str]) -> str:
    rows = con.execute(f"SELECT {settings_digest_sql(columns)} FROM drift_settings").fetchall()
    return str(rows[0][0])  # drift_settings has one row


def _rows(con: duckdb.DuckDBPyConnection, name: str, together: bool = False) -> pa.Table:
    """A rollup's rows in their stored order (`_row_order`), checked against and cast to its
    documented columns; with `together` (several steps), with their `rollout_id` first and
    ordered by it first."""
    kept = _STEP_COLUMNS[:1] if together else _STEP_COLUMNS
    order = f"{schema.ROLLOUT_ID}, {_row_order(name)}" if together else _row_order(name)
    query = f"SELECT * EXCLUDE ({', '.join(kept)}) FROM {name} ORDER BY {order}"
    # `execute`, not `sql`: a relation binds the query once more before it runs, and binding
    # the nested views is most of a small step's cost (its rows are few: their copy is not).
    with warnings.catch_warnings():  # that Arrow output of `execute` copies the rows once
        warnings.filterwarnings("ignore", "Arrow output on a DB-API result", UserWarning)
        table = con.execute(query).to_arrow_table()
    assert table is not None  # a query gives a table, empty or not
    wanted = rollup_schema(name)
    if together:
        import pyarrow as pa

        wanted = pa.schema([pa.field(schema.ROLLOUT_ID, pa.int64()), *wanted])
    if table.schema.names != wanted.names:
        raise LakeError(
            sql_dir() / "rollups" / f"{name}.sql",
            f"gives columns {', '.join(table.schema.names)}; its header documents {', '.join(wanted.names)}",
        )
    return table if table.schema == wanted else table.cast(wanted)


def default_settings_digests() -> dict[str, str]:
    """The settings digest of each rollup that depends on `drift_settings`, under the defaults
    of `sql/drift_settings.sql`: what `compute_step` records."""
    con = _step_connection()
    return {
        name: _settings_digest(con, columns)
        for name in rollup_names()
        if (columns := settings_of(name))
    }


def is_current(step: StepRecord, settings: dict[str, str]) -> bool:
    """Whether a step's rollups are this tokenlake's, computed under `settings` (as
    `default_settings_digests` gives): nothing to compute again."""
    return has_this_sql(step) and step.rollup_settings == settings


def has_this_sql(step: StepRecord) -> bool:
    """Whether a step lists every rollup, computed by this tokenlake's SQL (under whichever
    settings)."""
    return step.rollup_version == rollup_version() and all(
        name in step.files for name in rollup_names()
    )


# Floats computed in another order (DuckDB's sums) may differ in the last bits: equal within
# this relative distance, or this absolute one near zero.
TOLERANCE = 1e-12


def differences(name: str, stored: pa.Table, computed: pa.Table) -> str | None:
    """How one step's stored rows of a rollup differ from the rows computed from its tokens
    (None: the same rows; counts, keys and flags exactly, floats within TOLERANCE).

    Examples:
        >>> import pyarrow as pa
        >>> t = pa.table({"k": [1, 2], "x": [0.5, 1.0]})
        >>> differences("r", t, t) is None
        True
        >>> differences("r", t, pa.table({"k": [1, 2], "x": [0.5, 1.5]}))
        'row 2 of 2: `x` is 1.0 stored, 1.5 from the tokens'
    """
    if stored.schema.names != computed.schema.names:
        return f"columns {', '.join(stored.schema.names)}; the tokens give {', '.join(computed.schema.names)}"
    if stored.num_rows != computed.num_rows:
        return f"{stored.num_rows:,} rows stored; the tokens give {computed.num_rows:,}"
    left, right = _sorted_rows(stored), _sorted_rows(computed)
    for number, (a, b) in enumerate(zip(left, right, strict=True), start=1):
        for column, x, y in zip(stored.schema.names, a, b, strict=True):
            if not _same(x, y):
                return f"row {number} of {len(left)}: `{column}` is {x!r} stored, {y!r} from the tokens"
    return None


def _sorted_rows(table: pa.Table) -> list[tuple[object, ...]]:
    """The rows, ordered by their exact columns (keys, counts, flags), then the floats."""
    import pyarrow as pa

    rows = list(zip(*(table.column(i).to_pylist() for i in range(table.num_columns)), strict=True))
    exact = [i for i, f in enumerate(table.schema) if not pa.types.is_floating(f.type)]
    floats = [i for i, f in enumerate(table.schema) if pa.types.is_floating(f.type)]

    def key(row: tuple[object, ...]) -> tuple[object, ...]:
        return tuple((row[i] is None, repr(row[i])) for i in (*exact, *floats))

    return sorted(rows, key=key)


def _same(x: object, y: object) -> bool:
    if isinstance(x, float) and isinstance(y, float):
        if math.isnan(x) or math.isnan(y):
            return math.isnan(x) and math.isnan(y)
        return math.isclose(x, y, rel_tol=TOLERANCE, abs_tol=TOLERANCE)
    return x == y


def prepare_step_connection() -> None:
    """Start making this thread's connection for the rollups in another thread, unless it has
    one: DuckDB binds the views without holding the GIL, so the caller reads and flattens its
    steps meanwhile (about 0.06 s of CPU a process, on the second core). The connection is
    taken when the first rollups are computed; if making it failed, it is made again then, so
    that the error comes where it would have come without this."""
    if getattr(_local, "con", None) is None and getattr(_local, "pending", None) is None:
        _local.pending = _PendingConnection()


def step_connection_imported() -> None:
    """Wait until the connection `prepare_step_connection` started has imported every module
    it needs (DuckDB's import, ~0.1 s; not the binding after it), if one is being made.

    A caller that imports modules meanwhile holds a Ctrl-C until then: a Ctrl-C that lands
    inside an import while another thread imports can leave Python's import lock held
    (CPython 3.11: a module lock's weakref callback takes it outside its `try`), and the other
    thread, then the process's exit, wait for it forever."""
    pending: _PendingConnection | None = getattr(_local, "pending", None)
    if pending is not None:
        wait_for(pending.imported)


class _PendingConnection:
    """A step connection being made in its own thread (a process that exits meanwhile waits
    the few milliseconds left rather than leave DuckDB mid-statement)."""

    def __init__(self) -> None:
        self._made: duckdb.DuckDBPyConnection | None = None
        self.imported = threading.Event()  # set also when making it failed
        self._background = Background(self._make, "tokenlake-rollups-connection")

    def _make(self) -> None:
        try:
            self._made = _new_step_connection(self.imported.set)
        except BaseException:  # noqa: BLE001 - made again by the caller, who gets the error
            self._made = None
        finally:
            self.imported.set()

    def taken(self) -> duckdb.DuckDBPyConnection | None:
        """The connection once made (None: it failed)."""
        self._background.wait()
        return self._made


def _step_connection() -> duckdb.DuckDBPyConnection:
    con: duckdb.DuckDBPyConnection | None = getattr(_local, "con", None)
    if con is None:
        pending: _PendingConnection | None = getattr(_local, "pending", None)
        _local.pending = None
        con = pending.taken() if pending is not None else None
        if con is None:
            con = _new_step_connection()
        _local.con = con
    return con


def _new_step_connection(imported: Callable[[], None] = lambda: None) -> duckdb.DuckDBPyConnection:
    """A connection that computes rollups; `imported()` is called once it has imported and
    read what it needs, before DuckDB binds the views."""
    import duckdb

    con = duckdb.connect(config={"threads": 1, "autoload_known_extensions": False})
    # The tables typed and empty (tokens and samples become the step's), then the macros.
    tables = [f"CREATE VIEW {table} AS {base_view_sql(table, [])}" for table in schema.TABLES]
    macros = [path.read_text(encoding="utf-8") for path in iter_macro_files()]
    rollup_names()
    imported()
    run_script(con, [*tables, *macros])
    # The views a commit queries, and what they read: not the ~20 others (each costs its binding).
    create_views_reading(con, (*rollup_names(), "drift_settings", _DRIFT_TOKENS, _TEACHER_TOKENS))
    return con


def recomputed_rollups(con: duckdb.DuckDBPyConnection, catalog_settings: str) -> list[str]:
    """The rollups whose rows a connection computes from the tokens because its
    `drift_settings` (a TEMP override) differ, in the columns the rollup depends on, from the
    catalog's (`catalog_settings`: its qualified name), which the stored rows were computed
    with."""
    changed = []
    for name in rollup_names():
        columns = settings_of(name)
        if not columns:
            continue
        digest = settings_digest_sql(columns)
        rows = con.execute(
            f"SELECT (SELECT {digest} FROM drift_settings)"
            f" <> (SELECT {digest} FROM {catalog_settings})"
        ).fetchall()
        if rows[0][0]:
            changed.append(name)
    return changed


# ---------------------------------------------------------------------------------------------
# In the catalog: each rollup over its stored files, or over the tokens
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CatalogRollups:
    """The SQL the catalog defines stored rollups with (name -> query), and one line for the
    steps whose rollups cannot be served (None: every step's can)."""

    queries: dict[str, str]
    problem: str | None


def catalog_views(
    steps: Sequence[StepRecord],
    files: dict[str, list[str]],
    settled: Mapping[str, str] | None = None,
) -> CatalogRollups:
    """How the catalog defines each rollup, given every step record of the lake and each
    rollup's files (paths or URLs, as the base views list them).

    Args:
        settled: For a connection whose `drift_settings` are fixed (`settings_digests` of
            them): a rollup whose steps were computed under those settings reads its files
            alone, without the guard that falls back to the tokens when the settings differ
            (planning that fallback costs more than reading one step's rows).
    """
    lacking = [s for s in steps if not has_this_sql(s)]
    queries: dict[str, str] = {}
    mixed = 0
    if not lacking:
        for name in rollup_names():
            settings = settings_of(name)
            digests = {s.rollup_settings.get(name) for s in steps}
            if settings and len(digests) > 1:
                mixed += 1
                continue
            query = _stored_query(name, files.get(name, []))
            digest = next(iter(digests), None)
            fixed = settled is not None and settled.get(name) == digest
            if settings and digest is not None and not fixed:
                query = _guarded(name, query, settings, digest)
            queries[name] = query
    return CatalogRollups(queries, _problem(len(lacking), len(steps), mixed))


def _problem(lacking: int, steps: int, mixed: int) -> str | None:
    if lacking:
        return (
            f"{lacking:,} of {steps:,} steps have no rollups of this tokenlake version: the views"
            " read the tokens (slower) until `tokenlake views LAKE` computes them"
        )
    if mixed:
        return (
            f"{mixed} rollups were computed with different drift_settings defaults across steps:"
            " they read the tokens (slower) until `tokenlake views LAKE` computes them again"
        )
    return None


def _stored_query(name: str, files: Iterable[str]) -> str:
    """The rollup over its files, typed as its header says, the step from each file's path."""
    columns = _columns(name)
    listed = [quote_literal(str(f)) for f in files]
    if not listed:
        nothing = ", ".join(f"NULL::{t} AS {c}" for c, t in columns)
        return f"SELECT {nothing} WHERE false"
    parsed = [
        f"CAST(regexp_extract(filename, {quote_literal(pattern)}, 1) AS {t}) AS {c}"
        for (c, t), pattern in zip(columns[:2], partition_patterns(name).values(), strict=True)
    ]
    typed = [f"CAST({c} AS {t}) AS {c}" for c, t in columns[2:]]
    source = f"read_parquet([{', '.join(listed)}], hive_partitioning = false, filename = true)"
    return f"SELECT {', '.join([*parsed, *typed])} FROM {source}"


def settings_digests(con: duckdb.DuckDBPyConnection) -> dict[str, str]:
    """Per rollup that depends on `drift_settings`, the digest of the settings `con` reads
    (`settings_digest_sql`)."""
    found = {}
    for name in rollup_names():
        settings = settings_of(name)
        if settings:
            sql = f"SELECT {settings_digest_sql(settings)} FROM drift_settings"
            found[name] = str(con.execute(sql).fetchall()[0][0])
    return found


_HIT = "tokenlake_settings_hit"


def guarded(name: str, stored: str, digest: str) -> str:
    """`stored` (the rollup's rows computed under the settings digest `digest`) while the
    session's drift_settings give that digest, else the rollup computed from the tokens."""
    return _guarded(name, stored, settings_of(name), digest)


def _guarded(name: str, stored: str, settings: Sequence[str], digest: str) -> str:
    """The stored rows while the session's drift_settings give `digest`, else the rollup's
    own query over the tokens. The fallback is a join with a one-row-or-empty relation: DuckDB
    skips a hash join's probe side when its build side is empty, so the tokens are not read
    while the settings match (a WHERE on a scalar subquery would still scan them)."""
    if not re.fullmatch(r"[0-9a-f]{32}", digest):  # the manifest check allows only digests
        raise ValueError(f"not a settings digest: {digest!r}")
    current = f"(SELECT {settings_digest_sql(settings)} FROM drift_settings)"
    live = view_query(name, (sql_dir() / "rollups" / f"{name}.sql").read_text(encoding="utf-8"))
    return (
        f"SELECT * FROM ({stored}) WHERE {current} = '{digest}'\n"
        f"UNION ALL\n"
        f"SELECT live.* EXCLUDE ({_HIT}) FROM (SELECT *, 1 AS {_HIT} FROM ({live})) AS live\n"
        f"JOIN (SELECT 1 AS {_HIT} FROM drift_settings"
        f" WHERE {settings_digest_sql(settings)} <> '{digest}') AS guard USING ({_HIT})"
    )
