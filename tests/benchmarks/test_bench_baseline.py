"""`make bench` compares tokenlake with two straightforward scripts; they must keep running as
the schema grows (a column they do not derive is NULL), and a failing child says why."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from benchmarks import bench
from tokenlake import schema
from tokenlake.generator import synth


@pytest.mark.parametrize("weights_only", [True, False], ids=["safe", "unsafe"])
def test_the_scripts_write_every_token_of_the_example_in_the_lake_schema(tmp_path, weights_only):
    synth.write_dump(tmp_path / "dump", synth.PRESETS["example"])
    figures = bench.measure_baseline(tmp_path / "dump", tmp_path / "out", weights_only)
    assert figures["tokens"] == 4_079  # the example lake's `tokens` rows
    files = sorted((tmp_path / "out").glob("*.parquet"))
    assert [f.name for f in files] == ["0.parquet", "1.parquet", "2.parquet", "eval_0.parquet"]
    assert all(pq.read_schema(f).names == schema.TOKENS_SCHEMA.names for f in files)


def test_a_failing_child_shows_its_own_error(tmp_path):
    with pytest.raises(SystemExit) as failed:
        bench._run_child("_baseline", str(tmp_path / "missing"), str(tmp_path / "out"))
    message = str(failed.value)
    assert message.startswith(f"benchmarks.bench _baseline {tmp_path / 'missing'} ")
    assert "Traceback" in message
