"""prime-rl's token exports as its trainer wrote them before today's line shape.

The schema version stayed 1 while the line changed (prime-rl's
`src/prime_rl/trainer/rl/token_export.py`):

- 2026-06-11 (941019f2e) to 2026-08-08 (289562d2e): a line also has `export_step` (the folder's
  step: a multi-run trainer wrote each run's own step there, its `step` the trainer's) and
  `run_id`;
- until 2026-06-27 (0be5ac452): no weight streams, but `training_mode` (`rl`, `opd`, `sft`;
  prime-rl's mismatch statistics skip `sft` lines) and `rewards`, the sample's reward on every
  token (NaN, so `null`, without one).

The real exports (tests/fixtures/prime-rl-real/packed_2ranks) are rewritten line by line into
those shapes; what they hold in common lands exactly as today's lines do.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import store_of
from tests.fixture_paths import PRIME_RL_REAL
from tokenlake.generator import synth_frameworks
from tokenlake.orchestrate.extract import ExtractOptions, extract_run

CASE = "packed_2ranks"
AFTER = "Replace or remove the file, then extract again."
TOKENS_SQL = """
SELECT rollout_id, batch_position, position, token_id, loss_mask, train_log_prob,
       rollout_log_prob, lp_diff, advantage, entropy
FROM tokens ORDER BY rollout_id, batch_position, position
"""
REWARDS = {(1, 0): 0.25, (1, 1): 0.5, (2, 0): 1.0}  # (step, rank) -> its lines' reward; else none


def _copy(root: Path) -> Path:
    run = root / "run"
    shutil.copytree(PRIME_RL_REAL / CASE, run, ignore=shutil.ignore_patterns("expected"))
    return run


def _rank_files(run: Path) -> list[Path]:
    return sorted((run / "token_exports").glob("step_*/rank_*.jsonl"))


def _rewrite(path: Path, change: Any) -> None:
    """Every line of a rank file through `change(record, line number)`, keys in prime-rl's
    order as `change` leaves them, compact separators as prime-rl writes."""
    lines = path.read_text().splitlines()
    records = [json.loads(line) for line in lines]
    for number, record in enumerate(records, 1):
        change(record, number)
    path.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records))


def _june_2026(record: dict[str, Any], reward: float | None, mode: str = "rl") -> None:
    """A line as prime-rl 941019f2e .. 0be5ac452^ wrote it (2026-06-11 .. 2026-06-26)."""
    older = synth_frameworks.june_2026_line(record, reward, mode)
    record.clear()
    record.update(older)


def _to_june_2026(run: Path) -> None:
    for path in _rank_files(run):
        step, rank = int(path.parent.name.removeprefix("step_")), int(path.stem[5:])
        reward = REWARDS.get((step, rank))
        _rewrite(path, lambda record, _, reward=reward: _june_2026(record, reward))


def _extract(run: Path, lake: Path) -> Any:
    return extract_run(run, store_of(lake), ExtractOptions(workers=1))


def rows(lake: Path, sql: str) -> list[tuple]:
    import duckdb

    with duckdb.connect(str(lake / "tokenlake.duckdb"), read_only=True) as con:
        return con.execute(sql).fetchall()


@pytest.fixture(scope="module")
def today(tmp_path_factory: pytest.TempPathFactory) -> Path:
    lake = tmp_path_factory.mktemp("today") / "lake"
    assert _extract(PRIME_RL_REAL / CASE, lake).failed == []
    return lake


@pytest.fixture(scope="module")
def june(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("june")
    run = _copy(root)
    _to_june_2026(run)
    summary = _extract(run, root / "lake")
    assert (summary.failed, summary.dump_format, summary.counts["new"]) == ([], "prime-rl", 2)
    return root / "lake"


def test_june_2026_lines_land_as_todays_with_their_rewards(today: Path, june: Path) -> None:
    """Without weight streams every loss token of an `rl` line counts for drift, as today's
    all-`null` streams; the per-token `rewards` is the sample's reward (`null`: none)."""
    assert rows(june, TOKENS_SQL) == rows(today, TOKENS_SQL)
    assert rows(june, "SELECT rollout_id, tokens, k3_kl FROM drift_steps ORDER BY 1") == rows(
        today, "SELECT rollout_id, tokens, k3_kl FROM drift_steps ORDER BY 1"
    )
    got = rows(
        june,
        "SELECT rollout_id, dumped_rank, count(*), min(reward), max(reward), count(reward)"
        " FROM samples GROUP BY 1, 2 ORDER BY 1, 2",
    )
    assert got == [
        (1, 0, 4, 0.25, 0.25, 4),
        (1, 1, 4, 0.5, 0.5, 4),
        (2, 0, 4, 1.0, 1.0, 4),
        (2, 1, 4, None, None, 0),
    ]
    metadata = rows(
        june, "SELECT metadata_json FROM samples WHERE rollout_id = 2 AND batch_position = 0"
    )
    assert json.loads(metadata[0][0]) == {
        "rank": 0,
        "micro_step": 0,
        "micro_sequence_idx": 0,
        "export_sequence_idx": 0,
        "trainer_step": 2,
        "run_id": None,
    }


def test_an_sft_line_keeps_its_log_probs_out_of_the_drift(tmp_path: Path, today: Path) -> None:
    """prime-rl's mismatch statistics skip `training_mode` `sft` lines (their tokens are not
    this policy's samples): no engine log-prob, no lp_diff, the trainer's log-prob kept."""
    run = _copy(tmp_path)
    _to_june_2026(run)
    path = run / "token_exports" / "step_1" / "rank_1.jsonl"
    _rewrite(path, lambda record, n: n == 1 and record.update(training_mode="sft"))
    assert _extract(run, tmp_path / "lake").failed == []
    sql = (
        "SELECT count(*), count(train_log_prob), count(rollout_log_prob), count(lp_diff)"
        " FROM tokens WHERE rollout_id = 1 AND batch_position = 4 AND loss_mask = 1"
    )
    assert rows(tmp_path / "lake", sql) == [(10, 10, 0, 0)]
    steps = "SELECT tokens FROM drift_steps WHERE rollout_id = 1"
    assert rows(tmp_path / "lake", steps) == [(rows(today, steps)[0][0] - 10,)]


def test_a_multi_run_export_lands_as_its_runs_step(tmp_path: Path, today: Path) -> None:
    """A multi-run trainer (2026-06-11 .. 2026-08-08) wrote a run's step N into `step_N` while
    the line's `step` is the trainer's: the folder's step is the line's `export_step`."""
    run = _copy(tmp_path)
    for path in _rank_files(run):

        def multi_run(record: dict[str, Any], _: int) -> None:
            _june_2026(record, None)
            record.update(step=record["step"] + 6, run_id="run-a")

        _rewrite(path, multi_run)
    summary = _extract(run, tmp_path / "lake")
    assert (summary.failed, summary.counts["new"]) == ([], 2)
    assert rows(tmp_path / "lake", TOKENS_SQL) == rows(today, TOKENS_SQL)
    metadata = rows(
        tmp_path / "lake",
        "SELECT metadata_json FROM samples WHERE rollout_id = 2 AND batch_position = 0",
    )
    assert json.loads(metadata[0][0])["trainer_step"] == 8
    assert json.loads(metadata[0][0])["run_id"] == "run-a"


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda r: r.update(export_step=2), "`export_step` is 2, but the file is step 1's"),
        (
            lambda r: r.update(training_mode="ppo"),
            "`training_mode` is 'ppo'; prime-rl's are rl, opd, sft",
        ),
        (
            lambda r: r["rewards"].__setitem__(3, 0.75),
            "`rewards` differs between positions; prime-rl repeats the sample's reward on"
            " every token",
        ),
        (lambda r: r.update(run_id=3), "`run_id` is 3, not a string"),
        (lambda r: r.update(step="1"), "`step` is '1' (a str); expected an integer"),
        (lambda r: r.pop("training_mode"), "lacks `rl_weights`"),
    ],
    ids=[
        "export-step-not-the-folders",
        "unknown-mode",
        "rewards-differ",
        "run-id-not-text",
        "trainer-step-not-int",
        "no-streams-no-mode",
    ],
)
def test_a_broken_older_line_fails_its_step_alone(
    tmp_path: Path, change: Any, problem: str
) -> None:
    run = _copy(tmp_path)
    for path in _rank_files(run):
        _rewrite(path, lambda record, _: _june_2026(record, 0.5))
    path = run / "token_exports" / "step_1" / "rank_0.jsonl"
    _rewrite(path, lambda record, number: number == 2 and change(record))
    summary = _extract(run, tmp_path / "lake")
    assert summary.failed == [("1", f"`{path}` (line 2): {problem}. {AFTER}")]
    assert summary.counts["new"] == 1


# -- before `STABLE` (2026-05-21 .. 2026-06-10) ----------------------------------------------


def _may_2026(record: dict[str, Any], _: int = 0) -> None:
    """A line as prime-rl badd2b0fe .. 941019f2e^ wrote it: June's without `export_step` and
    `run_id`."""
    _june_2026(record, 0.5)
    del record["export_step"], record["run_id"]


def _to_may_2026(run: Path) -> None:
    for path in _rank_files(run):
        _rewrite(path, _may_2026)
    for marker in (run / "token_exports").glob("step_*/STABLE"):
        marker.unlink()


def test_may_2026_steps_without_stable_land_and_the_newest_when_settled(
    tmp_path: Path, today: Path
) -> None:
    """prime-rl wrote no `STABLE` until 2026-06-10: a step a later step shows finished (a file
    of each of its ranks there) is complete; the newest lands once its files no longer change,
    marked incomplete, since nothing tells whether the run ended there."""
    run = _copy(tmp_path)
    _to_may_2026(run)
    summary = extract_run(run, store_of(tmp_path / "lake"), ExtractOptions(settle_seconds=0.0))
    assert (summary.failed, summary.counts["new"], summary.ignored_files) == ([], 2, [])
    assert summary.warnings == [
        "Step 2 is incomplete: prime-rl wrote no `STABLE` before 2026-06-11 and no later step"
        " shows this newest one finished; its files no longer change, so it is extracted as it"
        " is and marked incomplete (`tokenlake audit`: incomplete_steps)"
    ]
    assert rows(tmp_path / "lake", TOKENS_SQL) == rows(today, TOKENS_SQL)


def test_the_newest_step_without_stable_waits_while_its_files_change(tmp_path: Path) -> None:
    run = _copy(tmp_path)
    _to_may_2026(run)
    summary = extract_run(run, store_of(tmp_path / "lake"), ExtractOptions(settle_seconds=3600))
    assert summary.counts["new"] == 1
    assert summary.failed == [
        (
            "2",
            "not yet complete: prime-rl wrote no `STABLE` before 2026-06-11 and no later step"
            " shows this newest one finished, and its files changed less than 3600 s ago;"
            " extract again once they are written",
        )
    ]


def test_a_step_without_stable_whose_later_step_lacks_a_rank_is_judged_by_settling(
    tmp_path: Path,
) -> None:
    """Step 1's rank 1 has no file in step 2: rank 1 may still be writing step 1."""
    run = _copy(tmp_path)
    _to_may_2026(run)
    (run / "token_exports" / "step_2" / "rank_1.jsonl").unlink()
    summary = extract_run(run, store_of(tmp_path / "lake"), ExtractOptions(settle_seconds=3600))
    assert [label for label, _ in summary.failed] == ["1", "2"]
    assert summary.counts["new"] == 0


def test_todays_lines_without_stable_are_still_not_yet(tmp_path: Path) -> None:
    """Only the writer before 2026-06-11 (a `training_mode`, no `export_step`) wrote no
    `STABLE`; June's lines without it are a step still being written."""
    run = _copy(tmp_path)
    _to_june_2026(run)
    (run / "token_exports" / "step_2" / "STABLE").unlink()
    summary = extract_run(run, store_of(tmp_path / "lake"), ExtractOptions(settle_seconds=0.0))
    assert summary.counts["new"] == 1
    folder = run / "token_exports" / "step_2"
    assert summary.ignored_files == [
        (folder, "not yet: it has no `STABLE`, prime-rl is still writing the step")
    ]
