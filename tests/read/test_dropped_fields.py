"""Fields of the spec the lake now keeps (dump-format.md 2.3, 3.3, 9b): the teacher of on-policy
distillation (`teacher_log_probs`, `teacher_entropy`, `opd_reverse_kl`: the student-teacher
gap, `drift_teacher_tokens` / `drift_teacher_steps`), the critic's `values`, Tinker-style
`loss_weights` and client `advantages` (their 0.0 filler NULL, never drift), and
`start_weight_version`.

The real `spec_rename` dump (DP 2, miles' writers) gets the fields in the shapes and places the
spec gives them (train columns: one float32 tensor per row, CP-sliced like `log_probs`; rollout
keys: response-aligned lists), with values chosen so every statistic is exact.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import store_of
from tests.fixture_paths import NEXT_DUMPS

pytestmark = pytest.mark.slow

GAP = 0.25  # student - teacher log-prob on every token


def _rewrite(dump: Path, change_rollout, change_train) -> None:
    import torch

    for path in sorted((dump / "rollout_data").glob("*.pt")):
        data = torch.load(path, weights_only=True)
        change_rollout(data)
        torch.save(data, path)
    for path in sorted((dump / "train_data").glob("*.pt")):
        data = torch.load(path, weights_only=True)
        change_train(data["rollout_data"])
        torch.save(data, path)


def _distillation(rollout: dict[str, Any]) -> None:
    for position, sample in enumerate(rollout["samples"]):
        sample["start_weight_version"] = position % 2
        sample["teacher_log_probs"] = [-1.0] * sample["response_length"]  # train side wins


def _distillation_train(columns: dict[str, Any]) -> None:
    columns["teacher_log_probs"] = [lp - GAP for lp in columns["log_probs"]]
    columns["teacher_entropy"] = [2 * e for e in columns["entropy"]]
    columns["opd_reverse_kl"] = [lp * 0 + GAP for lp in columns["log_probs"]]
    columns["values"] = [r + 1 for r in columns["returns"]]


# Tinker batch: batch position 1 of each step came without engine log-probs and without
# client advantages; every other sample has loss weights 0.5 and advantages -2.
def _tinker(rollout: dict[str, Any]) -> None:
    rollout["metadata"] = {"batch_kind": "tinker"}
    for position, sample in enumerate(rollout["samples"]):
        r = sample["response_length"]
        if position == 1:
            sample["rollout_log_probs"] = None
        else:
            sample["loss_weights"] = [0.5] * r
            sample["advantages"] = [-2.0] * r


def _tinker_train(indices_without: set[int]):
    import torch

    def change(columns: dict[str, Any]) -> None:
        rows = list(enumerate(columns["sample_indices"]))
        lengths = columns["response_lengths"]
        without = [i in indices_without for _, i in rows]
        columns["rollout_log_probs"] = [
            torch.zeros(lengths[row]) if w else lp
            for (row, _), w, lp in zip(rows, without, columns["rollout_log_probs"], strict=True)
        ]
        columns["loss_weights"] = [
            torch.full((lengths[row],), 0.0 if w else 0.5)
            for (row, _), w in zip(rows, without, strict=True)
        ]
        columns["advantages"] = [
            torch.full((lengths[row],), 0.0 if w else -2.0)
            for (row, _), w in zip(rows, without, strict=True)
        ]

    return change


@pytest.fixture(scope="module")
def con(tmp_path_factory):
    import duckdb

    from tokenlake.orchestrate.extract import ExtractOptions, extract_run

    root = tmp_path_factory.mktemp("dropped")
    distilled, tinker = root / "distilled", root / "tinker"
    shutil.copytree(NEXT_DUMPS / "spec_rename", distilled)
    _rewrite(distilled, _distillation, _distillation_train)
    shutil.copytree(NEXT_DUMPS / "spec_rename", tinker)
    _rewrite(tinker, _tinker, _tinker_train({1, 9}))  # Sample.index of batch position 1
    lake = root / "lake"
    for run in (distilled, tinker):
        assert (
            extract_run(run, store_of(lake), ExtractOptions(run_name=run.name, strict=True)).failed
            == []
        )
    connection = duckdb.connect(str(lake / "tokenlake.duckdb"), read_only=True)
    yield connection
    connection.close()


def test_teacher_columns_come_from_the_train_side(con):
    got = con.execute(
        "SELECT count(*), count(teacher_log_prob), max(abs(train_log_prob - teacher_log_prob -"
        " 0.25)) < 1e-6, bool_and(teacher_entropy = 2 * entropy),"
        " bool_and(opd_reverse_kl = 0.25), bool_and(value = returns + 1)"
        " FROM tokens WHERE run = 'distilled' AND loss_mask > 0"
    ).fetchone()
    assert got == (94, 94, True, True, True, True)
    absent = con.execute(
        "SELECT count(teacher_log_prob) FILTER (WHERE run = 'tinker'), count(value) FILTER"
        " (WHERE run = 'tinker'), count(loss_weight) FILTER (WHERE run = 'distilled') FROM tokens"
    ).fetchone()
    assert absent == (0, 0, 0)


def test_drift_teacher_steps_has_drifts_statistics_of_the_gap(con):
    rows = con.execute(
        "SELECT rollout_id, tokens, samples, mean_lp_diff, mean_abs_lp_diff_tm,"
        " mean_abs_lp_diff_smtm, max_abs_lp_diff, k1_kl, k2_kl, k3_kl, mult_prob_error,"
        " mean_opd_reverse_kl FROM drift_teacher_steps WHERE run = 'distilled' ORDER BY 1"
    ).fetchall()
    assert [row[:3] for row in rows] == [(0, 47, 8), (1, 47, 8)]
    k3 = math.exp(GAP) - 1 - GAP
    expected = (GAP, GAP, GAP, GAP, -GAP, GAP * GAP / 2, k3, math.exp(GAP), GAP)
    for row in rows:
        assert row[3:] == pytest.approx(expected, abs=1e-6)
    assert con.execute(
        "SELECT count(*) FROM drift_teacher_tokens WHERE run = 'tinker'"
    ).fetchone() == (0,)


def test_start_staleness(con):
    got = con.execute(
        "SELECT rollout_id, list(start_weight_version ORDER BY batch_position),"
        " list(start_staleness ORDER BY batch_position) FROM samples WHERE run = 'distilled'"
        " GROUP BY ALL ORDER BY ALL"
    ).fetchall()
    assert got == [
        (0, [0, 1] * 4, [0, -1] * 4),
        (1, [0, 1] * 4, [1, 0] * 4),
    ]


def test_tinker_rewards_are_null(con):
    got = con.execute(
        "SELECT run, count(*), count(raw_reward), count(normalized_reward) FROM samples"
        " GROUP BY ALL ORDER BY ALL"
    ).fetchall()
    assert got == [("distilled", 16, 16, 16), ("tinker", 16, 0, 0)]


def test_tinker_filler_is_null_and_never_drift(con):
    got = con.execute(
        "SELECT rollout_id, batch_position = 1 AS filled, count(*), count(rollout_log_prob),"
        " count(lp_diff), min(loss_weight), max(loss_weight), count(loss_weight),"
        " min(advantage), count(advantage)"
        " FROM tokens WHERE run = 'tinker' AND loss_mask > 0 GROUP BY ALL ORDER BY ALL"
    ).fetchall()
    assert got == [
        (0, False, 40, 40, 40, 0.5, 0.5, 40, -2.0, 40),
        (0, True, 7, 0, 0, None, None, 0, None, 0),
        (1, False, 41, 41, 41, 0.5, 0.5, 41, -2.0, 41),
        (1, True, 6, 0, 0, None, None, 0, None, 0),
    ]
    drift = con.execute(
        "SELECT list(DISTINCT batch_position ORDER BY batch_position) FROM drift_tokens"
        " WHERE run = 'tinker'"
    ).fetchone()
    assert drift == ([0, 2, 3, 4, 5, 6, 7],)
