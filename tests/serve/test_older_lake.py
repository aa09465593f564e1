"""A lake written by an older tokenlake stays readable: the columns added since read NULL until
the next extraction rewrites its steps."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

import tokenlake
from tests.fixture_paths import REAL_DUMPS
from tokenlake import schema

# Columns schema versions 4 and 5 added; a version-3 file has none of them.
NEW_TOKEN_COLUMNS = ["token_version", "token_staleness", "support_size", "teacher_log_prob"]
NEW_TOKEN_COLUMNS += ["rl_weight", "ce_weight", "ref_kl_weight", "dppo_masked"]
NEW_SAMPLE_COLUMNS = ["bounded_sampling", "start_weight_version", "start_staleness", "env_name"]


def _make_version_3(lake, run):
    path = lake / "_manifest" / f"{run}.json"
    record = json.loads(path.read_text())
    for step in record["steps"].values():
        step["schema_version"] = 3
        del step["identities"]  # an older tokenlake recorded no file identities
        for table, drop in (
            (schema.TOKENS, NEW_TOKEN_COLUMNS),
            (schema.SAMPLES, NEW_SAMPLE_COLUMNS),
        ):
            file = lake / step["files"][table]
            data = pq.read_table(file)
            pq.write_table(data.drop_columns([c for c in drop if c in data.column_names]), file)
    path.write_text(json.dumps(record))


@pytest.mark.slow
def test_a_lake_of_schema_version_3_reads_with_the_new_columns_null(tmp_path):
    lake = tokenlake.Lake(tmp_path / "lake")
    lake.extract(REAL_DUMPS / "basic", run_name="basic")
    before = lake.sql("SELECT rollout_id, mean_abs_lp_diff_smtm FROM drift_steps ORDER BY 1")
    expected = before.fetchall()
    lake.close()
    _make_version_3(tmp_path / "lake", "basic")
    old = tokenlake.Lake(tmp_path / "lake")
    got = old.sql("SELECT rollout_id, mean_abs_lp_diff_smtm FROM drift_steps ORDER BY 1")
    # DuckDB's parallel sums may move the last bit between two builds
    assert got.fetchall() == [(step, pytest.approx(value, rel=1e-12)) for step, value in expected]
    assert old.sql(
        "SELECT count(*), count(token_version), count(support_size) FROM tokens"
    ).fetchall() == [(206, 0, 0)]
    assert old.sql("SELECT count(start_weight_version) FROM samples").fetchall() == [(0,)]
    assert old.sql(
        "SELECT count(rl_weight), count(dppo_masked), count(*) FROM tokens"
    ).fetchall() == [(0, 0, 206)]
    assert old.sql("SELECT count(env_name) FROM samples").fetchall() == [(0,)]
    assert old.tokens(columns=["token_version"]).collect()["token_version"].null_count() == 206
    assert old.audit() != []  # every audit still binds
