"""The drift views (`sql/drift_*.sql`) against numpy over the same tokens.

The hand-built lake (`rich_lake`) holds:
  run `a` step 0: bp0 12 covered tokens; bp1 a three-turn mask [1x6, 0x4, 1x5, 0x2, 1x3];
      bp2 all masked; bp3 one token (no entropy); bp4 a NaN train log-prob, an infinite rollout
      log-prob and a delta of -10 (vetoed); bp5 a mask starting with masked tokens; plus an eval
      sample whose values must not leak in.
  run `a` step 1: four samples with wider drift and one delta of +25.
  run `a` step 2: only an all-masked sample (a step with no covered token).
  run `b` step 0: three samples, same keys as run `a`.
Every expected value is computed here, with numpy, from the rows written to the lake.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import store_of
from tests.fixture_paths import MILES_REAL
from tests.lakes import build_lake
from tokenlake.serve.query import run_query

F32 = np.float32
REL = 1e-9
ABS = 1e-12
DEFAULTS = {
    "is_cap": 2.0,
    "veto_min_ratio": 1e-4,
    "outlier_min_ratio": 1e-4,
    "outlier_max_ratio": 100.0,
    "geo_band_low": 0.999,
    "geo_band_high": 1.001,
    "seq_ratio_low": 0.5,
    "seq_ratio_high": 2.0,
    "icepop_low": 0.5,
    "icepop_high": 2.0,
    "log_ratio_clamp": 20.0,
    "k3_clamp": 10.0,
    "outliers_per_step": 20,
}


# ---------------------------------------------------------------------------------------------
# The lake
# ---------------------------------------------------------------------------------------------
def _sample(rng, run, rid, bp, mask, sigma=0.05, special=None, evaluation=False, entropy=True):
    """Token rows of one sample: masked positions get NULL stats, as the extractor writes."""
    n = len(mask)
    rollout = (-rng.exponential(2.0, n)).astype(F32)
    train = (rollout + rng.normal(0.0, sigma, n)).astype(F32)
    for pos, (t, r) in (special or {}).items():
        train[pos], rollout[pos] = F32(t), F32(r)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = train - rollout
    ent = rng.uniform(0.0, 5.0, n).astype(F32)
    token_ids = rng.integers(0, 6, n)
    rows = []
    for pos in range(n):
        on = evaluation or mask[pos] > 0
        rows.append(
            {
                "run": run,
                "rollout_id": rid,
                "evaluation": evaluation,
                "batch_position": bp,
                "sample_index": 100 * rid + bp,
                "position": pos,
                "token_id": int(token_ids[pos]),
                "loss_mask": None if evaluation else mask[pos],
                "train_log_prob": float(train[pos]) if on else None,
                "rollout_log_prob": float(rollout[pos]) if on else None,
                "lp_diff": float(diff[pos]) if on else None,
                "entropy": float(ent[pos]) if on and entropy else None,
            }
        )
    return rows


def _meta(run, rid, bp, n, staleness, mixed, rank, evaluation=False):
    return {
        "run": run,
        "rollout_id": rid,
        "evaluation": evaluation,
        "batch_position": bp,
        "sample_index": 100 * rid + bp,
        "response_length": n,
        "staleness": staleness,
        "mixed_version": mixed,
        "dumped_rank": rank,
        "has_train_row": not evaluation,
    }


def rich_rows():
    rng = np.random.default_rng(0)
    tokens, samples = [], []

    def add(run, rid, bp, mask, staleness=0, mixed=False, rank=0, **kw):
        tokens.extend(_sample(rng, run, rid, bp, mask, **kw))
        samples.append(
            _meta(run, rid, bp, len(mask), staleness, mixed, rank, kw.get("evaluation", False))
        )

    add("a", 0, 0, [1] * 12, staleness=0, rank=0)
    add("a", 0, 1, [1] * 6 + [0] * 4 + [1] * 5 + [0] * 2 + [1] * 3, staleness=1, mixed=True, rank=1)
    add("a", 0, 2, [0] * 8, rank=0)
    add("a", 0, 3, [1], staleness=None, mixed=None, rank=1, entropy=False)
    special = {3: (math.nan, -1.0), 7: (-1.0, math.inf), 10: (-12.0, -2.0)}
    add("a", 0, 4, [1] * 15, staleness=1, rank=0, special=special)
    add("a", 0, 5, [0, 0, 1, 1, 1, 0, 1, 1], staleness=0, rank=1)
    add("a", 0, 0, [1] * 5, rank=None, evaluation=True, sigma=3.0)
    for bp in range(4):
        special = {2: (-1.0, -26.0)} if bp == 2 else None
        add(
            "a",
            1,
            bp,
            [1] * (3 + 5 * bp),
            staleness=bp % 2,
            rank=bp % 2,
            sigma=0.2,
            special=special,
        )
    add("a", 2, 0, [0] * 4)
    for bp in range(3):
        add("b", 0, bp, [1] * (4 + bp), staleness=2, rank=bp, sigma=0.01)
    add("b", 0, 3, [1] * 6, staleness=None, rank=0, sigma=1e-5)  # inside the geo-mean band
    return tokens, samples


@pytest.fixture(scope="module")
def rich(tmp_path_factory):
    tokens, samples = rich_rows()
    lake = tmp_path_factory.mktemp("drift_lake")
    build_lake(lake, tokens=tokens, samples=samples)
    return lake, tokens, samples


# ---------------------------------------------------------------------------------------------
# numpy reference
# ---------------------------------------------------------------------------------------------
def _finite(*values):
    return all(v is not None and math.isfinite(v) for v in values)


def covered(tokens, samples):
    """Covered finite token records with their sample's attributes and turn index."""
    meta = {(s["run"], s["rollout_id"], s["evaluation"], s["batch_position"]): s for s in samples}
    turns, state = {}, {}
    for row in sorted(
        tokens,
        key=lambda r: (
            r["run"],
            r["rollout_id"],
            r["evaluation"],
            r["batch_position"],
            r["position"],
        ),
    ):
        key = (row["run"], row["rollout_id"], row["evaluation"], row["batch_position"])
        on = (row["loss_mask"] or 0) > 0
        prev_on, seg = state.get(key, (False, -1))
        seg += on and not prev_on
        state[key] = (on, seg)
        turns[(*key, row["position"])] = seg
    out = []
    for row in tokens:
        if row["evaluation"] or not (row["loss_mask"] or 0) > 0 or row["lp_diff"] is None:
            continue
        if not _finite(row["lp_diff"], row["train_log_prob"], row["rollout_log_prob"]):
            continue
        key = (row["run"], row["rollout_id"], False, row["batch_position"])
        out.append({**row, "meta": meta[key], "turn": turns[(*key, row["position"])]})
    return out


def _close(actual, expected, where):
    if expected is None:
        assert actual is None, where
    elif isinstance(expected, (str, bool)) or (
        isinstance(expected, (int, np.integer)) and not isinstance(expected, bool)
    ):
        assert actual == expected, where
    else:
        assert actual == pytest.approx(float(expected), rel=REL, abs=ABS), where


def assert_rows(actual_rows, expected_rows, keys):
    """Rows of a view equal the expected dicts (same key set; every expected column)."""
    actual = {tuple(r[k] for k in keys): r for r in actual_rows}
    assert sorted(actual, key=repr) == sorted(expected_rows, key=repr)
    for key, expected in expected_rows.items():
        for column, value in expected.items():
            _close(actual[key][column], value, (key, column))


def step_metrics(recs, s):
    """Every drift_steps statistic of one step's covered finite tokens (settings `s`)."""
    d = np.array([r["lp_diff"] for r in recs])
    tr = np.array([r["train_log_prob"] for r in recs])
    ro = np.array([r["rollout_log_prob"] for r in recs])
    sid = np.array([r["batch_position"] for r in recs])
    ad, ratio = np.abs(d), np.exp(d)
    by = [sid == b for b in np.unique(sid)]
    n_s = np.array([m.sum() for m in by])
    sums = np.array([d[m].sum() for m in by])
    mt = np.array([tr[m].mean() for m in by])
    mr = np.array([ro[m].mean() for m in by])
    dc = np.clip(d, -s["log_ratio_clamp"], s["log_ratio_clamp"])
    k3c = np.clip(np.exp(dc) - 1 - dc, -s["k3_clamp"], s["k3_clamp"])
    c = s["is_cap"]
    w = np.clip(ratio, 1 / c, c)
    pt, pr = np.exp(tr), np.exp(ro)
    corr = np.corrcoef(pt, pr)[0, 1] if len(d) > 1 else None
    vetoed = np.array([(ratio[m] < s["veto_min_ratio"]).any() for m in by])
    outlier = (ratio < s["outlier_min_ratio"]) | (ratio > s["outlier_max_ratio"])
    icepop = (ratio < s["icepop_low"]) | (ratio > s["icepop_high"])
    geo = np.exp(sums / n_s)
    geo_rej = (geo < s["geo_band_low"]) | (geo > s["geo_band_high"])
    seq = np.exp(sums)
    seq_rej = (seq < s["seq_ratio_low"]) | (seq > s["seq_ratio_high"])
    lpd = mr - mt
    q = np.percentile(ad, [50, 90, 99, 99.9])
    return {
        "tokens": len(d),
        "samples": len(by),
        "mean_lp_diff": d.mean(),
        "mean_abs_lp_diff_tm": ad.mean(),
        "mean_abs_lp_diff_smtm": np.mean([ad[m].mean() for m in by]),
        "max_abs_lp_diff": ad.max(),
        "p50_abs_lp_diff": q[0],
        "p90_abs_lp_diff": q[1],
        "p99_abs_lp_diff": q[2],
        "p999_abs_lp_diff": q[3],
        "k1_kl": np.mean(-d),
        "k2_kl": np.mean(d * d / 2),
        "k3_kl": np.mean(ratio - 1 - d),
        "k3_kl_smtm": np.mean([k3c[m].mean() for m in by]),
        "mult_prob_error": np.mean(np.exp(ad)),
        "chi2_token": np.mean(ratio**2) - 1,
        "chi2_seq": np.mean(np.exp(2 * np.clip(sums, -20, 20)) - 1),
        "mean_abs_prob_diff": np.mean(np.abs(pt - pr)),
        "max_abs_prob_diff": np.max(np.abs(pt - pr)),
        "prob_corr": corr,
        "train_mean_log_prob": mt.mean(),
        "rollout_mean_log_prob": mr.mean(),
        "train_ppl": np.mean(np.exp(-mt)),
        "rollout_ppl": np.mean(np.exp(-mr)),
        "log_ppl_diff": lpd.mean(),
        "log_ppl_abs_diff": np.abs(lpd).mean(),
        "log_ppl_diff_max": lpd.max(),
        "log_ppl_diff_min": lpd.min(),
        "ppl_ratio": np.mean(np.exp(lpd)),
        "is_ratio_mean": ratio.mean(),
        "is_ratio_std": ratio.std(),
        "is_ratio_min": ratio.min(),
        "is_ratio_max": ratio.max(),
        "is_frac_above_cap": np.mean(ratio > c),
        "is_frac_below_inv_cap": np.mean(ratio < 1 / c),
        "ess": 1 / np.mean((w / w.mean()) ** 2),
        "ess_raw": 1 / np.mean((ratio / ratio.mean()) ** 2),
        "veto_token_frac": n_s[vetoed].sum() / len(d),
        "veto_seq_frac": vetoed.mean(),
        "outlier_token_frac": outlier.mean(),
        "outlier_seq_frac": np.mean([outlier[m].any() for m in by]),
        "geo_reject_token_frac": n_s[geo_rej].sum() / len(d),
        "geo_reject_seq_frac": geo_rej.mean(),
        "seq_ratio_reject_token_frac": n_s[seq_rej].sum() / len(d),
        "seq_ratio_reject_seq_frac": seq_rej.mean(),
        "icepop_token_frac": icepop.mean(),
        "icepop_seq_frac": np.mean([icepop[m].any() for m in by]),
    }


CHANGED = ["mean_abs_lp_diff_tm", "mean_abs_lp_diff_smtm", "k3_kl", "mult_prob_error", "ess"]


# Each framework's published gate (docs/drift.md): the value from the step's statistics, the
# drift_settings limit, and whether the value passes.
GATES = {
    "miles": (
        "|rollout/log_probs - rollout/rollout_log_probs|",
        lambda m: abs(m["train_mean_log_prob"] - m["rollout_mean_log_prob"]),
        0.03,
        lambda value, limit: value <= limit,
    ),
}


def expected_gate(framework, metrics):
    """The framework_gate columns of a step, whose other expected columns are `metrics`."""
    names = ("framework_gate", "framework_gate_value", "framework_gate_limit")
    if framework not in GATES:  # no runs row records a framework: no gate applies
        return {**dict.fromkeys(names, None), "framework_gate_passed": None}
    gate, formula, limit, rule = GATES[framework]
    value = None
    if metrics.get("train_mean_log_prob") is not None:  # a step with drift tokens
        value = formula(metrics) * metrics["samples"] / metrics["train_samples"]
    passed = None if value is None else rule(value, limit)
    return {**dict(zip(names, (gate, value, limit), strict=True)), "framework_gate_passed": passed}


def expected_steps(tokens, samples, settings=DEFAULTS, framework=None):
    recs = covered(tokens, samples)
    steps = {(r["run"], r["rollout_id"]) for r in tokens + samples if not r["evaluation"]}
    out = {}
    for run, rid in sorted(steps):
        mine = [r for r in recs if (r["run"], r["rollout_id"]) == (run, rid)]
        nonfinite = sum(
            1
            for r in tokens
            if (r["run"], r["rollout_id"]) == (run, rid)
            and not r["evaluation"]
            and (r["loss_mask"] or 0) > 0
            and r["lp_diff"] is not None
            and not _finite(r["lp_diff"], r["train_log_prob"], r["rollout_log_prob"])
        )
        metrics = step_metrics(mine, settings) if mine else {"tokens": 0, "samples": 0}
        train = sum(
            1
            for r in samples
            if (r["run"], r["rollout_id"]) == (run, rid)
            and not r["evaluation"]
            and r["has_train_row"]
        )
        row = {**metrics, "nonfinite_tokens": nonfinite, "train_samples": train}
        out[(run, rid)] = {**row, **expected_gate(framework, row)}
    for (run, rid), row in out.items():
        earlier = [k for k in out if k[0] == run and k[1] < rid]
        prev = out[max(earlier)] if earlier else None
        row["prev_rollout_id"] = max(earlier)[1] if earlier else None
        for name in CHANGED:
            both = prev is not None and row.get(name) is not None and prev.get(name) is not None
            row[f"{name}_change"] = row[name] - prev[name] if both else None
    return out


def expected_groups(recs, keyfn):
    """The breakdown statistics of covered tokens grouped by (run, rollout_id, *keyfn(rec))."""
    groups = defaultdict(list)
    for r in recs:
        groups[(r["run"], r["rollout_id"], *keyfn(r))].append(r)
    k3_step = defaultdict(float)
    for r in recs:
        k3_step[(r["run"], r["rollout_id"])] += math.exp(r["lp_diff"]) - 1 - r["lp_diff"]
    out = {}
    for key, rows in groups.items():
        d = np.array([r["lp_diff"] for r in rows])
        k3 = np.exp(d) - 1 - d
        out[key] = {
            "tokens": len(rows),
            "samples": len({r["batch_position"] for r in rows}),
            "mean_lp_diff": d.mean(),
            "mean_abs_lp_diff": np.abs(d).mean(),
            "max_abs_lp_diff": np.abs(d).max(),
            "k3_kl": k3.mean(),
            "k3_share": k3.sum() / k3_step[key[:2]],
            "mult_prob_error": np.exp(np.abs(d)).mean(),
        }
    return out


def view(lake: Path, name: str, settings=None) -> list[dict]:
    return run_query(store_of(lake), f"SELECT * FROM {name}", settings).to_pylist()


# ---------------------------------------------------------------------------------------------
# drift_steps
# ---------------------------------------------------------------------------------------------
STEP_KEYS = ("run", "rollout_id")


def test_drift_steps_match_numpy(rich):
    lake, tokens, samples = rich
    expected = expected_steps(tokens, samples)
    actual = view(lake, "drift_steps")
    assert [(r["run"], r["rollout_id"]) for r in actual] == [("a", 0), ("a", 1), ("a", 2), ("b", 0)]
    assert_rows(actual, expected, STEP_KEYS)
    # Every statistic is computed and compared, so the view has no column the test skips.
    assert set(actual[0]) == set(STEP_KEYS) | set(expected[("a", 0)])


def test_drift_steps_counts_masked_nonfinite_and_eval_tokens_out(rich):
    lake, _, _ = rich
    rows = {(r["run"], r["rollout_id"]): r for r in view(lake, "drift_steps")}
    # a/0: 12 + 14 (three turns) + 0 (all masked) + 1 (one token) + 13 (15 minus NaN, inf)
    # + 5 (mask [0,0,1,1,1,0,1,1]); the eval sample is not counted.
    assert (rows["a", 0]["tokens"], rows["a", 0]["samples"], rows["a", 0]["nonfinite_tokens"]) == (
        45,
        5,
        2,
    )
    # A step whose only sample is all masked: a row with zero counts and null statistics.
    empty = rows["a", 2]
    assert (empty["tokens"], empty["samples"], empty["nonfinite_tokens"]) == (0, 0, 0)
    stats = [
        k
        for k in empty
        if k
        not in (
            "run",
            "rollout_id",
            "tokens",
            "samples",
            "nonfinite_tokens",
            "prev_rollout_id",
            "train_samples",
        )
    ]
    assert all(empty[k] is None for k in stats)
    assert empty["train_samples"] == 1  # its sample has a train row, all of it masked
    assert empty["prev_rollout_id"] == 1
    # The vetoed token (delta = -10) rejects all 13 covered tokens of bp4.
    assert rows["a", 0]["veto_token_frac"] == pytest.approx(13 / 45)
    assert rows["a", 0]["veto_seq_frac"] == pytest.approx(1 / 5)


def test_one_token_step_has_null_correlation(tmp_path):
    row = {
        "run": "r",
        "rollout_id": 0,
        "batch_position": 0,
        "position": 0,
        "token_id": 1,
        "loss_mask": 1,
        "train_log_prob": -1.0,
        "rollout_log_prob": -1.5,
        "lp_diff": 0.5,
    }
    build_lake(tmp_path, tokens=[row])
    got = view(tmp_path, "drift_steps")[0]
    assert (got["tokens"], got["samples"], got["prob_corr"]) == (1, 1, None)
    assert got["k3_kl"] == pytest.approx(math.exp(0.5) - 1.5)
    assert got["p999_abs_lp_diff"] == 0.5
    assert got["ess"] == pytest.approx(1.0)


def test_drift_samples_match_numpy(rich):
    lake, tokens, samples = rich
    recs = covered(tokens, samples)
    expected = {}
    for key, group in expected_groups(recs, lambda r: (r["batch_position"],)).items():
        rows = [r for r in recs if (r["run"], r["rollout_id"], r["batch_position"]) == key]
        d = np.array([r["lp_diff"] for r in rows])
        expected[key] = {
            "tokens": group["tokens"],
            "sum_lp_diff": d.sum(),
            "mean_abs_lp_diff": group["mean_abs_lp_diff"],
            "max_abs_lp_diff": group["max_abs_lp_diff"],
            "veto_tokens": int((np.exp(d) < 1e-4).sum()),
            "vetoed": bool((np.exp(d) < 1e-4).any()),
        }
    assert_rows(view(lake, "drift_samples"), expected, ("run", "rollout_id", "batch_position"))


# ---------------------------------------------------------------------------------------------
# Settings
# ---------------------------------------------------------------------------------------------
def test_settings_override_changes_every_dependent_view(rich):
    lake, tokens, samples = rich
    settings = {**DEFAULTS, "is_cap": 1.05, "icepop_high": 1.01, "outliers_per_step": 3}
    expected = expected_steps(tokens, samples, settings)
    actual = view(
        lake, "drift_steps", {"is_cap": 1.05, "icepop_high": 1.01, "outliers_per_step": 3}
    )
    assert_rows(actual, expected, STEP_KEYS)
    assert expected["a", 0]["ess"] != pytest.approx(expected_steps(tokens, samples)["a", 0]["ess"])
    outliers = view(lake, "drift_outliers", {"outliers_per_step": 3})
    assert [r["outlier_rank"] for r in outliers] == [1, 2, 3] * 3


def test_settings_override_by_hand_written_temp_view(rich):
    lake, tokens, samples = rich
    sql = (
        "CREATE OR REPLACE TEMP VIEW drift_settings AS "
        "SELECT * REPLACE (1.05::DOUBLE AS is_cap) FROM tokenlake.main.drift_settings; "
        "SELECT run, rollout_id, ess FROM drift_steps WHERE tokens > 0"
    )
    expected = expected_steps(tokens, samples, {**DEFAULTS, "is_cap": 1.05})
    got = run_query(store_of(lake), sql).to_pylist()
    assert [r["ess"] for r in got] == pytest.approx(
        [expected[k]["ess"] for k in [("a", 0), ("a", 1), ("b", 0)]], rel=REL
    )
    # The override lives in that one connection only.
    assert run_query(store_of(lake), "SELECT is_cap FROM drift_settings").to_pylist() == [
        {"is_cap": 2.0}
    ]


# ---------------------------------------------------------------------------------------------
# Breakdowns
# ---------------------------------------------------------------------------------------------
def test_drift_by_position_log_buckets(rich):
    lake, tokens, samples = rich
    recs = covered(tokens, samples)
    expected = expected_groups(recs, lambda r: (int(math.floor(math.log2(r["position"] + 1))),))
    for key, row in expected.items():
        row["position_low"], row["position_high"] = 2 ** key[2] - 1, 2 ** (key[2] + 1) - 2
    actual = view(lake, "drift_by_position")
    assert_rows(actual, expected, ("run", "rollout_id", "position_bucket"))
    assert [(r["position_low"], r["position_high"]) for r in actual[:5]] == [
        (0, 0),
        (1, 2),
        (3, 6),
        (7, 14),
        (15, 30),
    ]


def test_drift_by_token_shares_and_ranks(rich):
    lake, tokens, samples = rich
    recs = covered(tokens, samples)
    expected = expected_groups(recs, lambda r: (r["token_id"],))
    actual = view(lake, "drift_by_token")
    assert_rows(actual, expected, ("run", "rollout_id", "token_id"))
    for step in {(r["run"], r["rollout_id"]) for r in actual}:
        rows = [r for r in actual if (r["run"], r["rollout_id"]) == step]
        assert sum(r["k3_share"] for r in rows) == pytest.approx(1.0)
        by_share = sorted(rows, key=lambda r: (-r["k3_share"], r["token_id"]))
        assert [r["k3_rank"] for r in by_share] == list(range(1, len(rows) + 1))


PROB_EDGES = [0, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 0.1, 0.5, 0.9, 0.99, math.inf]
ENTROPY_EDGES = [-math.inf, 0.01, 0.1, 0.5, 1, 2, 4, math.inf]


def _bucket(x, edges):
    return next(i for i in range(len(edges) - 1) if edges[i] <= x < edges[i + 1])


def test_drift_by_prob_buckets_rollout_probability_and_entropy(rich):
    lake, tokens, samples = rich
    recs = covered(tokens, samples)
    expected = {}
    prob = expected_groups(
        recs, lambda r: ("rollout_prob", _bucket(math.exp(r["rollout_log_prob"]), PROB_EDGES))
    )
    with_entropy = [r for r in recs if r["entropy"] is not None]
    entropy = expected_groups(
        with_entropy, lambda r: ("entropy", _bucket(r["entropy"], ENTROPY_EDGES))
    )
    # k3_share is relative to the step's k3 within the dimension: recompute for entropy.
    k3_step = defaultdict(float)
    for r in with_entropy:
        k3_step[(r["run"], r["rollout_id"])] += math.exp(r["lp_diff"]) - 1 - r["lp_diff"]
    for key, row in entropy.items():
        row["k3_share"] = row["k3_kl"] * row["tokens"] / k3_step[key[:2]]
    expected.update(prob)
    expected.update(entropy)
    for (_, _, dim, b), row in expected.items():
        edges = PROB_EDGES if dim == "rollout_prob" else ENTROPY_EDGES
        row["bucket_low"], row["bucket_high"] = edges[b], edges[b + 1]
    assert_rows(view(lake, "drift_by_prob"), expected, ("run", "rollout_id", "dimension", "bucket"))


def test_drift_by_turn_segments_after_masked_runs(rich):
    lake, tokens, samples = rich
    recs = covered(tokens, samples)
    expected = expected_groups(recs, lambda r: (r["turn"],))
    actual = view(lake, "drift_by_turn")
    assert_rows(actual, expected, ("run", "rollout_id", "turn_index"))
    a0 = {
        r["turn_index"]: (r["tokens"], r["samples"])
        for r in actual
        if (r["run"], r["rollout_id"]) == ("a", 0)
    }
    # Turn 0: bp0 12, bp1 6, bp3 1, bp4 13, bp5 3 (its leading masked run opens no segment);
    # turn 1: bp1 5, bp5 2; turn 2: bp1 3.
    assert a0 == {0: (35, 5), 1: (7, 2), 2: (3, 1)}


@pytest.mark.parametrize(
    ("name", "keys", "keyfn"),
    [
        (
            "drift_by_staleness",
            ("staleness", "mixed_version"),
            lambda r: (r["meta"]["staleness"], r["meta"]["mixed_version"]),
        ),
        (
            "drift_by_length",
            ("length_bucket",),
            lambda r: (int(math.floor(math.log2(r["meta"]["response_length"]))),),
        ),
        ("drift_by_rank", ("dumped_rank",), lambda r: (r["meta"]["dumped_rank"],)),
    ],
)
def test_sample_attribute_breakdowns(rich, name, keys, keyfn):
    lake, tokens, samples = rich
    expected = expected_groups(covered(tokens, samples), keyfn)
    assert_rows(view(lake, name), expected, ("run", "rollout_id", *keys))


def test_drift_by_length_bucket_edges(rich):
    lake, _, _ = rich
    got = run_query(
        store_of(lake),
        "SELECT DISTINCT length_bucket, length_low, length_high FROM drift_by_length ORDER BY 1",
    )
    assert got.to_pylist() == [
        {"length_bucket": b, "length_low": lo, "length_high": hi}
        for b, lo, hi in [(0, 1, 1), (1, 2, 3), (2, 4, 7), (3, 8, 15), (4, 16, 31)]
    ]


def test_drift_histogram_fixed_bins(rich):
    lake, tokens, samples = rich
    recs = covered(tokens, samples)
    actual = view(lake, "drift_histogram")
    steps = sorted({(r["run"], r["rollout_id"]) for r in recs})
    assert len(actual) == 102 * len(steps)
    for step in steps:
        d = np.array([r["lp_diff"] for r in recs if (r["run"], r["rollout_id"]) == step])
        bins = np.clip(np.floor(d * 500.0), -51, 50).astype(int)
        rows = [r for r in actual if (r["run"], r["rollout_id"]) == step]
        assert [r["bin"] for r in rows] == list(range(-51, 51))
        assert [r["tokens"] for r in rows] == [int((bins == b).sum()) for b in range(-51, 51)]
        assert rows[-1]["cumulative_fraction"] == pytest.approx(1.0)
        assert rows[10]["fraction"] == pytest.approx((bins == -41).mean())
    first = actual[0], actual[1], actual[100], actual[101]
    assert [(r["bin_low"], r["bin_high"]) for r in first] == [
        (-math.inf, -0.1),
        (-0.1, -0.098),
        (0.098, 0.1),
        (0.1, math.inf),
    ]


def test_drift_outliers_worst_tokens(rich):
    lake, tokens, samples = rich
    recs = covered(tokens, samples)
    actual = view(lake, "drift_outliers")
    for step in sorted({(r["run"], r["rollout_id"]) for r in recs}):
        mine = [r for r in recs if (r["run"], r["rollout_id"]) == step]
        worst = sorted(
            mine, key=lambda r: (-abs(r["lp_diff"]), r["batch_position"], r["position"])
        )[:20]
        got = [r for r in actual if (r["run"], r["rollout_id"]) == step]
        assert [
            (
                r["batch_position"],
                r["position"],
                r["token_id"],
                r["lp_diff"],
                r["train_log_prob"],
                r["rollout_log_prob"],
            )
            for r in got
        ] == [
            (
                r["batch_position"],
                r["position"],
                r["token_id"],
                r["lp_diff"],
                r["train_log_prob"],
                r["rollout_log_prob"],
            )
            for r in worst
        ]
        assert [r["outlier_rank"] for r in got] == list(range(1, len(worst) + 1))
    top = next(r for r in actual if (r["run"], r["rollout_id"]) == ("a", 1))
    assert (top["batch_position"], top["position"], top["lp_diff"]) == (2, 2, 25.0)


# ---------------------------------------------------------------------------------------------
# Real dump
# ---------------------------------------------------------------------------------------------
FIXTURES = MILES_REAL


@pytest.mark.slow
def test_drift_steps_on_real_basic_dump(tmp_path):
    import pyarrow.parquet as pq

    from tokenlake.orchestrate.extract import ExtractOptions, extract_run

    extract_run(
        FIXTURES / "dumps" / "basic",
        store_of(tmp_path),
        ExtractOptions(run_name="basic", strict=True),
    )
    tokens = run_query(store_of(tmp_path), "SELECT * FROM tokens").to_pylist()
    samples = run_query(store_of(tmp_path), "SELECT * FROM samples").to_pylist()
    expected = expected_steps(tokens, samples, framework="miles")
    actual = view(tmp_path, "drift_steps")
    assert [(r["run"], r["rollout_id"]) for r in actual] == [("basic", 0), ("basic", 1)]
    assert_rows(actual, expected, STEP_KEYS)
    assert all(r["tokens"] > 0 and r["samples"] == 8 for r in actual)
    # The SMTM mean |delta| is the reference reader's step `mean_abs_lp_diff` (reduced there in
    # float32, hence the tolerance).
    oracle = pq.read_table(FIXTURES / "oracle" / "basic" / "step_aggregates.parquet").to_pylist()
    assert [r["mean_abs_lp_diff_smtm"] for r in actual] == pytest.approx(
        [r["mean_abs_lp_diff"] for r in oracle], rel=1e-5
    )


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["multi-turn", "nonfinite", "cp-thd", "removed"])
def test_drift_steps_on_generated_dumps(tmp_path, preset):
    """The generator's layouts (masked tool runs, NaN/inf, CP reassembly, removed samples)
    through the whole pipeline, checked against numpy over the same tokens."""
    from tokenlake.generator import synth
    from tokenlake.orchestrate.extract import ExtractOptions, extract_run

    synth.write_dump(tmp_path / "dump", synth.PRESETS[preset])
    extract_run(
        tmp_path / "dump", store_of(tmp_path / "lake"), ExtractOptions(run_name=preset, strict=True)
    )
    lake = tmp_path / "lake"
    tokens = run_query(store_of(lake), "SELECT * FROM tokens").to_pylist()
    samples = run_query(store_of(lake), "SELECT * FROM samples").to_pylist()
    actual = view(lake, "drift_steps")
    assert [r["rollout_id"] for r in actual] == list(range(synth.PRESETS[preset].steps))
    assert_rows(actual, expected_steps(tokens, samples, framework="miles"), STEP_KEYS)
