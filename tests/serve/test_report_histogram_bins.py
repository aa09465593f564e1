"""The report's δ histogram spans the data (± the largest p99 |δ|, rounded up), not a fixed
±0.1 nats, and says how many tokens lie beyond, in its two end bins."""

from __future__ import annotations

import json
import re

from tests.conftest import store_of
from tests.lakes import build_lake
from tokenlake.serve.query import run_query
from tokenlake.serve.report import build_report


def _lake(path):
    """One step of 201 tokens, δ = -1, -0.99, ..., 1 nats (p99 |δ| = 0.99)."""
    tokens = [
        {"run": "r", "rollout_id": 0, "batch_position": 0, "position": i, "token_id": 7,
         "loss_mask": 1, "train_log_prob": -2.0 + i / 100 - 1, "rollout_log_prob": -2.0,
         "lp_diff": i / 100 - 1}
        for i in range(201)
    ]  # fmt: skip
    samples = [{"run": "r", "rollout_id": 0, "batch_position": 0, "sample_index": 0,
                "response_length": 201, "has_train_row": True, "raw_reward": 1.0}]  # fmt: skip
    build_lake(path, tokens=tokens, samples=samples,
               runs=[{"run": "r", "source_dir": "/d", "tool": "t", "train_steps": 1}])  # fmt: skip
    return path


def test_histogram_bins_follow_the_data_and_count_the_tails(tmp_path):
    lake = _lake(tmp_path / "lake")
    build_report(store_of(lake), tmp_path / "r.html")
    text = (tmp_path / "r.html").read_text()
    payload = json.loads(
        re.search(r'id="report-data">(.*?)</script>', text, re.S).group(1).replace("<\\/", "</")
    )
    chart = next(c for c in payload["charts"] if c["id"] == "histogram")
    assert chart["spec"]["title"]["subtitle"] == [
        "Beyond ±1 nats (the end bins), all steps:",
        "r: 1 of 201 tokens (0.498 %)",
    ]
    assert chart["spec"]["encoding"]["x"]["title"] == (
        "δ = train − rollout log-prob (nats, bins of 0.02)"
    )
    rows = [r for r in payload["datasets"]["histogram"] if r["step"] == "all"]
    assert (rows[0]["bin"], rows[0]["label"]) == (-50, "-1 to -0.98")  # no token below -1
    assert (rows[-1]["bin"], rows[-1]["label"], rows[-1]["tokens"]) == (50, "≥ 1", 1)
    # The view's default, ±0.1 nats, puts 182 of these 201 tokens in the two tails.
    fixed = run_query(
        store_of(lake), "SELECT sum(tokens) FROM drift_histogram WHERE bin IN (-51, 50)"
    )
    assert int(fixed.column(0)[0].as_py()) == 182
