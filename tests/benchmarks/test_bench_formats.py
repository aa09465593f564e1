"""`make bench-formats` (pipeline/benchmarks/bench_formats.py): its arguments, the partition columns
it adds for the table formats, and how it picks and prints the best repetition. The measuring
itself needs the `formats` extra and a server; `make bench-formats` runs it."""

from __future__ import annotations

import pyarrow as pa
import pytest

from benchmarks import bench_formats
from benchmarks import bench_formats_writers as bw


@pytest.mark.parametrize("args", [["--steps", "0"], ["--repeat", "0"], ["--scale", "0"]])
def test_bad_arguments_are_refused_before_anything_runs(args, capsys):
    with pytest.raises(SystemExit) as stop:
        bench_formats.main(args)
    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "python -m benchmarks.bench_formats: error:"
        " --steps, --repeat and --tiny must be at least 1, --scale above 0"
    )


def test_partition_columns_are_added_as_real_columns():
    table = pa.table({"position": pa.array([0, 1, 2], pa.int32())})
    out = bw.with_partitions(table, 7)
    assert out.schema.names == ["position", "run", "rollout_id"]
    assert out.schema.field("run").type == pa.string()
    assert out.schema.field("rollout_id").type == pa.int64()
    assert out.column("run").to_pylist() == ["bench"] * 3
    assert out.column("rollout_id").to_pylist() == [7, 7, 7]


def _figures(total: float, rewrite: float) -> bw.Figures:
    return bw.Figures("w", [total / 2, total / 2], [0.01, 0.03], rewrite, 5, 4, 4000, 300)


def test_the_best_run_has_the_lowest_total_and_the_lowest_rewrite_of_all():
    best = bench_formats._best([_figures(2.0, 0.1), _figures(1.0, 0.5), _figures(3.0, 0.2)])
    assert best.total == 1.0
    assert best.rewrite == 0.1


def test_a_figure_line_shows_median_step_commit_total_rewrite_objects_and_bytes_per_token():
    lines = bench_formats.figure_lines([_figures(1.0, 0.25)], tokens=1000)
    assert lines[1] == (
        f"  {'w':<34}    500ms   500ms    20ms   1.00s    250ms       5       4    4.00      300"
    )
