"""The schema/SQL contract: every `sql/*.sql` view binds against typed empty base views, the
reference-statistics views have exactly the columns and types below, and every view file has
a header with a `Grain:` line and is documented in docs/views.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import store_of
from tokenlake.serve import catalog, sql_views

DOCS = Path(__file__).resolve().parents[2] / "docs" / "views.md"

EXPECTED_COLUMNS: dict[str, list[tuple[str, str]]] = {
    "sample_stats": [
        ("run", "VARCHAR"),
        ("rollout_id", "BIGINT"),
        ("evaluation", "BOOLEAN"),
        ("batch_position", "INTEGER"),
        ("sample_index", "BIGINT"),
        ("group_index", "BIGINT"),
        ("status", "VARCHAR"),
        ("remove_sample", "BOOLEAN"),
        ("response_length", "INTEGER"),
        ("total_length", "INTEGER"),
        ("reward", "DOUBLE"),
        ("weight_version", "VARCHAR"),
        ("weight_version_min", "BIGINT"),
        ("mixed_version", "BOOLEAN"),
        ("staleness", "BIGINT"),
        ("turns", "BIGINT"),
        ("tool_calls", "BIGINT"),
        ("non_generation_time", "DOUBLE"),
        ("spec_accept_rate", "DOUBLE"),
        ("prefix_cache_hit_rate", "DOUBLE"),
        ("raw_reward", "DOUBLE"),
        ("normalized_reward", "DOUBLE"),
        ("truncated", "BOOLEAN"),
        ("dumped_rank", "BIGINT"),
        ("mean_entropy", "DOUBLE"),
        ("max_entropy", "DOUBLE"),
        ("ref_entropy_mean", "DOUBLE"),
        ("mean_abs_lp_diff", "DOUBLE"),
        ("max_abs_lp_diff", "DOUBLE"),
        ("mean_imp_ratio", "DOUBLE"),
        ("adv_mean", "DOUBLE"),
        ("adv_std", "DOUBLE"),
        ("return_mean", "DOUBLE"),
        ("alignment_failed", "BOOLEAN"),
        ("has_train_row", "BOOLEAN"),
    ],
    "group_stats": [
        ("run", "VARCHAR"),
        ("rollout_id", "BIGINT"),
        ("evaluation", "BOOLEAN"),
        ("group_index", "BIGINT"),
        ("n", "BIGINT"),
        ("reward_mean", "DOUBLE"),
        ("reward_std", "DOUBLE"),
        ("response_length_mean", "DOUBLE"),
        ("truncated_frac", "DOUBLE"),
        ("zero_std", "BOOLEAN"),
    ],
    "step_stats": [
        ("run", "VARCHAR"),
        ("rollout_id", "BIGINT"),
        ("n_samples", "BIGINT"),
        ("reward_mean", "DOUBLE"),
        ("reward_std", "DOUBLE"),
        ("response_length_mean", "DOUBLE"),
        ("truncated_frac", "DOUBLE"),
        ("zero_std_group_frac", "DOUBLE"),
        ("mean_abs_lp_diff", "DOUBLE"),
        ("mean_entropy", "DOUBLE"),
        ("mixed_version_frac", "DOUBLE"),
    ],
}

VIEW_FILES = list(sql_views.iter_view_files())


@pytest.fixture(scope="module")
def empty_catalog(tmp_path_factory):
    import duckdb

    lake = tmp_path_factory.mktemp("empty_lake")
    con = duckdb.connect(str(catalog.build_catalog(store_of(lake))), read_only=True)
    yield con
    con.close()


def _describe(con, view: str) -> list[tuple[str, str]]:
    return [(row[0], row[1]) for row in con.execute(f"DESCRIBE {view}").fetchall()]


def test_reference_views_are_defined():
    assert {p.stem for p in VIEW_FILES} >= set(EXPECTED_COLUMNS)


@pytest.mark.parametrize("view", sorted(EXPECTED_COLUMNS))
def test_reference_view_columns_and_types(empty_catalog, view):
    assert _describe(empty_catalog, view) == EXPECTED_COLUMNS[view]


@pytest.mark.parametrize("path", VIEW_FILES, ids=lambda p: p.name)
def test_every_view_binds_and_runs_on_an_empty_lake(empty_catalog, path):
    assert _describe(empty_catalog, path.stem)
    # Runs, not only binds: a settings view may return a constant row, so no row count here.
    empty_catalog.execute(f"SELECT * FROM {path.stem}").fetchall()


@pytest.mark.parametrize("path", VIEW_FILES, ids=lambda p: p.name)
def test_every_view_file_has_a_header_with_grain(path):
    header = sql_views.header_comment(path.read_text(encoding="utf-8"))
    assert header, f"{path.name} must start with a `--` comment header"
    assert any(line.startswith("Grain: ") for line in header.splitlines()), (
        f"{path.name} header lacks a `Grain: ...` line"
    )


@pytest.mark.parametrize("path", VIEW_FILES, ids=lambda p: p.name)
def test_every_view_file_is_documented(path):
    assert path.name in DOCS.read_text(encoding="utf-8"), (
        f"docs/views.md does not mention `{path.name}`"
    )
