"""NeMo-RL's logged batches against the reference answers beside them (tests/fixtures/nemo-rl-real).

The GRPO log directory (3 training steps of 16 lines, a validation at step 2) is extracted
once and compared with `expected/`: every position of every line (the prompt's in
`samples.prompt_token_ids`, the response's as `tokens` rows, padding nowhere), every line's
values, each step's pooled drift, and NeMo-RL's own mismatch metrics
(`ClippedPGLossFn`'s `token_mult_prob_error`, `gen_kl_error`, `sampling_importance_ratio`,
`num_valid_samples`) against `drift_steps`. Then placeholders and broken lines.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import shutil
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import store_of
from tests.fixture_paths import NEMO_RL_REAL
from tokenlake.orchestrate.extract import ExtractOptions, extract_run
from tokenlake.read import nemo_rl

CASE = NEMO_RL_REAL / "grpo_multiturn"
EXPECTED = CASE / "expected"
REL_TOL = 1e-6  # the lake's lp_diff is float32, the reference's double
ORACLE_TOL = 1e-5  # NeMo-RL's metrics are torch float32 with +1e-8 in the denominators
AFTER = "Replace or remove the file, then extract again."


def _jsonl(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as handle:
        return [json.loads(line) for line in handle]


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("nemo") / "lake"
    summary = extract_run(CASE, store_of(root), ExtractOptions(workers=1))
    assert (summary.failed, summary.dump_format, summary.counts["new"]) == ([], "nemo-rl", 4)
    return root


def rows(lake: Path, sql: str) -> list[tuple]:
    import duckdb

    with duckdb.connect(str(lake / "tokenlake.duckdb"), read_only=True) as con:
        return con.execute(sql).fetchall()


def test_the_run_is_recorded_as_nemo_rl(lake: Path) -> None:
    assert rows(lake, "SELECT framework, dump_format, format_version FROM runs") == [
        ("nemo-rl", "nemo-rl", None)
    ]


def test_truncation_nemo_rl_does_not_log_is_null_never_false(lake: Path) -> None:
    assert rows(lake, "SELECT count(*), count(truncated) FROM samples") == [
        (rows(lake, "SELECT count(*) FROM samples")[0][0], 0)
    ]
    assert rows(lake, "SELECT count(truncated_frac) FROM step_stats") == [(0,)]


def test_reward_health_reads_the_logged_rewards_and_leaves_prompt_groups_unknown(
    lake: Path,
) -> None:
    """NeMo-RL logs `rewards` (samples.reward) and no raw_reward; it logs no prompt groups, so
    whether a group's rewards have zero spread is unknown: NULL, never 0."""
    import statistics

    logged: dict[int, list[float]] = defaultdict(list)
    for line in _jsonl(EXPECTED / "samples.jsonl"):
        logged[line["step"]].append(line["reward"])
    got = rows(
        lake,
        "SELECT rollout_id, reward_mean, reward_std, zero_std_group_frac FROM step_stats"
        " ORDER BY rollout_id",
    )
    assert [(step, mean, frac) for step, mean, _, frac in got] == [
        (1, 0.5, None),
        (2, 0.1875, None),
        (3, 0.25, None),
    ]
    for step, _, std, _ in got:
        assert math.isclose(std, statistics.stdev(logged[step]), rel_tol=1e-12)
    assert [round(std, 6) for _, _, std, _ in got] == [0.516398, 0.403113, 0.447214]
    assert rows(
        lake,
        "SELECT evaluation, count(*), count(zero_std) FROM group_stats GROUP BY ALL ORDER BY 1",
    ) == [(False, 3, 0), (True, 1, 1)]


def test_the_report_shows_the_logged_reward(lake: Path) -> None:
    import duckdb

    from tokenlake.serve.report_data import Selection, run_summary

    with duckdb.connect(str(lake / "tokenlake.duckdb"), read_only=True) as con:
        summary = run_summary(con, Selection(("grpo_multiturn",)))
    assert [(r["run"], r["reward_mean"], r["eval_reward_mean"]) for r in summary] == [
        ("grpo_multiturn", (8 + 3 + 4) / 48, 0.5)
    ]


def test_every_position_below_the_input_length_and_nothing_else_lands(lake: Path) -> None:
    expected = _jsonl(EXPECTED / "tokens.jsonl.gz")
    prompts = {
        (step, line): (prompt, ids)
        for step, line, prompt, ids in rows(
            lake,
            "SELECT rollout_id, batch_position, prompt_length, prompt_token_ids FROM samples"
            " WHERE NOT evaluation",
        )
    }
    tokens = {
        (r[0], r[1], r[2]): r[3:]
        for r in rows(
            lake,
            "SELECT rollout_id, batch_position, position, token_id, loss_mask, train_log_prob,"
            " rollout_log_prob, lp_diff, advantage FROM tokens WHERE NOT evaluation",
        )
    }
    in_prompt = 0
    for want in expected:
        prompt, ids = prompts[want["step"], want["line"]]
        if want["position"] < prompt:
            assert ids[want["position"]] == want["token_id"] and want["mask"] == 0
            in_prompt += 1
            continue
        token_id, mask, trainer, rollout, lp_diff, advantage = tokens.pop(
            (want["step"], want["line"], want["position"] - prompt)
        )
        assert (token_id, mask) == (want["token_id"], want["mask"])
        if want["mask"] == 1:
            assert (trainer, rollout, advantage) == (
                np.float32(want["trainer_logprob"]),
                np.float32(want["rollout_logprob"]),
                np.float32(want["advantage"]),
            )
            assert lp_diff == np.float32(want["lp_diff"])
        else:  # tool and environment tokens, and whole samples out of the loss
            assert (trainer, rollout, lp_diff, advantage) == (None, None, None, None)
    assert tokens == {}  # no row beyond the reference's: padding never lands
    assert (len(expected), in_prompt) == (2304, 584)


SAMPLES_SQL = """
SELECT s.rollout_id, s.batch_position, s.sample_index, s.total_length, s.reward,
       s.remove_sample, s.has_train_row, s.step_train_files,
       s.group_index, s.weight_version, s.staleness, s.dumped_rank, s.raw_reward,
       s.normalized_reward, s.non_generation_time, s.status,
       d.tokens, d.mean_lp_diff, d.mean_abs_lp_diff, d.max_abs_lp_diff,
       json_array_length(s.messages_json)
FROM samples AS s LEFT JOIN drift_samples AS d USING (run, rollout_id, batch_position)
WHERE NOT s.evaluation ORDER BY s.rollout_id, s.batch_position
"""


def test_every_line_matches_the_reference_and_what_nemo_rl_does_not_log_is_null(
    lake: Path,
) -> None:
    expected = _jsonl(EXPECTED / "samples.jsonl")
    got = rows(lake, SAMPLES_SQL)
    assert len(got) == len(expected) == 48
    for want, row in zip(expected, got, strict=True):
        assert row[:8] == (
            want["step"],
            want["line"],
            want["line"],  # `idx`
            want["input_length"],
            want["reward"],
            want["sample_loss_mask"] == 0,  # out of the loss: remove_sample
            True,
            1,
        )
        assert row[8:16] == (None,) * 8
        assert row[20] == want["n_messages"]
        if want["n_mask_on"] == 0:
            assert row[16] is None
            continue
        assert row[16] == want["n_mask_on"]
        for value, key in zip(row[17:19], ("mean_lp_diff", "mean_abs_lp_diff"), strict=True):
            assert math.isclose(value, want[key], rel_tol=REL_TOL, abs_tol=1e-9), key
        assert row[19] == pytest.approx(want["max_abs_lp_diff"], rel=1e-7)
    removed = [(r[0], r[1]) for r in got if r[5]]
    assert removed == [(2, 8), (2, 9), (2, 10), (2, 11)]


def test_drift_steps_agree_with_nemo_rls_own_mismatch_metric(lake: Path) -> None:
    expected = json.loads((EXPECTED / "steps.json").read_text())["steps"]
    oracle = json.loads((EXPECTED / "framework_oracle.json").read_text())["steps"]
    got = rows(
        lake,
        "SELECT rollout_id, tokens, samples, mult_prob_error, k3_kl, is_ratio_mean,"
        " mean_abs_lp_diff_tm, mean_abs_lp_diff_smtm FROM drift_steps ORDER BY rollout_id",
    )
    assert [r[0] for r in got] == [1, 2, 3]
    for want, logged, row in zip(expected, oracle, got, strict=True):
        assert row[1:3] == (want["n_mask_on"], want["n_samples_with_tokens"])
        assert row[2] == logged["train/num_valid_samples"]
        metric = ("train/token_mult_prob_error", "train/gen_kl_error")
        metric += ("train/sampling_importance_ratio",)
        for value, key in zip(row[3:6], metric, strict=True):
            assert math.isclose(value, logged[key], rel_tol=ORACLE_TOL), key
        pooled = ("mean_exp_abs_lp_diff", "k3_mean", "mean_ratio", "mean_abs_lp_diff")
        for value, key in zip(row[3:7], pooled, strict=True):
            assert math.isclose(value, want[key], rel_tol=REL_TOL), key
        assert math.isclose(row[7], want["sample_mean_abs_lp_diff"], rel_tol=REL_TOL)


def test_the_per_sequence_error_nemo_rl_masks_by_is_the_lakes_too(lake: Path) -> None:
    """`compute_and_apply_seq_logprob_error_masking`'s max/mean/min of each sequence's mean
    exp(|lp_diff|), over the sequences with loss tokens, from `drift_tokens`."""
    oracle = json.loads((EXPECTED / "framework_oracle.json").read_text())["steps"]
    got = rows(
        lake,
        "SELECT rollout_id, max(error), avg(error), min(error) FROM ("
        " SELECT rollout_id, batch_position, avg(exp(abs(lp_diff::DOUBLE))) AS error"
        " FROM drift_tokens GROUP BY ALL) GROUP BY ALL ORDER BY rollout_id",
    )
    assert [r[0] for r in got] == [s["step"] for s in oracle] == [1, 2, 3]
    for row, logged in zip(got, oracle, strict=True):
        keys = ("max_seq_mult_prob_error", "mean_seq_mult_prob_error", "min_seq_mult_prob_error")
        for value, key in zip(row[1:], keys, strict=True):
            assert math.isclose(value, logged[f"train/{key}"], rel_tol=ORACLE_TOL), key


def test_the_validation_lines_land_as_an_eval_step_without_tokens(lake: Path) -> None:
    val = json.loads((EXPECTED / "steps.json").read_text())["val"][0]
    got = rows(
        lake,
        "SELECT rollout_id, reward, has_train_row, step_train_files, tool_calls,"
        " json_extract_string(messages_json, '$[*].role'), response_length, total_length,"
        " prompt_length, prompt_token_ids FROM samples WHERE evaluation ORDER BY batch_position",
    )
    assert got == [
        (val["step"], reward, False, 0, roles.count("tool"), roles, None, None, None, None)
        for reward, roles in zip(val["rewards"], val["roles"], strict=True)
    ]
    assert rows(lake, "SELECT count(*) FROM tokens WHERE evaluation") == [(0,)]


# -- placeholders and broken lines -----------------------------------------------------------


def _copy(tmp_path: Path) -> Path:
    dump = tmp_path / "logs"
    shutil.copytree(CASE, dump, ignore=shutil.ignore_patterns("expected"))
    return dump


def _edit_lines(path: Path, edit: Any) -> None:
    lines = path.read_text().splitlines()
    path.write_text("".join(f"{edit(number, line)}\n" for number, line in enumerate(lines, 1)))


def test_all_zero_prev_logprobs_are_placeholders_never_a_drift(tmp_path: Path) -> None:
    """With `loss_fn.force_on_policy_ratio` NeMo-RL logs `prev_logprobs` as 0.0 everywhere:
    the trainer side is unknown, so train_log_prob and lp_diff are NULL (never -engine)."""
    dump = _copy(tmp_path)

    def zero(number: int, line: str) -> str:
        record = json.loads(line)
        record["prev_logprobs"] = [[0.0] * len(record["prev_logprobs"][0])]
        return json.dumps(record)

    _edit_lines(dump / "train_data_step1.jsonl", zero)
    summary = extract_run(dump, store_of(tmp_path / "lake"), ExtractOptions(workers=1))
    assert summary.failed == []
    got = rows(
        tmp_path / "lake",
        "SELECT rollout_id, count(*) FILTER (WHERE loss_mask = 1), count(train_log_prob),"
        " count(lp_diff), count(rollout_log_prob) FROM tokens WHERE NOT evaluation"
        " GROUP BY ALL ORDER BY ALL",
    )
    assert got == [(1, 419, 0, 0, 419), (2, 351, 351, 351, 351), (3, 537, 537, 537, 537)]
    steps = rows(tmp_path / "lake", "SELECT rollout_id, tokens FROM drift_steps ORDER BY 1")
    assert steps == [(1, 0), (2, 351), (3, 537)]


def test_a_log_prob_beyond_float32_is_inf_without_a_numpy_warning(tmp_path: Path) -> None:
    """1e308 is +inf in the lake's float32 (as torch casts it), one of the NaN/inf values the
    extraction counts; numpy's RuntimeWarning about it reached the user's terminal as two lines
    of tokenlake's source."""
    import warnings

    dump = _copy(tmp_path)
    first = json.loads((dump / "train_data_step1.jsonl").read_text().splitlines()[0])
    start = first["token_loss_mask"][0].index(1)
    _edit_lines(
        dump / "train_data_step1.jsonl", _change_entry(1, "generation_logprobs", start, 1e308)
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = extract_run(dump, store_of(tmp_path / "lake"), ExtractOptions(workers=1))
    assert [str(warning.message) for warning in caught] == []
    assert summary.failed == []
    got = rows(
        tmp_path / "lake",
        "SELECT rollout_log_prob, lp_diff FROM tokens"
        " WHERE rollout_id = 1 AND NOT evaluation AND batch_position = 0 AND position = 0",
    )
    assert got == [(math.inf, -math.inf)]


def _replace_line(number: int, text: str) -> Any:
    return lambda n, line: text if n == number else line


def _change_key(number: int, key: str, value: Any) -> Any:
    def edit(n: int, line: str) -> str:
        if n != number:
            return line
        record = json.loads(line)
        if value is _DROP:
            del record[key]
        else:
            record[key] = value
        return json.dumps(record)

    return edit


def _change_entry(number: int, key: str, entry: int, value: Any) -> Any:
    def edit(n: int, line: str) -> str:
        if n != number:
            return line
        record = json.loads(line)
        record[key][0][entry] = value
        return json.dumps(record)

    return edit


_DROP = object()


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (_replace_line(3, "{not json"), "(line 3): is not JSON ("),
        (_replace_line(3, "[1, 2]"), "(line 3): is a list of 2 entries, not a JSON object"),
        (_replace_line(3, "[" * 50 + "]" * 50), "(line 3): is not JSON ('nested more than 8"),
        (_change_key(2, "token_ids", _DROP), "(line 2): lacks `token_ids`"),
        (
            _change_key(2, "input_lengths", 47),
            "(line 2): `input_lengths` is 47; NeMo-RL logs each value as a list of one entry",
        ),
        (
            _change_key(2, "input_lengths", [500]),
            "(line 2): `input_lengths` is 500; the line has 86 positions",
        ),
        (
            _change_key(2, "input_lengths", [8.5]),
            "(line 2): `input_lengths` is 8.5 (a float); expected an integer",
        ),
        (
            _change_key(2, "token_ids", [[1.5] * 86]),
            "(line 2): `token_ids` holds numbers that are not integers",
        ),
        (
            _change_key(2, "advantages", [[0.0] * 85]),
            "(line 2): `advantages` has 85 positions; `token_ids` has 86",
        ),
        (
            _change_key(2, "prev_logprobs", [["x"] * 86]),
            "(line 2): `prev_logprobs` holds a list of 86 entries, not numbers",
        ),
        (
            _change_key(2, "sample_loss_mask", ["1"]),
            "(line 2): `sample_loss_mask` is '1', not a finite number",
        ),
        (
            _change_key(2, "sample_loss_mask", [float("nan")]),
            "(line 2): `sample_loss_mask` is nan, not a finite number",
        ),
        (
            _change_key(2, "token_loss_mask", [[2] * 86]),
            "(line 2): `token_loss_mask` holds values other than 0 and 1",
        ),
        (
            _change_key(2, "token_ids", [[-1] * 86]),
            "(line 2): `token_ids` holds a negative token id",
        ),
        (
            _change_key(2, "token_ids", [[2**70] * 86]),
            "(line 2): `token_ids` holds a list of 86 entries, not numbers",
        ),
        (
            _change_key(2, "content", [["prompt", 3]]),
            "(line 2): `content` entry 1 is 3, not a message text",
        ),
        (
            _change_entry(2, "generation_logprobs", 40, True),
            "(line 2): `generation_logprobs` entry 40 is True, a bool among numbers",
        ),
        (
            _change_entry(2, "token_ids", 3, False),
            "(line 2): `token_ids` entry 3 is False, a bool among numbers",
        ),
    ],
    ids=[
        "not-json",
        "not-an-object",
        "too-deep",
        "missing-key",
        "not-wrapped",
        "length-beyond-padding",
        "length-a-float",
        "float-token-ids",
        "ragged-arrays",
        "strings-as-log-probs",
        "mask-a-string",
        "mask-nan",
        "token-mask-not-binary",
        "negative-token-id",
        "token-id-beyond-int64",
        "content-not-text",
        "a-bool-among-log-probs",
        "a-bool-among-token-ids",
    ],
)
def test_a_broken_line_fails_its_step_alone(tmp_path: Path, edit: Any, problem: str) -> None:
    dump = _copy(tmp_path)
    path = dump / "train_data_step1.jsonl"
    _edit_lines(path, edit)
    summary = extract_run(dump, store_of(tmp_path / "lake"), ExtractOptions(workers=1))
    assert [label for label, _ in summary.failed] == ["1"]
    message = summary.failed[0][1]
    assert message.startswith(f"`{path}` {problem}")
    assert message.endswith(f". {AFTER}") and "\n" not in message
    assert summary.counts["new"] == 3


def test_a_second_name_for_a_step_fails_that_step_and_the_others_land(tmp_path: Path) -> None:
    # Either name could be meant, so neither is picked; the whole extraction was refused.
    dump = _copy(tmp_path)
    shutil.copyfile(dump / "train_data_step2.jsonl", dump / "train_data_step02.jsonl")
    summary = extract_run(dump, store_of(tmp_path / "lake"), ExtractOptions(workers=1))
    assert summary.failed == [
        (
            "2",
            f"`{dump}/train_data_step2.jsonl`: names the same step as `logs/train_data_step02"
            f".jsonl`; which one is meant is ambiguous: remove or rename one of them. {AFTER}",
        )
    ]
    landed = rows(tmp_path / "lake", "SELECT DISTINCT rollout_id, evaluation FROM samples")
    assert sorted(landed) == [(1, False), (2, True), (3, False)]


def test_a_line_written_twice_fails_its_step(tmp_path: Path) -> None:
    """NeMo-RL writes a batch's file in one go, `idx` the line's place: a repeat is not a
    second sample."""
    dump = _copy(tmp_path)
    path = dump / "train_data_step1.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("".join(f"{line}\n" for line in [*lines, lines[2]]))
    summary = extract_run(dump, store_of(tmp_path / "lake"), ExtractOptions(workers=1))
    problem = "`idx` 2 is line 3's too; NeMo-RL logs each sample of a batch once"
    assert summary.failed == [("1", f"`{path}` (line 17): {problem}. {AFTER}")]
    assert summary.counts["new"] == 3


def test_a_last_line_without_its_newline_is_still_being_written_or_cut_short(
    tmp_path: Path,
) -> None:
    dump = _copy(tmp_path)
    path = dump / "train_data_step3.jsonl"
    text = path.read_text()
    path.write_text(text[: len(text) - 100])  # NeMo-RL still writing its last line
    summary = extract_run(dump, store_of(tmp_path / "lake"), ExtractOptions(workers=1, steps={3}))
    assert summary.failed == [
        (
            "3",
            f"Cannot read `{path}`: its last line (line 16) has no newline. It was modified less"
            " than a minute ago and is probably still being written; extract again later.",
        )
    ]
    old = path.stat().st_mtime - 3600
    os.utime(path, (old, old))
    summary = extract_run(dump, store_of(tmp_path / "lake"), ExtractOptions(workers=1, steps={3}))
    assert summary.failed == [
        (
            "3",
            f"`{path}` (line 16): ends without a newline: the file was cut short. {AFTER}",
        )
    ]


def test_train_messages_may_carry_roles(tmp_path: Path) -> None:
    """Train `content` as `{role, content}` messages (as validation lines log them) reads
    like the strings: the first is the prompt, the rest the response text."""
    dump = _copy(tmp_path)
    path = dump / "train_data_step1.jsonl"

    def with_roles(number: int, line: str) -> str:
        record = json.loads(line)
        texts = record["content"][0]
        roles = ["user"] + ["assistant"] * (len(texts) - 1)
        record["content"] = [[{"role": r, "content": t} for r, t in zip(roles, texts, strict=True)]]
        return json.dumps(record)

    _edit_lines(path, with_roles)
    assert (
        extract_run(dump, store_of(tmp_path / "lake"), ExtractOptions(workers=1, steps={1})).failed
        == []
    )
    first = json.loads(path.read_text().splitlines()[0])["content"][0]
    got = rows(
        tmp_path / "lake",
        "SELECT prompt_text, response_text FROM samples WHERE batch_position = 0",
    )
    assert got == [(first[0]["content"], "".join(m["content"] for m in first[1:]))]


def test_a_line_beyond_the_size_bound_fails_its_step_unread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lines are streamed: one longer than the bound is skipped chunk by chunk, never held,
    and its step fails naming it (a sample is never dropped silently)."""
    dump = _copy(tmp_path)
    monkeypatch.setattr(nemo_rl, "MAX_LINE_BYTES", 2048)  # step 1's lines are ~2.4-4.6 kB
    summary = extract_run(dump, store_of(tmp_path / "lake"), ExtractOptions(workers=1, steps={1}))
    path = dump / "train_data_step1.jsonl"
    assert summary.failed == [
        (
            "1",
            f"`{path}` (line 1): is longer than 2 KiB, tokenlake's bound for one sample's"
            f" line. {AFTER}",
        )
    ]


def test_every_step_of_the_fixture_is_found_in_order() -> None:
    listing = nemo_rl.discover(CASE)
    assert [(s.label, s.rollout_file.name, s.format) for s in listing.steps] == [
        ("1", "train_data_step1.jsonl", "nemo-rl"),
        ("2", "train_data_step2.jsonl", "nemo-rl"),
        ("eval_2", "val_data_step2.jsonl", "nemo-rl"),
        ("3", "train_data_step3.jsonl", "nemo-rl"),
    ]


def test_lines_per_step_are_grouped_as_the_logger_wrote_them() -> None:
    """The fixture itself: 16 lines per step, each value wrapped once (the layout read)."""
    counts: dict[str, int] = defaultdict(int)
    for path in sorted(CASE.glob("*.jsonl")):
        for record in _jsonl(path):
            assert all(isinstance(v, list) and len(v) == 1 for k, v in record.items() if k != "idx")
            counts[path.name] += 1
    assert dict(counts) == {
        "train_data_step1.jsonl": 16,
        "train_data_step2.jsonl": 16,
        "train_data_step3.jsonl": 16,
        "val_data_step2.jsonl": 4,
    }


def test_a_line_of_empty_containers_fails_its_step_before_it_is_parsed(tmp_path: Path) -> None:
    """`[{}, {}, ...]`: each `{}, ` would be a dict of ~64 bytes, ~20 x the line; refused by
    counting before anything is built, in a process that could not hold the parse."""
    from tests.limits import run_cli_limited

    dump = _copy(tmp_path)
    path = dump / "train_data_step1.jsonl"
    count = 16 << 20  # dicts, in one list
    wide = b"[" + b"{}, " * (count - 1) + b"{}]"  # 64 MiB
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join([*lines[:2], wide + b"\n", *lines[3:]]))
    os.utime(path, (time.time() - 3600, time.time() - 3600))  # not a file still being written
    lake = tmp_path / "lake"
    args = ["extract", str(dump), "--lake", str(lake), "--workers", "1", "--silent"]
    done = run_cli_limited(args, 1 << 30, 300, "RLIMIT_DATA")
    assert (done.returncode, done.stderr.splitlines()) == (
        1,
        [
            "Read the dump as NeMo-RL (detected from its layout).",
            f"Skipped step 1: `{path}` (line 3): holds {count + 1:,} containers and strings in"
            f" {len(wide):,} bytes, more than one per 32 bytes (parsed, each takes ~64 bytes)."
            f" {AFTER}",
        ],
    )
