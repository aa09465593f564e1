"""Run SQL against a lake's catalog and render the result (`tokenlake query`).

The catalog is opened read-only, so the only way to change a drift threshold for one query is
a TEMP view that shadows `drift_settings`; `settings=` builds that view. Every drift view and
audit binds `drift_settings` when it runs, so they all follow the override.
"""

from __future__ import annotations

import io
import json
import logging
import math
import numbers
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from tokenlake.errors import (
    LakeError,
    UsageError,
    ctrl_c_from_duckdb,
    duckdb_problem,
    lake_read_error,
    shown,
)
from tokenlake.serve import catalog, rollups
from tokenlake.steps import INT64_MAX
from tokenlake.store.base import Store
from tokenlake.terminal import escape_controls, plural

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

log = logging.getLogger(__name__)

FORMATS = ("table", "csv", "json", "parquet")
SETTINGS_VIEW = "drift_settings"


def connect_reader(
    store: Store, settings: Mapping[str, float] | None = None
) -> duckdb.DuckDBPyConnection:
    """A reader's DuckDB connection to the catalog (not a `Lake`: that is
    `tokenlake.open_lake`), with `settings` overriding `drift_settings`.

    Args:
        store: The lake's store (its catalog, `tokenlake.duckdb`, or its manifests).
        settings: Column name -> value for `drift_settings`; the other columns keep their
            defaults. Only for this connection.

    Returns:
        The open connection; the caller closes it.
    """
    con = catalog.connect(store)
    try:
        if settings:
            con.execute(settings_override_sql(con, settings))
            _say_what_reads_the_tokens(con)
    except BaseException:
        con.close()
        raise
    return con


_Result = TypeVar("_Result")


def read_lake(
    store: Store,
    read: Callable[[duckdb.DuckDBPyConnection], _Result],
    settings: Mapping[str, float] | None = None,
) -> _Result:
    """`read(con)` on a reader's connection (`connect_reader`), closed after it. Another command
    of the user (an extraction landing a step, a tag) may commit new manifests while it reads,
    and delete the files the connection's views list: a read that then fails is made again on
    a connection to the lake as it is now, up to `catalog.READ_ATTEMPTS` reads in all. Whatever
    else fails is raised as it is."""
    import duckdb

    attempts = catalog.READ_ATTEMPTS
    while True:
        con = connect_reader(store, settings)
        try:
            return read(con)
        except (duckdb.Error, LakeError):
            attempts -= 1
            if attempts == 0 or not catalog.changed_since_built(con, store):
                raise
        finally:
            con.close()


def cache_footers(con: duckdb.DuckDBPyConnection) -> None:
    """Let DuckDB parse each Parquet footer once for all the queries of this connection: a
    command of many queries (`audit`, `report`) reads the same file a step again and again.
    For one command's connection only (the files were checked as it opened)."""
    con.execute("SET parquet_metadata_cache = true")


def _say_what_reads_the_tokens(con: duckdb.DuckDBPyConnection) -> None:
    """One line when the overrides change what stored rollups were computed with: those are
    computed from the tokens for this connection (right, and slower)."""
    changed = rollups.recomputed_rollups(con, _catalog_settings(con))
    if changed:
        names = ", ".join(f"`{name}`" for name in changed)
        log.warning(
            "these drift settings differ from those the stored rollups %s were computed with:"
            " they are computed from the tokens for this query (slower)",
            names,
        )


def _catalog_settings(con: duckdb.DuckDBPyConnection) -> str:
    """The catalog's own `drift_settings`, by its qualified name (a TEMP one shadows it)."""
    return catalog_view(con, SETTINGS_VIEW)


def catalog_view(con: duckdb.DuckDBPyConnection, view: str) -> str:
    """The qualified name of the catalog's own view `view` (a TEMP object of its name shadows
    the bare name)."""
    return f"{catalog_database(con)}.main.{view}"


def catalog_database(con: duckdb.DuckDBPyConnection) -> str:
    """The quoted name of the catalog's database: one query, asked once by a caller that names
    several of its views (each query costs a few milliseconds)."""
    database = con.execute("SELECT current_database()").fetchall()[0][0]
    return _quote_ident(database)


def settings_override_sql(con: duckdb.DuckDBPyConnection, settings: Mapping[str, float]) -> str:
    """`CREATE TEMP VIEW drift_settings` replacing the given columns of the catalog's view.

    Raises:
        UsageError: A name is not a column of `drift_settings`.
    """
    qualified = _catalog_settings(con)
    types = {name: type_ for name, type_, *_ in con.execute(f"DESCRIBE {qualified}").fetchall()}
    unknown = sorted(set(settings) - set(types))
    if unknown:
        names = ", ".join(f"`{name}`" for name in types)
        raise UsageError(f"Unknown drift setting `{unknown[0]}`; the settings are {names}")
    replaced = ", ".join(
        f"{_setting_in_domain(name, value, types[name])!r}::{types[name]} AS {name}"
        for name, value in settings.items()
    )
    # The temp schema is searched before `main`, so this view shadows the catalog's one for
    # every view that reads `drift_settings`; the source must name the catalog explicitly.
    return (
        f"CREATE OR REPLACE TEMP VIEW {SETTINGS_VIEW} AS "
        f"SELECT * REPLACE ({replaced}) FROM {qualified}"
    )


def _setting_value(name: str, value: object) -> float:
    """A drift setting's override as the float the SQL holds: a finite real number (the
    Python API passes them as they come; `--set` text is checked by the CLI).

    Examples:
        >>> _setting_value("alarm_k3_kl", 1)
        1.0
        >>> _setting_value("alarm_k3_kl", float("nan"))
        Traceback (most recent call last):
        ...
        tokenlake.errors.UsageError: Drift setting `alarm_k3_kl` is nan; give a finite number.
    """
    number = math.nan
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:  # an int beyond float64
            pass
    if not math.isfinite(number):
        raise UsageError(
            f"Drift setting `{shown(name, literal=False)}` is {shown(value)}; give a finite number."
        )
    return number


# Settings whose formulas have no meaning outside a range (sql/drift_settings.sql): a value
# outside it gives numbers, not an error (is_cap 0 an ess of NaN, a negative clamp a k3 of
# e - 2 for every step, a negative histogram width bins whose low edge is above the high).
_AT_LEAST_ONE = {"is_cap": "the weight cap is at least 1 (weights clamp to [1/C, C])"}
_ABOVE_ZERO = {"histogram_half_width": "give a number above 0 (nats)"}
_AT_LEAST_ZERO = {"log_ratio_clamp": "a clamp is at least 0", "k3_clamp": "a clamp is at least 0"}
_WHOLE_NUMBER = "give a whole number from 0"


def _setting_in_domain(name: str, value: object, sql_type: str) -> float | int:
    """The override as the SQL column takes it, refused outside the range where the
    setting's formulas mean something; a BIGINT column's is a whole number from 0 (a count of
    rows or tokens), not rounded by the cast.

    Examples:
        >>> _setting_in_domain("outliers_per_step", 50.0, "BIGINT")
        50
        >>> _setting_in_domain("is_cap", 0.5, "DOUBLE")
        Traceback (most recent call last):
        ...
        tokenlake.errors.UsageError: Drift setting `is_cap` is 0.5; the weight cap is at least 1 (weights clamp to [1/C, C]).
    """
    number = _setting_value(name, value)
    problem = None
    if sql_type == "BIGINT":
        if number != int(number) or not 0 <= number <= INT64_MAX:
            problem = _WHOLE_NUMBER
        else:
            return int(number)
    elif name in _AT_LEAST_ONE and number < 1:
        problem = _AT_LEAST_ONE[name]
    elif name in _ABOVE_ZERO and number <= 0:
        problem = _ABOVE_ZERO[name]
    elif name in _AT_LEAST_ZERO and number < 0:
        problem = _AT_LEAST_ZERO[name]
    if problem is not None:
        raise UsageError(
            f"Drift setting `{shown(name, literal=False)}` is {shown(value)}; {problem}."
        )
    return number


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def run_query(store: Store, sql: str, settings: Mapping[str, float] | None = None) -> pa.Table:
    """Run SQL (one or more `;`-separated statements) and return the last statement's result.

    Args:
        store: The lake's store.
        sql: The query; may read every view of the catalog.
        settings: Optional `drift_settings` overrides, see `connect_reader`.

    Returns:
        The result as an Arrow table (zero columns when the last statement returns nothing).

    Raises:
        UsageError: DuckDB rejected the query; the message is DuckDB's.
        LakeError: A file of the lake could not be read (damaged, or another program's).
    """
    return _run(store, sql, settings, _arrow_table)


def render_query(
    store: Store, sql: str, fmt: str, settings: Mapping[str, float] | None = None
) -> str | bytes:
    """`run_query`'s result rendered by `format_table`, as `tokenlake query` prints it. The
    text formats take DuckDB's rows without Arrow when they are the same values (`plain_result`).

    Raises:
        UsageError: DuckDB rejected the query, or `fmt` is not one of FORMATS.
        LakeError: A file of the lake could not be read (damaged, or another program's).
    """
    if fmt in _TEXT_FORMATS:
        return format_table(_run(store, sql, settings, plain_result), fmt)
    return format_table(run_query(store, sql, settings), fmt)


def _run(
    store: Store,
    sql: str,
    settings: Mapping[str, float] | None,
    fetch: Callable[[duckdb.DuckDBPyRelation | None], _Result],
) -> _Result:
    import duckdb

    def read(con: duckdb.DuckDBPyConnection) -> _Result:
        with ctrl_c_from_duckdb():
            return fetch(con.sql(sql))

    try:
        return read_lake(store, read, settings)
    except duckdb.Error as exc:
        location = str(store.location)
        if location.rstrip("/") + "/" in duckdb_problem(exc):  # a lake file failed, not the SQL
            raise lake_read_error(location, "a query", exc) from exc
        raise UsageError(f"Query failed: {exc}") from exc


def _arrow_table(relation: duckdb.DuckDBPyRelation | None) -> pa.Table:
    import pyarrow as pa

    return pa.table({}) if relation is None else relation.to_arrow_table()


@dataclass(frozen=True)
class Rows:
    """A result as Python rows, without Arrow: what the text formats render. It offers the
    parts of `pyarrow.Table` they and the audits use (`column_names`, `num_rows`, `slice`,
    `to_pylist`).

    Attributes:
        column_names: The columns, in order.
        numeric: Per column, whether it holds numbers (right-aligned in a table).
        rows: One tuple of values per row.
    """

    column_names: list[str]
    numeric: list[bool]
    rows: list[tuple[Any, ...]]

    @property
    def num_rows(self) -> int:
        return len(self.rows)

    def slice(self, offset: int, length: int) -> Rows:
        return Rows(self.column_names, self.numeric, self.rows[offset : offset + length])

    def to_pylist(self) -> list[dict[str, Any]]:
        return [dict(zip(self.column_names, row, strict=True)) for row in self.rows]

    @classmethod
    def of_arrow(cls, table: pa.Table) -> Rows:
        import pyarrow as pa

        numeric = [
            pa.types.is_integer(f.type)
            or pa.types.is_floating(f.type)
            or pa.types.is_decimal(f.type)
            for f in table.schema
        ]
        columns = [column.to_pylist() for column in table.columns]
        return cls(list(table.column_names), numeric, list(zip(*columns, strict=True)))


# DuckDB types whose Python values DuckDB gives exactly as Arrow's `to_pylist` would: not
# HUGEINT (an int here, a Decimal there), nor time zones (the session's zone here, UTC there).
_NUMERIC_TYPES = frozenset(
    {"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT"}
    | {"FLOAT", "DOUBLE"}
)
_PLAIN_TYPES = _NUMERIC_TYPES | {"BOOLEAN", "VARCHAR", "DATE"}
_TEXT_FORMATS = ("table", "json")


def _is_plain(type_name: str) -> bool:
    """Whether values of this DuckDB type (as `str(relation.types[i])` names it) are plain.

    Examples:
        >>> [_is_plain(t) for t in ("BIGINT", "DECIMAL(18,3)", "VARCHAR[]", "HUGEINT", "JSON")]
        [True, True, True, False, False]
    """
    if type_name.endswith("[]"):
        return _is_plain(type_name[:-2])
    return type_name in _PLAIN_TYPES or type_name.startswith("DECIMAL(")


def plain_result(
    result: duckdb.DuckDBPyRelation | duckdb.DuckDBPyConnection | None,
) -> Rows | pa.Table:
    """A result's rows (a relation, or a connection after `execute`) as `Rows` when every
    column is of a type whose values DuckDB's rows and Arrow give alike (pyarrow is not even
    imported), else as an Arrow table."""
    if result is None or result.description is None:
        return Rows([], [], [])
    names = [column[0] for column in result.description]
    types = [str(column[1]) for column in result.description]
    if not all(_is_plain(t) for t in types):
        with warnings.catch_warnings():  # that Arrow output of `execute` copies the rows once
            warnings.filterwarnings("ignore", "Arrow output on a DB-API result", UserWarning)
            return result.to_arrow_table()
    numeric = [t in _NUMERIC_TYPES or t.startswith("DECIMAL(") for t in types]
    return Rows(names, numeric, result.fetchall())


def format_table(table: pa.Table | Rows, fmt: str) -> str | bytes:
    """Render a result as text ("table", "csv", "json") or Parquet bytes ("parquet").

    "json" writes JSON Lines: one object per row, keys in column order; NaN and infinities,
    which JSON cannot hold, become null. "table" rounds floats to 6 significant digits and
    shows NULL for missing values.

    Examples:
        >>> import pyarrow as pa
        >>> print(format_table(pa.table({"step": [0, 1], "k3": [0.001234567, None]}), "table"))
        step          k3
        ----  ----------
           0  0.00123457
           1        NULL
        (2 rows)
    """
    if fmt == "table":
        return _format_text(_as_rows(table))
    if fmt == "json":
        return _format_json(_as_rows(table))
    if fmt == "csv":
        return _format_csv(_as_arrow(table))
    if fmt == "parquet":
        return _format_parquet(_as_arrow(table))
    raise UsageError(f"Unknown format `{fmt}`; choose one of {', '.join(FORMATS)}")


def _cell(value: Any) -> str:
    """A table cell's text; a string from the lake shows its control characters escaped
    (a token text must not retitle or clear the user's terminal)."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.6g}"
    return escape_controls(str(value))


def _as_rows(table: pa.Table | Rows) -> Rows:
    return table if isinstance(table, Rows) else Rows.of_arrow(table)


def _as_arrow(table: pa.Table | Rows) -> pa.Table:
    if isinstance(table, Rows):  # its types are not kept: CSV and Parquet need them
        raise TypeError("CSV and Parquet are written from an Arrow table (`run_query`)")
    return table


# A table cell is cut for a terminal at this many characters (DuckDB's shell cuts too);
# `--format csv`, `json` and `parquet` keep every value whole.
MAX_CELL_CHARS = 40


def _shortened(cell: str) -> str:
    return cell if len(cell) <= MAX_CELL_CHARS else cell[: MAX_CELL_CHARS - 1] + "…"


def _format_text(table: Rows) -> str:
    whole = [[_cell(v) for v in column] for column in zip(*table.rows, strict=True)] or [
        [] for _ in table.column_names
    ]
    columns = [[_shortened(cell) for cell in cells] for cells in whole]
    cut = columns != whole
    names = [escape_controls(name) for name in table.column_names]
    lines = []
    widths = [
        max([len(name), *(len(c) for c in cells)])
        for name, cells in zip(names, columns, strict=True)
    ]
    right = table.numeric
    rows = [names, ["-" * w for w in widths], *zip(*columns, strict=True)]
    for row in rows:
        cells = [
            cell.rjust(width) if align else cell.ljust(width)
            for cell, width, align in zip(row, widths, right, strict=True)
        ]
        lines.append("  ".join(cells).rstrip())
    count = table.num_rows
    lines.append(f"({plural(count, 'row')})")
    if cut:
        lines.append(
            f"(cells cut at {MAX_CELL_CHARS} characters: `--format csv`, `json` or `parquet`"
            " keep them whole)"
        )
    return "\n".join(lines)


def _json_value(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list):
        return [_json_value(v) for v in value]
    if isinstance(value, dict):
        return {k: _json_value(v) for k, v in value.items()}
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    return str(value)  # timestamps, decimals: their text form


def _format_json(table: Rows) -> str:
    lines = [
        json.dumps({name: _json_value(value) for name, value in row.items()})
        for row in table.to_pylist()
    ]
    return "".join(line + "\n" for line in lines)


def _format_csv(table: pa.Table) -> str:
    import pyarrow as pa
    import pyarrow.csv as pa_csv

    # CSV has no nested types: lists and structs are written as their JSON text.
    columns = []
    for column in table.columns:
        if pa.types.is_nested(column.type):
            column = pa.array(
                [None if v is None else json.dumps(_json_value(v)) for v in column.to_pylist()],
                pa.string(),
            )
        columns.append(column)
    flat = pa.table(columns, names=table.column_names)
    sink = io.BytesIO()
    pa_csv.write_csv(flat, sink)
    return sink.getvalue().decode("utf-8")


def _format_parquet(table: pa.Table) -> bytes:
    import pyarrow.parquet as pq

    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue()
