"""The documented sample key is a key: drift_samples joins samples one to one."""

from __future__ import annotations

import pytest

import tokenlake
from tests.fixture_paths import REAL_DUMPS

JOIN = "drift_samples AS d JOIN samples AS s USING (run, rollout_id, evaluation, batch_position)"


@pytest.mark.slow
def test_drift_samples_join_samples_one_to_one_and_carry_reward_and_staleness(tmp_path):
    lake = tokenlake.Lake(tmp_path / "lake")
    lake.extract(REAL_DUMPS / "basic", run_name="basic")  # step 0 has an eval file too
    one = lake.sql("SELECT count(*) FROM drift_samples").fetchall()
    assert lake.sql(f"SELECT count(*) FROM {JOIN}").fetchall() == one
    assert lake.sql(
        "SELECT count(*) FROM samples WHERE rollout_id = 0 AND batch_position = 0"
    ).fetchall() == [(2,)]  # the train and the eval sample of step 0 share a position
    mismatched = lake.sql(
        f"SELECT count(*) FROM {JOIN} WHERE d.reward IS DISTINCT FROM s.reward"
        " OR d.raw_reward IS DISTINCT FROM s.raw_reward"
        " OR d.staleness IS DISTINCT FROM s.staleness OR d.evaluation"
    ).fetchall()
    assert mismatched == [(0,)]
    assert lake.sql("SELECT count(*) FROM drift_samples WHERE reward IS NULL").fetchall() == [(0,)]
