"""`sql/audits/*.sql` through `pipeline.audit`: silent on a healthy lake, each one firing on a
lake built to trip it, with the exact offending rows.

Trip lake, run `r`:
  step 0: bp0 has a loss-covered rollout log-prob of exactly 0.0; bp1 a NaN train log-prob;
          bp2 failed alignment (NULL train values); bp3 has no train row. Rewards differ in
          both groups, nothing truncated, drift tiny.
  step 1: bp0 has a delta of +25 nats; every reward is 1 (both groups zero-std); bp0 and bp1
          are truncated. So the drift, zero-std and truncation alarms fire for step 1.
"""

from __future__ import annotations

import math

import pytest

from pipeline.audit import AuditResult, format_audit_report, run_audits
from tests.lakes import build_lake

AUDITS = [
    "alignment_failed",
    "drift_alarms",
    "large_lp_diff",
    "missing_train_rows",
    "nonfinite_log_probs",
    "placeholder_rollout_log_prob",
    "zero_std_groups",
]


def _tokens(rid, bp, n=4, delta=1e-4, overrides=None, train_side=True):
    rows = []
    for pos in range(n):
        rollout = -0.5 - 0.1 * pos
        train = rollout + delta
        row = {
            "run": "r",
            "rollout_id": rid,
            "batch_position": bp,
            "sample_index": 10 * rid + bp,
            "position": pos,
            "token_id": 7 + pos,
            "loss_mask": 1 if train_side else None,
            "rollout_log_prob": rollout,
            "train_log_prob": train if train_side else None,
            "lp_diff": train - rollout if train_side else None,
        }
        row.update((overrides or {}).get(pos, {}))
        rows.append(row)
    return rows


def _sample(rid, bp, reward, **extra):
    return {
        "run": "r",
        "rollout_id": rid,
        "batch_position": bp,
        "sample_index": 10 * rid + bp,
        "group_index": 2 * rid + bp // 2,
        "raw_reward": reward,
        "response_length": 4,
        "has_train_row": True,
        "status": "completed",
        **extra,
    }


def healthy_rows():
    tokens = [t for bp in range(4) for t in _tokens(0, bp)]
    samples = [_sample(0, bp, float(bp % 2)) for bp in range(4)]
    return tokens, samples


def trip_rows():
    tokens, samples = healthy_rows()
    tokens = [t for t in tokens if t["batch_position"] < 2]
    tokens[1].update(rollout_log_prob=0.0, train_log_prob=-1e-4, lp_diff=-1e-4)  # bp0 pos1
    tokens[6].update(train_log_prob=math.nan, lp_diff=math.nan)  # bp1 pos2
    tokens += _tokens(
        0, 2, overrides={p: {"train_log_prob": None, "lp_diff": None} for p in range(4)}
    )
    tokens += _tokens(0, 3, train_side=False)
    samples[2]["alignment_failed"] = True
    samples[3]["has_train_row"] = False
    tokens += _tokens(
        1, 0, overrides={0: {"train_log_prob": -0.5, "rollout_log_prob": -25.5, "lp_diff": 25.0}}
    )
    for bp in range(1, 4):
        tokens += _tokens(1, bp)
    samples += [_sample(1, bp, 1.0, truncated=bp < 2) for bp in range(4)]
    return tokens, samples


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    lake = tmp_path_factory.mktemp("healthy")
    build_lake(lake, *healthy_rows())
    return lake


@pytest.fixture(scope="module")
def tripped(tmp_path_factory):
    lake = tmp_path_factory.mktemp("tripped")
    build_lake(lake, *trip_rows())
    return {r.name: r for r in run_audits(lake)}, lake


def test_healthy_lake_passes_every_audit(healthy):
    results = run_audits(healthy)
    assert [r.name for r in results] == AUDITS
    assert all(r.passed for r in results)
    assert format_audit_report(results).splitlines()[-1] == "All 7 audits passed."


def test_every_audit_fires_on_the_tripped_lake(tripped):
    results, _ = tripped
    assert sorted(results) == AUDITS
    assert [name for name, r in results.items() if r.passed] == []


def _rows(result: AuditResult, *columns: str) -> list[tuple]:
    return [tuple(row[c] for c in columns) for row in result.rows.to_pylist()]


def test_placeholder_rollout_log_prob_rows(tripped):
    result = tripped[0]["placeholder_rollout_log_prob"]
    assert _rows(result, "rollout_id", "batch_position", "position", "rollout_log_prob") == [
        (0, 0, 1, 0.0)
    ]


def test_nonfinite_log_probs_rows(tripped):
    rows = tripped[0]["nonfinite_log_probs"].rows.to_pylist()
    assert [(r["rollout_id"], r["batch_position"], r["position"]) for r in rows] == [(0, 1, 2)]
    assert math.isnan(rows[0]["train_log_prob"]) and math.isnan(rows[0]["lp_diff"])


def test_large_lp_diff_rows(tripped):
    result = tripped[0]["large_lp_diff"]
    assert _rows(
        result, "rollout_id", "batch_position", "position", "lp_diff", "abs_lp_diff_limit"
    ) == [(1, 0, 0, 25.0, 20.0)]


def test_sample_level_audit_rows(tripped):
    results, _ = tripped
    assert _rows(results["alignment_failed"], "rollout_id", "evaluation", "batch_position") == [
        (0, False, 2)
    ]
    assert _rows(results["missing_train_rows"], "rollout_id", "batch_position", "sample_index") == [
        (0, 3, 3)
    ]
    assert _rows(results["zero_std_groups"], "rollout_id", "group_index", "n", "reward_mean") == [
        (1, 2, 2, 1.0),
        (1, 3, 2, 1.0),
    ]


def test_drift_alarms_rows(tripped):
    rows = tripped[0]["drift_alarms"].rows.to_pylist()
    assert [(r["rollout_id"], r["metric"], r["rule"], r["threshold"]) for r in rows] == [
        (1, "k3_kl", ">", 1e-3),
        (1, "mean_abs_lp_diff_smtm", ">", 0.1),
        (1, "mult_prob_error", ">", 1.05),
        (1, "truncated_frac", ">=", 0.25),
        (1, "zero_std_group_frac", ">=", 0.5),
    ]
    values = {r["metric"]: r["value"] for r in rows}
    # Step 1: 16 covered tokens, one with delta 25, the rest 1e-4 (as float32 differences).
    assert values["truncated_frac"] == 0.5
    assert values["zero_std_group_frac"] == 1.0
    assert values["mean_abs_lp_diff_smtm"] == pytest.approx((25.0 / 4 + 3 * 1e-4) / 4, rel=1e-3)


def test_thresholds_come_from_settings(tripped):
    _, lake = tripped
    # With C = 2 the ESS cannot fall below 16/25; a cap of 100 lets the +25 token dominate.
    alarms = {r.name: r for r in run_audits(lake, {"is_cap": 100.0, "alarm_truncated_frac": 0.9})}
    rows = alarms["drift_alarms"].rows.to_pylist()
    assert [(r["rollout_id"], r["metric"]) for r in rows] == [
        (1, "ess"),
        (1, "k3_kl"),
        (1, "mean_abs_lp_diff_smtm"),
        (1, "mult_prob_error"),
        (1, "zero_std_group_frac"),
    ]
    ess = next(r["value"] for r in rows if r["metric"] == "ess")
    mean_w, mean_w2 = (15 + 100) / 16, (15 + 100**2) / 16
    assert ess == pytest.approx(mean_w**2 / mean_w2, rel=1e-3)
    quiet = run_audits(lake, {"abs_lp_diff_limit": 30.0})
    assert next(r for r in quiet if r.name == "large_lp_diff").passed


def test_report_text(tripped):
    results, _ = tripped
    report = format_audit_report([results["missing_train_rows"], results["alignment_failed"]])
    assert report == "\n".join(
        [
            "FAIL  missing_train_rows: Training-step samples of the rollout dump that no train"
            " file holds. (1 row)",
            "      run  rollout_id  batch_position  sample_index  group_index  status     remove_sample  response_length",
            "      ---  ----------  --------------  ------------  -----------  ---------  -------------  ---------------",
            "      r             0               3             3            1  completed  NULL                         4",
            "FAIL  alignment_failed: Samples whose train-side per-token fields could not be"
            " reassembled. (1 row)",
            "      run  rollout_id  evaluation  batch_position  sample_index  dumped_rank  response_length  train_response_length",
            "      ---  ----------  ----------  --------------  ------------  -----------  ---------------  ---------------------",
            "      r             0  false                    2             2         NULL                4                   NULL",
            "2 of 2 audits failed.",
        ]
    )


def test_report_truncates_long_row_lists(tripped):
    results, _ = tripped
    report = format_audit_report([results["zero_std_groups"]], max_rows=1)
    assert report.splitlines()[-2:] == ["      ... 1 more rows", "1 of 1 audits failed."]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("preset", "audit", "rows"),
    [
        ("nonfinite", "nonfinite_log_probs", None),
        ("cp-missing-rank", "alignment_failed", 4),
        ("rollout-only", "missing_train_rows", 8),
    ],
)
def test_audits_fire_on_generated_dumps_built_to_trip_them(tmp_path, preset, audit, rows):
    """Whole pipeline: a generated dump with the defect, extracted, then audited."""
    from pipeline import synth
    from pipeline.extract import extract_run

    synth.write_dump(tmp_path / "dump", synth.PRESETS[preset])
    extract_run(tmp_path / "dump", tmp_path / "lake", run_name=preset)
    results = {r.name: r for r in run_audits(tmp_path / "lake")}
    assert not results[audit].passed
    if rows is None:  # count the non-finite tokens independently, with numpy
        import numpy as np

        from pipeline.query import run_query

        table = run_query(tmp_path / "lake", "SELECT * FROM tokens")
        columns = ("rollout_log_prob", "train_log_prob", "lp_diff")
        bad = np.zeros(table.num_rows, dtype=bool)
        for name in columns:
            values = table.column(name).to_numpy(zero_copy_only=False).astype(float)
            bad |= np.isinf(values) | (
                np.isnan(values) & ~table.column(name).is_null().to_numpy(zero_copy_only=False)
            )
        rows = int(bad.sum())
        assert rows > 0
    assert results[audit].rows.num_rows == rows
