"""The lake against the miles reference reader, on the four real dumps.

All four cases are extracted once, as four runs of one lake, and every view is compared with
what `DumpReader` computed (`tests/fixtures/miles-real/oracle/<case>/`):
`sample_stats` ↔ `summary_*.parquet`, `group_stats` ↔ `groups_*.parquet`, `step_stats` ↔
`step_aggregates.parquet`, and the `tokens` view ↔ `tokens.jsonl`.
"""

from __future__ import annotations

import json
import math
from itertools import groupby
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import store_of
from tests.fixture_paths import MILES_REAL

pytestmark = pytest.mark.slow

FIXTURES = MILES_REAL
CASES = ("basic", "cp2", "pp2", "removed")
REL_TOL = 1e-5
# Statistics the reference reduced in float32 can miss a value near 0 by a float32 rounding.
ABS_TOL = 1e-7

# tokens.jsonl array -> `tokens` column; `imp_ratio` is checked against exp(lp_diff).
TOKEN_ARRAYS = {
    "rollout_log_probs": "rollout_log_prob",
    "train_log_probs": "train_log_prob",
    "ref_log_probs": "ref_log_prob",
    "lp_diff": "lp_diff",
    "entropy": "entropy",
    "ref_entropy": "ref_entropy",
    "advantages": "advantage",
    "returns": "returns",
}
TOKEN_COLUMNS = ["token_id", "loss_mask", *TOKEN_ARRAYS.values()]


@pytest.fixture(scope="module")
def con(tmp_path_factory):
    import duckdb

    from tokenlake.orchestrate.extract import ExtractOptions, extract_run

    lake = tmp_path_factory.mktemp("oracle_lake")
    for case in CASES:
        extract_run(
            FIXTURES / "dumps" / case, store_of(lake), ExtractOptions(run_name=case, strict=True)
        )
    connection = duckdb.connect(str(lake / "tokenlake.duckdb"), read_only=True)
    yield connection
    connection.close()


def _oracle(case: str) -> Path:
    return FIXTURES / "oracle" / case


def _steps(case: str) -> list[tuple[int, bool]]:
    ids = json.loads((_oracle(case) / "rollout_ids.json").read_text())
    return [(rid, False) for rid in ids["train"]] + [(rid, True) for rid in ids["eval"]]


def _stem(rid: int, evaluation: bool) -> str:
    return f"eval_{rid}" if evaluation else str(rid)


def _same(expected, got, column: str) -> bool:
    """Oracle value vs view value: NULL exactly, floats within tolerance, NaN matches NaN."""
    if isinstance(expected, float) and math.isnan(expected):
        # adv_std of a single covered token: NaN in the reference, NULL in the view.
        return (got is None and column == "adv_std") or (got is not None and math.isnan(got))
    if expected is None or got is None or isinstance(expected, (bool, str)):
        return expected == got and type(expected) is type(got)
    if isinstance(expected, float) or isinstance(got, float):
        return math.isclose(expected, got, rel_tol=REL_TOL, abs_tol=ABS_TOL)
    return expected == got


def _rows(con, sql: str, params: list) -> list[dict]:
    result = con.execute(sql, params)
    names = [d[0] for d in result.description]
    return [dict(zip(names, row, strict=True)) for row in result.fetchall()]


def _read_parquet(path: Path):
    import polars

    return polars.read_parquet(path)


def _mismatches(label: str, expected: list[dict], got: list[dict]) -> list[str]:
    if len(expected) != len(got):
        return [f"{label}: {len(expected)} oracle rows, {len(got)} view rows"]
    problems = []
    for i, (want, have) in enumerate(zip(expected, got, strict=True)):
        for column, value in want.items():
            if column not in have:
                problems.append(f"{label} row {i}: view has no column `{column}`")
            elif not _same(value, have[column], column):
                problems.append(
                    f"{label} row {i} `{column}`: oracle {value!r}, view {have[column]!r}"
                )
    return problems


@pytest.mark.parametrize("case", CASES)
def test_sample_stats_match_reference_summary(con, case):
    problems = []
    for rid, evaluation in _steps(case):
        expected = _read_parquet(_oracle(case) / f"summary_{_stem(rid, evaluation)}.parquet")
        assert expected.width == 30
        got = _rows(
            con,
            "SELECT * FROM sample_stats WHERE run = ? AND rollout_id = ? AND evaluation = ? "
            "ORDER BY batch_position",
            [case, rid, evaluation],
        )
        assert [r["batch_position"] for r in got] == list(range(expected.height))
        problems += _mismatches(f"summary_{_stem(rid, evaluation)}", expected.to_dicts(), got)
    assert problems == []


@pytest.mark.parametrize("case", CASES)
def test_group_stats_match_reference_groups(con, case):
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
def test_step_stats_match_reference_step_aggregates(con, case):
    expected = _read_parquet(_oracle(case) / "step_aggregates.parquet").sort("rollout_id")
    got = _rows(con, "SELECT * FROM step_stats WHERE run = ? ORDER BY rollout_id", [case])
    assert _mismatches("step_aggregates", expected.to_dicts(), got) == []


def _oracle_tokens(case: str) -> dict[tuple[int, bool, int], dict]:
    """tokens.jsonl keyed by (rollout_id, evaluation, batch_position = order in its dump)."""
    lines = [json.loads(line) for line in (_oracle(case) / "tokens.jsonl").open()]
    keyed = {}
    for (rid, evaluation), group in groupby(
        lines, key=lambda d: (d["rollout_id"], d["evaluation"])
    ):
        for bp, line in enumerate(group):
            keyed[(rid, evaluation, bp)] = line
    return keyed


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


def _array_problems(
    label: str, expected: list | None, got: list, float32: bool = True, ulps: int = 0
) -> list[str]:
    """Where `got` differs from the oracle's array: exactly (as float32 when `float32`), or within
    `ulps` float32 units in the last place."""
    if expected is None:
        expected = [None] * len(got)
    if len(expected) != len(got):
        return [f"{label}: oracle length {len(expected)}, view length {len(got)}"]
    problems = []
    for i, (want, have) in enumerate(zip(expected, got, strict=True)):
        if want is None or have is None:
            ok = want is None and have is None
        elif float32:
            ok = _ulp_distance(np.float32(want), np.float32(have)) <= ulps
        else:
            ok = want == have
        if not ok:
            problems.append(f"{label}[{i}]: oracle {want!r}, view {have!r}")
    return problems


def _ulp_distance(a: np.float32, b: np.float32) -> int:
    """How many float32 values lie between `a` and `b` (0 when equal; NaN only equals NaN)."""
    if np.isnan(a) or np.isnan(b):
        return 0 if np.isnan(a) and np.isnan(b) else 1 << 31
    ia, ib = (int(np.array(x, dtype=np.float32).view(np.int32)) for x in (a, b))
    ia, ib = (x if x >= 0 else -(x & 0x7FFFFFFF) for x in (ia, ib))
    return abs(ia - ib)


def _exp32(lp_diff: list) -> list:
    """exp in float32, computed here by torch. float32 `exp` is not correctly rounded: its last
    bit differs between libraries and between CPUs (the reference's torch on one CPU, this
    torch on another), so `imp_ratio` is compared to 1 ulp; stored values are compared exactly."""
    import torch

    values = torch.tensor([math.nan if d is None else d for d in lp_diff], dtype=torch.float32)
    return [
        None if d is None else v for d, v in zip(lp_diff, torch.exp(values).tolist(), strict=True)
    ]


def _sample_token_problems(label: str, line: dict, got: dict[str, list]) -> list[str]:
    response_ids = line["token_ids"][line["prompt_len"] :]
    problems = _array_problems(f"{label} token_id", response_ids, got["token_id"], False)
    problems += _array_problems(f"{label} loss_mask", line["loss_mask"], got["loss_mask"], False)
    for array, column in TOKEN_ARRAYS.items():
        problems += _array_problems(f"{label} {column}", line[array], got[column])
    problems += _array_problems(
        f"{label} exp(lp_diff)", line["imp_ratio"], _exp32(got["lp_diff"]), ulps=1
    )
    if set(got["sample_index"]) != {line["sample_index"]}:
        problems.append(f"{label}: sample_index {line['sample_index']} vs {got['sample_index']}")
    return problems


@pytest.mark.parametrize("case", CASES)
def test_tokens_match_reference_token_view(con, case):
    expected = _oracle_tokens(case)
    got = _view_tokens(con, case)
    # Samples with R = 0 have no token rows; the oracle then has empty response arrays.
    empty = {k for k, line in expected.items() if line["total_len"] == line["prompt_len"]}
    assert sorted(got) == sorted(set(expected) - empty)
    problems = []
    for key, line in expected.items():
        if key not in empty:
            problems += _sample_token_problems(f"{case} {key}", line, got[key])
    assert problems == []
