"""The sampler's support per token (dump-format.md 9b, miles #2595): `tokens.support_size`,
`samples.bounded_sampling`, and the audit `mixed_sampling_support` on the real dump."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from tests.conftest import store_of
from tests.fixture_paths import NEXT_DUMPS, NEXT_ORACLE
from tokenlake.errors import SampleValueError
from tokenlake.read.sampling_support import bounded, support_sizes


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    from tokenlake.orchestrate.extract import ExtractOptions, extract_run

    lake = tmp_path_factory.mktemp("support_lake")
    for case in ("sampling_support", "spec_rename"):
        assert (
            extract_run(
                NEXT_DUMPS / case, store_of(lake), ExtractOptions(run_name=case, strict=True)
            ).failed
            == []
        )
    return lake


def _query(lake, sql: str) -> list[tuple]:
    import duckdb

    with duckdb.connect(str(lake / "tokenlake.duckdb"), read_only=True) as con:
        return con.execute(sql).fetchall()


@pytest.mark.slow
def test_support_sizes_are_the_writers_own(lake):
    truth = json.loads((NEXT_ORACLE / "sampling_support" / "truth.json").read_text())["samples"]
    expected = [
        (int(rid), bp, True, sample["support_sizes"])
        for rid, samples in truth.items()
        for bp, sample in enumerate(samples)
    ]
    got = _query(
        lake,
        "SELECT s.rollout_id, s.batch_position, s.bounded_sampling,"
        " list(t.support_size ORDER BY t.position) FROM samples s JOIN tokens t"
        " USING (run, rollout_id, evaluation, batch_position)"
        " WHERE run = 'sampling_support' AND NOT evaluation GROUP BY ALL ORDER BY ALL",
    )
    assert got == expected
    assert sum(len(sizes) for *_, sizes in got) == 91
    assert sum(sum(sizes) for *_, sizes in got) == 205


@pytest.mark.slow
def test_eval_and_unbounded_runs_have_no_support(lake):
    got = _query(
        lake,
        "SELECT run, evaluation, bool_or(bounded_sampling), count(support_size) FROM samples"
        " JOIN tokens USING (run, rollout_id, evaluation, batch_position) GROUP BY ALL ORDER BY ALL",
    )
    assert got == [
        ("sampling_support", False, True, 91),
        ("sampling_support", True, False, 0),
        ("spec_rename", False, False, 0),
    ]
    # Each run alone is not mixed; the audit looks within a step.
    assert _query(
        lake,
        "SELECT count(*) FROM drift_tokens WHERE support_size IS NULL AND run = 'sampling_support'",
    ) == [(0,)]


def _sample(ids: Any, offsets: Any) -> dict[str, Any]:
    return {"rollout_sampling_mask_ids": ids, "rollout_sampling_mask_offsets": offsets}


def test_supports_that_do_not_fit_the_response_are_null():
    assert support_sizes(_sample([1, 2, 3], [0, 1, 3]), 2).tolist() == [1, 2]
    assert support_sizes(_sample([1, 2, 3], [0, 1, 3]), 3) is None
    assert support_sizes(_sample(None, None), 3) is None
    assert support_sizes({}, 3) is None


BAD = [
    (_sample([1], None), "`rollout_sampling_mask_ids` is set but `rollout_sampling_mask_offsets` is None; miles writes both"),
    (_sample(None, [0]), "`rollout_sampling_mask_offsets` is set but `rollout_sampling_mask_ids` is None; miles writes both"),
    (_sample("12", [0, 2]), "`rollout_sampling_mask_ids` is '12', not a list of integers"),
    (_sample([1, 2], [0, 2.0]), "`rollout_sampling_mask_offsets` holds 2.0, not integer offsets"),
    (_sample([1, 2], [0, 2**70]), f"`rollout_sampling_mask_offsets` holds {2**70}, outside 0..2 (the number of `rollout_sampling_mask_ids`)"),
    (_sample([1, 2], [1, 2]), "`rollout_sampling_mask_offsets` run from 1 to 2; expected 0 to 2 (the number of `rollout_sampling_mask_ids`)"),
    (_sample([1, 2], [0, 2, 2]), "`rollout_sampling_mask_offsets` are not strictly increasing (an empty support)"),
]  # fmt: skip


@pytest.mark.parametrize(("sample", "problem"), BAD)
def test_malformed_supports_are_named(sample, problem):
    with pytest.raises(SampleValueError) as caught:
        support_sizes(sample, 1)
    assert str(caught.value) == problem


def _slime(ids: Any, offsets: Any) -> dict[str, Any]:
    return {"rollout_top_p_token_ids": ids, "rollout_top_p_token_offsets": offsets}


def test_slimes_top_p_supports_are_read_as_miles_are():
    """slime #2102 records the top-p supports under its own keys, as lists or int32 tensors
    (arrays once read); miles' keys win where a sample had both."""
    assert support_sizes(_slime([4, 5, 6], [0, 1, 3]), 2).tolist() == [1, 2]
    offsets = np.array([0, 2, 3], dtype=np.int32)
    assert support_sizes(_slime(np.arange(3, dtype=np.int32), offsets), 2).tolist() == [2, 1]
    both = {**_slime([4, 5, 6], [0, 1, 3]), **_sample([1], [0, 1])}
    assert support_sizes(both, 1).tolist() == [1]
    assert bounded(_slime([4], [0, 1])) and bounded(_sample([1], [0, 1]))
    assert not bounded(_slime(None, None)) and not bounded({})


SLIME_BAD = [
    (_slime([1], None), "`rollout_top_p_token_ids` is set but `rollout_top_p_token_offsets` is None; slime writes both"),
    (_slime(np.zeros((1, 2), dtype=np.int32), [0, 2]), "`rollout_top_p_token_ids` is an int32 array of shape (1, 2), not a list of integers"),
    (_slime([1, 2], np.array([0, 1], dtype=np.int32)), "`rollout_top_p_token_offsets` run from 0 to 1; expected 0 to 2 (the number of `rollout_top_p_token_ids`)"),
    (_slime([1, 2], np.array([], dtype=np.int32)), "`rollout_top_p_token_offsets` holds an int32 array of shape (0,), not integer offsets"),
]  # fmt: skip


@pytest.mark.parametrize(("sample", "problem"), SLIME_BAD)
def test_malformed_slime_supports_are_named(sample, problem):
    with pytest.raises(SampleValueError) as caught:
        support_sizes(sample, 1)
    assert str(caught.value) == problem
