"""The report's worst samples are the ones carrying their step's drift (share of its Σ|δ|),
not the shortest samples with the largest mean |δ|."""

from __future__ import annotations

import html
import re

from tests.conftest import store_of
from tests.lakes import build_lake
from tokenlake.serve.report import build_report

# Sample 0: 1 token, |δ| 0.5. Sample 1: 40 tokens, |δ| 0.1 (Σ 4). Sample 2: 10 tokens, |δ| 0.03.
SAMPLES = {0: (1, 0.5), 1: (40, 0.1), 2: (10, 0.03)}


def _lake(path):
    tokens, samples = [], []
    for position_in_batch, (length, delta) in SAMPLES.items():
        samples.append({"run": "r", "rollout_id": 0, "batch_position": position_in_batch,
                        "sample_index": position_in_batch, "response_length": length,
                        "has_train_row": True, "raw_reward": 1.0})  # fmt: skip
        tokens += [
            {"run": "r", "rollout_id": 0, "batch_position": position_in_batch, "position": p,
             "sample_index": position_in_batch, "token_id": 7, "loss_mask": 1, "train_log_prob": -1.0 + delta,
             "rollout_log_prob": -1.0, "lp_diff": delta}
            for p in range(length)
        ]  # fmt: skip
    build_lake(path, tokens=tokens, samples=samples,
               runs=[{"run": "r", "source_dir": "/d", "tool": "t", "train_steps": 1}])  # fmt: skip
    return path


def test_worst_samples_are_ranked_by_share_of_the_steps_abs_drift(tmp_path):
    build_report(store_of(_lake(tmp_path / "lake")), tmp_path / "r.html", worst=3)
    text = (tmp_path / "r.html").read_text()
    # Σ|δ| of the step: 0.5 + 4 + 0.3 = 4.8; by mean |δ| the 1-token sample 0 would lead.
    assert [
        html.unescape(label) for label in re.findall(r'<p class="strip-label">(.*?)</p>', text)
    ] == [
        "r · step 0 · sample 1 · 83.3 % of the step's Σ|δ| · mean |δ| 0.1 nats over 40 tokens"
        " · 40 response tokens",
        "r · step 0 · sample 0 · 10.4 % of the step's Σ|δ| · mean |δ| 0.5 nats over 1 token"
        " · 1 response token",
        "r · step 0 · sample 2 · 6.25 % of the step's Σ|δ| · mean |δ| 0.03 nats over 10 tokens"
        " · 10 response tokens",
    ]
    assert "<h3>Worst samples by share of their step's Σ|δ|</h3>" in text
