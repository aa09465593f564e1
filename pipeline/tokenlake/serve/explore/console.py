"""The explorer's SQL console: a stranger's query, checked as a user view is, then run with
a row limit, a time limit and a limit on its result's bytes.

A page can send any text to `/api/sql`, so the console runs only what a user view could hold:
exactly one SELECT whose syntax tree reads only the lake's tables and views (the catalog's
user views included) and calls no function that reads files, settings, variables or the
environment (serve/user_view_check.py decides, with DuckDB's own parser). Statements such as
COPY, ATTACH, SET, INSTALL or LOAD are not one SELECT and are refused before anything runs.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tokenlake.errors import UsageError
from tokenlake.serve.user_view_check import (
    Refused,
    check_tree,
    first_line,
    open_sandbox,
    query_tree,
)
from tokenlake.serve.user_views import table_macros

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

# At most this many characters of SQL are parsed: a console query is typed, not generated.
MAX_QUERY_CHARS = 20_000
# The rows fetched at a time: the result's bytes are counted after each batch, so a query whose
# rows are huge (`repeat('x', 10^8)`) is stopped within one batch of its limit.
BATCH_ROWS = 256


class ConsoleRefused(UsageError):
    """A console query that is not run (one line, shown on the page)."""


class QueryTimeout(UsageError):
    """A query interrupted at its time limit."""


class QueryTooLarge(UsageError):
    """A query whose result holds more bytes than the console keeps."""


@dataclass(frozen=True)
class ConsoleResult:
    table: pa.Table  # at most `limit` rows
    truncated: bool  # the query had more rows than the limit


class Console:
    """Checks console queries against one lake's relations (one sandbox, reused)."""

    def __init__(self) -> None:
        self._sandbox = open_sandbox()
        self._macros = table_macros(self._sandbox)
        self._lock = threading.Lock()  # one DuckDB connection, one parse at a time

    def close(self) -> None:
        self._sandbox.close()

    def check(self, sql: str, relations: set[str]) -> None:
        """Raise ConsoleRefused unless `sql` is one SELECT a user view could hold.

        Args:
            relations: Lower-cased names of every table and view of the served catalog.
        """
        if not sql.strip():
            raise ConsoleRefused("Refused: the query is empty.")
        if len(sql) > MAX_QUERY_CHARS:
            raise ConsoleRefused(f"Refused: the query is longer than {MAX_QUERY_CHARS} characters.")
        if "\x00" in sql:
            raise ConsoleRefused("Refused: the query holds a NUL character.")
        try:
            with self._lock:
                tree = query_tree(self._sandbox, sql)
            check_tree(tree, relations, self._macros)
        except Refused as refused:
            raise ConsoleRefused(f"Refused: {refused.reason}.") from None


def catalog_relations(con: duckdb.DuckDBPyConnection) -> set[str]:
    """Lower-cased names of the catalog's views: the lake's tables, tokenlake's views and the
    user views it built."""
    rows = con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()
    return {str(name).lower() for (name,) in rows}


def run_limited(
    cursor: duckdb.DuckDBPyConnection, sql: str, max_rows: int, seconds: float, max_bytes: int
) -> ConsoleResult:
    """Run one checked SELECT on `cursor` (a connection of this query's alone, which the
    caller closes, and may interrupt): at most `max_rows` rows are fetched, the query is
    interrupted after `seconds` (DuckDB stops it; its thread is free again), and one whose
    rows take more than `max_bytes` (Arrow's count, as fetched) is refused.

    Raises:
        QueryTimeout: It ran longer than `seconds`.
        QueryTooLarge: Its rows, up to the row limit, take more than `max_bytes`.
        UsageError: DuckDB refused or failed it (DuckDB's first line), or the caller
            interrupted it (the server is stopping).
    """
    import duckdb
    import pyarrow as pa

    timed_out = threading.Event()

    def time_out() -> None:
        timed_out.set()
        cursor.interrupt()

    timer = threading.Timer(seconds, time_out)
    timer.start()
    try:
        reader = cursor.sql(sql).to_arrow_reader(min(max_rows + 1, BATCH_ROWS))
        batches, rows, size = [], 0, 0
        for batch in reader:
            batches.append(batch)
            rows += batch.num_rows
            size += batch.nbytes
            if size > max_bytes:
                raise QueryTooLarge(
                    f"Refused: its result takes more than {max_bytes:,} bytes (the console's"
                    " limit); select fewer or narrower columns, or run it with `tokenlake query`."
                )
            if rows > max_rows:
                break
        table = pa.Table.from_batches(batches, schema=reader.schema)
        return ConsoleResult(table.slice(0, max_rows), rows > max_rows)
    except duckdb.Error as exc:
        if timed_out.is_set():
            raise QueryTimeout(
                f"The query was stopped after {seconds:g} s (the console's limit)."
            ) from None
        if isinstance(exc, duckdb.InterruptException):
            raise UsageError("The query was stopped: the server is stopping.") from None
        raise UsageError(f"Query failed: {first_line(exc)}") from None
    finally:
        timer.cancel()
