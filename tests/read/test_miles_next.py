"""The lake against miles' own readers on dumps in the formats miles wrote after the spec's
snapshot, and one older one (docs/dump-format.md 9b; tests/fixtures/miles-next/README.md).

The five cases are extracted once, as five runs of one lake. Each view is compared with what
the reference reader of the case's own commit computed (`oracle/<case>/`), with the
corrections the fixtures' README states: the `weight_spans` reader predates `staleness` and
`alignment_failed` (its summaries have 28 columns) and zeroes masked positions (its corrected
`tokens.jsonl` has them NULL); the `legacy_pre_dashboard` reader shows no conversation, though
the `.pt` holds it (`messages_expected.json`).
"""

from __future__ import annotations

import json
from itertools import groupby
from pathlib import Path

import pytest

from tests.conftest import store_of
from tests.e2e.test_oracle import _mismatches, _read_parquet, _rows, _sample_token_problems
from tests.fixture_paths import NEXT_DUMPS, NEXT_ORACLE

pytestmark = pytest.mark.slow

CASES = ("weight_spans", "spec_rename", "sampling_support", "sparse_ranks", "legacy_pre_dashboard")


@pytest.fixture(scope="module")
def con(tmp_path_factory):
    import duckdb

    from tokenlake.orchestrate.extract import ExtractOptions, extract_run

    lake = tmp_path_factory.mktemp("miles_next_lake")
    for case in CASES:
        summary = extract_run(
            NEXT_DUMPS / case, store_of(lake), ExtractOptions(run_name=case, strict=True)
        )
        assert summary.failed == []
    connection = duckdb.connect(str(lake / "tokenlake.duckdb"), read_only=True)
    yield connection
    connection.close()


def _oracle(case: str) -> Path:
    return NEXT_ORACLE / case


def _steps(case: str) -> list[tuple[int, bool]]:
    ids = json.loads((_oracle(case) / "rollout_ids.json").read_text())
    return [(rid, False) for rid in ids["train"]] + [(rid, True) for rid in ids["eval"]]


def _stem(rid: int, evaluation: bool) -> str:
    return f"eval_{rid}" if evaluation else str(rid)


# The `weight_spans` reader predates these two columns; the README gives the correct values.
WEIGHT_SPANS_STALENESS = {
    (0, False): [0, -1, -2, 0, -1, None, 0, -1],
    (1, False): [-1, 1, 0, -1, 1, None, -1, 1],
    (0, True): [0, -1, -2, 0],
}


def _expected_summary(case: str, rid: int, evaluation: bool) -> list[dict]:
    expected = _read_parquet(_oracle(case) / f"summary_{_stem(rid, evaluation)}.parquet")
    rows = expected.to_dicts()
    if case != "weight_spans":
        assert expected.width == 30
        return rows
    assert expected.width == 28
    staleness = WEIGHT_SPANS_STALENESS[rid, evaluation]
    assert len(staleness) == len(rows)
    return [
        row | {"staleness": value, "alignment_failed": False}
        for row, value in zip(rows, staleness, strict=True)
    ]


@pytest.mark.parametrize("case", CASES)
def test_sample_stats_match_the_reference_of_the_cases_commit(con, case):
    problems = []
    for rid, evaluation in _steps(case):
        expected = _expected_summary(case, rid, evaluation)
        got = _rows(
            con,
            "SELECT * FROM sample_stats WHERE run = ? AND rollout_id = ? AND evaluation = ? "
            "ORDER BY batch_position",
            [case, rid, evaluation],
        )
        assert [r["batch_position"] for r in got] == list(range(len(expected)))
        problems += _mismatches(f"summary_{_stem(rid, evaluation)}", expected, got)
    assert problems == []


@pytest.mark.parametrize("case", CASES)
def test_group_stats_match_the_reference_groups(con, case):
    problems = []
    for rid, evaluation in _steps(case):
        expected = _read_parquet(_oracle(case) / f"groups_{_stem(rid, evaluation)}.parquet")
        got = _rows(
            con,
            "SELECT * FROM group_stats WHERE run = ? AND rollout_id = ? AND evaluation = ? "
            "ORDER BY group_index NULLS FIRST",
            [case, rid, evaluation],
        )
        problems += _mismatches(f"groups_{_stem(rid, evaluation)}", expected.to_dicts(), got)
    assert problems == []


@pytest.mark.parametrize("case", CASES)
def test_step_stats_match_the_reference_step_aggregates(con, case):
    expected = _read_parquet(_oracle(case) / "step_aggregates.parquet").sort("rollout_id")
    got = _rows(con, "SELECT * FROM step_stats WHERE run = ? ORDER BY rollout_id", [case])
    assert len(got) == expected.height > 0
    assert _mismatches("step_aggregates", expected.to_dicts(), got) == []


TOKEN_COLUMNS = [
    "token_id",
    "loss_mask",
    "rollout_log_prob",
    "train_log_prob",
    "ref_log_prob",
    "lp_diff",
    "entropy",
    "ref_entropy",
    "advantage",
    "returns",
]


STAT_ARRAYS = ("rollout_log_probs", "train_log_probs", "ref_log_probs", "lp_diff", "imp_ratio")
STAT_ARRAYS += ("entropy", "ref_entropy", "advantages", "returns")


def _oracle_tokens(case: str) -> dict[tuple[int, bool, int], dict]:
    """tokens.jsonl keyed by (rollout_id, evaluation, batch position), corrected where the
    README says: an eval sample without a train side whose rollout dump has a loss mask gets
    that mask, and NULL where it is 0 (every reader shows none and the 0.0 placeholders)."""
    lines = [json.loads(line) for line in (_oracle(case) / "tokens.jsonl").open()]
    truth = json.loads((_oracle(case) / "truth.json").read_text()).get("samples", {})
    keyed = {}
    for (rid, evaluation), group in groupby(
        lines, key=lambda d: (d["rollout_id"], d["evaluation"])
    ):
        for bp, line in enumerate(group):
            mask = truth[str(rid)][bp].get("loss_mask") if evaluation and truth else None
            if mask is not None:  # the eval rollout holds step `rid`'s first samples
                assert line["loss_mask"] is None and truth[str(rid)][bp]["index"] == bp
                line = (
                    line
                    | {"loss_mask": mask}
                    | {
                        name: None if line[name] is None else _masked(line[name], mask)
                        for name in STAT_ARRAYS
                    }
                )
            keyed[(rid, evaluation, bp)] = line
    return keyed


def _masked(values: list, mask: list[int]) -> list:
    return [v if m else None for v, m in zip(values, mask, strict=True)]


def _view_tokens(con, case: str) -> dict[tuple[int, bool, int], dict[str, list]]:
    rows = _rows(
        con,
        f"SELECT rollout_id, evaluation, batch_position, sample_index, {', '.join(TOKEN_COLUMNS)} "
        "FROM tokens WHERE run = ? ORDER BY rollout_id, evaluation, batch_position, position",
        [case],
    )
    keyed = {}
    for key, group in groupby(
        rows, key=lambda r: (r["rollout_id"], r["evaluation"], r["batch_position"])
    ):
        group = list(group)
        keyed[key] = {c: [r[c] for r in group] for c in ["sample_index", *TOKEN_COLUMNS]}
    return keyed


@pytest.mark.parametrize("case", CASES)
def test_tokens_match_the_reference_token_view(con, case):
    expected = _oracle_tokens(case)
    got = _view_tokens(con, case)
    assert len(expected) >= 16
    assert sorted(got) == sorted(expected)
    problems = []
    for key, line in expected.items():
        problems += _sample_token_problems(f"{case} {key}", line, got[key])
    assert problems == []


def test_legacy_conversations_come_from_the_pt(con):
    """Before the sidecar existed the conversation stayed in `metadata["messages"]`."""
    expected = json.loads((_oracle("legacy_pre_dashboard") / "messages_expected.json").read_text())
    assert len(expected) == 9
    got = _rows(
        con,
        "SELECT rollout_id, evaluation, batch_position, sample_index, messages_json FROM samples"
        " WHERE run = 'legacy_pre_dashboard' AND messages_json IS NOT NULL"
        " ORDER BY rollout_id, evaluation, batch_position",
        [],
    )
    order = ("rollout_id", "evaluation", "batch_position")
    assert [
        {k: row[k] for k in (*order, "sample_index")}
        | {"messages": json.loads(row["messages_json"])}
        for row in got
    ] == sorted(expected, key=lambda e: tuple(e[k] for k in order))


def test_spec_accept_rate_reads_the_renamed_counters(con):
    got = con.execute(
        "SELECT rollout_id, list(round(spec_accept_rate, 6) ORDER BY batch_position)"
        " FROM samples WHERE run = 'spec_rename' GROUP BY ALL ORDER BY ALL"
    ).fetchall()
    assert got == [
        (0, [0.375, 0.333333, None, 0.5, 0.333333, 0.0, 0.25, 0.333333]),
        (1, [0.375, None, 0.375, 0.333333, 0.5, 0.0, 0.5, 0.375]),
    ]


def test_sparse_ranks_are_read_without_rank_zero(con):
    got = con.execute(
        "SELECT rollout_id, list(DISTINCT dumped_rank ORDER BY dumped_rank), min(step_train_files),"
        " bool_and(has_train_row) FROM samples WHERE run = 'sparse_ranks' GROUP BY ALL ORDER BY ALL"
    ).fetchall()
    assert got == [(0, [8, 12], 2, True), (1, [8, 12], 2, True)]
