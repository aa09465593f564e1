"""Per-sample columns (dump-format.md 6.2) on the value shapes old and unusual dumps carry."""

from __future__ import annotations

import numpy as np

from tokenlake.read.pt import SpecInfo
from tokenlake.transform.summary import sample_summary


def _sample(**fields):
    base = {
        "index": 4,
        "group_index": 2,
        "tokens": [10, 11, 12, 13, 14],
        "response_length": 2,
        "status": "completed",
        "reward": 1.0,
        "weight_versions": ["7", "8"],
        "prompt": "plain text",
        "metadata": {},
    }
    return {**base, **fields}


def test_rollout_side_columns_of_an_ordinary_sample():
    row = sample_summary(9, False, 3, _sample(), None, step_train_files=0)
    picked = {
        k: row[k]
        for k in (
            "batch_position",
            "sample_index",
            "prompt_length",
            "prompt_token_ids",
            "reward",
            "reward_json",
            "weight_version",
            "weight_version_min",
            "mixed_version",
            "staleness",
            "turns",
            "tool_calls",
            "has_train_row",
            "truncated",
            "alignment_failed",
            "step_train_files",
        )
    }
    assert picked == {
        "batch_position": 3,
        "sample_index": 4,
        "prompt_length": 3,
        "prompt_token_ids": [10, 11, 12],
        "reward": 1.0,
        "reward_json": None,
        "weight_version": "8",
        "weight_version_min": 7,
        "mixed_version": True,
        "staleness": 2,
        "turns": 2,
        "tool_calls": None,
        "has_train_row": False,
        "truncated": False,
        "alignment_failed": False,
        "step_train_files": 0,
    }


def test_dict_and_numpy_rewards_follow_the_reference_rule():
    row = sample_summary(0, False, 0, _sample(reward={"acc": 1, "fmt": 0.5}), None)
    assert (row["reward"], row["reward_json"]) == (None, '{"acc": 1, "fmt": 0.5}')
    row = sample_summary(0, False, 0, _sample(reward=np.float32(0.5)), None)
    assert (row["reward"], row["reward_json"]) == (None, "0.5")
    row = sample_summary(0, False, 0, _sample(reward=np.float64(0.25)), None)
    assert (row["reward"], row["reward_json"]) == (0.25, None)
    row = sample_summary(0, False, 0, _sample(reward=True), None)
    assert row["reward"] == 1.0


def test_versions_that_are_not_numbers_and_empty_versions():
    row = sample_summary(5, False, 0, _sample(weight_versions=["v2", "3", "3"]), None)
    assert (row["weight_version"], row["weight_version_min"], row["mixed_version"]) == (
        "3",
        3,
        True,
    )
    assert row["staleness"] == 2
    row = sample_summary(5, False, 0, _sample(weight_versions=[]), None)
    assert [row[k] for k in ("weight_version", "weight_version_min", "mixed_version", "turns")] == [
        None,
        None,
        None,
        None,
    ]


def test_chat_prompt_counts_tool_messages_and_is_kept_as_json():
    prompt = [{"role": "user", "content": "é"}, {"role": "tool", "content": "2"}]
    row = sample_summary(0, False, 0, _sample(prompt=prompt), None)
    assert row["tool_calls"] == 1
    assert (
        row["prompt_text"] == '[{"role": "user", "content": "é"}, {"role": "tool", "content": "2"}]'
    )


def test_spec_info_as_dict_or_old_object_and_prefix_cache():
    info = {"spec_accept_token_num": 3, "spec_draft_token_num": 4}
    cache = {"cached_tokens": 1, "total_prompt_tokens": 4}
    row = sample_summary(0, False, 0, _sample(spec_info=info, prefix_cache_info=cache), None)
    assert (row["spec_accept_rate"], row["prefix_cache_hit_rate"]) == (0.75, 0.25)
    # the reader turns the older pickled object into this dict (tests/read/test_older_dumps.py)
    old = SpecInfo(spec_accept_token_num=1, spec_draft_token_num=2).to_dict()
    row = sample_summary(0, False, 0, _sample(spec_info=old), None)
    assert row["spec_accept_rate"] == 0.5
    zero = {"spec_accept_token_num": 0, "spec_draft_token_num": 0}
    assert sample_summary(0, False, 0, _sample(spec_info=zero), None)["spec_accept_rate"] is None


def test_a_missing_numerator_is_an_unknown_rate_not_0():
    """A dict that gives the drafts (or the prompt tokens) but not what was accepted (or
    cached) says nothing about the rate: NULL, never a made-up 0.0."""
    spec = {"spec_num_proposed_drafts": 12, "spec_num_correct_drafts": None}
    cache = {"total_prompt_tokens": 8}
    row = sample_summary(0, False, 0, _sample(spec_info=spec, prefix_cache_info=cache), None)
    assert (row["spec_accept_rate"], row["prefix_cache_hit_rate"]) == (None, None)


def test_truncated_comes_from_status_without_a_train_row():
    row = sample_summary(0, False, 0, _sample(status="truncated"), None)
    assert row["truncated"] is True
