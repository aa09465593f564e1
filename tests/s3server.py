"""What the S3 tests share: moto's server (pipeline/benchmarks/s3server.py), the CLI's output with
its timing blanked, and a query's rows through a lake's catalog."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from click.testing import CliRunner

from benchmarks.s3server import list_keys, moto_server, new_bucket
from tests.conftest import store_of
from tokenlake.cli import main
from tokenlake.serve import catalog

if TYPE_CHECKING:
    import duckdb

__all__ = ["cli", "fresh_s3", "list_keys", "moto_server", "new_bucket", "rows", "text_rows"]

SUMMARY_TIME = re.compile(r" in \d+\.\d s -> ")


@contextmanager
def fresh_s3() -> Iterator[dict[str, str]]:
    """moto's server for one test module, with s3fs's cached filesystems dropped before and
    after (a cached instance would point at another module's server)."""
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    with moto_server() as env:
        yield env
    s3fs.S3FileSystem.clear_instance_cache()


def cli(*args: str) -> tuple[int, str]:
    """Exit code and output of a command, its summary's seconds as `T`."""
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, SUMMARY_TIME.sub(" in T s -> ", result.output)


def rows(lake: Path | str, sql: str) -> list[tuple[str, ...]]:
    """A query's rows through the lake's catalog, sorted, compared as text (NaN-safe)."""
    con = catalog.connect(store_of(lake))
    try:
        return text_rows(con, sql)
    finally:
        con.close()


def text_rows(con: duckdb.DuckDBPyConnection, sql: str) -> list[tuple[str, ...]]:
    """A query's rows on an open catalog (an object-store lake's is built anew by every
    `catalog.connect`, so a test comparing many tables opens it once), sorted, as text."""
    return sorted(tuple(map(repr, row)) for row in con.execute(sql).fetchall())
