"""Conversations from trajectory/ land in samples.messages_json, matched by sample index."""

from __future__ import annotations

import json

import duckdb
import pytest

from tests.conftest import store_of
from tests.fixture_paths import REAL_DUMPS
from tokenlake.errors import DumpFormatError
from tokenlake.orchestrate.extract import ExtractOptions, extract_run
from tokenlake.read.trajectory import messages_by_position

REAL = REAL_DUMPS


@pytest.mark.slow
def test_real_conversations_reach_the_samples_table(tmp_path):
    extract_run(REAL / "basic", store_of(tmp_path), ExtractOptions(run_name="basic"))
    con = duckdb.connect(str(tmp_path / "tokenlake.duckdb"), read_only=True)
    got = con.execute(
        "SELECT rollout_id, evaluation, sample_index, messages_json FROM samples"
        " WHERE messages_json IS NOT NULL ORDER BY rollout_id, batch_position"
    ).fetchall()
    expected = []
    for rid in (0, 1):
        for line in (REAL / "basic" / "trajectory" / f"{rid}.jsonl").read_text().splitlines():
            record = json.loads(line)
            expected.append((rid, False, record["sample_index"], record["messages"]))
    assert [(r, e, i, json.loads(m)) for r, e, i, m in got] == expected
    assert len(expected) == 4


def test_repeated_indices_go_to_samples_in_order(tmp_path):
    path = tmp_path / "eval_0.jsonl"
    path.write_text(
        '{"sample_index": 0, "messages": ["a"]}\n{"sample_index": 0, "messages": ["b"]}\n'
    )
    samples = [{"index": 0}, {"index": 1}, {"index": 0}]
    assert messages_by_position(path, samples) == ['["a"]', None, '["b"]']


def test_a_broken_line_names_the_file_and_line(tmp_path):
    path = tmp_path / "3.jsonl"
    path.write_text('{"sample_index": 0, "messages": []}\n{"sample_ind')
    with pytest.raises(DumpFormatError) as caught:
        messages_by_position(path, [{"index": 0}])
    assert str(caught.value).startswith(f"`{path}`: line 2 is not a trajectory record (")
    assert str(caught.value).endswith("; delete or fix it")
