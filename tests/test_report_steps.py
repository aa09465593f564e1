"""`tokenlake report --steps` hands the report a lazy range selection, not a list."""

from __future__ import annotations

from pipeline import catalog, report
from pipeline.cli_util import parse_steps
from tests.lakes import build_lake


def test_a_range_selection_keeps_the_steps_the_lake_has(tmp_path):
    samples = [
        {"run": run, "rollout_id": step, "batch_position": 0}
        for run, steps in (("a", (0, 1, 5, 12)), ("b", (3,)))
        for step in steps
    ]
    build_lake(tmp_path, samples=samples)
    con = catalog.connect(tmp_path)
    try:
        assert report._step_ids(con, ("a",), parse_steps("1-5,12,99")) == (1, 5, 12)
        assert report._step_ids(con, ("a", "b"), parse_steps("2-4")) == (3,)
        assert report._step_ids(con, ("a",), [7, 1]) == (7, 1)  # a list is kept as given
    finally:
        con.close()
