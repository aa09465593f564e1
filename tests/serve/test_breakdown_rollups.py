"""The drift_by_* views read rollups, never the tokens, and their rollups hold per-step rows."""

from __future__ import annotations

import pytest

from tests.conftest import store_of
from tests.lakes import build_lake
from tokenlake.serve import catalog, sql_views

BREAKDOWNS = {
    "drift_by_length": ("drift_sample_terms",),
    "drift_by_rank": ("drift_sample_terms",),
    "drift_by_staleness": ("drift_sample_terms",),
    "drift_by_position": ("drift_breakdown_parts",),
    "drift_by_turn": ("drift_breakdown_parts",),
    "drift_by_weight_version": ("drift_breakdown_parts",),
    "drift_by_prob": ("drift_breakdown_parts",),
    "drift_by_token": ("drift_token_id_parts", "vocab"),
}


@pytest.mark.parametrize("name", sorted(BREAKDOWNS))
def test_breakdown_inputs_are_rollups(name):
    text = sql_views.view_file(name).read_text(encoding="utf-8")
    assert sql_views.view_inputs(text) == BREAKDOWNS[name]


def _tokens(rollout_id: int) -> list[dict]:
    rows = []
    for batch_position in range(3):
        for position in range(5):
            lp = -0.2 - 0.3 * position
            rows.append({
                "run": "r", "rollout_id": rollout_id, "batch_position": batch_position,
                "position": position, "token_id": position % 2, "loss_mask": 1,
                "train_log_prob": lp, "rollout_log_prob": lp - 0.01 * (batch_position + rollout_id),
                "lp_diff": 0.01 * (batch_position + rollout_id), "entropy": 0.4 * position,
                "token_version": str(rollout_id - position % 2),
                "token_staleness": position % 2,
            })  # fmt: skip
    return rows


def _rows(lake, rollup: str, rollout_id: int) -> list[tuple]:
    con = catalog.connect(store_of(lake))
    try:
        return con.sql(
            f"SELECT * FROM {rollup} WHERE rollout_id = {rollout_id} ORDER BY ALL"
        ).fetchall()
    finally:
        con.close()


@pytest.mark.parametrize("rollup", ["drift_breakdown_parts", "drift_token_id_parts"])
def test_a_rollup_over_one_step_gives_that_steps_rows(tmp_path, rollup):
    build_lake(tmp_path / "both", tokens=_tokens(0) + _tokens(1))
    build_lake(tmp_path / "one", tokens=_tokens(1))
    rows = _rows(tmp_path / "one", rollup, 1)
    assert rows
    assert _rows(tmp_path / "both", rollup, 1) == rows


def test_breakdown_parts_rows_per_dimension(tmp_path):
    build_lake(tmp_path, tokens=_tokens(1))
    con = catalog.connect(store_of(tmp_path))
    try:
        got = con.sql(
            "SELECT dimension, bucket, token_version, token_staleness, tokens, samples"
            " FROM drift_breakdown_parts ORDER BY ALL"
        ).fetchall()
    finally:
        con.close()
    # 3 samples of 5 tokens: positions 0..4 (buckets 0, 1, 1, 2, 2), one turn, versions '1'
    # (even positions, staleness 0) and '0' (odd, 1), entropy 0, 0.4, 0.8, 1.2, 1.6.
    assert [row for row in got if row[0] != "rollout_prob"] == [
        ("entropy", 0, None, None, 3, 3),
        ("entropy", 2, None, None, 3, 3),
        ("entropy", 3, None, None, 3, 3),
        ("entropy", 4, None, None, 6, 3),
        ("position", 0, None, None, 3, 3),
        ("position", 1, None, None, 6, 3),
        ("position", 2, None, None, 6, 3),
        ("turn", 0, None, None, 15, 3),
        ("weight_version", None, "0", 1, 6, 3),
        ("weight_version", None, "1", 0, 9, 3),
    ]
    assert sum(row[4] for row in got if row[0] == "rollout_prob") == 15
