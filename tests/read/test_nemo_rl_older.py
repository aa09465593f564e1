"""NeMo-RL's train lines as its GRPO loop logged them before 2026-02-21 (f11f99c79; the async
loop until 2026-03-01, 7684dc27c): `content`, `rewards`, `generation_logprobs`,
`prev_logprobs`, `input_lengths` (and `idx`), without `token_ids`, `token_loss_mask`,
`sample_loss_mask` or `advantages`.

The real log directory (tests/fixtures/nemo-rl-real/grpo_multiturn) is rewritten into that
shape: its samples land with their rewards and messages, and no position is placed anywhere
(nothing tells the response from the prompt without the mask).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import store_of
from tests.fixture_paths import NEMO_RL_REAL
from tokenlake.orchestrate.extract import ExtractOptions, extract_run

CASE = NEMO_RL_REAL / "grpo_multiturn"
AFTER = "Replace or remove the file, then extract again."
NEWER = ("token_ids", "token_loss_mask", "sample_loss_mask", "advantages")
SAMPLES_SQL = """
SELECT rollout_id, batch_position, sample_index, reward, prompt_text, response_text,
       messages_json
FROM samples WHERE NOT evaluation ORDER BY rollout_id, batch_position
"""


def rows(lake: Path, sql: str) -> list[tuple]:
    import duckdb

    with duckdb.connect(str(lake / "tokenlake.duckdb"), read_only=True) as con:
        return con.execute(sql).fetchall()


def _copy(tmp_path: Path) -> Path:
    logs = tmp_path / "logs"
    shutil.copytree(CASE, logs, ignore=shutil.ignore_patterns("expected"))
    return logs


def _rewrite(path: Path, change: Any) -> None:
    records = [json.loads(line) for line in path.read_text().splitlines()]
    for number, record in enumerate(records, 1):
        change(record, number)
    path.write_text("".join(json.dumps(record) + "\n" for record in records))


def _before_2026_02(record: dict[str, Any], _: int = 0) -> None:
    for key in NEWER:
        del record[key]


@pytest.fixture(scope="module")
def today(tmp_path_factory: pytest.TempPathFactory) -> Path:
    lake = tmp_path_factory.mktemp("today") / "lake"
    assert extract_run(CASE, store_of(lake), ExtractOptions(workers=1)).failed == []
    return lake


def test_older_train_lines_land_as_samples_without_tokens(tmp_path: Path, today: Path) -> None:
    logs = _copy(tmp_path)
    for path in sorted(logs.glob("train_data_step*.jsonl")):
        _rewrite(path, _before_2026_02)
    summary = extract_run(logs, store_of(tmp_path / "lake"), ExtractOptions(workers=1))
    assert (summary.failed, summary.dump_format, summary.counts["new"]) == ([], "nemo-rl", 4)
    lake = tmp_path / "lake"
    assert rows(lake, SAMPLES_SQL) == rows(today, SAMPLES_SQL)
    assert len(rows(lake, SAMPLES_SQL)) == 48
    got = rows(
        lake,
        "SELECT count(*), count(response_length), count(total_length), count(prompt_length),"
        " count(prompt_token_ids), count(*) FILTER (WHERE has_train_row),"
        " max(step_train_files) FROM samples WHERE NOT evaluation",
    )
    assert got == [(48, 0, 0, 0, 0, 0, 0)]
    assert rows(lake, "SELECT count(*) FROM tokens") == [(0,)]
    assert rows(lake, "SELECT rollout_id, reward_mean FROM step_stats ORDER BY 1") == rows(
        today, "SELECT rollout_id, reward_mean FROM step_stats ORDER BY 1"
    )


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (
            lambda record, number: number == 3 and _before_2026_02(record),
            "lacks `token_ids` while line 1 has it; NeMo-RL logs every line of a step with the"
            " same keys",
        ),
        (
            lambda record, number: (
                _before_2026_02(record) or (number == 3 and record.update(input_lengths=["47"]))
            ),
            "`input_lengths` is '47' (a str); expected an integer",
        ),
        (
            lambda record, number: (
                _before_2026_02(record) or (number == 3 and record.update(prev_logprobs=[3]))
            ),
            "`prev_logprobs` is not a list",
        ),
    ],
    ids=["shapes-mixed", "length-not-int", "log-probs-not-a-list"],
)
def test_a_broken_older_line_fails_its_step_alone(
    tmp_path: Path, change: Any, problem: str
) -> None:
    logs = _copy(tmp_path)
    path = logs / "train_data_step1.jsonl"
    _rewrite(path, change)
    summary = extract_run(logs, store_of(tmp_path / "lake"), ExtractOptions(workers=1))
    assert summary.failed == [("1", f"`{path}` (line 3): {problem}. {AFTER}")]
    assert summary.counts["new"] == 3


def test_distillation_lines_land_as_samples_without_tokens_or_reward(tmp_path: Path) -> None:
    """NeMo-RL's on-policy distillation (`algorithms/distillation.py`) logs a train line as
    `content` and `input_lengths` only: the samples and their messages, reward NULL."""
    logs = _copy(tmp_path)
    keep = ("content", "input_lengths", "idx")
    for path in sorted(logs.glob("train_data_step*.jsonl")):
        _rewrite(path, lambda record, _: [record.pop(k) for k in list(record) if k not in keep])
    summary = extract_run(logs, store_of(tmp_path / "lake"), ExtractOptions(workers=1))
    assert (summary.failed, summary.counts["new"]) == ([], 4)
    got = rows(
        tmp_path / "lake",
        "SELECT count(*), count(reward), count(messages_json), count(prompt_text)"
        " FROM samples WHERE NOT evaluation",
    )
    assert got == [(48, 0, 48, 48)]
