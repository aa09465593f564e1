"""No SQL is written twice. A run of clauses that two places in `sql/` share (a cast list, a
join, a filter) is one definition kept twice, and the two drift apart: each belongs in the view
or macro that owns it. The check normalizes each line (comments, table aliases, case and
spacing dropped), leaves out lines too plain to be a copy of anything (a bare column name,
`SELECT`, a parenthesis), and fails on any run of MIN_RUN clauses found in two places but the
accepted ones below, each with the reason it is kept.
"""

from __future__ import annotations

import itertools
import re
from collections import defaultdict

from tokenlake.serve import sql_views

# Five clauses: the audits' cast of four columns back to the tokens' types, with the table it
# read, was a copy of five. A view's own key columns typed alike in another view can reach five
# too (a sample's key: run, rollout_id, evaluation, batch_position, sample_index): accepted.
MIN_RUN = 5

_COMMENT = re.compile(r"--.*")
_ALIAS = re.compile(r"\b[a-z]\.")  # `p.run`, `t.lp_diff`: the same clause under another alias
_PLAIN = re.compile(r"^(\w+|[()]|\),|SELECT|SELECT \*|FROM \(|WITH|UNION ALL|\);)$")

# (file, file) -> why the shared clauses stay in both. Paths are relative to sql/.
ACCEPTED: dict[tuple[str, str], str] = {
    ("drift_samples.sql", "rollups/drift_sample_parts.sql"): (
        "a view over a rollup states the types of the columns it passes on (the catalog reads"
        " the rollup's stored Parquet); drift_samples passes 24 of the rollup's 30 columns in"
        " another order, beside the sample's reward and staleness"
    ),
    ("drift_teacher_steps.sql", "rollups/drift_teacher_step_parts.sql"): (
        "a view over a rollup states the types of the columns it passes on; drift_teacher_steps"
        " passes the rollup's statistics beside the ones it computes from its sums"
    ),
    ("drift_by_token.sql", "macros/drift_breakdown.sql"): (
        "drift_statistics types the columns of every drift_by_* view but drift_by_token, whose"
        " statistics come from its own rollup's sums: the same eight columns, each view's contract"
    ),
    ("drift_by_token.sql", "rollups/drift_breakdown_parts.sql"): (
        "drift_by_token and the breakdown rollup both end in the eight breakdown statistics"
    ),
    ("macros/drift_breakdown.sql", "rollups/drift_breakdown_parts.sql"): (
        "the breakdown rollup stores the statistics drift_statistics types, in its own types"
    ),
    ("drift_steps.sql", "drift_teacher_steps.sql"): (
        "the teacher gap's steps have drift_steps' core statistics under the same names and"
        " types, in the same order, by design (docs/drift.md): the lists are each view's contract"
    ),
    ("drift_steps.sql", "rollups/drift_teacher_step_parts.sql"): (
        "the teacher rollup's statistics are drift_steps' core ones under the same names"
    ),
    ("macros/drift_breakdown.sql", "macros/drift_breakdown.sql"): (
        "drift_counts, drift_sums and drift_rollup each add up the five partial sums at their"
        " own grain (GROUP BY ALL over different keys); DuckDB has no macro for a list of"
        " aggregates"
    ),
    ("rollups/drift_breakdown_parts.sql", "rollups/drift_breakdown_parts.sql"): (
        "one UNION ALL branch per dimension, each setting the other dimensions' keys to NULL"
        " with the same EXCLUDE: the branches are one pass over the tokens"
    ),
    ("rollups/audit_token_rows.sql", "sample_stats.sql"): (
        "a sample's five key columns, typed alike where each view states its own key"
    ),
    ("drift_by_rank.sql", "drift_by_staleness.sql"): (
        "the per-sample breakdowns read drift_sample_terms alike; each keys it its own way, and"
        " the shared lines are that view's name and the columns it leaves out"
    ),
}


def clauses(text: str) -> list[str]:
    """The lines of a SQL file that can be copies, normalized (see the module docstring)."""
    found = []
    for line in text.splitlines():
        clause = _COMMENT.sub("", line).strip().rstrip(",").strip()
        clause = " ".join(_ALIAS.sub("", clause).split()).upper()
        if clause and not _PLAIN.match(clause):
            found.append(clause)
    return found


def copies(sources: dict[str, str], min_run: int = MIN_RUN) -> dict[tuple[str, str], list[str]]:
    """Each pair of files (a file with itself, for a run it holds twice) that share a run of `min_run` clauses, with
    the first such run."""
    places: dict[tuple[str, ...], list[str]] = defaultdict(list)
    for name, text in sorted(sources.items()):
        lines = clauses(text)
        for start in range(len(lines) - min_run + 1):
            places[tuple(lines[start : start + min_run])].append(name)
    found: dict[tuple[str, str], list[str]] = {}
    for run, names in places.items():
        for pair in itertools.combinations(sorted(names), 2):
            found.setdefault(pair, list(run))
    return found


def sql_sources() -> dict[str, str]:
    root = sql_views.sql_dir()
    return {p.relative_to(root).as_posix(): p.read_text("utf-8") for p in root.rglob("*.sql")}


def test_sql_is_written_once_but_for_the_accepted_copies() -> None:
    sources = sql_sources()
    assert len(sources) > 50  # the views, rollups, macros and audits were all read
    found = copies(sources)
    assert {pair: run for pair, run in found.items() if pair not in ACCEPTED} == {}


def test_every_accepted_copy_still_exists() -> None:
    """An accepted copy that was removed leaves its entry behind, which would accept it again."""
    assert sorted(set(ACCEPTED) - set(copies(sql_sources()))) == []


def test_a_planted_cast_list_is_found() -> None:
    owner = sql_views.sql_dir() / "macros" / "outlier_rows.sql"
    casts = owner.read_text("utf-8").split("SELECT\n", 1)[1].split("FROM", 1)[0]
    view = f"CREATE OR REPLACE VIEW v AS\nSELECT\n{casts.replace('run::', 'o.run::')}FROM o\n"
    found = copies({**sql_sources(), "v.sql": view})
    assert found[("macros/outlier_rows.sql", "v.sql")] == [
        "RUN::VARCHAR AS RUN",
        "ROLLOUT_ID::BIGINT AS ROLLOUT_ID",
        "OUTLIER_RANK::BIGINT AS OUTLIER_RANK",
        "BATCH_POSITION::INTEGER AS BATCH_POSITION",
        "SAMPLE_INDEX::BIGINT AS SAMPLE_INDEX",
    ]


def test_a_planted_join_is_found() -> None:
    join = (
        "FROM drift_sample_parts AS x\nLEFT JOIN samples AS y\n    ON y.run = x.run\n"
        "    AND y.rollout_id = x.rollout_id\n    AND NOT y.evaluation\n"
        "    AND y.batch_position = x.batch_position\n"
    )
    found = copies({"a.sql": f"SELECT 1 AS one\n{join}", "b.sql": f"SELECT 2 AS two\n{join}"})
    assert found == {
        ("a.sql", "b.sql"): [
            "FROM DRIFT_SAMPLE_PARTS AS X",
            "LEFT JOIN SAMPLES AS Y",
            "ON RUN = RUN",
            "AND ROLLOUT_ID = ROLLOUT_ID",
            "AND NOT EVALUATION",
        ]
    }
