"""A weight version per token (dump-format.md 2.3, 9b: `weight_versions` spans and lists).

On the real `weight_spans` dump (#1891/#1892) every response token gets its span's version,
as the writer's own record says (`truth.json: response_token_version`); on the real
`legacy_pre_dashboard` dump (lists of strings) only where the calls can be placed. Malformed
spans are one line naming file, step, sample and field; spans that do not fit the tokens give
no versions (NULL), never a guess. `drift_by_weight_version` groups drift by them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import store_of
from tests.e2e.test_bad_input import REPLACE, age, extract
from tests.fixture_paths import NEXT_DUMPS, NEXT_ORACLE
from tokenlake.errors import SampleValueError
from tokenlake.read import weight_versions
from tokenlake.steptypes import Span, WeightVersions


@pytest.fixture(scope="module")
def con(tmp_path_factory):
    import duckdb

    from tokenlake.orchestrate.extract import ExtractOptions, extract_run

    lake = tmp_path_factory.mktemp("spans_lake")
    for case in ("weight_spans", "legacy_pre_dashboard"):
        assert (
            extract_run(
                NEXT_DUMPS / case, store_of(lake), ExtractOptions(run_name=case, strict=True)
            ).failed
            == []
        )
    connection = duckdb.connect(str(lake / "tokenlake.duckdb"), read_only=True)
    yield connection
    connection.close()


def _per_sample(con, run: str, sql_columns: str, evaluation: bool = False) -> dict:
    rows = con.execute(
        f"SELECT rollout_id, batch_position, {sql_columns} FROM tokens"
        " WHERE run = ? AND evaluation = ? GROUP BY ALL ORDER BY ALL",
        [run, evaluation],
    ).fetchall()
    return {(rid, bp): rest[0] if len(rest) == 1 else rest for rid, bp, *rest in rows}


@pytest.mark.slow
def test_span_versions_per_token_are_the_writers_own(con):
    truth = json.loads((NEXT_ORACLE / "weight_spans" / "truth.json").read_text())["samples"]
    expected = {
        (int(rid), bp): sample["response_token_version"]
        for rid, samples in truth.items()
        for bp, sample in enumerate(samples)
    }
    assert len(expected) == 16
    got = _per_sample(con, "weight_spans", "list(token_version ORDER BY position)")
    assert got == expected
    # The eval rollout holds step 0's first four samples, spans included.
    got_eval = _per_sample(con, "weight_spans", "list(token_version ORDER BY position)", True)
    assert got_eval == {key: value for key, value in expected.items() if key[0] == 0 and key[1] < 4}


@pytest.mark.slow
def test_token_staleness_is_the_step_minus_the_tokens_version(con):
    got = _per_sample(con, "weight_spans", "list(token_staleness ORDER BY position)")
    assert got[0, 0] == [0, 0, -1, -1, -1, -2, -2, -2]  # weights updated twice mid-call
    assert got[0, 2] == [-2, -2, None, None, -3, -3, -3]  # the tool observation has none
    assert got[0, 5] == [None] * 6  # one unstamped call
    assert got[1, 1] == [1, 1, 1, 0, 0, 0, 0]
    mismatched = con.execute(
        "SELECT count(*) FROM tokens WHERE run = 'weight_spans'"
        " AND token_staleness IS DISTINCT FROM rollout_id - token_version::BIGINT"
    ).fetchone()
    assert mismatched == (0,)


@pytest.mark.slow
def test_legacy_lists_give_a_version_only_where_calls_can_be_placed(con):
    got = _per_sample(con, "legacy_pre_dashboard", "list(token_version ORDER BY position)")
    assert got[0, 1] == ["1"] * 5  # one call: the whole response
    assert got[1, 2] == ["1"] * 8
    # Index 0 (agentic: two versions, no loss mask to place the calls on): unknown.
    assert got[0, 0] == [None] * 8
    samples = con.execute(
        "SELECT weight_versions FROM samples WHERE run = 'legacy_pre_dashboard'"
        " AND rollout_id = 0 AND NOT evaluation AND batch_position = 0"
    ).fetchone()
    assert samples == (["0", "1"],)


@pytest.mark.slow
def test_drift_by_weight_version_groups_tokens_by_their_version(con):
    rows = con.execute(
        "SELECT rollout_id, token_version, token_staleness, tokens, samples,"
        " round(mean_abs_lp_diff, 6), round(k3_share, 6) FROM drift_by_weight_version"
        " WHERE run = 'weight_spans' ORDER BY rollout_id, token_version NULLS LAST"
    ).fetchall()
    assert rows == [
        (0, "0", 0, 7, 3, 0.293032, 0.166969),
        (0, "1", -1, 20, 5, 0.304844, 0.447707),
        (0, "2", -2, 8, 3, 0.351156, 0.202877),
        (0, "3", -3, 3, 1, 0.278158, 0.0422),
        (0, None, None, 9, 2, 0.29904, 0.140247),
        (1, "0", 1, 6, 3, 0.318343, 0.098185),
        (1, "1", 0, 13, 4, 0.286948, 0.139241),
        (1, "2", -1, 13, 4, 0.429361, 0.353962),
        (1, "3", -2, 2, 1, 0.472745, 0.036189),
        (1, "4", -3, 2, 1, 0.804697, 0.144873),
        (1, None, None, 6, 2, 0.513186, 0.22755),
    ]
    total = con.execute(
        "SELECT rollout_id, count(*) FROM drift_tokens WHERE run = 'weight_spans' GROUP BY ALL"
        " ORDER BY ALL"
    ).fetchall()
    assert total == [(0, 47), (1, 42)]  # every drift token in exactly one group


def _codes(result: weight_versions.TokenVersions | None) -> list[str | None] | None:
    if result is None:
        return None
    return [None if c < 0 else result.names[c] for c in result.codes]


def test_legacy_calls_are_placed_on_the_loss_covered_runs():
    mask = np.array([1, 1, 0, 0, 1])
    assert _codes(weight_versions.legacy_calls(("3", "4"), 5, mask)) == [
        "3", "3", None, None, "4",
    ]  # fmt: skip
    assert _codes(weight_versions.legacy_calls(("3",), 5, mask)) is None  # 2 runs, 1 version
    assert _codes(weight_versions.legacy_calls(("3", "4"), 5, None)) is None
    assert _codes(weight_versions.legacy_calls(("7",), 3, None)) == ["7", "7", "7"]
    assert _codes(weight_versions.legacy_calls(("7",), 3, np.array([1, 1]))) is None


def test_spans_beyond_the_tokens_place_no_version():
    """Media expansion shifts the engine's positions; such spans do not fit `Sample.tokens`."""
    spans = weight_versions.parse([[{"version": "2", "abs_start": 3, "abs_end": 9}]])
    assert spans == WeightVersions(("2",), 1, (Span("2", 3, 9),))
    assert weight_versions.per_token(spans, 8, 4, None) is None
    assert _codes(weight_versions.per_token(spans, 10, 6, None)) == ["2"] * 5 + [None]


def _span(version: Any = "1", start: Any = 0, end: Any = 2) -> dict[str, Any]:
    return {"version": version, "abs_start": start, "abs_end": end}


BAD_SPANS = [
    ([[_span()], "2"], "entry 1 is '2', not a list of spans like entry 0"),
    ([[_span(), {"version": "1"}]], "entry 0 span 1 lacks `abs_start`, `abs_end`"),
    ([[_span(), ["1", 0, 2]]], "entry 0 span 1 is a list of 3 entries, not a dict of version, abs_start, abs_end"),
    ([[_span(start=-1)]], "entry 0 span 0 `abs_start` is -1, not a position (an integer from 0)"),
    ([[_span(end=2.0)]], "entry 0 span 0 `abs_end` is 2.0, not a position (an integer from 0)"),
    ([[_span(version=None)]], "entry 0 span 0 `version` is None, not a string"),
    ([[_span(start=2, end=2)]], "entry 0 span 0 covers [2, 2); spans must be non-empty, increasing and not overlap (the previous one ends at 0)"),
    ([[_span(end=4)], [_span(start=3, end=5)]], "entry 1 span 0 covers [3, 5); spans must be non-empty, increasing and not overlap (the previous one ends at 4)"),
    ([[_span(version=str(10**20))]], f"entry 0 span 0 `version` is '{10**20}', a number outside the int64 range"),
]  # fmt: skip


@pytest.mark.parametrize(("value", "problem"), BAD_SPANS)
def test_malformed_spans_are_named(value, problem):
    with pytest.raises(SampleValueError) as caught:
        weight_versions.parse(value)
    assert str(caught.value) == f"`weight_versions` {problem}"


@pytest.mark.slow
def test_a_malformed_span_skips_its_step_with_one_line(tmp_path: Path):
    import torch

    dump = tmp_path / "spans"
    shutil.copytree(NEXT_DUMPS / "weight_spans", dump)
    path = dump / "rollout_data" / "1.pt"
    data = torch.load(path, weights_only=True)
    data["samples"][3]["weight_versions"] = [[_span(start=5, end=3)]]
    torch.save(data, path)
    for file in dump.rglob("*"):
        age(file)
    code, _, err = extract(dump, tmp_path / "lake")
    problem = BAD_SPANS[6][1].replace("[2, 2)", "[5, 3)")
    assert code == 1
    assert err == [
        f"Skipped step 1: `{path.resolve()}` (batch position 3, sample_index 11):"
        f" `weight_versions` {problem}. {REPLACE}"
    ]


@pytest.mark.slow
def test_a_version_too_long_to_repeat_on_every_token_skips_its_step_with_one_line(tmp_path: Path):
    import torch

    dump = tmp_path / "spans"
    shutil.copytree(NEXT_DUMPS / "weight_spans", dump)
    path = dump / "rollout_data" / "1.pt"
    data = torch.load(path, weights_only=True)
    sample = data["samples"][3]
    for call in sample["weight_versions"]:
        for span in call:
            span["version"] = "v" * (1 << 20)  # one string, taken by every token of its span
    torch.save(data, path)
    for file in dump.rglob("*"):
        age(file)
    code, _, err = extract(dump, tmp_path / "lake")
    covered = sum(
        min(span["abs_end"], len(sample["tokens"]))
        - max(span["abs_start"], len(sample["tokens"]) - sample["response_length"])
        for call in sample["weight_versions"]
        for span in call
    )
    assert code == 1
    assert err == [
        f"Skipped step 1: `{path.resolve()}` (batch position 3, sample_index 11):"
        f" `weight_versions` would repeat {covered << 20:,} bytes of version strings on its"
        f" {sample['response_length']:,} response tokens; `token_version` holds at most 256"
        f" bytes a token. {REPLACE}"
    ]
