"""`samples` of the drift_by_* views is an exact distinct count, across sample blocks."""

from __future__ import annotations

import math
from collections import defaultdict

from tests.conftest import store_of
from tests.lakes import build_lake
from tokenlake.serve import catalog

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
    con = catalog.connect(store_of(tmp_path))
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


def test_prob_and_entropy_buckets_follow_the_edges_column(tmp_path):
    """The view's CASE buckets agree with its own `bucket_low` edges, next to every edge."""
    edges_p = [1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 0.1, 0.5, 0.9, 0.99]
    edges_e = [0.01, 0.1, 0.5, 1.0, 2.0, 4.0]
    probs = [p * f for p in edges_p for f in (0.999, 1.001)] + [1.0, 1e-30]
    entropies = [e * f for e in edges_e for f in (0.999, 1.001)] + [-1.0, 0.0, 50.0]
    rows = [
        {"run": "r", "rollout_id": 0, "batch_position": i, "position": 0, "token_id": 1,
         "loss_mask": 1, "train_log_prob": math.log(p), "rollout_log_prob": math.log(p),
         "lp_diff": 0.0, "entropy": entropies[i % len(entropies)]}
        for i, p in enumerate(probs)
    ]  # fmt: skip
    build_lake(tmp_path, tokens=rows)
    con = catalog.connect(store_of(tmp_path))
    try:
        got = con.sql("SELECT dimension, bucket_low, tokens FROM drift_by_prob").fetchall()
        lows = {
            d: sorted(low for dd, low, _ in got if dd == d) for d in ("rollout_prob", "entropy")
        }
        stored = con.sql(
            "SELECT exp(rollout_log_prob), entropy::DOUBLE FROM drift_tokens"
        ).fetchall()
    finally:
        con.close()
    expected: dict[tuple[str, float], int] = defaultdict(int)
    for prob, entropy in stored:
        for dimension, value, edges in (
            ("rollout_prob", prob, [0.0, *edges_p]),
            ("entropy", entropy, [-math.inf, *edges_e]),
        ):
            expected[dimension, max(low for low in edges if low <= value)] += 1
    assert {(d, low): n for d, low, n in got} == dict(expected)
    assert set(lows["rollout_prob"]) <= {0.0, *edges_p}


def test_a_non_finite_entropy_is_in_no_entropy_bucket(tmp_path):
    """NaN compares above every edge in DuckDB: it must not read as an entropy of 4 nats or
    more (nor -inf as below 0.01); such tokens stay in the probability dimension."""
    entropies = [math.nan, math.inf, -math.inf, 0.3, None]
    rows = [
        {"run": "r", "rollout_id": 0, "batch_position": i, "position": 0, "token_id": 1,
         "loss_mask": 1, "train_log_prob": -0.5, "rollout_log_prob": -0.5, "lp_diff": 0.0,
         "entropy": entropy}
        for i, entropy in enumerate(entropies)
    ]  # fmt: skip
    build_lake(tmp_path, tokens=rows)
    con = catalog.connect(store_of(tmp_path))
    try:
        got = con.sql(
            "SELECT dimension, bucket_low, tokens FROM drift_by_prob ORDER BY ALL"
        ).fetchall()
    finally:
        con.close()
    assert got == [("entropy", 0.1, 1), ("rollout_prob", 0.5, 5)]
