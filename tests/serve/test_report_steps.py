"""`tokenlake report --steps` hands the report a lazy range selection, never expanded."""

from __future__ import annotations

from tokenlake.serve import report
from tokenlake.serve.report_data import Selection
from tokenlake.steps import parse_steps


def test_a_range_selection_becomes_ranges_not_a_list():
    assert report._step_ranges(parse_steps("1-5,12,99")) == ((1, 5), (12, 12), (99, 99))
    assert report._step_ranges(parse_steps("0-10000000000")) == ((0, 10_000_000_000),)
    assert report._step_ranges([7, 1, 7]) == ((1, 1), (7, 7))  # step ids, as the library takes
    assert report._step_ranges(None) is None


def test_the_ranges_filter_every_dataset_in_sql():
    selection = Selection(("a",), report._step_ranges(parse_steps("1-5,12")))
    assert selection.where() == (
        "run IN ('a') AND (rollout_id BETWEEN 1 AND 5 OR rollout_id BETWEEN 12 AND 12)"
    )
