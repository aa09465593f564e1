"""tokenlake's own SQL: where the files of `sql/` live (the package `tokenlake.sql`), how each
view file is checked and ordered by its `Inputs:` header, and the SQL text of the base views
over a table's Parquet files. It knows nothing of a lake: the catalog (catalog.py) and the
user-view check (user_view_check.py) both build on it.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tokenlake import schema
from tokenlake.errors import InstallError, LakeError
from tokenlake.layout import partition_patterns
from tokenlake.processes import crash_point
from tokenlake.threads import Background, sigint_held

if TYPE_CHECKING:
    import duckdb


_VIEW_STATEMENT = re.compile(r"CREATE\s+OR\s+REPLACE\s+VIEW\s+(\w+)\s", re.IGNORECASE)


def sql_dir() -> Path:
    """The one place that knows where the SQL files live: the folder of the package
    `tokenlake.sql` (the repository's top-level `sql/`, shipped inside the wheel)."""
    return Path(str(importlib.resources.files("tokenlake.sql")))


def _sql_files(folder: Path, what: str) -> list[Path]:
    """The `.sql` files of one folder, sorted; none at all means a broken installation, which
    must stop the command rather than pass as "0 audits" or a catalog without views."""
    files = sorted(folder.glob("*.sql"))
    if not files:
        raise InstallError(what, folder)
    return files


def iter_view_files() -> Iterator[Path]:
    """Every view definition, one `CREATE OR REPLACE VIEW <file stem>` per file: the views of
    `sql/`, then the rollups of `sql/rollups/` (views too, whose rows are also computed for each
    step at commit: serve/rollups.py)."""
    yield from _sql_files(sql_dir(), "SQL views")
    yield from iter_rollup_files()


def iter_rollup_files() -> Iterator[Path]:
    """The rollup views: per-step partial aggregates that the views of `sql/` read."""
    yield from _sql_files(sql_dir() / "rollups", "SQL rollups")


def view_file(name: str) -> Path:
    """The file that defines view `name` (a rollup's lies in `sql/rollups/`)."""
    rollup = sql_dir() / "rollups" / f"{name}.sql"
    return rollup if rollup.is_file() else sql_dir() / f"{name}.sql"


def iter_macro_files() -> Iterator[Path]:
    """Scalar macros the views use; created before every view."""
    yield from _sql_files(sql_dir() / "macros", "SQL macros")


def iter_audit_files() -> Iterator[Path]:
    """Every audit query (returns the offending rows; zero rows means healthy)."""
    yield from _sql_files(sql_dir() / "audits", "SQL audits")


def quote_literal(text: str) -> str:
    """A SQL string literal for DuckDB.

    Examples:
        >>> quote_literal("it's")
        "'it''s'"
    """
    return "'" + text.replace("'", "''") + "'"


def base_view_sql(table: str, files: list[str], older_files: bool = False) -> str:
    """`SELECT` over a table's files with the partition columns first, typed from the schema.

    The partition values are parsed from the end of each file's path by the lake's layout
    (`lake.partition_patterns`), not by DuckDB's Hive parsing of the whole path. DuckDB
    still prunes files on them: a filter on `rollout_id` reads only that step's files.
    With `older_files` (some file was written by an older schema version, which lacks the
    columns added since), the files are read by name and those columns read NULL.
    """
    table_columns = schema.duckdb_columns(table)
    partitions = schema.TABLE_PARTITIONS[table]
    types = {col: schema.PARTITION_DUCKDB_TYPES[col] for col in partitions}
    if not files:
        columns = [f"NULL::{types[col]} AS {col}" for col in partitions]
        columns += [f"NULL::{c.duckdb_type} AS {c.name}" for c in table_columns]
        return "SELECT " + ", ".join(columns) + " WHERE false"
    file_list = ", ".join(quote_literal(str(p)) for p in files)
    parsed = [
        f"CAST(regexp_extract(filename, {quote_literal(pattern)}, 1) AS {types[col]}) AS {col}"
        for col, pattern in partition_patterns(table).items()
    ]
    selected = ", ".join([*parsed, *(c.name for c in table_columns)])
    source = f"read_parquet([{file_list}], hive_partitioning = false, filename = true)"
    if table in _GROWN_TABLES or older_files:
        source = _with_added_columns(table, file_list)
    return f"SELECT {selected} FROM {source}"


# Tables that gained columns since schema version 1 (`runs`: the run metadata). Files written
# before lack them: they read as NULL there (and the next extraction rewrites the row).
_GROWN_TABLES = frozenset({schema.RUNS})


def _with_added_columns(table: str, file_list: str) -> str:
    """The files read by name, unioned with a typed empty row set that has every column, so a
    column absent from every file is still there (NULL) with the schema's type."""
    typed = ", ".join(f"NULL::{c.duckdb_type} AS {c.name}" for c in schema.duckdb_columns(table))
    return (
        f"(SELECT * FROM read_parquet([{file_list}], hive_partitioning = false, filename = true,"
        f" union_by_name = true) UNION ALL BY NAME SELECT {typed}, NULL::VARCHAR AS filename"
        " WHERE false)"
    )


def header_comment(sql_text: str) -> str:
    """The leading `--` comment block of a view file, used as the view's COMMENT."""
    return "\n".join(line[2:].strip() for line in header_comment_lines(sql_text)).strip()


def view_query(name: str, sql_text: str) -> str:
    """The query of a view file: what follows `CREATE OR REPLACE VIEW <name> AS`.

    Examples:
        >>> view_query("v", "-- v\\nCREATE OR REPLACE VIEW v AS\\nSELECT 1;\\n")
        'SELECT 1'
    """
    match = re.search(
        rf"CREATE\s+OR\s+REPLACE\s+VIEW\s+{re.escape(name)}\s+AS\s+(.*)",
        sql_text,
        re.DOTALL | re.IGNORECASE,
    )
    if match is None:
        raise LakeError(view_file(name), f"must hold one `CREATE OR REPLACE VIEW {name} AS ...`")
    return match.group(1).strip().rstrip(";").strip()


def create_sql_views(
    con: duckdb.DuckDBPyConnection, queries: Mapping[str, str] | None = None
) -> list[str]:
    """Create every `sql/*.sql` view, each after the views its `Inputs:` header names, with
    its header as its COMMENT; a view named in `queries` is defined by that query instead of
    its file (a rollup over its stored files), still in its file's place in the order.

    The views are made a layer at a time (those whose inputs all exist), each layer shared
    between `con` and a second connection to its database in another thread, each committing
    its share before the next layer, which reads it: DuckDB binds a view as it creates it,
    without the GIL, and that binding is most of a catalog's build. `con` must not be inside
    a transaction (the other connection would not see what it holds).

    Returns:
        The view names in the order they were created.
    """
    texts = _view_texts()
    inputs = {name: view_inputs(text) for name, text in texts.items()}
    created = view_order(inputs)
    statements = {name: _commented_view(name, texts[name], queries) for name in created}
    helper = con.cursor()
    started: list[_Made] = []
    try:
        for layer in view_layers(created, inputs):
            _create_layer(con, helper, layer, statements, started)
    finally:
        for made in started:  # after an error or a Ctrl-C, none is left running
            made.stopped()
        helper.close()
    return created


def redefine_sql_views(con: duckdb.DuckDBPyConnection, queries: Mapping[str, str]) -> None:
    """Define each view named in `queries` by that query instead of its file, with its header
    as its COMMENT, in a database where `create_sql_views` made every view: the statements
    `create_sql_views(con, queries)` runs for those views. A view that reads them binds them
    when it is queried, so it reads the new definitions (whose columns are the same: those its
    file's header documents)."""
    if not queries:
        return
    texts = _view_texts()
    order = view_order({name: view_inputs(text) for name, text in texts.items()})
    run_script(
        con,
        [
            statement
            for name in order
            if name in queries
            for statement in _commented_view(name, texts[name], queries)
        ],
    )


def view_layers(
    order: Sequence[str], inputs: Mapping[str, tuple[str, ...] | None]
) -> list[list[str]]:
    """The views of `order` (`view_order`'s) by layer: a view lies one layer above the
    highest of the views it reads, the views that read only tables in the first, each layer
    in `order`'s order.

    Examples:
        >>> view_layers(["a", "d", "b", "c"], {"c": ("b", "tokens"), "b": ("a",), "a": (), "d": ()})
        [['a', 'd'], ['b'], ['c']]
    """
    depth: dict[str, int] = {}
    for name in order:
        depth[name] = 1 + max((depth[n] for n in inputs[name] or () if n in depth), default=-1)
    return [
        [name for name in order if depth[name] == level]
        for level in range(max(depth.values(), default=-1) + 1)
    ]


def _commented_view(name: str, text: str, queries: Mapping[str, str] | None) -> list[str]:
    """The statements that create view `name` (from its file, or from `queries`) and set its
    header as its COMMENT."""
    query = None if queries is None else queries.get(name)
    created = text if query is None else _defined_as(name, query)
    return [created, f"COMMENT ON VIEW {name} IS {quote_literal(header_comment(text))}"]


def _create_layer(
    con: duckdb.DuckDBPyConnection,
    helper: duckdb.DuckDBPyConnection,
    layer: list[str],
    statements: Mapping[str, list[str]],
    started: list[_Made],
) -> None:
    """One layer's views, every other one made by `helper` in its own thread (listed in
    `started` as it starts: the caller stops it if this raises)."""
    theirs = layer[1::2]
    other = _Made(helper, theirs, statements, started) if theirs else None
    crash_point("views:layer")
    _create_in_transaction(con, layer[0::2], statements)
    failure = other.joined() if other is not None else None
    if failure is not None:
        raise failure


class _Made:
    """Views being made by a connection in its own thread; its error kept for the caller."""

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        names: list[str],
        statements: Mapping[str, list[str]],
        started: list[_Made],
    ) -> None:
        self._error: BaseException | None = None
        self._con = con
        with sigint_held():  # listed once started, or the caller would not stop it
            self._background = Background(lambda: self._make(names, statements), "tokenlake-views")
            started.append(self)

    def _make(self, names: list[str], statements: Mapping[str, list[str]]) -> None:
        try:
            crash_point("views:helper")  # its signal is the main thread's to handle
            _create_in_transaction(self._con, names, statements)
        except BaseException as exc:  # noqa: BLE001 - raised again by the caller
            self._error = exc

    def joined(self) -> BaseException | None:
        """Wait for the views; the error that stopped them (None: all made)."""
        self._background.wait()
        return self._error

    def stopped(self) -> None:
        """Unless its thread has ended: interrupt the connection's statement and wait until
        it has (within milliseconds), whatever Ctrl-C comes meanwhile. A connection still in a
        statement cannot be closed, and a statement left running as Python exits aborts the
        process."""
        if not self._background.ended:
            self._background.wait_out(self._con.interrupt)


def _create_in_transaction(
    con: duckdb.DuckDBPyConnection, names: list[str], statements: Mapping[str, list[str]]
) -> None:
    """Create the views `names` and commit them; a failure leaves none of them."""
    import duckdb

    if not names:
        return
    con.execute("BEGIN TRANSACTION")  # fails inside a caller's transaction, never joins it
    try:
        try:
            run_script(con, [statement for name in names for statement in statements[name]])
        except duckdb.Error:  # again one by one, for the error of the view that fails
            con.execute("ROLLBACK")
            con.execute("BEGIN TRANSACTION")
            for name in names:
                created, comment = statements[name]
                _create_view(con, name, created)
                con.execute(comment)
    except BaseException:
        with contextlib.suppress(duckdb.Error):  # the error that stopped it is the one to tell
            con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")


def create_views_reading(con: duckdb.DuckDBPyConnection, wanted: Iterable[str]) -> list[str]:
    """Create the views `wanted` and every view they read (by the `Inputs:` headers, all the
    way down), each after its inputs and without a COMMENT: for a private connection that
    queries those alone (the rollups' at commit), as DuckDB binds each view it creates, which
    costs more the more views lie beneath it.

    Returns:
        The view names in the order they were created.
    """
    import duckdb

    texts = _view_texts()
    inputs = {name: view_inputs(text) for name, text in texts.items()}
    needed = _read_by(wanted, inputs)
    created = [name for name in view_order(inputs) if name in needed]
    try:
        run_script(con, [texts[name] for name in created])
    except duckdb.Error:  # again one by one, for the error of the view that fails
        for name in created:
            _create_view(con, name, texts[name])
    return created


def run_script(con: duckdb.DuckDBPyConnection, statements: Iterable[str]) -> None:
    """Run the statements in one call, in turn: the caller takes the GIL back once, not once a
    statement (up to the switch interval, 5 ms, each time another thread holds it)."""
    con.execute("\n;\n".join(statements))  # a line of its own: a statement may end in a comment


def _view_texts() -> dict[str, str]:
    """Each view file's text by view name, every file checked to define its own name."""
    texts = {path.stem: path.read_text(encoding="utf-8") for path in iter_view_files()}
    for name, text in texts.items():
        _check_view_file(view_file(name), text)
    return texts


def _read_by(wanted: Iterable[str], inputs: Mapping[str, tuple[str, ...] | None]) -> set[str]:
    """The views among `wanted` and every view they read, directly or through another."""
    needed: set[str] = set()
    waiting = list(wanted)
    while waiting:
        name = waiting.pop()
        if name in needed:
            continue
        if name not in inputs:
            raise ValueError(f"no view file defines `{name}`")
        needed.add(name)
        waiting += [n for n in inputs[name] or () if n in inputs]
    return needed


def _defined_as(name: str, query: str) -> str:
    return f"CREATE OR REPLACE VIEW {name} AS {query}"


def _create_view(con: duckdb.DuckDBPyConnection, name: str, statement: str) -> None:
    import duckdb

    try:
        con.execute(statement)
    except duckdb.CatalogException as exc:  # it reads something its header does not name
        first = str(exc).splitlines()[0]
        raise LakeError(view_file(name), f"view cannot be created: {first}") from exc


_INPUTS_LINE = re.compile(r"^--\s*Inputs:(.*)$", re.IGNORECASE)
_SETTINGS_LINE = re.compile(r"^--\s*Settings:(.*)$", re.IGNORECASE)


_HEADER_CONTINUATION = re.compile(r"^--\s{2,}(\S.*)$")


def view_inputs(sql_text: str) -> tuple[str, ...] | None:
    """The tables and views a view file's header declares under `Inputs:` (None: no such line).

    Parenthesised notes and what follows a `;` (the macros) are not inputs.

    Examples:
        >>> view_inputs("-- Inputs: tokens (for the masks), drift_tokens; macro k3_term.")
        ('tokens', 'drift_tokens')
        >>> view_inputs("-- Inputs: none.")
        ()
    """
    lines = header_comment_lines(sql_text)
    start = next((i for i, line in enumerate(lines) if _INPUTS_LINE.match(line)), None)
    if start is None:
        return None
    match = _INPUTS_LINE.match(lines[start])
    assert match is not None
    text = match.group(1)
    for line in lines[start + 1 :]:  # continuation lines are indented further
        more = _HEADER_CONTINUATION.match(line)
        if more is None:
            break
        text += " " + more.group(1)
    text = re.sub(r"\([^)]*\)", "", text).split(";")[0].strip().rstrip(".")
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    return () if names == ("none",) else names


def view_settings(sql_text: str) -> tuple[str, ...] | None:
    """The `drift_settings` columns a rollup file's header declares its rows depend on, under
    `Settings:` (None: no such line; `none` is the empty tuple).

    Examples:
        >>> view_settings("-- Settings: is_cap, k3_clamp (the clamps).")
        ('is_cap', 'k3_clamp')
        >>> view_settings("-- Settings: none.")
        ()
    """
    lines = header_comment_lines(sql_text)
    start = next((i for i, line in enumerate(lines) if _SETTINGS_LINE.match(line)), None)
    if start is None:
        return None
    match = _SETTINGS_LINE.match(lines[start])
    assert match is not None
    text = match.group(1)
    for line in lines[start + 1 :]:
        more = _HEADER_CONTINUATION.match(line)
        if more is None:
            break
        text += " " + more.group(1)
    text = re.sub(r"\([^)]*\)", "", text).strip().rstrip(".")
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    return () if names == ("none",) else names


def header_comment_lines(sql_text: str) -> list[str]:
    """The leading `--` lines of a view file, as written."""
    lines = []
    for line in sql_text.splitlines():
        if not line.startswith("--"):
            break
        lines.append(line)
    return lines


_COLUMNS_START = re.compile(r"^--\s*Columns\b[^:]*:$")


# `--   name[, name...]  TYPE  meaning`: three spaces, then the names and one DuckDB type word.
_COLUMN_LINE = re.compile(
    r"^--   (?P<names>[a-z_]\w*(?:, [a-z_]\w*)*)\s+(?P<type>[A-Z]+(?:\[\])?)(\s.*)?$"
)


_MACRO_COLUMNS_LINE = re.compile(r"^--   \+ the columns of macro (?P<macro>\w+)\b")


_COLUMN_CONTINUATION = re.compile(r"^-- {4,}\S")


_MACRO_STATEMENT = re.compile(r"^CREATE\s+OR\s+REPLACE\s+MACRO\s+(\w+)\(", re.IGNORECASE)


def documented_columns(path: Path) -> list[tuple[str, str]]:
    """The output columns a view file's header documents, as (name, DuckDB type), in order.

    The header's `-- Columns:` block runs to the end of the header. Each column line is
    `--   name  TYPE  meaning` (several names may share one line and type); a line indented
    further continues the meaning; `--   + the columns of macro NAME` stands for the
    `-- Columns:` block in the comment above `CREATE OR REPLACE MACRO NAME` in `sql/macros/`.

    Raises:
        LakeError: The header has no `Columns:` block, or a line in it is none of the above.
    """
    return _columns_block(path, header_comment_lines(path.read_text(encoding="utf-8")))


def macro_columns(name: str) -> list[tuple[str, str]]:
    """The columns documented above the table macro `name` in `sql/macros/` (as
    `documented_columns` reads them).

    Raises:
        LakeError: No macro file defines `name`, or its comment has no well-formed
            `Columns:` block.
    """
    for path in iter_macro_files():
        comment: list[str] = []  # the `--` lines right above the current line
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.startswith("--"):
                comment.append(line)
                continue
            match = _MACRO_STATEMENT.match(line)
            if match is not None and match.group(1) == name:
                return _columns_block(path, comment)
            comment = []
    raise LakeError(sql_dir() / "macros", f"no file defines the macro `{name}`")


def _columns_block(path: Path, lines: list[str]) -> list[tuple[str, str]]:
    start = next((i for i, line in enumerate(lines) if _COLUMNS_START.match(line)), None)
    if start is None:
        raise LakeError(path, "has no `-- Columns:` block in its header")
    columns: list[tuple[str, str]] = []
    for line in lines[start + 1 :]:
        column = _COLUMN_LINE.match(line)
        macro = _MACRO_COLUMNS_LINE.match(line)
        if column is not None:
            columns += [(name, column.group("type")) for name in column.group("names").split(", ")]
        elif macro is not None:
            columns += macro_columns(macro.group("macro"))
        elif not (_COLUMN_CONTINUATION.match(line) and columns):
            raise LakeError(
                path,
                f"header line `{line}` is none of `--   name  TYPE  meaning`, a continuation"
                " indented further, or `--   + the columns of macro NAME`",
            )
    return columns


def view_order(inputs: dict[str, tuple[str, ...] | None]) -> list[str]:
    """The views in an order that creates each after its inputs (by name among equals).

    Raises:
        LakeError: A view declares no inputs, an input that is neither a table nor a view,
            or views that read each other in a cycle.
    """
    known = set(schema.TABLES) | set(inputs)
    for name, needs in sorted(inputs.items()):
        if needs is None:
            raise LakeError(view_file(name), "has no `-- Inputs:` line in its header")
        unknown = [n for n in needs if n not in known]
        if unknown:
            raise LakeError(
                view_file(name),
                f"names unknown input `{unknown[0]}` in its `Inputs:` header (tables:"
                f" {', '.join(schema.TABLES)}; or a view under sql/)",
            )
    waiting = {name: {n for n in needs or () if n in inputs} for name, needs in inputs.items()}
    order: list[str] = []
    while waiting:
        ready = sorted(name for name, needs in waiting.items() if not needs)
        if not ready:
            cycle = ", ".join(f"`{n}`" for n in sorted(waiting))
            raise LakeError(sql_dir(), f"views {cycle} name each other as inputs in a cycle")
        for name in ready:
            del waiting[name]
            for rest in waiting.values():
                rest.discard(name)
        order.extend(ready)
    return order


def _check_view_file(path: Path, text: str) -> None:
    match = _VIEW_STATEMENT.search(text)
    if match is None or match.group(1) != path.stem:
        raise LakeError(path, f"must hold one `CREATE OR REPLACE VIEW {path.stem} AS ...`")


def expected_views() -> list[str]:
    """Every view a complete catalog holds."""
    return [*schema.TABLES, *(path.stem for path in iter_view_files())]
