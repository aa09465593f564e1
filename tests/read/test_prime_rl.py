"""prime-rl's token exports against the reference answers beside them (tests/fixtures/prime-rl-real).

Both run directories (one rank; two ranks with packed, padded micro-batches and multi-turn
samples) are extracted once and compared with `expected/`: every position of every line (the
prompt's in `samples.prompt_token_ids`, the response's as `tokens` rows), every line's values,
each step's pooled drift, and prime-rl's own `mismatch_kl/all/mean` (its `metrics.jsonl`, also
in the lake's `metrics`) and per-env means. Then nulls, weight streams, unfinished steps and
broken lines.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import store_of
from tests.fixture_paths import PRIME_RL_REAL
from tokenlake.orchestrate.extract import ExtractOptions, extract_run
from tokenlake.read import prime_rl

CASES = ("single_rank", "packed_2ranks")
REL_TOL = 1e-6  # the lake's lp_diff is float32, the reference's double
# prime-rl computes each token's exp(r) - r - 1 in float32: each term is off by about an ulp of
# exp(r) ~ 1, so its mean is within two float32 ulps of 1.0 of the exact one (the lake's, in
# double over the float32 log-probs); relative to the small means that is up to ~1e-4.
ORACLE_ABS = 2 * float(np.finfo(np.float32).eps)
AFTER = "Replace or remove the file, then extract again."


def _jsonl(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as handle:
        return [json.loads(line) for line in handle]


@pytest.fixture(scope="module")
def lakes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    made = {}
    for case in CASES:
        root = tmp_path_factory.mktemp(case) / "lake"
        summary = extract_run(PRIME_RL_REAL / case, store_of(root), ExtractOptions(workers=1))
        assert (summary.failed, summary.dump_format, summary.counts["new"]) == ([], "prime-rl", 2)
        assert summary.ignored_files == []
        made[case] = root
    return made


def rows(lake: Path, sql: str) -> list[tuple]:
    import duckdb

    with duckdb.connect(str(lake / "tokenlake.duckdb"), read_only=True) as con:
        return con.execute(sql).fetchall()


def _f32(value: float | None) -> np.float32 | None:
    return None if value is None else np.float32(value)


@pytest.mark.parametrize("case", CASES)
def test_the_run_is_recorded_as_prime_rl(lakes: dict[str, Path], case: str) -> None:
    assert rows(lakes[case], "SELECT framework, dump_format, format_version FROM runs") == [
        ("prime-rl", "prime-rl", None)
    ]


SAMPLE_KEYS_SQL = """
SELECT rollout_id, dumped_rank, json_extract(metadata_json, '$.export_sequence_idx')::INT,
       batch_position, prompt_length, prompt_token_ids
FROM samples
"""


@pytest.mark.parametrize(
    ("case", "counts"), [("single_rank", (266, 112)), ("packed_2ranks", (457, 162))]
)
def test_every_position_lands_with_its_exact_value_and_placeholders_are_null(
    lakes: dict[str, Path], case: str, counts: tuple[int, int]
) -> None:
    """Prompt tokens (before the first loss token) in `prompt_token_ids`; every later position a
    `tokens` row: the values prime-rl's trainer and engine gave on loss tokens (float32, as
    exported), lp_diff on the tokens its mismatch statistics count, NULL everywhere else (the
    0.0 placeholders of `inference_logprobs` and `advantages` included)."""
    lake = lakes[case]
    expected = _jsonl(PRIME_RL_REAL / case / "expected" / "tokens.jsonl.gz")
    samples = {(r[0], r[1], r[2]): r[3:] for r in rows(lake, SAMPLE_KEYS_SQL)}
    tokens = {
        (r[0], r[1], r[2]): r[3:]
        for r in rows(
            lake,
            "SELECT rollout_id, batch_position, position, token_id, loss_mask, train_log_prob,"
            " rollout_log_prob, lp_diff, advantage, entropy, rl_weight, ce_weight, dppo_masked"
            " FROM tokens",
        )
    }
    in_prompt = 0
    for want in expected:
        position, prompt, ids = samples[want["step"], want["rank"], want["line"]]
        if want["position"] < prompt:
            assert ids[want["position"]] == want["token_id"] and not want["loss_mask"]
            in_prompt += 1
            continue
        got = tokens.pop((want["step"], position, want["position"] - prompt))
        assert got[:2] == (want["token_id"], int(want["loss_mask"]))
        if not want["loss_mask"]:  # tool observations inside the response
            assert got[2:] == (None,) * 8
            continue
        covered = want["rl_covered"]
        assert got[2:] == (
            _f32(want["trainer_logprob"]),
            _f32(want["inference_logprob"]) if covered else None,
            _f32(want["lp_diff"]),
            _f32(want["advantage"]),
            _f32(want["entropy"]),
            _f32(want["rl_weight"]),
            _f32(want["ce_weight"]),
            want["is_masked"],
        )
    assert tokens == {}  # nothing beyond the reference's positions
    assert (len(expected), in_prompt) == counts


SAMPLES_SQL = """
SELECT s.rollout_id, s.dumped_rank, s.metadata_json, s.env_name, s.total_length,
       s.has_train_row, s.step_train_files,
       s.sample_index, s.group_index, s.reward, s.weight_version, s.staleness, s.truncated,
       s.raw_reward, s.normalized_reward, s.status,
       d.tokens, d.mean_lp_diff, d.mean_abs_lp_diff, d.max_abs_lp_diff
FROM samples AS s LEFT JOIN drift_samples AS d USING (run, rollout_id, batch_position)
ORDER BY s.rollout_id, s.batch_position
"""


@pytest.mark.parametrize("case", CASES)
def test_every_line_matches_the_reference_and_what_prime_rl_does_not_export_is_null(
    lakes: dict[str, Path], case: str
) -> None:
    expected = _jsonl(PRIME_RL_REAL / case / "expected" / "samples.jsonl")
    files = {(w["step"], w["rank"]) for w in expected}
    got = rows(lakes[case], SAMPLES_SQL)
    assert len(got) == len(expected) == {"single_rank": 12, "packed_2ranks": 16}[case]
    for want, row in zip(expected, got, strict=True):
        keys = {k: want[k] for k in ("micro_step", "micro_sequence_idx", "export_sequence_idx")}
        assert row[:7] == (
            want["step"],
            want["rank"],
            json.dumps({"rank": want["rank"], **keys}),
            want["env_name"],
            want["n_tokens"],
            True,
            sum(1 for step, _ in files if step == want["step"]),
        )
        assert row[7:16] == (None,) * 9
        assert row[16] == want["n_mask_on"]
        for value, key in zip(row[17:19], ("mean_lp_diff", "mean_abs_lp_diff"), strict=True):
            assert math.isclose(value, want[key], rel_tol=REL_TOL, abs_tol=1e-9), key
        assert row[19] == pytest.approx(want["max_abs_lp_diff"], rel=1e-7)


@pytest.mark.parametrize("case", CASES)
def test_each_steps_mean_k3_is_prime_rls_mismatch_kl(lakes: dict[str, Path], case: str) -> None:
    """drift_steps over the covered tokens: the reference's pooled statistics, and prime-rl's
    own `mismatch_kl/all/mean` as its metrics.jsonl logged it (the same tokens: its count)."""
    expected = json.loads((PRIME_RL_REAL / case / "expected" / "steps.json").read_text())
    oracle = json.loads((PRIME_RL_REAL / case / "expected" / "framework_oracle.json").read_text())
    logged = {r["step"]: r for r in _jsonl(PRIME_RL_REAL / case / "metrics.jsonl")}
    got = rows(
        lakes[case],
        "SELECT rollout_id, tokens, samples, k3_kl, k1_kl, k2_kl, mean_abs_lp_diff_tm,"
        " mean_abs_lp_diff_smtm, is_ratio_mean, mult_prob_error FROM drift_steps ORDER BY 1",
    )
    assert [r[0] for r in got] == [1, 2] and expected["unstable_steps"] == []
    for want, frame, row in zip(expected["steps"], oracle["steps"], got, strict=True):
        assert row[1:3] == (want["n_mask_on"], want["n_samples_with_tokens"])
        assert row[1] == frame["mismatch_kl/all/count"]
        pooled = ("k3_mean", "k1_mean", "k2_mean", "mean_abs_lp_diff")
        pooled += ("sample_mean_abs_lp_diff", "mean_ratio", "mean_exp_abs_lp_diff")
        for value, key in zip(row[3:], pooled, strict=True):
            assert math.isclose(value, want[key], rel_tol=REL_TOL), key
        metric = logged[row[0]]["mismatch_kl/all/mean"]
        assert metric == frame["mismatch_kl/all/mean"]
        assert math.isclose(row[3], metric, rel_tol=0, abs_tol=ORACLE_ABS)


@pytest.mark.parametrize("case", CASES)
def test_per_env_mean_k3_is_prime_rls_per_env_mismatch_kl(
    lakes: dict[str, Path], case: str
) -> None:
    oracle = json.loads((PRIME_RL_REAL / case / "expected" / "framework_oracle.json").read_text())
    got = rows(
        lakes[case],
        "SELECT rollout_id, env_name, count(*), avg(k3) FROM drift_tokens"
        " JOIN samples USING (run, rollout_id, batch_position) GROUP BY ALL ORDER BY ALL",
    )
    want = [
        (step["step"], env, step[f"mismatch_kl/{env}/count"], step[f"mismatch_kl/{env}/mean"])
        for step in oracle["steps"]
        for env in sorted(
            k.split("/")[1] for k in step if k.endswith("/count") and "/all/" not in k
        )
    ]
    assert [r[:3] for r in got] == [w[:3] for w in want]
    for row, expected in zip(got, want, strict=True):
        assert math.isclose(row[3], expected[3], rel_tol=0, abs_tol=ORACLE_ABS)


def test_metrics_jsonl_lands_in_metrics_and_joins_the_drift_views(
    lakes: dict[str, Path],
) -> None:
    lake = lakes["packed_2ranks"]
    logged = _jsonl(PRIME_RL_REAL / "packed_2ranks" / "metrics.jsonl")
    got = rows(
        lake,
        "SELECT m.step, m.value, d.tokens FROM metrics AS m JOIN drift_steps AS d"
        " ON d.run = m.run AND d.rollout_id = m.step"
        " WHERE m.step_key = 'rollout/step' AND m.metric = 'mismatch_kl/all/mean' ORDER BY 1",
    )
    assert got == [
        (1, logged[0]["mismatch_kl/all/mean"], 93),
        (2, logged[1]["mismatch_kl/all/mean"], 88),
    ]
    counts = rows(lake, "SELECT step, count(*), min(epoch(ts)) FROM metrics GROUP BY 1 ORDER BY 1")
    assert counts == [(line["step"], len(line) - 2, pytest.approx(line["time"])) for line in logged]


# -- nulls, weight streams, unfinished steps and broken lines ---------------------------------


def _copy(tmp_path: Path, case: str = "packed_2ranks") -> Path:
    run = tmp_path / "run"
    shutil.copytree(PRIME_RL_REAL / case, run, ignore=shutil.ignore_patterns("expected"))
    return run


def _edit_lines(path: Path, edit: Any) -> None:
    lines = path.read_text().splitlines()
    path.write_text("".join(f"{edit(number, line)}\n" for number, line in enumerate(lines, 1)))


def _edit_record(number: int, change: Any) -> Any:
    def edit(n: int, line: str) -> str:
        if n != number:
            return line
        record = json.loads(line)
        change(record)
        return json.dumps(record, separators=(",", ":"))

    return edit


def _first_loss(record: dict[str, Any]) -> int:
    return record["loss_mask"].index(True)


def test_a_null_log_prob_is_null_and_leaves_the_drift(tmp_path: Path) -> None:
    """prime-rl writes a non-finite value as `null`: NULL in the lake, never a number, and the
    token leaves the drift statistics (both log-probs are needed)."""
    run = _copy(tmp_path)
    path = run / "token_exports" / "step_1" / "rank_1.jsonl"
    first = json.loads(path.read_text().splitlines()[0])
    start = _first_loss(first)

    def nulls(record: dict[str, Any]) -> None:
        record["trainer_logprobs"][start] = None
        record["inference_logprobs"][start + 1] = None

    _edit_lines(path, _edit_record(1, nulls))
    assert extract_run(run, store_of(tmp_path / "lake"), ExtractOptions(workers=1)).failed == []
    got = rows(
        tmp_path / "lake",
        "SELECT position, loss_mask, train_log_prob, rollout_log_prob IS NULL, lp_diff"
        " FROM tokens WHERE rollout_id = 1 AND batch_position = 4 AND position < 3 ORDER BY 1",
    )
    assert got == [
        (0, 1, None, False, None),
        (1, 1, np.float32(first["trainer_logprobs"][start + 1]), True, None),
        (2, 1, np.float32(first["trainer_logprobs"][start + 2]), False, got[2][4]),
    ]
    assert got[2][4] is not None
    assert rows(tmp_path / "lake", "SELECT tokens FROM drift_steps WHERE rollout_id = 1") == [(91,)]


def test_a_value_beyond_float32_is_inf_and_inf_minus_inf_is_nan_without_a_numpy_warning(
    tmp_path: Path,
) -> None:
    """The lake's floats are float32: 1e308 is +inf there (IEEE rounding, as torch casts it)
    and inf - inf is NaN, both counted among the NaN/inf values kept. numpy's RuntimeWarnings
    about them reached the user's terminal as two lines of tokenlake's source."""
    import warnings

    run = _copy(tmp_path)
    path = run / "token_exports" / "step_1" / "rank_1.jsonl"
    start = _first_loss(json.loads(path.read_text().splitlines()[0]))

    def huge(record: dict[str, Any]) -> None:
        record["trainer_logprobs"][start] = 1e308
        record["trainer_logprobs"][start + 1] = math.inf
        record["inference_logprobs"][start + 1] = math.inf

    _edit_lines(path, _edit_record(1, huge))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = extract_run(run, store_of(tmp_path / "lake"), ExtractOptions(workers=1))
    assert [str(warning.message) for warning in caught] == []
    assert summary.failed == []
    got = rows(
        tmp_path / "lake",
        "SELECT position, train_log_prob, rollout_log_prob, lp_diff"
        " FROM tokens WHERE rollout_id = 1 AND batch_position = 4 AND position < 2 ORDER BY 1",
    )
    assert got[0][1] == math.inf and got[0][3] == math.inf
    assert got[1][1:3] == (math.inf, math.inf) and math.isnan(got[1][3])
    assert rows(
        tmp_path / "lake", "SELECT nonfinite_tokens FROM drift_steps WHERE rollout_id = 1"
    ) == [(2,)]


def test_weight_streams_decide_which_tokens_count_for_drift(tmp_path: Path) -> None:
    """With weight streams, the tokens prime-rl's mismatch statistics count are loss tokens with
    rl_weights != 0 or ref_kl_weights != 0: a cross-entropy-only token keeps its trainer
    log-prob but has no engine log-prob (not this policy's engine's) and no lp_diff."""
    run = _copy(tmp_path)
    path = run / "token_exports" / "step_1" / "rank_1.jsonl"
    first = json.loads(path.read_text().splitlines()[0])
    start, n = _first_loss(first), len(first["token_ids"])

    def streams(record: dict[str, Any]) -> None:
        mask = record["loss_mask"]
        record["rl_weights"] = [1.0 if m else 0.0 for m in mask]
        record["rl_weights"][start] = 0.0  # ce only
        record["ce_weights"] = [0.0] * n
        record["ce_weights"][start] = 0.5
        record["ref_kl_weights"] = [0.0] * n
        record["rl_weights"][start + 1] = 0.0  # ref_kl only: still counted
        record["ref_kl_weights"][start + 1] = 0.1

    _edit_lines(path, _edit_record(1, streams))
    assert extract_run(run, store_of(tmp_path / "lake"), ExtractOptions(workers=1)).failed == []
    got = rows(
        tmp_path / "lake",
        "SELECT position, loss_mask, train_log_prob IS NOT NULL, rollout_log_prob IS NOT NULL,"
        " lp_diff IS NOT NULL, rl_weight, ce_weight, ref_kl_weight FROM tokens"
        " WHERE rollout_id = 1 AND batch_position = 4 AND position < 3 ORDER BY 1",
    )
    assert got == [
        (0, 1, True, False, False, 0.0, 0.5, 0.0),
        (1, 1, True, True, True, 0.0, 0.0, np.float32(0.1)),
        (2, 1, True, True, True, 1.0, 0.0, 0.0),
    ]
    assert rows(tmp_path / "lake", "SELECT tokens FROM drift_steps WHERE rollout_id = 1") == [(92,)]


def test_a_pure_cross_entropy_line_has_no_dppo_flags(tmp_path: Path) -> None:
    """In a micro-batch without rl or ref_kl members prime-rl computes no ratio fields or DPPO
    masks (all `null`): NULL flags, never false; and no token counts for drift."""
    run = _copy(tmp_path)
    path = run / "token_exports" / "step_1" / "rank_1.jsonl"

    def cross_entropy(record: dict[str, Any]) -> None:
        n = len(record["token_ids"])
        record["rl_weights"] = [0.0] * n
        record["ce_weights"] = [1.0 if m else 0.0 for m in record["loss_mask"]]
        for key in ("mismatch_kl", "log_importance_ratio", "importance_ratio", "prob_delta"):
            record[key] = [None] * n
        for key in ("is_masked", "is_masked_high", "is_masked_low"):
            record[key] = [None] * n

    _edit_lines(path, _edit_record(1, cross_entropy))
    assert extract_run(run, store_of(tmp_path / "lake"), ExtractOptions(workers=1)).failed == []
    got = rows(
        tmp_path / "lake",
        "SELECT count(*), count(dppo_masked), count(dppo_masked_high), count(lp_diff),"
        " count(train_log_prob), min(ce_weight) FROM tokens"
        " WHERE rollout_id = 1 AND batch_position = 4 AND loss_mask = 1",
    )
    assert got == [(10, 0, 0, 0, 10, 1.0)]  # expected/samples.jsonl: its n_loss_mask
    flags = rows(
        tmp_path / "lake",
        "SELECT count(dppo_masked), count(*) FILTER (WHERE NOT dppo_masked_low) FROM tokens"
        " WHERE rollout_id = 1 AND batch_position = 3 AND loss_mask = 1",
    )
    assert flags == [(10, 10)]


def test_a_step_without_stable_is_not_yet_and_lands_once_stable_appears(tmp_path: Path) -> None:
    """prime-rl touches `STABLE` after every rank flushed the step: before that the step is
    "not yet" (named among the ignored files, nothing of it read), then lands whole."""
    run = _copy(tmp_path)
    marker = run / "token_exports" / "step_2" / "STABLE"
    marker.unlink()
    summary = extract_run(run, store_of(tmp_path / "lake"), ExtractOptions(workers=1))
    assert (summary.failed, summary.counts["new"]) == ([], 1)
    assert summary.ignored_files == [
        (marker.parent, "not yet: it has no `STABLE`, prime-rl is still writing the step")
    ]
    assert rows(tmp_path / "lake", "SELECT DISTINCT rollout_id FROM samples") == [(1,)]
    marker.touch()
    summary = extract_run(run, store_of(tmp_path / "lake"), ExtractOptions(workers=1))
    assert (summary.failed, summary.counts["new"], summary.counts["unchanged"]) == ([], 1, 1)
    assert summary.ignored_files == []
    assert rows(tmp_path / "lake", "SELECT count(*) FROM samples") == [(16,)]


def test_the_cli_says_which_step_is_not_yet_and_what_it_read(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from tokenlake.cli import main

    run = _copy(tmp_path)
    (run / "token_exports" / "step_2" / "STABLE").unlink()
    result = CliRunner().invoke(main, ["extract", str(run), "--lake", str(tmp_path / "lake")])
    assert result.exit_code == 0
    lines = result.stderr.splitlines()
    assert lines[-2:] == [
        "Read the dump as prime-rl (detected from its layout).",
        f"Ignored `{run}/token_exports/step_2`: not yet: it has no `STABLE`, prime-rl is still"
        " writing the step",
    ]
    assert result.stdout.startswith("Run `run`: 1 new, 0 updated, 0 unchanged, 0 removed")


def test_metrics_warnings_name_the_metrics_jsonl_they_are_about(tmp_path: Path) -> None:
    # The warnings named `RUN/dashboard` and `RUN/dashboard/../metrics.jsonl`: a prime-rl run
    # has no `dashboard/` folder.
    from click.testing import CliRunner

    from tokenlake.cli import main

    run = _copy(tmp_path)
    metrics = run / "metrics.jsonl"
    _edit_lines(metrics, _edit_record(1, lambda record: record.update(a="x", b=10**400)))
    result = CliRunner().invoke(main, ["extract", str(run), "--lake", str(tmp_path / "lake")])
    assert result.exit_code == 0
    assert result.stderr.splitlines()[-1] == (
        f"Warning: `{metrics}`: 2 non-numeric metric values skipped (strings, null, lists,"
        " objects, integers beyond float64)."
    )
    metrics.unlink()  # and `RUN/dashboard/../metrics.jsonl`, a path that does not resolve
    result = CliRunner().invoke(main, ["extract", str(run), "--lake", str(tmp_path / "lake")])
    assert result.exit_code == 0
    assert result.stderr.splitlines()[-1] == (
        f"Warning: `{metrics}` was rewritten or removed since it was read; the run's metrics"
        " are read again from the start."
    )


def test_a_changed_rank_file_re_extracts_its_step_alone(tmp_path: Path) -> None:
    run = _copy(tmp_path)
    lake = tmp_path / "lake"
    assert extract_run(run, store_of(lake), ExtractOptions(workers=2)).counts["new"] == 2
    path = run / "token_exports" / "step_2" / "rank_1.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("".join(f"{line}\n" for line in lines[:-1]))
    summary = extract_run(run, store_of(lake), ExtractOptions(workers=2))
    assert (summary.counts["updated"], summary.counts["unchanged"]) == (1, 1)
    assert rows(lake, "SELECT rollout_id, count(*) FROM samples GROUP BY 1 ORDER BY 1") == [
        (1, 8),
        (2, 7),
    ]


def _set(key: str, value: Any) -> Any:
    def change(record: dict[str, Any]) -> None:
        if value is _DROP:
            del record[key]
        else:
            record[key] = value

    return change


def _set_entry(key: str, entry: int, value: Any) -> Any:
    return lambda record: record[key].__setitem__(entry, value)


_DROP = object()


@pytest.mark.parametrize(
    ("line", "change", "problem"),
    [
        (
            2,
            _set("schema_version", 2),
            "`schema_version` is 2; tokenlake reads prime-rl's token export schema 1",
        ),
        (2, _set("step", 7), "`step` is 7, but the file is step 1's"),
        (2, _set("rank", 1), "`rank` is 1, but the file is rank 0's"),
        (2, _set("token_ids", _DROP), "lacks `token_ids`"),
        (2, _set("micro_step", "0"), "`micro_step` is '0' (a str); expected an integer"),
        (2, _set("advantages", [0.0] * 3), "`advantages` has 3 positions; `token_ids` has 49"),
        (2, _set("token_ids", [-1] * 49), "`token_ids` holds a negative token id"),
        (2, _set("token_ids", [1.5] * 49), "`token_ids` is not a flat list of integers"),
        (
            2,
            _set("trainer_logprobs", ["x"] * 49),
            "`trainer_logprobs` holds values that are not numbers",
        ),
        (2, _set("loss_mask", [1] * 49), "`loss_mask` holds values other than true or false"),
        (2, _set("is_masked", [0] * 49), "`is_masked` holds values other than true, false or null"),
        (2, _set("env_name", 3), "`env_name` is 3, not a string"),
        (
            2,
            _set_entry("inference_logprobs", 30, True),
            "`inference_logprobs` entry 30 is True, a bool among numbers",
        ),
        (2, _set_entry("token_ids", 4, True), "`token_ids` entry 4 is True, a bool among numbers"),
    ],
    ids=[
        "schema-version",
        "wrong-step",
        "wrong-rank",
        "missing-key",
        "key-not-int",
        "ragged",
        "negative-id",
        "float-ids",
        "strings",
        "mask-ints",
        "flag-ints",
        "env-not-text",
        "a-bool-among-log-probs",
        "a-bool-among-token-ids",
    ],
)
def test_a_broken_line_fails_its_step_alone(
    tmp_path: Path, line: int, change: Any, problem: str
) -> None:
    run = _copy(tmp_path)
    path = run / "token_exports" / "step_1" / "rank_0.jsonl"
    _edit_lines(path, _edit_record(line, change))
    summary = extract_run(run, store_of(tmp_path / "lake"), ExtractOptions(workers=1))
    assert summary.failed == [("1", f"`{path}` (line {line}): {problem}. {AFTER}")]
    assert summary.counts["new"] == 1


def test_a_second_name_for_a_rank_or_a_step_fails_that_step_and_the_other_lands(
    tmp_path: Path,
) -> None:
    # Either name could be meant, so neither is picked; the whole extraction was refused,
    # and the run's other step did not land either.
    run = _copy(tmp_path)
    exports = run / "token_exports"
    shutil.copyfile(exports / "step_2" / "rank_1.jsonl", exports / "step_2" / "rank_01.jsonl")
    summary = extract_run(run, store_of(tmp_path / "lake"), ExtractOptions(workers=1))
    assert summary.failed == [
        (
            "2",
            f"`{exports}/step_2/rank_1.jsonl`: names the same rank as `step_2/rank_01.jsonl`;"
            f" which one is meant is ambiguous: remove or rename one of them. {AFTER}",
        )
    ]
    assert rows(tmp_path / "lake", "SELECT DISTINCT rollout_id FROM samples") == [(1,)]
    (exports / "step_2" / "rank_01.jsonl").unlink()
    shutil.copytree(exports / "step_1", exports / "step_01")
    summary = extract_run(run, store_of(tmp_path / "lake"), ExtractOptions(workers=1))
    assert summary.failed == [
        (
            "1",
            f"`{exports}/step_1/STABLE`: names the same step as `step_01/STABLE`;"
            f" which one is meant is ambiguous: remove or rename one of them. {AFTER}",
        )
    ]
    assert summary.counts["new"] == 1


def test_a_line_written_twice_fails_its_step(tmp_path: Path) -> None:
    """(step, rank, `export_sequence_idx`) keys a sample: a repeated line is not two samples."""
    run = _copy(tmp_path)
    path = run / "token_exports" / "step_1" / "rank_0.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("".join(f"{line}\n" for line in [*lines, lines[1]]))
    summary = extract_run(run, store_of(tmp_path / "lake"), ExtractOptions(workers=1))
    problem = "`export_sequence_idx` 1 is line 2's too; prime-rl exports each sequence once"
    assert summary.failed == [("1", f"`{path}` (line 5): {problem}. {AFTER}")]
    assert summary.counts["new"] == 1


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{not json", "is not JSON ("),
        ("[1, 2]", "is a list of 2 entries, not a JSON object"),
        ('{"a": ' * 6 + "1" + "}" * 6, "is not JSON ('nested more than 4"),
    ],
    ids=["not-json", "not-an-object", "too-deep"],
)
def test_a_line_that_is_not_an_object_fails_its_step(
    tmp_path: Path, text: str, problem: str
) -> None:
    run = _copy(tmp_path)
    path = run / "token_exports" / "step_2" / "rank_1.jsonl"
    _edit_lines(path, lambda n, line: text if n == 3 else line)
    summary = extract_run(run, store_of(tmp_path / "lake"), ExtractOptions(workers=1))
    assert [label for label, _ in summary.failed] == ["2"]
    assert summary.failed[0][1].startswith(f"`{path}` (line 3): {problem}")


def test_a_rank_file_cut_mid_line_is_being_rewritten_or_was_cut_short(tmp_path: Path) -> None:
    """prime-rl writes whole lines before `STABLE`: a complete step's file ending mid-line is
    being rewritten when it is young (a resumed run re-running the step), else was cut."""
    run = _copy(tmp_path)
    path = run / "token_exports" / "step_1" / "rank_1.jsonl"
    text = path.read_text()
    path.write_text(text[:-100])
    summary = extract_run(run, store_of(tmp_path / "lake"), ExtractOptions(workers=1, steps={1}))
    assert summary.failed == [
        (
            "1",
            f"Cannot read `{path}`: its last line (line 4) has no newline. It was modified less"
            " than a minute ago and is probably still being written; extract again later.",
        )
    ]
    old = path.stat().st_mtime - 3600
    os.utime(path, (old, old))
    summary = extract_run(run, store_of(tmp_path / "lake"), ExtractOptions(workers=1, steps={1}))
    assert summary.failed == [
        ("1", f"`{path}` (line 4): ends without a newline: the file was cut short. {AFTER}")
    ]


def test_a_line_beyond_the_size_bound_fails_its_step_unread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _copy(tmp_path)
    monkeypatch.setattr(prime_rl, "MAX_LINE_BYTES", 4096)  # rank 1's first line is ~5.6 kB
    summary = extract_run(run, store_of(tmp_path / "lake"), ExtractOptions(workers=1, steps={1}))
    path = run / "token_exports" / "step_1" / "rank_0.jsonl"
    assert summary.failed == [
        (
            "1",
            f"`{path}` (line 1): is longer than 4 KiB, tokenlake's bound for one"
            f" sample's line. {AFTER}",
        )
    ]


def test_a_rank_file_beyond_the_size_bound_fails_its_step_unread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _copy(tmp_path)
    monkeypatch.setattr(prime_rl, "MAX_FILE_BYTES", 20 << 10)
    summary = extract_run(run, store_of(tmp_path / "lake"), ExtractOptions(workers=1))
    first, second = (run / "token_exports" / f"step_{s}" / "rank_0.jsonl" for s in (1, 2))
    assert summary.failed == [
        (
            str(step),
            f"`{path}`: is {size} bytes, more than 20 KiB, tokenlake's bound for one rank's"
            f" token exports of a step. {AFTER}",
        )
        for step, path, size in ((1, first, "30,763"), (2, second, "29,911"))
    ]


def test_steps_and_ranks_are_found_in_order_and_strays_are_named() -> None:
    listing = prime_rl.discover(PRIME_RL_REAL / "packed_2ranks")
    assert [
        (s.label, s.rollout_file.name, [(r, p.name) for r, p in s.train_files], s.format)
        for s in listing.steps
    ] == [
        ("1", "STABLE", [(0, "rank_0.jsonl"), (1, "rank_1.jsonl")], "prime-rl"),
        ("2", "STABLE", [(0, "rank_0.jsonl"), (1, "rank_1.jsonl")], "prime-rl"),
    ]
    assert listing.ignored == ()


def test_stray_files_and_folders_are_ignored_with_a_reason(tmp_path: Path) -> None:
    run = _copy(tmp_path)
    exports = run / "token_exports"
    (exports / "step_1" / "rank_0.jsonl.bak").write_text("")
    (exports / "latest").mkdir()
    (exports / "step_8").mkdir()  # just created by prime-rl: no rank file, no STABLE yet
    (exports / "step_9").mkdir()
    (exports / "step_9" / "STABLE").touch()
    listing = prime_rl.discover(run)
    assert [s.label for s in listing.steps] == ["1", "2"]
    assert listing.ignored == (
        (exports / "latest", "not a `step_{N}` folder of prime-rl's token exports"),
        (exports / "step_1" / "rank_0.jsonl.bak", "not a rollout or train dump file name"),
        (exports / "step_8", "not yet: it has no `STABLE`, prime-rl is still writing the step"),
        (exports / "step_9", "holds no `rank_{R}.jsonl` file"),
    )


def test_a_stable_that_is_not_a_file_is_named_as_such_not_as_a_step_being_written(
    tmp_path: Path,
) -> None:
    # They read "not yet: ... prime-rl is still writing the step", which no wait would end.
    run = _copy(tmp_path)
    exports = run / "token_exports"
    (exports / "step_2" / "STABLE").unlink()
    (exports / "step_2" / "STABLE").mkdir()
    (exports / "step_1" / "STABLE").unlink()
    (exports / "step_1" / "STABLE").symlink_to(tmp_path / "elsewhere")
    listing = prime_rl.discover(run)
    assert listing.steps == ()
    assert listing.ignored == (
        (
            exports / "step_1",
            "its `STABLE` is a symbolic link, not the empty file prime-rl writes once every"
            " rank flushed the step",
        ),
        (
            exports / "step_2",
            "its `STABLE` is a directory, not the empty file prime-rl writes once every rank"
            " flushed the step",
        ),
    )


def test_a_line_of_empty_containers_fails_its_step_before_it_is_parsed(tmp_path: Path) -> None:
    """`[{}, {}, ...]` in one line: each `{}, ` would parse into a dict of ~64 bytes, ~20 x
    the line; counted and refused before anything is built, as NeMo-RL's lines are."""
    run = _copy(tmp_path)
    path = run / "token_exports" / "step_1" / "rank_0.jsonl"
    count = 1 << 16
    wide = "[" + "{}, " * (count - 1) + "{}]"
    _edit_lines(path, lambda number, line: wide if number == 2 else line)
    summary = extract_run(run, store_of(tmp_path / "lake"), ExtractOptions(workers=1))
    assert summary.failed == [
        (
            "1",
            f"`{path}` (line 2): holds {count + 1:,} containers and strings in {len(wide):,}"
            f" bytes, more than one per 32 bytes (parsed, each takes ~64 bytes). {AFTER}",
        )
    ]
    assert summary.counts["new"] == 1
