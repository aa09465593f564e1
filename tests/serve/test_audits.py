"""`sql/audits/*.sql` through `tokenlake.serve.audit`: silent on a healthy lake, each one firing on a
lake built to trip it, with the exact offending rows.

Trip lake, run `r`:
  step 0: bp0 has a loss-covered rollout log-prob of exactly 0.0; bp1 a NaN train log-prob;
          bp2 failed alignment (NULL train values); bp3 has no train row. Rewards differ in
          both groups, nothing truncated, drift tiny.
  step 1: bp0 has a delta of +25 nats; every reward is 1 (both groups zero-std); bp0 and bp1
          are truncated. So the drift, zero-std and truncation alarms fire for step 1. bp1's
          tokens had a bounded sampling support, the others none (mixed support).
Healthy data (the built-in example and every real miles fixture) passes: exit 0, no error.
"""

from __future__ import annotations

import math

import pytest
from click.testing import CliRunner

from tests.conftest import store_of
from tests.fixture_paths import REAL_DUMPS
from tests.lakes import build_lake
from tokenlake.cli import main
from tokenlake.errors import LakeError
from tokenlake.serve import catalog, sql_views
from tokenlake.serve.audit import AuditResult, format_audit_report, has_errors, run_audits, severity
from tokenlake.store import manifest

AUDITS = [
    "alignment_failed",
    "drift_alarms",
    "framework_gates",
    "incomplete_steps",
    "large_lp_diff",
    "missing_train_rows",
    "mixed_sampling_support",
    "nonfinite_log_probs",
    "placeholder_rollout_log_prob",
    "removed_samples",
    "shifted_log_probs",
    "tokens_beyond_ln2",
    "truncated_steps",
    "zero_std_group_list",
    "zero_std_groups",
]
SEVERITY = {
    "alignment_failed": "warning",
    "drift_alarms": "error",
    "framework_gates": "error",
    "incomplete_steps": "warning",
    "large_lp_diff": "error",
    "missing_train_rows": "warning",
    "mixed_sampling_support": "warning",
    "nonfinite_log_probs": "error",
    "placeholder_rollout_log_prob": "warning",
    "removed_samples": "info",
    "shifted_log_probs": "error",
    "tokens_beyond_ln2": "warning",
    "truncated_steps": "warning",
    "zero_std_group_list": "info",
    "zero_std_groups": "warning",
}


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
    for token in tokens[-12:-8]:  # step 1, bp1
        token["support_size"] = 3
    samples += [_sample(1, bp, 1.0, truncated=bp < 2) for bp in range(4)]
    samples[-1]["remove_sample"] = True  # step 1, bp3: kept in the batch, out of the loss
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
    record = manifest.load_manifest(store_of(lake), "r")
    assert record is not None  # step 1 extracted although a rank file never came
    record.steps["1"].incomplete = "rank 1 of ranks 0-1 has no train file"
    manifest.save_manifest(store_of(lake), record)
    catalog.build_catalog(store_of(lake))
    return {r.name: r for r in run_audits(store_of(lake))}, lake


def test_healthy_lake_passes_every_audit(healthy):
    results = run_audits(store_of(healthy))
    assert [r.name for r in results] == AUDITS
    assert all(r.passed for r in results)
    assert format_audit_report(results).splitlines()[-1] == "All 15 audits passed."


def test_every_audit_fires_on_the_tripped_lake(tripped):
    results, _ = tripped
    assert sorted(results) == AUDITS
    # an off-by-one needs 32 token pairs to be judged: tests/serve/test_alarms.py trips it; the
    # hand-built runs record no framework, so no framework gate judges them
    # (tests/e2e/test_framework_gates.py trips it on real runs)
    assert [name for name, r in results.items() if r.passed] == [
        "framework_gates",
        "shifted_log_probs",
    ]


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


def test_mixed_sampling_support_rows(tripped):
    result = tripped[0]["mixed_sampling_support"]
    assert _rows(result, "rollout_id", "bounded_tokens", "unbounded_tokens") == [(1, 4, 12)]


def test_sample_level_audit_rows(tripped):
    results, _ = tripped
    assert _rows(results["alignment_failed"], "rollout_id", "evaluation", "batch_position") == [
        (0, False, 2)
    ]
    assert _rows(results["missing_train_rows"], "rollout_id", "batch_position", "sample_index") == [
        (0, 3, 3)
    ]
    assert _rows(
        results["zero_std_group_list"], "rollout_id", "group_index", "n", "reward_mean"
    ) == [(1, 2, 2, 1.0), (1, 3, 2, 1.0)]


def test_zero_std_groups_fires_on_the_dashboard_rule_only(tripped):
    # Step 0: rewards 0/1 in both groups (no zero-std group); step 1: both groups zero-std.
    result = tripped[0]["zero_std_groups"]
    assert result.rows.to_pylist() == [
        {
            "run": "r",
            "rollout_id": 1,
            "groups_with_reward": 2,
            "zero_std_groups": 2,
            "zero_std_frac": 1.0,
            "threshold": 0.5,
        }
    ]
    _, lake = tripped
    # At a threshold above the step's share the audit is quiet; the group list is not.
    quiet = {r.name: r for r in run_audits(store_of(lake), {"alarm_zero_std_group_frac": 1.01})}
    assert quiet["zero_std_groups"].passed and not quiet["zero_std_group_list"].passed


def test_half_the_groups_with_rewards_is_enough_and_groups_without_rewards_do_not_count(tmp_path):
    samples = [
        _sample(0, 0, 1.0),
        _sample(0, 1, 1.0),  # group 0: zero-std
        _sample(0, 2, 0.0),
        _sample(0, 3, 1.0),  # group 1: spread
        _sample(0, 4, None),
        _sample(0, 5, None),  # group 2: no reward data
    ]
    build_lake(tmp_path, tokens=[], samples=samples)
    result = next(r for r in run_audits(store_of(tmp_path)) if r.name == "zero_std_groups")
    assert _rows(result, "groups_with_reward", "zero_std_groups", "zero_std_frac") == [(2, 1, 0.5)]


def test_truncated_steps_rows(tripped):
    assert _rows(tripped[0]["truncated_steps"], "rollout_id", "truncated_frac", "threshold") == [
        (1, 0.5, 0.25)
    ]


def test_drift_alarms_rows(tripped):
    rows = tripped[0]["drift_alarms"].rows.to_pylist()
    assert [(r["rollout_id"], r["metric"], r["rule"], r["threshold"]) for r in rows] == [
        (1, "ess_raw", "<", 0.3),
        (1, "k3_kl", ">", 0.01),
        (1, "mean_abs_lp_diff_smtm", ">", 0.1),
        (1, "mult_prob_error", ">", 1.05),
    ]
    values = {r["metric"]: r["value"] for r in rows}
    # Step 1: 16 covered tokens, one with delta 25, the rest 1e-4 (as float32 differences).
    assert values["mean_abs_lp_diff_smtm"] == pytest.approx((25.0 / 4 + 3 * 1e-4) / 4, rel=1e-3)
    r = math.exp(25.0)
    mean_r, mean_r2 = (15 + r) / 16, (15 + r * r) / 16
    assert values["ess_raw"] == pytest.approx(mean_r**2 / mean_r2, rel=1e-3)
    assert values["ess_raw"] == pytest.approx(1 / 16, rel=1e-6)


def test_thresholds_come_from_settings(tripped):
    _, lake = tripped
    # Only the ESS alarm stays once the other thresholds are raised past step 1's values.
    raised = {"alarm_k3_kl": 1e12, "alarm_mult_prob_error": 1e12, "alarm_truncated_frac": 0.9}
    alarms = {
        r.name: r
        for r in run_audits(store_of(lake), {**raised, "alarm_mean_abs_lp_diff_smtm": 2.0})
    }
    rows = alarms["drift_alarms"].rows.to_pylist()
    assert [(r["rollout_id"], r["metric"]) for r in rows] == [(1, "ess_raw")]
    assert alarms["truncated_steps"].passed
    quiet = run_audits(store_of(lake), {"abs_lp_diff_limit": 30.0})
    assert next(r for r in quiet if r.name == "large_lp_diff").passed


def test_views_several_audits_read_give_the_rows_each_audit_would_compute(tripped, monkeypatch):
    """SHARED_VIEWS are computed once into TEMP tables; without them (or with a view that cannot
    be computed, left to the audits) every audit returns the same rows, overrides included."""
    from tokenlake.serve import audit

    def report(shared: tuple[str, ...]) -> tuple[str, list[tuple[object, object]]]:
        monkeypatch.setattr(audit, "SHARED_VIEWS", shared)
        found = run_audits(store_of(tripped[1]), {"alarm_k3_kl": 1e12, "alarm_ess_min": 0.5})
        alarms = next(r for r in found if r.name == "drift_alarms").rows.to_pylist()
        # the text holds every row (NaN log-probs among them, which no list of them equals)
        return format_audit_report(found, max_rows=1000), [
            (r["rollout_id"], r["metric"]) for r in alarms
        ]

    once = report(audit.SHARED_VIEWS)
    assert once[1] == [(1, "ess_raw"), (1, "mean_abs_lp_diff_smtm"), (1, "mult_prob_error")]
    assert report(()) == once
    assert report(("no_such_view", *audit.SHARED_VIEWS)) == once


def test_ess_raw_alarms_where_clamped_ess_cannot(tripped):
    """With C = 2 the clamped ESS cannot fall below 4C^2 / (1 + C^2)^2 = 0.64; ess_raw can."""
    _, lake = tripped
    from tokenlake.serve.query import run_query

    row = run_query(
        store_of(lake), "SELECT ess, ess_raw FROM drift_steps WHERE rollout_id = 1"
    ).to_pylist()
    mean_w, mean_w2 = (15 * 1.0001 + 2) / 16, (15 * 1.0001**2 + 4) / 16
    assert row[0]["ess"] == pytest.approx(mean_w**2 / mean_w2, rel=1e-3)
    assert row[0]["ess"] > 0.64
    assert row[0]["ess_raw"] == pytest.approx(1 / 16, rel=1e-6)


def test_report_text(tripped):
    results, _ = tripped
    report = format_audit_report([results["missing_train_rows"], results["alignment_failed"]])
    assert report == "\n".join(
        [
            "WARN  missing_train_rows [warning]: Training-step samples of the rollout dump that"
            " no train file holds. (1 row)",
            "      run  rollout_id  batch_position  sample_index  group_index  status     remove_sample  response_length",
            "      ---  ----------  --------------  ------------  -----------  ---------  -------------  ---------------",
            "      r             0               3             3            1  completed  NULL                         4",
            "WARN  alignment_failed [warning]: Samples whose train-side per-token fields could"
            " not be reassembled. (1 row)",
            "      run  rollout_id  evaluation  batch_position  sample_index  dumped_rank  response_length  train_response_length",
            "      ---  ----------  ----------  --------------  ------------  -----------  ---------------  ---------------------",
            "      r             0  false                    2             2         NULL                4                   NULL",
            "0 of 2 audits failed; 2 warnings, 0 info.",
        ]
    )


def test_report_truncates_long_row_lists(tripped):
    results, _ = tripped
    report = format_audit_report([results["zero_std_group_list"]], max_rows=1)
    assert report.splitlines()[-2:] == [
        "      ... 1 more rows",
        "0 of 1 audits failed; 0 warnings, 1 info.",
    ]


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
    from tokenlake.generator import synth
    from tokenlake.orchestrate.extract import ExtractOptions, extract_run

    synth.write_dump(tmp_path / "dump", synth.PRESETS[preset])
    # settle 0: the dump is finished (a missing rank lands, marked incomplete)
    options = ExtractOptions(run_name=preset, settle_seconds=0.0)
    extract_run(tmp_path / "dump", store_of(tmp_path / "lake"), options)
    results = {r.name: r for r in run_audits(store_of(tmp_path / "lake"))}
    assert not results[audit].passed
    if rows is None:  # count the non-finite tokens independently, with numpy
        import numpy as np

        from tokenlake.serve.query import run_query

        table = run_query(store_of(tmp_path / "lake"), "SELECT * FROM tokens")
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


def test_every_audit_file_declares_its_severity():
    declared = {
        path.stem: severity(path, path.read_text(encoding="utf-8"))
        for path in sql_views.iter_audit_files()
    }
    assert declared == SEVERITY


def test_a_file_without_a_severity_line_is_refused(tmp_path):
    path = tmp_path / "x.sql"
    with pytest.raises(LakeError) as info:
        severity(path, "-- Rows.\n-- Severity: fatal\nSELECT 1")
    assert (
        str(info.value) == f"Lake `{path}`: needs a header line `-- Severity: error|warning|info`"
    )


def test_results_carry_the_severity(tripped):
    results, _ = tripped
    assert {name: r.severity for name, r in results.items()} == SEVERITY
    assert has_errors(list(results.values()))
    warnings_only = [r for r in results.values() if r.severity != "error"]
    assert not warnings_only[0].passed and not has_errors(warnings_only)


def test_cli_exits_1_on_errors_and_prints_severities(tripped):
    _, lake = tripped
    result = CliRunner().invoke(main, ["audit", str(lake)])
    assert result.exit_code == 1
    heads = [line.split(":")[0] for line in result.output.splitlines() if line[:1] != " "]
    assert heads == [
        "WARN  alignment_failed [warning]",
        "FAIL  drift_alarms [error]",
        "PASS  framework_gates [error]",
        "WARN  incomplete_steps [warning]",
        "FAIL  large_lp_diff [error]",
        "WARN  missing_train_rows [warning]",
        "WARN  mixed_sampling_support [warning]",
        "FAIL  nonfinite_log_probs [error]",
        "WARN  placeholder_rollout_log_prob [warning]",
        "INFO  removed_samples [info]",
        "PASS  shifted_log_probs [error]",
        "WARN  tokens_beyond_ln2 [warning]",
        "WARN  truncated_steps [warning]",
        "INFO  zero_std_group_list [info]",
        "WARN  zero_std_groups [warning]",
        "3 of 15 audits failed; 8 warnings, 2 info.",
    ]


def test_cli_exits_0_when_only_warnings_and_info_fire(tmp_path):
    # Every reward is 1: both groups are zero-std (warning and info), nothing else fires.
    tokens = [t for bp in range(4) for t in _tokens(0, bp)]
    build_lake(tmp_path, tokens, [_sample(0, bp, 1.0) for bp in range(4)])
    result = CliRunner().invoke(main, ["audit", str(tmp_path)])
    assert result.exit_code == 0
    assert result.output.splitlines()[-1] == "0 of 15 audits failed; 1 warning, 1 info."


@pytest.mark.slow
def test_the_example_run_passes_the_audit(tmp_path):
    """The built-in example models healthy drift (delta ~ N(0, 0.05)): exit 0, no error."""
    from tokenlake.generator import synth
    from tokenlake.orchestrate.extract import ExtractOptions, extract_run

    synth.write_dump(tmp_path / "dump", synth.PRESETS["example"])
    extract_run(tmp_path / "dump", store_of(tmp_path / "lake"), ExtractOptions(run_name="example"))
    result = CliRunner().invoke(main, ["audit", str(tmp_path / "lake")])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-1] == "0 of 15 audits failed; 0 warnings, 2 info."


@pytest.mark.slow
@pytest.mark.parametrize(
    ("case", "failing_steps"), [("basic", [0, 1]), ("cp2", []), ("pp2", [0]), ("removed", [])]
)
def test_real_miles_fixtures_are_judged_by_miles_own_log_prob_gate(tmp_path, case, failing_steps):
    """The real miles fixtures were written by miles' own code from a tiny model whose two
    sides' log-probs are unrelated noise (mean |delta| 0.31-0.38). miles' CI gate is on the
    signed mean, |rollout/log_probs - rollout/rollout_log_probs| <= 0.03, where the noise
    partly cancels: basic's two steps and pp2's step 0 fail it, cp2 and removed pass, as they
    would in miles' own CI. Nothing else fails."""
    from tokenlake.orchestrate.extract import ExtractOptions, extract_run

    extract_run(REAL_DUMPS / case, store_of(tmp_path / "lake"), ExtractOptions(run_name=case))
    results = {r.name: r for r in run_audits(store_of(tmp_path / "lake"))}
    failed = [name for name, r in results.items() if not r.passed and r.severity == "error"]
    assert failed == (["framework_gates"] if failing_steps else [])
    rows = results["framework_gates"].rows.to_pylist()
    assert [(r["rollout_id"], r["gate"], r["rule"], r["threshold"]) for r in rows] == [
        (step, "|rollout/log_probs - rollout/rollout_log_probs|", ">", 0.03)
        for step in failing_steps
    ]
    code = CliRunner().invoke(main, ["audit", str(tmp_path / "lake")]).exit_code
    assert code == (1 if failing_steps else 0)


def test_incomplete_steps_rows(tripped):
    result = tripped[0]["incomplete_steps"]
    assert _rows(result, "run", "rollout_id", "missing") == [
        ("r", 1, "rank 1 of ranks 0-1 has no train file")
    ]
