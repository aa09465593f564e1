"""slime's dumps against the reference answers written beside them (tests/fixtures/slime-real).

Both cases (train dump format 1, per rank, DP 2 x TP 2; format 2, one file per step, DP 2 x
CP 2) are extracted once, as two runs of one lake, and compared with `expected/`: every token
exactly as float32, every sample's values and drift statistics, each step's pooled values,
and slime's own logged metric (`framework_oracle.json`). Then format-2 files that are broken
in one way each: one line for their step, the other steps land.
"""

from __future__ import annotations

import gzip
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import store_of
from tests.e2e.test_bad_input import age
from tests.fixture_paths import SLIME_REAL
from tokenlake.orchestrate.extract import ExtractOptions, extract_run

pytestmark = pytest.mark.slow

CASES = ("v1_tp2", "v2_dp2_cp2")
# The lake's lp_diff is float32 (the schema's), the reference's double: per-sample and
# per-step means of it agree to float32 rounding.
REL_TOL = 1e-6
# slime's metric was reduced in torch float32.
ORACLE_TOL = 1e-5


def _expected(case: str, name: str) -> Any:
    path = SLIME_REAL / case / "expected" / name
    if name.endswith(".jsonl.gz"):
        with gzip.open(path, "rt") as handle:
            return [json.loads(line) for line in handle]
    if name.endswith(".jsonl"):
        return [json.loads(line) for line in path.read_text().splitlines()]
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("slime") / "lake"
    for case in CASES:
        summary = extract_run(SLIME_REAL / case, store_of(root), ExtractOptions(workers=1))
        assert summary.failed == [] and summary.counts["new"] == 4
    return root


def rows(lake: Path, sql: str) -> list[tuple]:
    import duckdb

    with duckdb.connect(str(lake / "tokenlake.duckdb"), read_only=True) as con:
        return con.execute(sql).fetchall()


def test_runs_record_the_framework_and_format(lake: Path) -> None:
    assert rows(
        lake, "SELECT run, framework, dump_format, format_version FROM runs ORDER BY run"
    ) == [("v1_tp2", "slime", "slime-v1", 1), ("v2_dp2_cp2", "slime", "slime-v2", 2)]


TOKENS_SQL = """
SELECT t.rollout_id, t.sample_index, t.batch_position, t.evaluation,
       t.position + s.prompt_length, t.position, t.token_id, t.loss_mask,
       t.train_log_prob, t.rollout_log_prob, t.lp_diff
FROM tokens AS t JOIN samples AS s USING (run, rollout_id, evaluation, batch_position)
WHERE run = '{run}'
ORDER BY t.evaluation, t.rollout_id, t.batch_position, t.position
"""


@pytest.mark.parametrize("case", CASES)
def test_every_token_matches_the_reference_exactly(lake: Path, case: str) -> None:
    expected = _expected(case, "tokens.jsonl.gz")
    got = rows(lake, TOKENS_SQL.format(run=case))
    assert len(got) == len(expected) > 1000
    for want, row in zip(expected, got, strict=True):
        keys = ("rollout_id", "sample_index", "rollout_position", "evaluation", "position")
        assert row[:8] == (
            *(want[k] for k in keys),
            want["response_index"],
            want["token_id"],
            want["loss_mask"],
        )
        trainer, rollout, lp_diff = row[8:]
        if want["loss_mask"] == 1 and not want["evaluation"]:
            assert (trainer, rollout) == (
                np.float32(want["trainer_logprob"]),
                np.float32(want["rollout_logprob"]),
            )
            assert lp_diff == np.float32(want["lp_diff"])  # the double difference, rounded
        else:  # masked (tool tokens, the removed sample) or eval: no drift value
            assert (trainer, lp_diff) == (None, None)
            assert want["lp_diff"] is None


SAMPLES_SQL = """
SELECT s.rollout_id, s.sample_index, s.batch_position, s.evaluation, s.prompt_length,
       s.response_length, s.remove_sample, s.status, s.reward, s.raw_reward, s.dumped_rank,
       d.tokens, d.mean_lp_diff, d.mean_abs_lp_diff, d.max_abs_lp_diff
FROM samples AS s
LEFT JOIN drift_samples AS d USING (run, rollout_id, batch_position)
WHERE s.run = '{run}' AND NOT s.evaluation
ORDER BY s.rollout_id, s.batch_position
"""


@pytest.mark.parametrize("case", CASES)
def test_every_sample_matches_the_reference(lake: Path, case: str) -> None:
    expected = [s for s in _expected(case, "samples.jsonl") if not s["evaluation"]]
    got = rows(lake, SAMPLES_SQL.format(run=case))
    assert len(got) == len(expected) == 48
    for want, row in zip(expected, got, strict=True):
        assert row[:10] == (
            want["rollout_id"],
            want["sample_index"],
            want["rollout_position"],
            False,
            want["prompt_length"],
            want["response_length"],
            want["remove_sample"],
            want["status"],
            want["reward"],
            want["raw_reward"],
        )
        tokens, mean, mean_abs, max_abs = row[11:]
        if want["n_mask_on"] == 0:  # the removed sample: no drift row at all
            assert want["remove_sample"] and tokens is None
            continue
        assert tokens == want["n_mask_on"]
        for value, key in ((mean, "mean_lp_diff"), (mean_abs, "mean_abs_lp_diff")):
            assert math.isclose(value, want[key], rel_tol=REL_TOL, abs_tol=1e-9), key
        assert max_abs == pytest.approx(want["max_abs_lp_diff"], rel=1e-7)


def test_format_2_samples_name_the_rank_of_their_data_parallel_shard(lake: Path) -> None:
    """`dumped_rank` is the global rank slime gave the sample's shard (`dp_shards[].rank`)."""
    expected = {
        (s["rollout_id"], s["rollout_position"]): 2 * s["data_parallel_rank"]
        for s in _expected("v2_dp2_cp2", "samples.jsonl")
        if not s["evaluation"]
    }
    got = rows(lake, SAMPLES_SQL.format(run="v2_dp2_cp2"))
    assert {(r[0], r[2]): r[10] for r in got} == expected
    assert set(expected.values()) == {0, 2}


STEPS_SQL = """
SELECT rollout_id, tokens, samples, mean_lp_diff, mean_abs_lp_diff_tm, max_abs_lp_diff,
       k3_kl, mult_prob_error, is_ratio_mean, mean_abs_lp_diff_smtm, k3_kl_smtm
FROM drift_steps WHERE run = '{run}' ORDER BY rollout_id
"""


@pytest.mark.parametrize("case", CASES)
def test_drift_steps_match_the_reference_and_slimes_own_metric(lake: Path, case: str) -> None:
    expected = _expected(case, "steps.json")["steps"]
    oracle = _expected(case, "framework_oracle.json")["steps"]
    got = rows(lake, STEPS_SQL.format(run=case))
    assert [r[0] for r in got] == [s["rollout_id"] for s in expected] == [0, 1, 2]
    for want, logged, row in zip(expected, oracle, got, strict=True):
        assert row[1:3] == (want["n_mask_on"], want["n_samples_with_tokens"])
        pooled = ("mean_lp_diff", "mean_abs_lp_diff", "max_abs_lp_diff", "k3_mean")
        pooled += ("mean_exp_abs_lp_diff", "mean_ratio", "sample_mean_abs_lp_diff")
        for value, key in zip(row[3:10], pooled, strict=True):
            assert math.isclose(value, want[key], rel_tol=REL_TOL), key
        # slime divides by the global batch size, counting a sample without tokens as 0.
        batch = logged["global_batch_size"]
        share = row[2] / batch
        abs_diff = logged["train/train_rollout_logprob_abs_diff"]
        assert math.isclose(row[9] * share, abs_diff, rel_tol=ORACLE_TOL)
        assert math.isclose(row[10] * share, logged["train/mis_k3_kl"], rel_tol=ORACLE_TOL)


def test_the_eval_rollout_lands_without_a_train_side(lake: Path) -> None:
    got = rows(
        lake,
        "SELECT run, rollout_id, count(*), bool_or(has_train_row), min(step_train_files)"
        " FROM samples WHERE evaluation GROUP BY ALL ORDER BY run",
    )
    assert got == [("v1_tp2", 0, 8, False, 0), ("v2_dp2_cp2", 0, 8, False, 0)]


# -- broken format-2 files: one line for their step ------------------------------------------


def _copy(tmp_path: Path) -> Path:
    dump = tmp_path / "v2"
    shutil.copytree(SLIME_REAL / "v2_dp2_cp2", dump)
    return dump


def _rewrite(path: Path, change: Any) -> None:
    import torch

    data = torch.load(path, weights_only=True)
    change(data)
    torch.save(data, path)


def _failures(dump: Path, tmp_path: Path, **options: Any) -> tuple[list, dict[str, int]]:
    summary = extract_run(dump, store_of(tmp_path / "lake"), ExtractOptions(workers=1, **options))
    return summary.failed, {str(k): v for k, v in summary.counts.items() if v}


def _set(key: str, value: Any) -> Any:
    return lambda data: data.__setitem__(key, value)


def _set_sample(entry: int, key: str, value: Any) -> Any:
    return lambda data: data["samples"][entry].__setitem__(key, value)


AFTER = "Replace or remove the file, then extract again."


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (
            _set("format_version", 3),
            "has `format_version` 3; tokenlake reads slime's per-step train dumps of format"
            " version 2",
        ),
        (_set("rollout_id", 7), "holds `rollout_id` 7, but its name says 1"),
        (_set("samples", None), "has no `samples` list"),
        (
            _set_sample(2, "rollout_position", 16),
            "(train sample 2): `rollout_position` 16 is outside the rollout dump's 16 samples"
            " (mixed or corrupt dumps)",
        ),
        (
            _set_sample(2, "rollout_position", 1),
            "(train sample 2): `rollout_position` 1 is listed twice",
        ),
        (
            _set_sample(3, "sample_index", 99),
            "(train sample 3): `sample_index` 99 differs from `index` 19 of the rollout dump's"
            " sample at position 3 (mixed or corrupt dumps)",
        ),
        (
            _set_sample(0, "data_parallel_rank", 5),
            "(train sample 0): `data_parallel_rank` 5 is in no `dp_shards` entry",
        ),
        (
            lambda data: data["dp_shards"].append({"data_parallel_rank": 1, "rank": 3}),
            "(dp_shards entry 2): `data_parallel_rank` 1 is dp_shards entry 1's too; slime"
            " lists each data-parallel shard once",
        ),
        (
            _set_sample(0, "rollout_position", "0"),
            "(train sample 0): `rollout_position` is '0' (a str); expected an integer",
        ),
        (
            lambda data: data["samples"][4]["tokens"].__setitem__(0, 7),
            "(train sample 4): `tokens` differ from those of the rollout dump's sample at"
            " position 4 (mixed or corrupt dumps)",
        ),
        (
            _set("raw_reward", [0.0]),
            "`raw_reward` is 1 entries; expected one entry per rollout sample (16)",
        ),
    ],
    ids=[
        "format-version",
        "rollout-id",
        "no-samples",
        "position-out-of-range",
        "position-twice",
        "index-mismatch",
        "unknown-dp-rank",
        "dp-rank-twice",
        "position-a-string",
        "other-tokens",
        "raw-reward-length",
    ],
)
def test_a_broken_format_2_file_fails_its_step_alone(
    tmp_path: Path, change: Any, problem: str
) -> None:
    dump = _copy(tmp_path)
    train = dump / "train_data" / "1.pt"
    _rewrite(train, change)
    failed, counts = _failures(dump, tmp_path)
    separator = " " if problem.startswith("(") else ": "
    assert failed == [("1", f"`{train}`{separator}{problem}. {AFTER}")]
    assert counts == {"new": 3, "skipped": 1}


def test_a_train_sample_with_a_misplaced_column_is_flagged_not_shifted(tmp_path: Path) -> None:
    """A per-token column of the wrong length is NULL and flags the sample, as in a rank file."""
    import torch

    dump = _copy(tmp_path)
    _rewrite(dump / "train_data" / "0.pt", _set_sample(0, "log_probs", torch.zeros(3)))
    failed, counts = _failures(dump, tmp_path)
    assert (failed, counts) == ([], {"new": 4})
    got = rows(
        tmp_path / "lake",
        "SELECT batch_position, alignment_failed, (SELECT count(lp_diff) FROM tokens AS t"
        " WHERE t.rollout_id = 0 AND t.batch_position = s.batch_position AND NOT t.evaluation)"
        " FROM samples AS s WHERE rollout_id = 0 AND NOT evaluation AND batch_position < 2"
        " ORDER BY 1",
    )
    assert got == [(0, True, 0), (1, False, 15)]


def test_cp_local_ref_entropy_is_null_without_flagging_the_sample(lake: Path) -> None:
    """slime leaves `ref_entropy` CP-local in format 2: it cannot be placed, and says so by
    NULL, not by an alignment failure on every sample."""
    got = rows(
        lake,
        "SELECT count(*), count(t.ref_entropy), count(t.entropy), bool_or(s.alignment_failed)"
        " FROM tokens AS t JOIN samples AS s USING (run, rollout_id, evaluation, batch_position)"
        " WHERE run = 'v2_dp2_cp2' AND NOT t.evaluation AND t.loss_mask = 1",
    )
    assert got == [(771, 0, 771, False)]


def test_format_2_read_as_miles_fails_each_trained_step_naming_its_file(tmp_path: Path) -> None:
    """Forcing the wrong format never lands a silent rollout-only step."""
    dump = SLIME_REAL / "v2_dp2_cp2"
    failed, counts = _failures(dump, tmp_path, dump_format="miles")
    assert failed == [
        (
            str(step),
            f"`{dump}/train_data/{step}.pt`: is a per-step train file of step {step}, which"
            " the miles format does not read; extract with the matching --format (or without"
            f" --format to detect it). {AFTER}",
        )
        for step in (0, 1, 2)
    ]
    assert counts == {"new": 1, "skipped": 3}  # the eval rollout


def test_the_cli_prints_one_line_for_a_broken_step_and_says_the_format(tmp_path: Path) -> None:
    dump = _copy(tmp_path)
    train = dump / "train_data" / "2.pt"
    train.write_bytes(b"not a torch file")
    age(train)  # an old file: not one still being written
    done = subprocess.run(
        [sys.executable, "-m", "tokenlake", "extract", str(dump), "--lake", str(tmp_path / "l")]
        + ["--silent", "--workers", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "Read the dump as slime (train dump format 2) (detected from its layout).",
        f"Skipped step 2: Cannot read `{train}`: it is not a zip archive, so `torch.save` did"
        f" not write it. {AFTER}",
    ]
    assert "Traceback" not in done.stdout + done.stderr


def test_slimes_own_rollout_sample_keys_read(lake: Path, tmp_path: Path) -> None:
    """slime's rollout samples differ from miles' a little: `session_id`, top-p ids and
    offsets as lists or int32 tensors, routed experts as a tensor, the `trace` dict, and the
    old `spec_info` counter names. None stops a step; the counters give the accept rate; the
    top-p supports (slime #2102) are the sampler's bounded supports, as miles'
    `rollout_sampling_mask_*`: each token's `support_size`, the sample `bounded_sampling`."""
    import torch

    dump = _copy(tmp_path)

    def vary(data: dict[str, Any]) -> None:
        first, second = data["samples"][0], data["samples"][1]
        length = first["response_length"]
        first["rollout_top_p_token_ids"] = torch.arange(2 * length, dtype=torch.int32)
        first["rollout_top_p_token_offsets"] = torch.arange(length + 1, dtype=torch.int32) * 2
        first["rollout_routed_experts"] = torch.zeros((len(first["tokens"]) - 1, 2, 2))
        first["spec_info"] = {
            "spec_accept_token_num": 6,
            "spec_draft_token_num": 8,
            "spec_verify_ct": 2,
            "completion_token_num": 24,
        }
        second["rollout_top_p_token_ids"] = list(range(second["response_length"]))
        second["rollout_top_p_token_offsets"] = list(range(second["response_length"] + 1))

    _rewrite(dump / "rollout_data" / "0.pt", vary)
    failed, counts = _failures(dump, tmp_path)
    assert (failed, counts) == ([], {"new": 4})
    sql = (
        "SELECT batch_position, spec_accept_rate, prefix_cache_hit_rate, (SELECT count(lp_diff)"
        " FROM tokens AS t WHERE t.run = s.run AND t.rollout_id = 0 AND NOT t.evaluation"
        " AND t.batch_position = s.batch_position) FROM samples AS s WHERE rollout_id = 0"
        " AND NOT evaluation AND batch_position < 3 AND run = '{run}' ORDER BY 1"
    )
    got = rows(tmp_path / "lake", sql.format(run="v2"))
    assert got == [(0, 0.75, 0.0, 17), (1, None, 5 / 36, 15), (2, None, 0.5, 22)]
    # the same drift as the dump as written
    unchanged = rows(lake, sql.format(run="v2_dp2_cp2"))
    assert [r[3] for r in got] == [r[3] for r in unchanged]
    supports = rows(
        tmp_path / "lake",
        "SELECT s.batch_position, s.bounded_sampling, count(t.support_size),"
        " min(t.support_size), max(t.support_size), count(*) FROM samples AS s JOIN tokens AS t"
        " USING (run, rollout_id, evaluation, batch_position) WHERE s.run = 'v2'"
        " AND s.rollout_id = 0 AND NOT s.evaluation AND s.batch_position < 3"
        " GROUP BY 1, 2 ORDER BY 1",
    )
    lengths = [r[5] for r in supports]
    assert supports == [
        (0, True, lengths[0], 2, 2, lengths[0]),
        (1, True, lengths[1], 1, 1, lengths[1]),
        (2, False, 0, None, None, lengths[2]),
    ]
