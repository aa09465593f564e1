"""The drift alarms fire on broken runs and stay quiet on healthy ones, both ways.

Each run is generated from a model of what a real run logs: the trainer's log-probs of sampled
tokens (a mix of confident and unsure tokens), and the engine's log-probs of the same tokens as
a healthy bf16 engine or a known bug produces them. The defaults (sql/drift_settings.sql) cite
their sources in docs/drift.md: slime's CI gate (mean |delta| <= 0.1) and NeMo-RL's threshold
on token_mult_prob_error (1.05).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import store_of
from tests.lakes import build_lake
from tokenlake.serve.audit import run_audits

STEPS, SAMPLES, LENGTH = 2, 16, 128


def _train_log_probs(rng: np.random.Generator) -> np.ndarray:
    """Sampled tokens' log-probs: most near 0 (confident), a tail of unsure ones."""
    confident = -rng.exponential(0.05, (SAMPLES, LENGTH))
    unsure = -rng.exponential(2.0, (SAMPLES, LENGTH))
    return np.where(rng.random((SAMPLES, LENGTH)) < 0.7, confident, unsure)


def _healthy(train: np.ndarray, rng: np.random.Generator, sigma: float) -> np.ndarray:
    return train - rng.normal(0.0, sigma, train.shape)


def _fp8_mismatch(train: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """fp8 rollout against a bf16 trainer: a quantisation error that grows with uncertainty."""
    return train - rng.normal(0.0, 0.06, train.shape) * (1.0 + 4.0 * np.sqrt(-train))


def _wrong_temperature(train: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The engine sampled at temperature 0.8 but logged its log-probs, the trainer at 1.0."""
    return train / 0.8 - rng.normal(0.0, 0.02, train.shape)


def _shifted(train: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The engine's log-probs one position late (its first token lost)."""
    shifted = np.roll(train, -1, axis=1)
    shifted[:, -1] = -rng.exponential(1.0, SAMPLES)
    return shifted - rng.normal(0.0, 0.02, train.shape)


MODELS = {
    "healthy_bf16_0.01": lambda t, g: _healthy(t, g, 0.01),
    "healthy_bf16_0.03": lambda t, g: _healthy(t, g, 0.03),
    "fp8_mismatch": _fp8_mismatch,
    "wrong_temperature": _wrong_temperature,
    "shifted_log_probs": _shifted,
}


def _lake(tmp_path, model: str):
    rng = np.random.default_rng(7)
    tokens, samples = [], []
    for rid in range(STEPS):
        train = _train_log_probs(rng)
        rollout = np.minimum(MODELS[model](train, rng), -1e-9)  # a log-prob is below 0
        for bp in range(SAMPLES):
            samples.append(
                {"run": model, "rollout_id": rid, "batch_position": bp, "sample_index": bp,
                 "group_index": bp // 4, "raw_reward": float(bp % 2), "response_length": LENGTH,
                 "has_train_row": True, "status": "completed"}
            )  # fmt: skip
            for pos in range(LENGTH):
                t, r = float(train[bp, pos]), float(rollout[bp, pos])
                tokens.append(
                    {"run": model, "rollout_id": rid, "batch_position": bp, "sample_index": bp,
                     "position": pos, "token_id": 100 + pos, "loss_mask": 1,
                     "train_log_prob": t, "rollout_log_prob": r, "lp_diff": t - r}
                )  # fmt: skip
    build_lake(tmp_path, tokens, samples)
    return {r.name: r for r in run_audits(store_of(tmp_path))}


def _fired(results) -> set[str]:
    return {name for name, r in results.items() if not r.passed and r.severity != "info"}


@pytest.mark.parametrize("model", ["healthy_bf16_0.01", "healthy_bf16_0.03"])
def test_healthy_bf16_drift_is_quiet(tmp_path, model):
    assert _fired(_lake(tmp_path, model)) == set()


@pytest.mark.parametrize("model", ["fp8_mismatch", "wrong_temperature", "shifted_log_probs"])
def test_a_real_bug_fires_the_drift_alarms(tmp_path, model):
    results = _lake(tmp_path, model)
    assert "drift_alarms" in _fired(results)
    fired_metrics = {row["metric"] for row in results["drift_alarms"].rows.to_pylist()}
    assert {"mean_abs_lp_diff_smtm", "mult_prob_error"} <= fired_metrics
    assert ("shifted_log_probs" in _fired(results)) == (model == "shifted_log_probs")


def test_the_shift_audit_names_the_neighbour_that_matches(tmp_path):
    rows = _lake(tmp_path, "shifted_log_probs")["shifted_log_probs"].rows.to_pylist()
    assert [(r["run"], r["rollout_id"], r["pairs"]) for r in rows] == [
        ("shifted_log_probs", 0, SAMPLES * (LENGTH - 1)),
        ("shifted_log_probs", 1, SAMPLES * (LENGTH - 1)),
    ]
    # the engine's value at a position is the trainer's of the next one: the trainer's matches
    # the engine's one position earlier
    assert all(r["corr_previous"] > 0.99 > abs(r["corr_same"]) + 0.9 for r in rows)
    assert {r["threshold"] for r in rows} == {0.9}
