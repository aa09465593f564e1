"""The user's own views, `LAKE/views/*.sql`, created after tokenlake's on every catalog build.

The rules of `sql/`: one `CREATE [OR REPLACE] VIEW <file stem> AS ...` per file (its leading
`--` comment becomes the view's comment); a view may build on the lake's tables, tokenlake's
views and other user views. Whoever can write to a shared lake wrote these files, and every
build of the catalog (on an object store: every reader) creates them, so a file's SQL is
created only once DuckDB's parser shows that it is such a view and reads nothing else
(user_view_check.py). A file that breaks the rules, takes a name that is already taken, or
does not bind is skipped with one warning line; the rest of the catalog is built all the same.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tokenlake.errors import SHOWN_PATH_CHARS, shown
from tokenlake.serve.user_view_check import (
    NAME_RULE,
    PLAIN_NAME,
    Refused,
    catalog_objects,
    check_tree,
    count_reads,
    create_checked,
    first_line,
    lake_relations,
    open_sandbox,
    query_tree,
    reserved_names,
    view_query,
)
from tokenlake.store.base import Store, ViewFile

if TYPE_CHECKING:
    import duckdb

log = logging.getLogger(__name__)

# DuckDB's syntax tree of a query is up to ~50 times its text, and Python's copy of it ~10
# times that: 64 KiB (7 times tokenlake's largest view) keeps a hostile file's check to about
# 150 MB and a second or two, where 1 MiB took 21 s and gigabytes.
MAX_USER_VIEW_BYTES = 1 << 16
# DuckDB binds a view's query again at every place that reads the view, so a chain of views
# each reading the one before twice binds 2^n times (23 files of 1.6 KB: hours). A user view
# may make this many bindings of the tables and views it reads, counted through the views it
# reads (tokenlake's and the user's); one costs 1.5 to 3 ms of CPU (docs/security.md). All the
# user views of a lake together may make MAX_TOTAL_BINDINGS, in file name order.
MAX_BINDINGS = 500
MAX_TOTAL_BINDINGS = 2_000
# DuckDB's messages quote the user's SQL: room for a whole first line, no more.
_SHOWN_PROBLEM_CHARS = 500


# One `views/*.sql` of a lake, as its store read it.
UserViewFile = ViewFile


def iter_user_view_files(store: Store) -> list[UserViewFile]:
    """The user's view files, `LAKE/views/*.sql`, by name, each read once."""
    return store.read_user_views(MAX_USER_VIEW_BYTES + 1)


@dataclass(frozen=True)
class _Candidate:
    file: UserViewFile
    text: str  # the whole file (its header becomes the view's comment)
    query: str  # what follows `AS`, as DuckDB's parser delimits it


def create_user_views(con: duckdb.DuckDBPyConnection, store: Store) -> list[str]:
    """Create the user's views after tokenlake's; a refused one is one warning and skipped.

    Each is checked and bound on a sandbox first (user_view_check.py), then created on `con`.

    Returns:
        One line per skipped file (`User view `FILE` skipped: ...`), in file name order.
    """
    files = iter_user_view_files(store)
    if not files:
        return []
    sandbox = open_sandbox()
    try:
        skipped = _create_checked_views(con, sandbox, files)
    finally:
        sandbox.close()
    return [_skip_line(path.shown, skipped[path]) for path in sorted(skipped, key=_by_name)]


def _create_checked_views(
    con: duckdb.DuckDBPyConnection,
    sandbox: duckdb.DuckDBPyConnection,
    files: list[UserViewFile],
) -> dict[UserViewFile, str]:
    """Create every file that passes; returns why each other one was skipped."""
    reserved = reserved_names(sandbox)
    skipped: dict[UserViewFile, str] = {}
    candidates: list[_Candidate] = []
    for path in files:
        try:
            candidates.append(_candidate(sandbox, path, reserved))
        except Refused as refused:
            skipped[path] = refused.reason
    relations = lake_relations(sandbox) | {c.file.stem.lower() for c in candidates}
    macros = table_macros(sandbox)
    checked = []
    reads: dict[str, Counter[str]] = {}
    for candidate in candidates:
        try:
            tree = query_tree(sandbox, candidate.query)
            reads[candidate.file.stem.lower()] = check_tree(tree, relations, macros)
            checked.append(candidate)
        except Refused as refused:
            skipped[candidate.file] = refused.reason
    checked = _within_bindings(checked, bindings(reads, tokenlake_view_bindings(sandbox)), skipped)
    created = _create_in_order(con, sandbox, checked, skipped)
    log.info("user views created: %s", ", ".join(created) or "none")
    return skipped


def _candidate(
    sandbox: duckdb.DuckDBPyConnection, path: UserViewFile, reserved: dict[str, str]
) -> _Candidate:
    """A file's text and query, if it is one `CREATE VIEW` under a name that is free."""
    if path.problem is not None:
        raise Refused(path.problem)
    if not PLAIN_NAME.fullmatch(path.stem):
        raise Refused(f"its file name is not a plain SQL name ({NAME_RULE}) with `.sql`")
    taken = reserved.get(path.stem.lower())
    if taken is not None:
        raise Refused(f"`{path.stem}` is {taken}; give the file another name")
    if len(path.content) > MAX_USER_VIEW_BYTES:
        raise Refused(f"it is larger than {MAX_USER_VIEW_BYTES} bytes")
    try:
        text = path.content.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Refused(f"it is not UTF-8 text (byte {exc.start})") from None
    return _Candidate(path, text, view_query(sandbox, path.stem, text))


def _within_bindings(
    checked: list[_Candidate], expanded: dict[str, int], skipped: dict[UserViewFile, str]
) -> list[_Candidate]:
    """The candidates whose binding stays within MAX_BINDINGS, and all of them together
    within MAX_TOTAL_BINDINGS (in file name order); the others are skipped, saying why."""
    kept: list[_Candidate] = []
    total = 0
    for candidate in sorted(checked, key=lambda c: _by_name(c.file)):
        cost = expanded[candidate.file.stem.lower()]
        if cost > MAX_BINDINGS:
            skipped[candidate.file] = (
                f"binding it would bind more than {MAX_BINDINGS:,} tables and views (DuckDB"
                " binds a view again at every place a query reads it)"
            )
        elif total + cost > MAX_TOTAL_BINDINGS:
            skipped[candidate.file] = (
                f"the user views before it (by file name) bind {total:,} tables and views;"
                f" together they may bind at most {MAX_TOTAL_BINDINGS:,}"
            )
        else:
            total += cost
            kept.append(candidate)
    return kept


def tokenlake_view_bindings(sandbox: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """How many bindings of tables and views binding each of tokenlake's views makes (the
    sandbox holds them, and the lake's tables as views reading nothing, before any user
    view)."""
    rows = sandbox.execute(
        "SELECT view_name, sql FROM duckdb_views() WHERE NOT internal"
    ).fetchall()
    reads = {
        str(name).lower(): count_reads(query_tree(sandbox, view_query(sandbox, name, sql)))
        for name, sql in rows
    }
    return bindings(reads)


def bindings(reads: dict[str, Counter[str]], known: dict[str, int] | None = None) -> dict[str, int]:
    """How many bindings of tables and views binding each view of `reads` makes (capped just
    above MAX_BINDINGS): each place it reads a relation binds that relation, and a view's
    query again with all the bindings it makes (from `reads`, else `known`, else none: a
    table), for DuckDB binds a view's query wherever it is read.

    `reads` maps each view to the relations it names and how often (`check_tree`). A cycle
    counts as too many (DuckDB could never bind it). Iterative, for long chains.

    Examples:
        >>> bindings({"a": Counter({"tokens": 2}), "b": Counter({"a": 3, "runs": 1})})
        {'a': 2, 'b': 10}
        >>> bindings({"a": Counter({"drift_steps": 2})}, {"drift_steps": 40})
        {'a': 82}
    """
    cap = MAX_BINDINGS + 1
    done: dict[str, int] = dict(known or {})
    for start in reads:
        if start in done:
            continue
        stack, on_path = [start], {start}
        while stack:
            view = stack[-1]
            pending = [n for n in reads[view] if n in reads and n not in done]
            looped = [n for n in pending if n in on_path]
            if looped:
                done[view] = cap
            elif pending:
                stack.append(pending[0])
                on_path.add(pending[0])
                continue
            else:
                total = sum(count * (1 + done.get(n, 0)) for n, count in reads[view].items())
                done[view] = min(total, cap)
            on_path.discard(stack.pop())
    return {view: done[view] for view in reads}


def table_macros(sandbox: duckdb.DuckDBPyConnection) -> set[str]:
    rows = sandbox.execute(
        "SELECT function_name FROM duckdb_functions()"
        " WHERE NOT internal AND function_type = 'table_macro'"
    ).fetchall()
    return {str(name).lower() for (name,) in rows}


def _create_in_order(
    con: duckdb.DuckDBPyConnection,
    sandbox: duckdb.DuckDBPyConnection,
    pending: list[_Candidate],
    skipped: dict[UserViewFile, str],
) -> list[str]:
    """Create the checked views, each after the user views it reads (rounds, by file name)."""
    import duckdb

    from tokenlake.serve.sql_views import header_comment, quote_literal

    created: list[str] = []
    objects = catalog_objects(con)
    while pending:
        waiting: list[_Candidate] = []
        for candidate in pending:
            stem = candidate.file.stem
            try:
                sandbox.execute(f"CREATE VIEW {stem} AS {candidate.query}")
            except duckdb.CatalogException as exc:  # may read a user view not created yet
                skipped[candidate.file] = first_line(exc)
                waiting.append(candidate)
                continue
            except duckdb.Error as exc:
                skipped[candidate.file] = first_line(exc)
                continue
            try:
                objects = create_checked(con, stem, candidate.query, objects)
            except (duckdb.Error, Refused) as exc:
                skipped[candidate.file] = _reason(exc)
                continue
            skipped.pop(candidate.file, None)
            comment = quote_literal(header_comment(candidate.text))
            con.execute(f"COMMENT ON VIEW {stem} IS {comment}")
            created.append(stem)
        if len(waiting) == len(pending):  # a round without progress: what waits is broken
            break
        pending = waiting
    return created


def _reason(exc: BaseException) -> str:
    return exc.reason if isinstance(exc, Refused) else first_line(exc)


def _by_name(view: UserViewFile) -> str:
    return view.shown


def _skip_line(path: str, problem: str) -> str:
    """One line, whatever the file name or DuckDB's message holds."""
    where = shown(path, SHOWN_PATH_CHARS, literal=False)
    return f"User view `{where}` skipped: {shown(problem, _SHOWN_PROBLEM_CHARS, literal=False)}."
