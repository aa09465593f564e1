"""The report opens with one row per run over the whole selection, pooled exactly: a mean over
every selected token or sample, never a mean of per-step means."""

from __future__ import annotations

import math
import re
from pathlib import Path

from tests.conftest import store_of
from tests.lakes import build_lake
from tokenlake.serve.report import build_report

# Step 0: one token, δ = 0.1. Step 1: four tokens, δ = ±0.02. One eval sample at step 0.
DELTAS = {0: [0.1], 1: [0.02, -0.02, 0.02, -0.02]}


def two_step_lake(lake: Path, run: str = "r") -> Path:
    """A run whose two steps differ in token count, so pooled and per-step means differ."""
    tokens, samples = [], []
    for step, deltas in DELTAS.items():
        for position, delta in enumerate(deltas):
            tokens.append({"run": run, "rollout_id": step, "batch_position": 0,
                           "position": position, "token_id": 5 + position, "loss_mask": 1,
                           "train_log_prob": -0.5 + delta, "rollout_log_prob": -0.5,
                           "lp_diff": delta})  # fmt: skip
        samples.append({"run": run, "rollout_id": step, "batch_position": 0,
                        "sample_index": step, "response_length": len(deltas),
                        "has_train_row": True, "raw_reward": 1.0 - step})  # fmt: skip
    samples.append({"run": run, "rollout_id": 1, "batch_position": 1, "sample_index": 9,
                    "response_length": 0, "has_train_row": True, "raw_reward": 0.0})  # fmt: skip
    samples.append({"run": run, "rollout_id": 0, "batch_position": 0, "sample_index": 20,
                    "evaluation": True, "response_length": 0, "reward": 0.4375})  # fmt: skip
    build_lake(lake, tokens=tokens, samples=samples,
               runs=[{"run": run, "source_dir": "/d", "tool": "t", "train_steps": 2}])  # fmt: skip
    return lake


def _summary_rows(text: str) -> list[list[str]]:
    section = text.split('<section id="summary">', 1)[1].split("</section>", 1)[0]
    head = re.findall(r"<th>(.*?)</th>", section)
    rows = [
        re.findall(r"<td[^>]*>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", section)
    ]
    return [head, *[row for row in rows if row]]


def test_summary_pools_every_selected_token_and_sample(tmp_path):
    lake = two_step_lake(tmp_path / "lake")
    build_report(store_of(lake), tmp_path / "r.html")
    text = (tmp_path / "r.html").read_text()
    assert re.findall(r'<section id="(\w+)"', text)[:2] == ["summary", "runs"]
    deltas = [d for step in DELTAS.values() for d in step]
    k3 = sum(math.exp(d) - 1 - d for d in deltas) / len(deltas)
    ratios = [math.exp(d) for d in DELTAS[1]]
    ess_step1 = (sum(ratios) / 4) ** 2 / (sum(r * r for r in ratios) / 4)
    assert f"{k3:.6g}" == "0.00119419" and f"{ess_step1:.6g}" == "0.9996"
    assert _summary_rows(text) == [
        ["run", "tokens", "mean |δ| (nats)", "k3 KL (nats)", "lowest ESS", "at step",
         "reward mean", "eval reward mean"],
        # (0.1 + 4 × 0.02) / 5 tokens, not (0.1 + 0.02) / 2 steps; reward (1 + 0 + 0) / 3.
        ["r", "5", "0.036", "0.00119419", "0.9996", "1", "0.333333", "0.4375"],
    ]  # fmt: skip
    assert (
        '<p class="note">Over every selected training step: mean |δ| and k3 KL are means over'
        " all the steps&#x27; loss-covered tokens (each step&#x27;s mean weighted by its tokens),"
        " ESS is the lowest step&#x27;s, rewards are means over all selected samples (training"
        " raw reward, eval reward).</p>"
    ) in text


def test_summary_follows_the_step_selection(tmp_path):
    lake = two_step_lake(tmp_path / "lake")
    build_report(store_of(lake), tmp_path / "r.html", steps=[0])
    rows = _summary_rows((tmp_path / "r.html").read_text())
    assert rows[1] == ["r", "1", "0.1", "0.00517092", "1", "0", "1", "0.4375"]
