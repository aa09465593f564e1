"""No dump, lake or other big binary is ever committed: tests build their own data."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN_SUFFIXES = (".pt", ".parquet", ".duckdb", ".pkl")
MAX_BYTES = 512 * 1024


def test_no_data_files_or_big_files_are_tracked():
    listed = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.split("\n")
    tracked = [ROOT / name for name in listed if name]
    assert tracked, "not a git checkout?"
    assert [p.name for p in tracked if p.suffix in FORBIDDEN_SUFFIXES] == []
    assert [p.name for p in tracked if p.is_file() and p.stat().st_size > MAX_BYTES] == []
