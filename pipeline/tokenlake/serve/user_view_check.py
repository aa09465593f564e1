"""What makes a user view's SQL acceptable, decided by DuckDB's own parser, never by a pattern.

A `LAKE/views/*.sql` file is shared storage: anyone who can write to the lake wrote it, and
everyone who builds or reads the catalog would run it. So nothing of it is executed until
DuckDB has parsed it and the parse shows one `CREATE [OR REPLACE] VIEW <stem> AS <query>`
whose query reads only the lake's relations:

1. The whole file parses (`extract_statements`, which runs nothing) as one CREATE statement,
   its first tokens are `CREATE [OR REPLACE] VIEW <stem> AS`, and the rest parses as exactly
   one SELECT (`json_serialize_sql`, which gives its syntax tree).
2. The tree names only the lake's tables, tokenlake's views, other user views and the
   query's own CTEs, unqualified; calls no table function but `range`, `generate_series`,
   `unnest` and tokenlake's table macros (these with a relation name as argument); and no
   function that reads the reader's settings or variables or has a side effect (`DENIED`).
3. `CREATE VIEW <stem> AS <that query>` is bound first on a sandbox: an in-memory database
   holding empty stand-ins of the lake's relations, with file access, extension loading and
   installing, persistent secrets and Python replacement scans off and its configuration
   locked (it is thrown away afterwards). Only then on the catalog, in a transaction that is
   rolled back unless exactly one new view, of that name, is all that changed.
"""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import duckdb

# A user view's name is its file's stem: a plain SQL name, so that it needs no quoting, and
# can never be mistaken for a file path by DuckDB's replacement scans.
PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
NAME_RULE = "ASCII letters, digits and `_`, not starting with a digit, at most 64 characters"

SANDBOX_CONFIG: dict[str, str | bool | int | float | list[str]] = {
    "enable_external_access": "false",  # no file, no URL, no ATTACH, no COPY, no INSTALL
    "autoload_known_extensions": "false",
    "autoinstall_known_extensions": "false",
    "allow_community_extensions": "false",
    "allow_persistent_secrets": "false",
    "python_enable_replacements": "false",  # a name never resolves to a Python variable
    "lock_configuration": "true",  # and none of this can be switched back
}

# Table functions a user view may call: they compute rows and read nothing.
ALLOWED_TABLE_FUNCTIONS = frozenset({"range", "generate_series", "unnest"})

# Functions a user view may not call, whoever binds it: what they return is the reader's
# (settings may hold credentials; variables, the query text), or they change state.
DENIED = {
    "current_setting": "it reads the reader's settings",
    "getvariable": "it reads the reader's variables",
    "getenv": "it reads the reader's environment",
    "current_query": "it reads the reader's query",
    "write_log": "it writes to the reader's log",
    "setseed": "it changes the reader's random seed",
    "nextval": "it changes a sequence",
    "setval": "it changes a sequence",
    "currval": "it reads a sequence",
    "sleep_ms": "it only waits",
}

_QUERY_NODES = frozenset({"SELECT_NODE", "SET_OPERATION_NODE", "RECURSIVE_CTE_NODE", "CTE_NODE"})
_TABLE_REFS = frozenset(
    {"BASE_TABLE", "JOIN", "SUBQUERY", "EXPRESSION_LIST", "EMPTY", "TABLE_FUNCTION", "PIVOT"}
)


class Refused(Exception):
    """Why a user view is not created (one clause: `User view FILE skipped: <reason>.`)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


def open_sandbox() -> duckdb.DuckDBPyConnection:
    """An in-memory database where user views are bound before the catalog sees them.

    It holds what a user view may read, with the catalog's names and column types: the base
    tables as empty views, tokenlake's macros and tokenlake's views (`sql/`, trusted).
    """
    import duckdb

    from tokenlake import schema
    from tokenlake.serve.sql_views import base_view_sql, create_sql_views, iter_macro_files

    con = duckdb.connect(":memory:", config=SANDBOX_CONFIG)
    try:
        for table in schema.TABLES:
            con.execute(f"CREATE VIEW {table} AS {base_view_sql(table, [])}")
        for path in iter_macro_files():
            con.execute(path.read_text(encoding="utf-8"))
        create_sql_views(con)
    except BaseException:
        con.close()
        raise
    return con


def reserved_names(sandbox: duckdb.DuckDBPyConnection) -> dict[str, str]:
    """Lower-cased names a user view may not take, each with what already has it."""
    taken: dict[str, str] = {}
    for (name,) in sandbox.execute(
        "SELECT keyword_name FROM duckdb_keywords() WHERE keyword_category = 'reserved'"
    ).fetchall():
        taken[str(name).lower()] = "an SQL keyword"
    for sql, what in (
        (
            "SELECT DISTINCT function_name FROM duckdb_functions()",
            "the name of a function or macro",
        ),
        ("SELECT view_name FROM duckdb_views() WHERE internal", "a name of DuckDB's system views"),
        ("SELECT view_name FROM duckdb_views() WHERE NOT internal", "one of tokenlake's views"),
    ):
        for (name,) in sandbox.execute(sql).fetchall():
            taken[str(name).lower()] = what
    return taken


def lake_relations(sandbox: duckdb.DuckDBPyConnection) -> set[str]:
    """Lower-cased names of what a user view may read besides other user views: the lake's
    tables and tokenlake's views (all views in the sandbox, before any user view)."""
    rows = sandbox.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()
    return {str(name).lower() for (name,) in rows}


def view_query(sandbox: duckdb.DuckDBPyConnection, stem: str, text: str) -> str:
    """The query of a file that holds one `CREATE [OR REPLACE] VIEW <stem> AS <query>`.

    Raises:
        Refused: The file holds anything else, or does not parse.
    """
    import duckdb

    form = Refused(f"it must hold one `CREATE OR REPLACE VIEW {stem} AS ...` and nothing else")
    if "\x00" in text:
        raise Refused("it holds a NUL character")
    try:
        statements = sandbox.extract_statements(text)
    except duckdb.Error as exc:
        raise Refused(first_line(exc)) from None
    if len(statements) != 1 or statements[0].type != duckdb.StatementType.CREATE:
        raise form
    raw = text.encode("utf-8")
    try:
        words = list(itertools.islice(_words(raw), 7))  # the head and the query's first token
    except duckdb.Error as exc:
        raise Refused(first_line(exc)) from None
    head = [word.upper() for word, _ in words[:6]]
    start = 5 if head[:3] == ["CREATE", "OR", "REPLACE"] else 3
    if head[:1] != ["CREATE"] or head[start - 2 : start - 1] != ["VIEW"]:
        raise form
    if head[start : start + 1] != ["AS"]:
        raise form
    if len(words) <= start + 1 or _unquoted(words[start - 1][0]) != stem:
        raise form
    return raw[words[start + 1][1] :].decode("utf-8")


def _words(raw: bytes) -> Iterator[tuple[str, int]]:
    """DuckDB's tokens of `raw` but its comments, each as its text and byte offset."""
    import duckdb

    tokens = duckdb.tokenize(raw.decode("utf-8"))  # offsets are byte offsets
    ends = [offset for offset, _ in tokens[1:]] + [len(raw)]
    for (offset, kind), end in zip(tokens, ends, strict=True):
        if kind != duckdb.token_type.comment:
            yield raw[offset:end].decode("utf-8", "replace").strip(), offset


def _unquoted(word: str) -> str:
    if len(word) >= 2 and word[0] == word[-1] == '"':
        return word[1:-1].replace('""', '"')
    return word


def query_tree(sandbox: duckdb.DuckDBPyConnection, query: str) -> dict[str, Any]:
    """DuckDB's syntax tree of one SELECT (`json_serialize_sql`; nothing is run).

    Raises:
        Refused: It is not exactly one SELECT, or nests too deeply to inspect.
    """
    import duckdb

    try:
        found = sandbox.execute("SELECT json_serialize_sql(?)", [query]).fetchone()
    except duckdb.Error as exc:
        raise Refused(first_line(exc)) from None
    try:
        tree = json.loads(found[0] if found else "{}")
    except RecursionError:
        raise Refused("it nests too deeply to be checked") from None
    if tree.get("error"):
        raise Refused(f"its query is not one SELECT ({str(tree.get('error_message'))[:200]})")
    statements = tree.get("statements") or []
    if len(statements) != 1:
        raise Refused("its query is not one SELECT")
    return dict(statements[0])


def check_tree(tree: dict[str, Any], relations: set[str], table_macros: set[str]) -> Counter[str]:
    """Refuse a query that reads or calls anything but what a user view may; returns how many
    places of it read each relation (lower-cased names; its own CTEs are not counted).

    Args:
        tree: `query_tree`'s result.
        relations: Lower-cased names the query may read: the lake's tables, tokenlake's
            views and the other user views.
        table_macros: Lower-cased names of tokenlake's table macros.

    Raises:
        Refused: What it reads or calls that it may not.
    """
    reads: Counter[str] = Counter()
    for node, ctes in _nodes(tree):
        _check_node(node, relations | ctes, table_macros)
        reads.update(name for name in _relations_read(node) if name not in ctes)
    return reads


def count_reads(tree: dict[str, Any]) -> Counter[str]:
    """How many places of a query (`query_tree`'s result) read each relation, unchecked: for
    tokenlake's own views, which `check_tree` would hold to a user view's rules."""
    reads: Counter[str] = Counter()
    for node, ctes in _nodes(tree):
        reads.update(name for name in _relations_read(node) if name not in ctes)
    return reads


def _nodes(tree: dict[str, Any]) -> Iterator[tuple[dict[str, Any], frozenset[str]]]:
    """Every node of a syntax tree with the CTE names visible there (lower-cased)."""
    stack: list[tuple[Any, frozenset[str]]] = [(tree, frozenset())]
    while stack:  # iterative: a deep tree must not exhaust Python's stack
        node, ctes = stack.pop()
        if isinstance(node, list):
            stack.extend((item, ctes) for item in node)
            continue
        if not isinstance(node, dict):
            continue
        ctes = ctes | _cte_names(node)
        yield node, ctes
        stack.extend((value, ctes) for value in node.values())


def _relations_read(node: dict[str, Any]) -> list[str]:
    """The relations one node reads (lower-cased): a table reference's name, or the names a
    table macro is given (`_check_table_function` allows no other argument)."""
    if "class" in node:
        return []
    if node.get("type") == "BASE_TABLE":
        return [str(node.get("table_name", "")).lower()]
    function = node.get("function") or {}
    name = str(function.get("function_name", "")).lower()
    if node.get("type") == "TABLE_FUNCTION" and name not in ALLOWED_TABLE_FUNCTIONS:
        arguments = function.get("arguments") or []
        expressions = [argument.get("expression") or {} for argument in arguments]
        return [
            str(e["column_names"][0]).lower()
            for e in expressions
            if e.get("class") == "COLUMN_REF" and len(e.get("column_names") or []) == 1
        ]
    return []


def _cte_names(node: dict[str, Any]) -> frozenset[str]:
    """The CTEs a query node defines: visible in all of its subtree, its own CTEs included."""
    entries = (node.get("cte_map") or {}).get("map") or []
    names = [str(entry.get("key", "")) for entry in entries]
    if node.get("type") == "RECURSIVE_CTE_NODE":
        names.append(str(node.get("cte_name", "")))
    for name in names:
        if not PLAIN_NAME.fullmatch(name):
            raise Refused(f"its CTE `{_shown(name)}` is not a plain SQL name ({NAME_RULE})")
    return frozenset(name.lower() for name in names)


def _check_node(
    node: dict[str, Any], readable: frozenset[str] | set[str], macros: set[str]
) -> None:
    kind = node.get("type")
    is_expression = "class" in node
    if not is_expression and "cte_map" in node and kind not in _QUERY_NODES:
        raise Refused(f"it holds a `{_shown(kind)}` query, which a user view may not")
    if not is_expression and "sample" in node and "alias" in node and kind not in _TABLE_REFS:
        raise Refused(f"it reads from a `{_shown(kind)}`, which a user view may not")
    if kind == "BASE_TABLE":
        _check_relation(node, readable)
    elif kind == "TABLE_FUNCTION":
        _check_table_function(node.get("function") or {}, readable, macros)
    if "function_name" in node:
        _check_function(node)


def _check_relation(node: dict[str, Any], readable: frozenset[str] | set[str]) -> None:
    name = str(node.get("table_name", ""))
    if node.get("schema_name") or node.get("catalog_name"):
        raise Refused(
            f"it names `{_shown(name)}` with a schema or catalog; a user view names the lake's"
            " tables and views without one"
        )
    if name.lower() not in readable:
        raise Refused(
            f"it reads `{_shown(name)}`, which is not a table or view of the lake nor another"
            " user view"
        )


def _check_table_function(
    function: dict[str, Any], readable: frozenset[str] | set[str], macros: set[str]
) -> None:
    name = str(function.get("function_name", "")).lower()
    if name in ALLOWED_TABLE_FUNCTIONS:
        return
    if name not in macros:
        raise Refused(
            f"it calls table function `{_shown(name)}`; a user view may read only the lake's"
            f" tables and views (and {', '.join(sorted(ALLOWED_TABLE_FUNCTIONS))})"
        )
    for argument in function.get("arguments") or []:
        expression = argument.get("expression") or {}
        names = expression.get("column_names") or []
        if expression.get("class") != "COLUMN_REF" or len(names) != 1:
            raise Refused(f"it calls `{name}` with an argument that is not a table or view name")
        _check_relation({"table_name": names[0]}, readable)


def _check_function(node: dict[str, Any]) -> None:
    name = str(node.get("function_name", ""))
    if node.get("schema") or node.get("catalog"):
        raise Refused(f"it calls `{_shown(name)}` with a schema or catalog")
    reason = DENIED.get(name.lower())
    if reason is not None:
        raise Refused(f"it calls `{name.lower()}`, which a user view may not ({reason})")


def catalog_objects(con: duckdb.DuckDBPyConnection) -> set[tuple[str, ...]]:
    """Every object a statement could have created: views, macros and functions, tables,
    schemas, sequences, types, attached databases and secrets."""
    queries = (
        "SELECT 'view', database_name, schema_name, view_name FROM duckdb_views()"
        " WHERE NOT internal",
        "SELECT DISTINCT 'function', database_name, schema_name, function_name"
        " FROM duckdb_functions() WHERE NOT internal",
        "SELECT 'table', database_name, schema_name, table_name FROM duckdb_tables()",
        "SELECT 'schema', database_name, schema_name, '' FROM duckdb_schemas()",
        "SELECT 'sequence', database_name, schema_name, sequence_name FROM duckdb_sequences()",
        "SELECT 'type', database_name, schema_name, type_name FROM duckdb_types()"
        " WHERE NOT internal",
        "SELECT 'database', database_name, '', '' FROM duckdb_databases()",
        "SELECT 'secret', name, '', '' FROM duckdb_secrets()",
    )
    found: set[tuple[str, ...]] = set()
    for sql in queries:
        found.update(tuple(str(v) for v in row) for row in con.execute(sql).fetchall())
    return found


def create_checked(
    con: duckdb.DuckDBPyConnection, stem: str, query: str, before: set[tuple[str, ...]]
) -> set[tuple[str, ...]]:
    """`CREATE VIEW <stem> AS <query>`, kept only if that one view is all it created.

    Args:
        before: `catalog_objects(con)` now (what the previous call returned).

    Returns:
        `catalog_objects(con)` afterwards.

    Raises:
        Refused: Something else changed (the transaction is rolled back).
        duckdb.Error: The view does not bind.
    """
    (database,) = con.execute("SELECT current_database()").fetchone() or ("",)
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute(f"CREATE VIEW {stem} AS {query}")
        after = catalog_objects(con)
        if after ^ before != {("view", str(database), "main", stem)}:
            raise Refused("creating it changed more than one view")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")
    return after


def first_line(exc: BaseException) -> str:
    """The first line of DuckDB's message, at most 300 characters."""
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]


def _shown(value: object) -> str:
    from tokenlake.errors import shown

    return shown(str(value), literal=False)
