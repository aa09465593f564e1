"""A step without drift tokens (an eval file, a rollout-only step, one whose log-probs are all
non-finite) commits the rollups that read only `drift_tokens` without running their SQL: the
rows are the ones the SQL gives, none. Likewise a step without teacher log-probs, for the
rollups that read only `drift_teacher_tokens`."""

from __future__ import annotations

import math

import pyarrow.parquet as pq
import pytest

from tests.conftest import store_of
from tests.lakes import build_lake
from tokenlake import schema
from tokenlake.serve import rollups
from tokenlake.store import manifest

DRIFT_TOKEN_ROLLUPS = {
    "drift_breakdown_parts",
    "drift_histogram_parts",
    "drift_outlier_parts",
    "drift_sample_parts",
    "drift_step_checks",
    "drift_token_id_parts",
}


def _token(position: int, **values) -> dict:
    row = {"run": "r", "rollout_id": 1, "batch_position": 0, "position": position,
           "token_id": position, "loss_mask": 1, "train_log_prob": -1.0,
           "rollout_log_prob": -1.25, "lp_diff": 0.25, "entropy": 0.5}  # fmt: skip
    row.update(values)
    return row


STEPS = {
    "eval file": [_token(p, evaluation=True) for p in range(3)],
    "rollout only": [_token(p, train_log_prob=None, lp_diff=None, entropy=None) for p in range(3)],
    "non-finite": [_token(p, train_log_prob=-math.inf, lp_diff=math.inf) for p in range(3)],
}


def _step_tables(lake):
    (record,) = manifest.load_all(store_of(lake))
    (step,) = record.steps.values()
    return (
        pq.read_table(lake / step.files[schema.TOKENS]),
        pq.read_table(lake / step.files[schema.SAMPLES]),
    )


def test_the_rollups_that_read_only_drift_tokens_are_named_by_their_inputs():
    assert rollups.drift_token_rollups() == DRIFT_TOKEN_ROLLUPS
    assert rollups.teacher_token_rollups() == {"drift_teacher_step_parts"}


@pytest.mark.parametrize("case", sorted(STEPS))
def test_a_step_without_drift_tokens_commits_what_the_sql_gives(tmp_path, monkeypatch, case):
    tokens = STEPS[case]
    samples = [{"run": "r", "rollout_id": 1, "batch_position": 0,
                "evaluation": tokens[0].get("evaluation", False)}]  # fmt: skip
    build_lake(tmp_path, tokens=tokens, samples=samples)
    token_table, sample_table = _step_tables(tmp_path)

    skipped = rollups.compute_step(token_table, sample_table, "r", 1)
    monkeypatch.setattr(rollups, "drift_token_rollups", frozenset)
    monkeypatch.setattr(rollups, "teacher_token_rollups", frozenset)
    computed = rollups.compute_step(token_table, sample_table, "r", 1)

    assert skipped == computed
    skippable = DRIFT_TOKEN_ROLLUPS | {"drift_teacher_step_parts"}  # no teacher log-probs
    assert all(skipped.tables[name].num_rows == 0 for name in skippable)
    others = {name: table.num_rows for name, table in skipped.tables.items()}
    if case == "non-finite":  # counted by drift_step_parts, listed by the audit rows
        assert (others["drift_step_parts"], others["audit_token_rows"]) == (1, 3)
