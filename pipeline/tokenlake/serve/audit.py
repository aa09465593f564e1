"""Run the checks under `sql/audits/` against a lake (`tokenlake audit`).

Each audit is one SELECT returning the offending rows; zero rows means healthy. Each file
declares its severity in its header (`-- Severity: error|warning|info`): rows of an `error`
audit fail the lake, a `warning` flags something routine in a live run (a step still training,
a dashboard advisory), an `info` audit only lists rows worth reading. The CLI prints
`format_audit_report` and exits 1 only when an `error` audit returned rows (`has_errors`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tokenlake.errors import LakeError, duckdb_problem
from tokenlake.serve import kept_rows, sql_views
from tokenlake.serve.kept_rows import SHARED_VIEWS
from tokenlake.serve.query import (
    Rows,
    cache_footers,
    catalog_database,
    format_table,
    plain_result,
    read_lake,
)
from tokenlake.store.base import Store

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

# Offending rows shown per failed audit; the rest are counted, not printed.
REPORT_ROWS = 10
_FIRST_SENTENCE = re.compile(r"^(.+?\.)(?:\s|$)", re.DOTALL)
_SEVERITY_LINE = re.compile(r"^Severity:\s*(\S+)\s*$", re.MULTILINE)
SEVERITIES = ("error", "warning", "info")
# Report label of an audit that returned rows, by severity.
_LABELS = {"error": "FAIL", "warning": "WARN", "info": "INFO"}


@dataclass(frozen=True)
class AuditResult:
    """One audit's outcome.

    Attributes:
        name: The audit's file stem, e.g. `large_lp_diff`.
        description: The first sentence of the file's header comment.
        rows: The offending rows (empty when healthy): `Rows`, or an Arrow table when a
            column's values need Arrow's types (`query.plain_result`).
        severity: `error`, `warning` or `info`, from the file's `Severity:` header line.
    """

    name: str
    description: str
    rows: Rows | pa.Table
    severity: str = "error"

    @property
    def passed(self) -> bool:
        """True when the audit returned no rows."""
        return self.rows.num_rows == 0

    @property
    def label(self) -> str:
        """`PASS` without rows, else `FAIL`, `WARN` or `INFO` by severity."""
        return "PASS" if self.passed else _LABELS[self.severity]


def has_errors(results: Sequence[AuditResult]) -> bool:
    """True when an `error` audit returned rows (the CLI then exits 1)."""
    return any(not r.passed and r.severity == "error" for r in results)


def severity(path: Path, sql_text: str) -> str:
    """The `Severity:` line of an audit file's header.

    Raises:
        LakeError: The header has no valid `Severity:` line.

    Examples:
        >>> severity(Path("a.sql"), "-- Rows.\\n-- Severity: warning\\nSELECT 1")
        'warning'
    """
    match = _SEVERITY_LINE.search(sql_views.header_comment(sql_text))
    if match is None or match.group(1) not in SEVERITIES:
        raise LakeError(path, "needs a header line `-- Severity: error|warning|info`")
    return match.group(1)


def describe(sql_text: str) -> str:
    """First sentence of an audit's header comment.

    Examples:
        >>> describe("-- Samples without a train row. More text.\\n-- Grain: x\\nSELECT 1")
        'Samples without a train row.'
    """
    header = " ".join(sql_views.header_comment(sql_text).split())
    match = _FIRST_SENTENCE.match(header)
    return match.group(1) if match else header


def run_audits(store: Store, settings: Mapping[str, float] | None = None) -> list[AuditResult]:
    """Run every `sql/audits/*.sql` against the lake's catalog, in file-name order.

    Args:
        store: The lake's store (its catalog, `tokenlake.duckdb`, or its manifests).
        settings: Optional `drift_settings` overrides (threshold name -> value).

    Returns:
        One result per audit file.

    Raises:
        LakeError: An audit query cannot run against this catalog.
    """
    return read_lake(store, lambda con: _run_audits(con, store, settings), settings)


def _run_audits(
    con: duckdb.DuckDBPyConnection, store: Store, settings: Mapping[str, float] | None
) -> list[AuditResult]:
    """Every audit's result, read through the reader's connection `con`."""
    import duckdb

    results = []
    cache_footers(con)  # 0.83 -> 0.67 s of the audits' CPU on a lake of 100 small steps
    # 0.74 -> 0.51 s more on that lake; those a kept catalog holds are read, not computed
    _compute_shared_views(con, set() if settings else kept_rows.kept_views(con))
    for path in sql_views.iter_audit_files():
        text = path.read_text(encoding="utf-8")
        level = severity(path, text)
        try:
            # `execute`, not `sql`: a relation binds the audit once more before it runs
            rows = plain_result(con.execute(text))
        except duckdb.Error as exc:
            problem = duckdb_problem(exc)
            raise LakeError(str(store), f"audit `{path.stem}` cannot run: {problem}") from exc
        results.append(AuditResult(path.stem, describe(text), rows, level))
    return results


def _compute_shared_views(con: duckdb.DuckDBPyConnection, kept: set[str]) -> None:
    """Each of SHARED_VIEWS into a TEMP table of its name, which the audits (and the views they
    read) find before the catalog's view, as they find a `--set` override of `drift_settings`
    (`query.settings_override_sql`): the same rows, with the overrides in force. Those in
    `kept` (never under an override) are copied from the rows the reader's kept catalog holds
    (serve/kept_rows.py), computed there under the catalog's own settings. A view that cannot
    be computed is left to the first audit that reads it, which fails with its own name and
    DuckDB's message, as without this."""
    import duckdb

    database = catalog_database(con)
    for view in SHARED_VIEWS:
        schema = kept_rows.VIEWS_SCHEMA if view in kept else "main"
        try:
            con.execute(f"CREATE TEMP TABLE {view} AS FROM {database}.{schema}.{view}")
        except duckdb.Error:
            continue


def format_audit_report(results: Sequence[AuditResult], max_rows: int = REPORT_ROWS) -> str:
    """Readable report: one line per audit with its severity, the rows of those that returned
    rows, and a summary line.

    Examples:
        >>> ok = AuditResult("alignment_failed", "Samples that failed.", Rows(["a"], [False], []))
        >>> print(format_audit_report([ok]))
        PASS  alignment_failed [error]: Samples that failed.
        All 1 audits passed.
    """
    lines = []
    for result in results:
        head = f"{result.label}  {result.name} [{result.severity}]: {result.description}"
        if result.passed:
            lines.append(head)
            continue
        count = result.rows.num_rows
        lines.append(f"{head} ({count} row{'' if count == 1 else 's'})")
        shown = format_table(result.rows.slice(0, max_rows), "table")
        body = str(shown).splitlines()[:-1]  # the row count is already on the head line
        if count > max_rows:
            body.append(f"... {count - max_rows} more rows")
        lines.extend("      " + line for line in body)
    lines.append(_summary(results))
    return "\n".join(lines)


def _summary(results: Sequence[AuditResult]) -> str:
    """`All N audits passed.`, or how many failed (errors) and how many warned or informed."""
    counts = {level: 0 for level in SEVERITIES}
    for result in results:
        counts[result.severity] += not result.passed
    if not any(counts.values()):
        return f"All {len(results)} audits passed."
    line = f"{counts['error']} of {len(results)} audits failed"
    others = [
        f"{counts['warning']} warning{'' if counts['warning'] == 1 else 's'}",
        f"{counts['info']} info",
    ]
    return f"{line}; {', '.join(others)}."
