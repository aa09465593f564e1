"""What the S3 tests share: moto's server (pipeline/tokenlake/tools/s3server.py), the CLI's output with
its timing blanked, and a query's rows through a lake's catalog."""

from __future__ import annotations

import re
from pathlib import Path

from click.testing import CliRunner

from tokenlake.cli import main
from tokenlake.serve import catalog
from tokenlake.tools.s3server import list_keys, moto_server, new_bucket

__all__ = ["cli", "list_keys", "moto_server", "new_bucket", "rows"]

SUMMARY_TIME = re.compile(r" in \d+\.\d s -> ")


def cli(*args: str) -> tuple[int, str]:
    """Exit code and output of a command, its summary's seconds as `T`."""
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, SUMMARY_TIME.sub(" in T s -> ", result.output)


def rows(lake: Path | str, sql: str) -> list[tuple[str, ...]]:
    """A query's rows through the lake's catalog, sorted, compared as text (NaN-safe)."""
    con = catalog.connect(lake)
    try:
        found = con.execute(sql).fetchall()
    finally:
        con.close()
    return sorted(tuple(map(repr, row)) for row in found)
