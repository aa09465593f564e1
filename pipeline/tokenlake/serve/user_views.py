"""The user's own views, `LAKE/views/*.sql`, created after tokenlake's on every catalog build.

The rules of `sql/`: one `CREATE [OR REPLACE] VIEW <file stem> AS ...` per file (its leading
`--` comment becomes the view's comment); a view may build on tokenlake's views and on other
user views. A file that breaks the rules, would replace one of tokenlake's views, or does not
bind is skipped with one warning line; the rest of the catalog is built all the same.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tokenlake.load.lake import USER_VIEWS_DIR, LakeRoot, lake_at
from tokenlake.load.local_lake import Lake

if TYPE_CHECKING:
    import duckdb

log = logging.getLogger(__name__)

MAX_USER_VIEW_BYTES = 1 << 20
_USER_VIEW_STATEMENT = re.compile(
    r"^\s*CREATE\s+(?:OR\s+REPLACE\s+)?VIEW\s+(\w+)\s+AS\s", re.IGNORECASE
)


@dataclass(frozen=True)
class UserViewFile:
    """One `views/*.sql` of a lake, local or on an object store."""

    shown: str  # how messages name it (its path or URL)
    stem: str
    size: Callable[[], int]
    read: Callable[[], bytes]


def iter_user_view_files(lake: LakeRoot) -> list[UserViewFile]:
    """The user's view files, `LAKE/views/*.sql`, by name."""
    layout = lake_at(lake)
    if isinstance(layout, Lake):
        folder = layout.user_views_dir
        paths = sorted(p for p in folder.glob("*.sql") if p.is_file()) if folder.is_dir() else []
        return [UserViewFile(str(p), p.stem, _size_of(p), p.read_bytes) for p in paths]
    return [
        UserViewFile(
            layout.url(name),
            Path(name).stem,
            lambda name=name: layout.size(name),  # type: ignore[misc]
            lambda name=name: layout.read_bytes(name),  # type: ignore[misc]
        )
        for name in layout.user_view_names()
        if name.startswith(f"{USER_VIEWS_DIR}/")
    ]


def _size_of(path: Path) -> Callable[[], int]:
    return lambda: path.stat().st_size


def create_user_views(con: duckdb.DuckDBPyConnection, lake: LakeRoot) -> list[str]:
    """Create the user's views after tokenlake's; a broken one is one warning and skipped.

    The rules of `sql/`: one `CREATE [OR REPLACE] VIEW <file stem> AS ...` per file (its
    leading `--` comment becomes the view's comment); a view may build on tokenlake's views
    and on other user views. A file that breaks the rules, would replace one of tokenlake's
    views, or does not bind is skipped; the rest of the catalog is built all the same.

    Returns:
        One line per skipped file (`User view `FILE` skipped: ...`), in file name order.
    """
    import duckdb

    from tokenlake.serve.catalog import expected_views, header_comment, quote_literal

    pending: dict[UserViewFile, str] = {}
    skipped: dict[UserViewFile, str] = {}
    for path in iter_user_view_files(lake):
        text, problem = _read_user_view(con, path, expected_views())
        if problem is None:
            pending[path] = text
        else:
            skipped[path] = problem
    created: list[str] = []
    while pending:
        waiting: dict[UserViewFile, str] = {}
        for path, text in pending.items():
            try:
                con.execute(text)
            except duckdb.CatalogException as exc:  # may build on a user view not created yet
                waiting[path] = _first_line(exc)
                continue
            except duckdb.Error as exc:
                skipped[path] = _first_line(exc)
                continue
            con.execute(f"COMMENT ON VIEW {path.stem} IS {quote_literal(header_comment(text))}")
            created.append(path.stem)
        if len(waiting) == len(pending):  # a round without progress: what waits is broken
            skipped.update(waiting)
            break
        pending = {path: pending[path] for path in waiting}
    log.info("user views created: %s", ", ".join(created) or "none")
    return [_skip_line(path.shown, skipped[path]) for path in sorted(skipped, key=_by_name)]


def _by_name(view: UserViewFile) -> str:
    return view.shown


def _read_user_view(
    con: duckdb.DuckDBPyConnection, path: UserViewFile, reserved: list[str]
) -> tuple[str, str | None]:
    """A user view file's text, or why it is refused."""
    import duckdb

    from tokenlake.errors import LakeError

    try:
        if path.size() > MAX_USER_VIEW_BYTES:
            return "", f"it is larger than {MAX_USER_VIEW_BYTES} bytes"
        text = path.read().decode("utf-8")
        statements = con.extract_statements(text)
    except (OSError, UnicodeDecodeError, LakeError) as exc:
        return "", f"it cannot be read ({getattr(exc, 'strerror', None) or exc})"
    except duckdb.Error as exc:
        return "", _first_line(exc)
    match = _USER_VIEW_STATEMENT.match(_strip_comments(text))
    if len(statements) != 1 or match is None or match.group(1) != path.stem:
        return "", f"it must hold one `CREATE OR REPLACE VIEW {path.stem} AS ...` and nothing else"
    if path.stem.lower() in {name.lower() for name in reserved}:
        return "", f"`{path.stem}` is one of tokenlake's views; give the file another name"
    return text, None


def _strip_comments(text: str) -> str:
    return re.sub(r"--[^\n]*|/\*.*?\*/", " ", text, flags=re.DOTALL)


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]


def _skip_line(path: str, problem: str) -> str:
    """One line, whatever the file name or DuckDB's message holds."""
    return re.sub(r"[\x00-\x1f\x7f]", " ", f"User view `{path}` skipped: {problem}.")
