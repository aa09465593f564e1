"""`samples` of the drift_by_* views is an exact distinct count, across sample blocks."""

from __future__ import annotations

from collections import defaultdict

from pipeline import catalog
from tests.lakes import build_lake

# Batch positions on both sides of every 64-bit word and 256-sample block edge, and negative.
POSITIONS = (0, 1, 63, 64, 127, 128, 191, 192, 255, 256, 257, 511, 512, 1000, 70_000, -1, -300)


def _rows() -> list[dict]:
    rows = []
    for i, batch_position in enumerate(POSITIONS):
        for position in range(4):
            token_id = (i + position) % 3  # each id in many samples, twice in some
            lp = -0.5 - 0.1 * position
            rows.append({
                "run": "r", "rollout_id": i % 2, "batch_position": batch_position,
                "position": position, "token_id": token_id, "loss_mask": 1,
                "train_log_prob": lp, "rollout_log_prob": lp - 0.01 * i,
                "lp_diff": 0.01 * i, "entropy": 0.3 * position,
            })  # fmt: skip
    return rows


def _expected(rows: list[dict], key: str) -> dict[tuple, int]:
    found: dict[tuple, set[int]] = defaultdict(set)
    for row in rows:
        found[row["rollout_id"], row[key]].add(row["batch_position"])
    return {k: len(v) for k, v in found.items()}


def test_samples_per_token_and_per_turn_are_exact(tmp_path):
    rows = _rows()
    build_lake(tmp_path, tokens=rows)
    con = catalog.connect(tmp_path)
    try:
        by_token = con.sql("SELECT rollout_id, token_id, samples FROM drift_by_token").fetchall()
        by_turn = con.sql("SELECT rollout_id, turn_index, samples FROM drift_by_turn").fetchall()
        by_entropy = con.sql(
            "SELECT rollout_id, samples, tokens FROM drift_by_prob WHERE dimension = 'entropy'"
        ).fetchall()
    finally:
        con.close()
    assert {(r, t): n for r, t, n in by_token} == _expected(rows, "token_id")
    assert {(r, t): n for r, t, n in by_turn} == {
        (r, 0): n for (r, _), n in _expected(rows, "run").items()
    }
    # Each step's samples sit in several entropy buckets; each bucket counts each sample once.
    assert sum(tokens for _, _, tokens in by_entropy) == len(rows)
    assert all(samples == 9 if r == 0 else samples == 8 for r, samples, _ in by_entropy)
