"""Parallel extraction (worker processes plus a thread of the parent) writes the same lake."""

from __future__ import annotations

import duckdb
import pytest

from tests.conftest import store_of
from tokenlake.generator import synth
from tokenlake.orchestrate.extract import ExtractOptions, extract_run


def _rows(lake, table):
    con = duckdb.connect(str(lake / "tokenlake.duckdb"), read_only=True)
    return sorted(map(repr, con.execute(f"SELECT * FROM {table}").fetchall()))


@pytest.mark.slow
def test_three_workers_write_what_one_writes(tmp_path):
    dump = tmp_path / "dump"
    synth.write_dump(dump, synth.PRESETS["example"])
    serial = extract_run(
        dump, store_of(tmp_path / "serial"), ExtractOptions(run_name="ex", workers=1)
    )
    parallel = extract_run(
        dump, store_of(tmp_path / "parallel"), ExtractOptions(run_name="ex", workers=3)
    )
    assert serial.counts == parallel.counts == {
        "new": 4, "updated": 0, "unchanged": 0, "removed": 0, "skipped": 0,
    }  # fmt: skip
    assert sorted(s.rollout_id for s in parallel.steps) == [0, 0, 1, 2]
    for table in ("tokens", "samples"):
        assert _rows(tmp_path / "serial", table) == _rows(tmp_path / "parallel", table)
