"""`make bench-steps` measures what it says: each stage counted once, every command on the run
the bench extracted, and a command that fails stops the bench instead of giving a figure.
Nothing here is timed: the figures are checked for what they count, not for their size."""

from __future__ import annotations

import json

import pytest

from benchmarks import bench
from tests.conftest import store_of
from tokenlake.generator import synth
from tokenlake.serve.query import run_query


def _stat(cumulative: float) -> tuple[int, int, float, float, dict]:
    return (1, 1, 0.0, cumulative, {})  # pstats' (calls, primitive calls, own, cumulative, callers)


def test_each_stage_counts_its_function_once():
    """The formats' `read_step` calls the format's own `read_step`, the generator has a
    `build_step` too, and `compute_step` (one step's rollups) calls `compute_steps`: each
    stage is one module's function."""
    stats = {
        ("/x/tokenlake/read/formats.py", 63, "read_step"): _stat(2.0),
        ("/x/tokenlake/read/miles.py", 21, "read_step"): _stat(1.9),  # inside the one above
        ("/x/tokenlake/transform/tables.py", 40, "build_step"): _stat(3.0),
        ("/x/tokenlake/generator/synth_spec.py", 258, "build_step"): _stat(7.0),
        ("/x/tokenlake/serve/rollups.py", 142, "compute_step"): _stat(0.25),  # one step's
        ("/x/tokenlake/serve/rollups.py", 160, "compute_steps"): _stat(0.5),  # calls this
        ("/x/tokenlake/orchestrate/step.py", 237, "_write_step"): _stat(0.25),
        ("/x/tokenlake/store/manifest.py", 190, "save_manifest"): _stat(0.125),
        ("/x/tokenlake/serve/catalog.py", 119, "build_catalog"): _stat(0.75),
    }
    assert bench.stage_seconds(stats)["stages"] == {
        "read": 2.0,
        "flatten": 1.0,
        "rollups": 0.5,
        "write": 0.25,
        "commit": 0.125,
        "catalog": 0.75,
    }


def test_a_failing_command_stops_the_bench(tmp_path):
    with pytest.raises(SystemExit) as failed:
        bench.command_cpu(["tag", str(tmp_path), bench.BENCH_RUN, "a=b"])
    assert str(failed.value) == (
        f"tokenlake tag {tmp_path} {bench.BENCH_RUN} a=b failed (exit 1):\n"
        f"Error: Lake `{tmp_path}`: is not a lake: it has no `_manifest/`; run `tokenlake"
        " extract` first"
    )


def test_every_command_is_timed_on_the_run_the_bench_extracted(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENLAKE_CACHE", str(tmp_path / "cache"))
    synth.write_dump(tmp_path / "example", synth.PRESETS["example"])
    bench.measure_extract(tmp_path / "example", tmp_path / "lake", 1)
    figures = bench.command_latencies(tmp_path / "lake", tmp_path, repeat=2)
    assert list(figures) == ["query", "audit", "verify", "tag", "report"]
    assert all(seconds > 0 for seconds in figures.values())
    # each `tag` set a new value on the bench's run: the last one is there
    tags = run_query(store_of(tmp_path / "lake"), "SELECT run, tags_json FROM runs").to_pylist()
    assert [(row["run"], json.loads(row["tags_json"])) for row in tags] == [
        (bench.BENCH_RUN, {"bench": "1"})
    ]
    assert (tmp_path / "report.html").stat().st_size > 0
