"""`tokenlake.serve.query`: running SQL against a lake and rendering the result."""

from __future__ import annotations

import io
import json
import math
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import store_of
from tests.lakes import build_lake
from tokenlake.errors import LakeError, UsageError
from tokenlake.serve.query import (
    Rows,
    connect_reader,
    format_table,
    plain_result,
    render_query,
    run_query,
)


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    path = tmp_path_factory.mktemp("query_lake")
    rows = [
        {
            "run": "r",
            "rollout_id": 0,
            "batch_position": 0,
            "position": pos,
            "token_id": 5 + pos,
            "loss_mask": 1,
            "train_log_prob": -0.5,
            "rollout_log_prob": -0.75,
            "lp_diff": 0.25,
        }
        for pos in range(3)
    ]
    build_lake(path, tokens=rows)
    return path


RESULT = pa.table(
    {
        "run": ["r", "longer"],
        "step": pa.array([0, 12], pa.int64()),
        "k3": [0.0012345678, math.nan],
        "ok": [True, None],
        "ids": [[1, 2], None],
    }
)


def test_run_query_returns_arrow(lake):
    table = run_query(store_of(lake), "SELECT token_id, lp_diff FROM tokens ORDER BY position")
    assert table.to_pylist() == [
        {"token_id": 5, "lp_diff": 0.25},
        {"token_id": 6, "lp_diff": 0.25},
        {"token_id": 7, "lp_diff": 0.25},
    ]


def test_run_query_reads_the_drift_views(lake):
    table = run_query(
        store_of(lake), "SELECT tokens, mean_abs_lp_diff_tm, max_abs_lp_diff FROM drift_steps"
    )
    assert table.to_pylist() == [
        {"tokens": 3, "mean_abs_lp_diff_tm": 0.25, "max_abs_lp_diff": 0.25}
    ]


def test_run_query_error_names_duckdb_problem(lake):
    with pytest.raises(UsageError) as info:
        run_query(store_of(lake), "SELECT nope FROM tokens")
    assert str(info.value).startswith(
        'Query failed: Binder Error: Referenced column "nope" not found'
    )


def test_run_query_is_read_only(lake):
    with pytest.raises(UsageError, match="read-only mode"):
        run_query(store_of(lake), "CREATE VIEW x AS SELECT 1")


def test_run_query_without_catalog(tmp_path):
    with pytest.raises(LakeError) as info:
        run_query(store_of(tmp_path), "SELECT 1")
    assert str(info.value) == (
        f"Lake `{tmp_path}`: has no `tokenlake.duckdb`; run `tokenlake extract` first"
    )


def test_unknown_setting(lake):
    with pytest.raises(UsageError) as info:
        run_query(store_of(lake), "SELECT 1", settings={"is_capp": 3.0})
    assert str(info.value).startswith(
        "Unknown drift setting `is_capp`; the settings are `is_cap`, `veto_min_ratio`,"
    )


@pytest.mark.parametrize(
    ("value", "shown"),
    [(float("nan"), "nan"), ("x", "'x'"), (None, "None"), (True, "True"), (10**400, None)],
    ids=["nan", "text", "none", "bool", "beyond-float64"],
)
def test_a_setting_that_is_not_a_finite_number_is_one_usage_error(lake, value, shown):
    # NaN made a Binder Error about a column `nan`; "x", None and 10**400 a ValueError,
    # TypeError or OverflowError from float(); True was read as 1.0.
    with pytest.raises(UsageError) as info:
        run_query(store_of(lake), "SELECT 1", settings={"is_cap": value})
    shown = shown or f"{str(10**400)[:60]}…"
    assert str(info.value) == f"Drift setting `is_cap` is {shown}; give a finite number."


@pytest.mark.parametrize(
    ("name", "value", "problem"),
    [
        ("is_cap", 0.5, "0.5; the weight cap is at least 1 (weights clamp to [1/C, C])"),
        ("is_cap", 0, "0; the weight cap is at least 1 (weights clamp to [1/C, C])"),
        ("histogram_half_width", 0.0, "0.0; give a number above 0 (nats)"),
        ("histogram_half_width", -0.1, "-0.1; give a number above 0 (nats)"),
        ("log_ratio_clamp", -1, "-1; a clamp is at least 0"),
        ("k3_clamp", -1.0, "-1.0; a clamp is at least 0"),
        ("outliers_per_step", 2.5, "2.5; give a whole number from 0"),
        ("outliers_per_step", -5, "-5; give a whole number from 0"),
        ("shift_min_tokens", 1e30, "1e+30; give a whole number from 0"),
    ],
)
def test_a_setting_outside_its_meaning_is_one_usage_error(lake, name, value, problem):
    # Each gave numbers with exit 0: is_cap=0 an `ess` of NaN, 0.5 every token both above
    # the cap and below its inverse; a width of -0.1 bins whose low edge is above the high;
    # a negative clamp a k3 of e - 2 for every step; outliers_per_step=2.5 kept 3 rows; 1e30
    # a Conversion Error from DuckDB.
    with pytest.raises(UsageError) as info:
        run_query(store_of(lake), "SELECT 1", settings={name: value})
    assert str(info.value) == f"Drift setting `{name}` is {problem}."


def test_a_setting_at_the_edge_of_its_meaning_is_taken(lake):
    settings = {"is_cap": 1, "outliers_per_step": 0.0, "k3_clamp": 0, "shift_min_tokens": 7}
    table = run_query(
        store_of(lake),
        "SELECT is_cap, outliers_per_step, k3_clamp, shift_min_tokens FROM drift_settings",
        settings=settings,
    )
    assert table.to_pylist() == [
        {"is_cap": 1.0, "outliers_per_step": 0, "k3_clamp": 0.0, "shift_min_tokens": 7}
    ]


def test_format_table_text():
    assert format_table(RESULT, "table") == "\n".join(
        [
            "run     step          k3  ok    ids",
            "------  ----  ----------  ----  ------",
            "r          0  0.00123457  true  [1, 2]",
            "longer    12         nan  NULL  NULL",
            "(2 rows)",
        ]
    )
    assert format_table(RESULT.slice(0, 0), "table").splitlines()[-1] == "(0 rows)"


def test_format_table_csv():
    assert format_table(RESULT, "csv") == (
        '"run","step","k3","ok","ids"\n"r",0,0.0012345678,true,"[1, 2]"\n"longer",12,nan,,\n'
    )


def test_format_table_json_lines():
    text = format_table(RESULT, "json")
    assert text == (
        '{"run": "r", "step": 0, "k3": 0.0012345678, "ok": true, "ids": [1, 2]}\n'
        '{"run": "longer", "step": 12, "k3": null, "ok": null, "ids": null}\n'
    )
    assert [json.loads(line)["step"] for line in text.splitlines()] == [0, 12]


def test_format_table_parquet_round_trips():
    data = format_table(RESULT, "parquet")
    assert isinstance(data, bytes)
    back = pq.read_table(io.BytesIO(data))
    assert back.schema.names == RESULT.schema.names
    assert back.drop_columns(["k3"]).to_pylist() == RESULT.drop_columns(["k3"]).to_pylist()
    assert back.column("k3")[0].as_py() == 0.0012345678 and math.isnan(back.column("k3")[1].as_py())


def test_format_table_unknown_format():
    with pytest.raises(UsageError) as info:
        format_table(RESULT, "xml")
    assert str(info.value) == "Unknown format `xml`; choose one of table, csv, json, parquet"


# Every type the plain rows take (and NaN, NULL, a list), then types that need Arrow's values:
# HUGEINT (an int in DuckDB's rows, a Decimal in Arrow's) and a time zone.
PLAIN_SQL = (
    "SELECT token_id, lp_diff, 'x' || position AS label, position = 1 AS first, [position] AS ids,"
    " 1.5::DECIMAL(10, 2) AS price, 'nan'::DOUBLE AS nan, NULL::INTEGER AS nothing,"
    " DATE '2026-12-06' AS day FROM tokens ORDER BY position"
)
ARROW_SQL = "SELECT sum(token_id) AS total, TIMESTAMPTZ '2026-12-06 05:00:00+00' AS at FROM tokens"


@pytest.mark.parametrize("fmt", ["table", "json"])
@pytest.mark.parametrize("sql", [PLAIN_SQL, ARROW_SQL], ids=["plain", "arrow"])
def test_rendered_without_arrow_as_with_it(lake, sql, fmt):
    """`tokenlake query` renders DuckDB's rows of plain types, and Arrow's of the others:
    the same text as rendering the Arrow table."""
    store = store_of(lake)
    assert render_query(store, sql, fmt) == format_table(run_query(store, sql), fmt)


def test_plain_types_come_as_rows_the_others_as_arrow(lake):
    con = connect_reader(store_of(lake))
    try:
        plain = plain_result(con.sql(PLAIN_SQL))
        arrow = plain_result(con.sql(ARROW_SQL))
    finally:
        con.close()
    assert isinstance(plain, Rows) and isinstance(arrow, pa.Table)
    assert plain.numeric == [True, True, False, False, False, True, True, True, False]
    assert repr(plain.to_pylist()) == repr(
        run_query(store_of(lake), PLAIN_SQL).to_pylist()
    )  # NaN too
    assert format_table(plain.slice(1, 1), "table").splitlines() == [
        "token_id  lp_diff  label  first  ids  price  nan  nothing  day",
        "--------  -------  -----  -----  ---  -----  ---  -------  ----------",
        "       6     0.25  x1     true   [1]   1.50  nan     NULL  2026-12-06",
        "(1 row)",
    ]


@pytest.mark.parametrize(
    ("argv", "exit_code"),
    [
        (["query", "{lake}", "SELECT count(*) FROM step_stats"], 0),
        (["audit", "{lake}"], 1),  # its lp_diff of 0.25 fires the error audit `drift_alarms`
    ],
    ids=["query", "audit"],
)
def test_reading_commands_import_no_arrow_or_numpy(lake, tmp_path, argv, exit_code):
    """`query` (text formats) and `audit` on a kept catalog read through DuckDB alone: pyarrow,
    numpy, polars, pandas and torch are never imported (each costs a command ~0.1-0.2 s of
    CPU). The first one builds the catalog, which takes the Arrow schemas' column types."""
    code = (
        "import runpy, sys\n"
        "sys.argv = ['tokenlake', *sys.argv[1:]]\n"
        "try:\n"
        "    runpy.run_module('tokenlake', run_name='__main__')\n"
        "finally:\n"
        "    heavy = ('numpy', 'pyarrow', 'polars', 'pandas', 'torch')\n"
        "    print(sorted(name for name in heavy if name in sys.modules), file=sys.stderr)\n"
    )
    args = [a.format(lake=lake) for a in argv]
    env = {**os.environ, "TOKENLAKE_CACHE": str(tmp_path / "cache")}
    runs = [
        subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env)
        for _ in ("builds the catalog", "opens the kept one")
    ]
    assert [done.returncode for done in runs] == [exit_code, exit_code]
    assert runs[1].stderr.splitlines()[-1] == "[]"
