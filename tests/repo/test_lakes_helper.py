from __future__ import annotations

import duckdb

from tests.lakes import build_lake


def test_hand_built_lake_reads_back_with_partition_columns(tmp_path):
    path = build_lake(
        tmp_path,
        tokens=[
            {
                "run": "it's",
                "rollout_id": 3,
                "batch_position": 1,
                "position": 0,
                "token_id": 7,
                "loss_mask": 1,
                "lp_diff": 0.5,
            },
        ],
        samples=[{"run": "it's", "rollout_id": 3, "batch_position": 1, "reward": 1.0}],
    )
    con = duckdb.connect(str(path), read_only=True)
    assert con.sql("SELECT run, rollout_id, token_id, lp_diff FROM tokens").fetchall() == [
        ("it's", 3, 7, 0.5)
    ]
    assert con.execute("SELECT count(*) FROM runs").fetchone() == (0,)
