"""Run the checks under `sql/audits/` against a lake (`tokenlake audit`).

Each audit is one SELECT returning the offending rows; zero rows means healthy. The CLI prints
`format_audit_report` and exits 1 when any result has `passed == False`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from pipeline import catalog
from pipeline.errors import LakeError
from pipeline.query import format_table, open_lake

# Offending rows shown per failed audit; the rest are counted, not printed.
REPORT_ROWS = 10
_FIRST_SENTENCE = re.compile(r"^(.+?\.)(?:\s|$)", re.DOTALL)


@dataclass(frozen=True)
class AuditResult:
    """One audit's outcome.

    Attributes:
        name: The audit's file stem, e.g. `large_lp_diff`.
        description: The first sentence of the file's header comment.
        rows: The offending rows (empty when healthy).
    """

    name: str
    description: str
    rows: pa.Table

    @property
    def passed(self) -> bool:
        """True when the audit returned no rows."""
        return self.rows.num_rows == 0


def describe(sql_text: str) -> str:
    """First sentence of an audit's header comment.

    Examples:
        >>> describe("-- Samples without a train row. More text.\\n-- Grain: x\\nSELECT 1")
        'Samples without a train row.'
    """
    header = " ".join(catalog.header_comment(sql_text).split())
    match = _FIRST_SENTENCE.match(header)
    return match.group(1) if match else header


def run_audits(lake: Path, settings: Mapping[str, float] | None = None) -> list[AuditResult]:
    """Run every `sql/audits/*.sql` against the lake's catalog, in file-name order.

    Args:
        lake: The lake directory (holding `tokenlake.duckdb`).
        settings: Optional `drift_settings` overrides (threshold name -> value).

    Returns:
        One result per audit file.

    Raises:
        LakeError: An audit query cannot run against this catalog.
    """
    import duckdb

    con = open_lake(lake, settings)
    results = []
    try:
        for path in catalog.iter_audit_files():
            text = path.read_text(encoding="utf-8")
            try:
                rows = con.sql(text).to_arrow_table()
            except duckdb.Error as exc:
                raise LakeError(lake, f"audit `{path.stem}` cannot run: {exc}") from exc
            results.append(AuditResult(path.stem, describe(text), rows))
    finally:
        con.close()
    return results


def format_audit_report(results: Sequence[AuditResult], max_rows: int = REPORT_ROWS) -> str:
    """Readable report: one PASS/FAIL line per audit, the offending rows, a summary line.

    Examples:
        >>> ok = AuditResult("alignment_failed", "Samples that failed.", pa.table({"a": []}))
        >>> print(format_audit_report([ok]))
        PASS  alignment_failed: Samples that failed.
        All 1 audits passed.
    """
    lines = []
    for result in results:
        if result.passed:
            lines.append(f"PASS  {result.name}: {result.description}")
            continue
        count = result.rows.num_rows
        lines.append(
            f"FAIL  {result.name}: {result.description} ({count} row{'' if count == 1 else 's'})"
        )
        shown = format_table(result.rows.slice(0, max_rows), "table")
        body = str(shown).splitlines()[:-1]  # the row count is already on the FAIL line
        if count > max_rows:
            body.append(f"... {count - max_rows} more rows")
        lines.extend("      " + line for line in body)
    failed = sum(not r.passed for r in results)
    if failed:
        lines.append(f"{failed} of {len(results)} audits failed.")
    else:
        lines.append(f"All {len(results)} audits passed.")
    return "\n".join(lines)
