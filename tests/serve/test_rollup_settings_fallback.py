"""Views over rollups give the same rows inside and outside what the rollups keep.

drift_histogram, drift_outliers and the audit large_lp_diff read rollups that cover a list of
half-widths, the top 100 outliers per step and |delta| >= 5 nats; a setting beyond those reads
the tokens instead. Either way the rows must be what numpy computes from the stored tokens.
The lake has one step of 360 covered tokens whose deltas repeat (ties) and sit on bin edges.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import store_of
from tests.lakes import build_lake
from tokenlake.serve.query import run_query
from tokenlake.serve.sql_views import sql_dir

F32 = np.float32
DELTAS = [0.25, -0.25, 0.5, -1.0, 0.0078125, 0.03, 6.0, -7.5, 0.1, 0.0, 25.0, -0.004]


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    rng = np.random.default_rng(7)
    tokens = []
    for bp in range(3):
        for pos in range(120):
            rollout = F32(-rng.exponential(2.0))
            train = F32(rollout + F32(DELTAS[int(rng.integers(0, len(DELTAS)))]))
            tokens.append(
                {
                    "run": "r",
                    "rollout_id": 1,
                    "evaluation": False,
                    "batch_position": bp,
                    "sample_index": bp,
                    "position": pos,
                    "token_id": pos % 7,
                    "loss_mask": 1,
                    "train_log_prob": float(train),
                    "rollout_log_prob": float(rollout),
                    "lp_diff": float(F32(train - rollout)),
                    "entropy": 1.0,
                }
            )
    samples = [
        {"run": "r", "rollout_id": 1, "evaluation": False, "batch_position": bp,
         "sample_index": bp, "response_length": 120, "has_train_row": True}
        for bp in range(3)
    ]  # fmt: skip
    lake = tmp_path_factory.mktemp("tied_lake")
    build_lake(lake, tokens=tokens, samples=samples)
    return lake, tokens


def stored_half_widths(lake):
    return run_query(store_of(lake), "SELECT histogram_half_widths() AS w").to_pylist()[0]["w"]


@pytest.mark.parametrize("half_width", [0.1, 0.5, 0.002, 50.0, 0.03, 0.7])
def test_histogram_bins_match_the_formula_whether_stored_or_not(tied, half_width):
    lake, tokens = tied
    rows = run_query(
        store_of(lake), "SELECT * FROM drift_histogram", {"histogram_half_width": half_width}
    ).to_pylist()
    d = np.array([t["lp_diff"] for t in tokens], dtype=np.float64)
    bins = np.clip(np.floor(d * (50.0 / half_width)), -51, 50).astype(int)
    assert [r["bin"] for r in rows] == list(range(-51, 51))
    assert [r["tokens"] for r in rows] == [int((bins == b).sum()) for b in range(-51, 51)]
    assert rows[-1]["cumulative_fraction"] == 1.0


def test_the_histogram_tests_cover_both_paths(tied):
    lake, _ = tied
    widths = stored_half_widths(lake)
    assert {0.1, 0.5, 0.002, 50.0} <= set(widths)
    assert not {0.03, 0.7} & set(widths)


@pytest.mark.parametrize("per_step", [20, 100, 101, 360, 500])
def test_outliers_keep_the_tie_order_inside_and_beyond_the_kept_100(tied, per_step):
    lake, tokens = tied
    rows = run_query(
        store_of(lake), "SELECT * FROM drift_outliers", {"outliers_per_step": per_step}
    ).to_pylist()
    worst = sorted(tokens, key=lambda t: (-abs(t["lp_diff"]), t["batch_position"], t["position"]))
    expected = worst[:per_step]
    assert [(r["batch_position"], r["position"], r["lp_diff"]) for r in rows] == [
        (t["batch_position"], t["position"], t["lp_diff"]) for t in expected
    ]
    assert [r["outlier_rank"] for r in rows] == list(range(1, len(expected) + 1))


@pytest.mark.parametrize("limit", [20.0, 5.0, 1.0, 0.25])
def test_large_lp_diff_lists_the_same_tokens_above_and_below_the_stored_floor(tied, limit):
    lake, tokens = tied
    audit = (sql_dir() / "audits" / "large_lp_diff.sql").read_text(encoding="utf-8")
    rows = run_query(store_of(lake), audit, {"abs_lp_diff_limit": limit}).to_pylist()
    expected = [t for t in tokens if abs(t["lp_diff"]) >= limit]
    assert expected
    assert [(r["batch_position"], r["position"], r["lp_diff"]) for r in rows] == [
        (t["batch_position"], t["position"], t["lp_diff"]) for t in expected
    ]
    assert {r["abs_lp_diff_limit"] for r in rows} == {limit}
