"""`sample_stats`, `group_stats` and `step_stats` on a hand-built lake (dump-format.md 6.2-6.4).

Run `a` step 0 (train):
  bp0  group 0, raw_reward 1, mask [1, 0, 1] with real values at the masked position too
  bp1  group 0, raw_reward 0, removed: mask [0, 0], every stat NULL (the extraction rule)
  bp2  group 1, raw_reward 1, one covered token
  bp3  group 2, no raw_reward, R = 0 (no token rows at all)
Run `a` step 0 (eval): three samples without a train side, group_index NULL, rollout mask 1
  and (deliberately) non-NULL entropy/lp_diff, which must not leak into the statistics.
Run `a` step 1 (train): two samples with NULL group_index, a NaN entropy in bp0.
Run `b` step 0 (train): one sample, same keys as run `a`, other values.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.lakes import build_lake

F32 = np.float32


def _tokens(run, rid, bp, masks, evaluation=False, **columns):
    rows = []
    for pos, mask in enumerate(masks):
        row = {
            "run": run,
            "rollout_id": rid,
            "evaluation": evaluation,
            "batch_position": bp,
            "sample_index": bp,
            "position": pos,
            "token_id": 100 + pos,
            "loss_mask": mask,
        }
        row.update({name: values[pos] for name, values in columns.items()})
        rows.append(row)
    return rows


def _sample(run, rid, bp, evaluation=False, **fields):
    row = {
        "run": run,
        "rollout_id": rid,
        "evaluation": evaluation,
        "batch_position": bp,
        "sample_index": bp,
        "has_train_row": not evaluation,
    }
    row.update(fields)
    return row


TOKENS = [
    *_tokens(
        "a",
        0,
        0,
        [1, 0, 1],
        entropy=[0.5, 9.0, 0.25],
        ref_entropy=[1.0, 3.0, 2.0],
        lp_diff=[-0.5, 7.0, 0.25],
        advantage=[1.0, 5.0, 2.0],
        returns=[0.5, 4.0, 1.5],
    ),
    *_tokens("a", 0, 1, [0, 0]),
    *_tokens(
        "a",
        0,
        2,
        [1],
        entropy=[0.75],
        ref_entropy=[0.5],
        lp_diff=[0.5],
        advantage=[2.0],
        returns=[1.0],
    ),
    *_tokens("a", 0, 0, [1, 1], evaluation=True, rollout_log_prob=[-0.5, -1.0], entropy=[1.0, 1.0]),
    *_tokens("a", 0, 1, [1], evaluation=True, rollout_log_prob=[-0.5], lp_diff=[3.0]),
    *_tokens("a", 0, 2, [None], evaluation=True, rollout_log_prob=[-0.5]),
    *_tokens("a", 1, 0, [1, 1], entropy=[float("nan"), 1.0], lp_diff=[0.5, 0.5]),
    *_tokens("a", 1, 1, [1], entropy=[0.5], lp_diff=[0.25]),
    *_tokens("b", 0, 0, [1], entropy=[2.0], lp_diff=[-1.0], advantage=[0.5]),
]
SAMPLES = [
    _sample(
        "a",
        0,
        0,
        group_index=0,
        raw_reward=1.0,
        reward=1.0,
        response_length=3,
        mixed_version=True,
    ),
    _sample(
        "a",
        0,
        1,
        group_index=0,
        raw_reward=0.0,
        response_length=2,
        truncated=True,
        remove_sample=True,
        mixed_version=False,
    ),
    _sample("a", 0, 2, group_index=1, raw_reward=1.0, response_length=1),
    _sample("a", 0, 3, group_index=2, response_length=0, mixed_version=False),
    _sample("a", 0, 0, evaluation=True, reward=1.0, response_length=2),
    _sample("a", 0, 1, evaluation=True, reward=0.0, response_length=1, truncated=True),
    _sample("a", 0, 2, evaluation=True, response_length=1),
    _sample("a", 1, 0, raw_reward=0.5, response_length=2),
    _sample("a", 1, 1, raw_reward=0.5, response_length=1),
    _sample("b", 0, 0, group_index=0, raw_reward=0.25, response_length=1, mixed_version=True),
]

MASKED_STATS = (
    "mean_entropy, max_entropy, ref_entropy_mean, mean_abs_lp_diff, max_abs_lp_diff, "
    "mean_imp_ratio, adv_mean, adv_std, return_mean"
)


@pytest.fixture(scope="module")
def con(tmp_path_factory):
    import duckdb

    lake = tmp_path_factory.mktemp("stats_lake")
    connection = duckdb.connect(str(build_lake(lake, tokens=TOKENS, samples=SAMPLES)))
    yield connection
    connection.close()


def _sample_row(con, run, rid, bp, evaluation=False):
    sql = (
        f"SELECT {MASKED_STATS} FROM sample_stats "
        "WHERE run = ? AND rollout_id = ? AND batch_position = ? AND evaluation = ?"
    )
    rows = con.execute(sql, [run, rid, bp, evaluation]).fetchall()
    assert len(rows) == 1
    return rows[0]


def _mean(values):
    return float(np.mean(np.asarray(values, dtype=F32).astype(np.float64)))


def test_sample_stats_has_one_row_per_rollout_sample(con):
    keys = con.execute(
        "SELECT run, rollout_id, evaluation, batch_position, sample_index, has_train_row "
        "FROM sample_stats ORDER BY ALL"
    ).fetchall()
    assert keys == [
        ("a", 0, False, 0, 0, True),
        ("a", 0, False, 1, 1, True),
        ("a", 0, False, 2, 2, True),
        ("a", 0, False, 3, 3, True),
        ("a", 0, True, 0, 0, False),
        ("a", 0, True, 1, 1, False),
        ("a", 0, True, 2, 2, False),
        ("a", 1, False, 0, 0, True),
        ("a", 1, False, 1, 1, True),
        ("b", 0, False, 0, 0, True),
    ]


def test_masked_positions_are_excluded(con):
    assert _sample_row(con, "a", 0, 0) == (
        0.375,  # mean of 0.5, 0.25 (9.0 is masked)
        0.5,
        1.5,
        0.375,
        0.5,
        float(np.mean(np.exp([-0.5, 0.25]))),
        1.5,
        math.sqrt(0.5),
        1.0,
    )


def test_removed_sample_gets_null_masked_stats_but_keeps_rewards(con):
    assert _sample_row(con, "a", 0, 1) == (None,) * 9
    assert con.execute(
        "SELECT raw_reward, truncated, remove_sample FROM sample_stats "
        "WHERE run = 'a' AND rollout_id = 0 AND NOT evaluation AND batch_position = 1"
    ).fetchall() == [(0.0, True, True)]


def test_one_covered_token_gives_null_adv_std(con):
    assert _sample_row(con, "a", 0, 2) == (
        0.75,
        0.75,
        0.5,
        0.5,
        0.5,
        math.exp(0.5),
        2.0,
        None,
        1.0,
    )


def test_empty_response_still_has_a_row_with_null_stats(con):
    assert _sample_row(con, "a", 0, 3) == (None,) * 9


@pytest.mark.parametrize("bp", [0, 1, 2])
def test_samples_without_train_side_get_null_stats(con, bp):
    assert _sample_row(con, "a", 0, bp, evaluation=True) == (None,) * 9


def test_nan_propagates_into_mean_and_max(con):
    row = _sample_row(con, "a", 1, 0)
    assert math.isnan(row[0]) and math.isnan(row[1])
    assert row[2:] == (None, 0.5, 0.5, math.exp(0.5), None, None, None)


def test_runs_are_kept_apart(con):
    assert _sample_row(con, "b", 0, 0) == (
        2.0,
        2.0,
        None,
        1.0,
        1.0,
        math.exp(-1.0),
        0.5,
        None,
        None,
    )
    assert con.execute(
        "SELECT run, n, reward_mean FROM group_stats WHERE rollout_id = 0 AND group_index = 0 "
        "AND NOT evaluation ORDER BY run"
    ).fetchall() == [("a", 2, 0.5), ("b", 1, 0.25)]


def _groups(con, run, rid, evaluation):
    return con.execute(
        "SELECT group_index, n, reward_mean, reward_std, response_length_mean, truncated_frac, "
        "zero_std FROM group_stats WHERE run = ? AND rollout_id = ? AND evaluation = ? "
        "ORDER BY group_index NULLS FIRST",
        [run, rid, evaluation],
    ).fetchall()


def test_train_groups_use_raw_reward_and_zero_std_rules(con):
    assert _groups(con, "a", 0, False) == [
        (0, 2, 0.5, float(np.std([1.0, 0.0], ddof=1)), 2.5, 0.5, False),
        (1, 1, 1.0, None, 1.0, 0.0, True),  # one rewarded sample: degenerate
        (2, 1, None, None, 0.0, 0.0, None),  # no reward data: unknown, not "not degenerate"
    ]


def test_eval_group_uses_reward_and_null_group_index_forms_one_group(con):
    assert _groups(con, "a", 0, True) == [
        (None, 3, 0.5, float(np.std([1.0, 0.0], ddof=1)), 4 / 3, 1 / 3, False),
    ]


def test_train_samples_without_group_index_are_no_group_whose_spread_is_known(con):
    # Equal rewards, but nothing says the two samples share a prompt: zero_std is unknown.
    assert _groups(con, "a", 1, False) == [(None, 2, 0.5, 0.0, 1.5, 0.0, None)]


def test_step_stats(con):
    rows = con.execute("SELECT * FROM step_stats ORDER BY run, rollout_id").fetchall()
    assert rows[0] == (
        "a",
        0,
        4,  # eval samples excluded
        2 / 3,
        float(np.std([1.0, 0.0, 1.0], ddof=1)),
        1.5,
        0.25,
        0.5,  # group 1 of groups 0 and 1; group 2 (no reward data) is unknown, not counted
        0.4375,  # unweighted mean of 0.375 and 0.5
        0.5625,  # mean of 0.375 and 0.75
        1 / 3,  # bp2 has no mixed_version and is skipped
    )
    assert rows[1][:8] == ("a", 1, 2, 0.5, 0.0, 1.5, 0.0, None)  # no prompt groups: unknown
    assert math.isnan(rows[1][9])  # a NaN per-sample mean_entropy makes the step's NaN
    assert rows[1][8] == _mean([0.5, 0.25]) and rows[1][10] is None
    assert rows[2] == ("b", 0, 1, 0.25, None, 1.0, 0.0, 1.0, 1.0, 2.0, 1.0)
    assert len(rows) == 3
