"""What the report shows, read from the catalog's views (`tokenlake report`).

Every number comes from a view under `sql/` or an audit under `sql/audits/`; this module
selects rows (runs, steps) and columns, and pools per-step rows over steps by their counts
(Σ tokens · mean / Σ tokens), so no statistic has a second implementation here. Only
aggregates leave the catalog, plus the tokens of the few worst samples for their strips.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tokenlake import schema
from tokenlake.errors import UnknownRunError, UsageError
from tokenlake.serve import audit, sql_views
from tokenlake.steps import describe_ids

if TYPE_CHECKING:
    import duckdb

Rows = list[dict[str, Any]]
AUDIT_ROWS = 20  # offending rows shown per failed audit

# Columns each per-step dataset carries into the page (the views have more).
STEP_STATS_COLUMNS = (
    "reward_mean",
    "reward_std",
    "zero_std_group_frac",
    "truncated_frac",
    "response_length_mean",
)
REJECTION_RULES = ("veto", "outlier", "geo_reject", "seq_ratio_reject", "icepop")
DRIFT_STEP_COLUMNS = (
    "tokens",
    "mean_abs_lp_diff_tm",
    "mean_abs_lp_diff_smtm",
    "p99_abs_lp_diff",
    "k3_kl",
    "k3_kl_smtm",
    "chi2_token",
    "chi2_seq",
    "ess",
    "mult_prob_error",
    *(f"{rule}_{kind}_frac" for rule in REJECTION_RULES for kind in ("token", "seq")),
)
BREAKDOWN_COLUMNS = ("tokens", "samples", "mean_abs_lp_diff", "k3_kl", "k3_share")


@dataclass(frozen=True)
class Selection:
    """The runs and steps a report covers.

    Attributes:
        runs: Run names, sorted.
        steps: Inclusive (low, high) step ranges to keep, or None for every step.
    """

    runs: tuple[str, ...]
    steps: tuple[tuple[int, int], ...] | None = None

    def where(self, *, steps: bool = True, alias: str = "") -> str:
        """SQL condition keeping the selection; literals inline so DuckDB prunes partitions.

        Examples:
            >>> Selection(("a", "b'c"), ((1, 2), (7, 7))).where()
            "run IN ('a', 'b''c') AND (rollout_id BETWEEN 1 AND 2 OR rollout_id BETWEEN 7 AND 7)"
        """
        prefix = f"{alias}." if alias else ""
        names = ", ".join(sql_views.quote_literal(run) for run in self.runs) or "NULL"
        condition = f"{prefix}run IN ({names})"
        if steps and self.steps is not None:
            ranges = [f"{prefix}rollout_id BETWEEN {lo} AND {hi}" for lo, hi in self.steps]
            condition += f" AND ({' OR '.join(ranges) or 'FALSE'})"
        return condition


@dataclass
class AuditSection:
    """One audit's outcome within the selection."""

    name: str
    description: str
    count: int
    severity: str = "error"  # from the audit file's `Severity:` header line
    columns: list[str] = field(default_factory=list)
    rows: list[list[Any]] = field(default_factory=list)


def clean(value: Any) -> Any:
    """A value JSON can hold: NaN and infinities become None, timestamps ISO text.

    Examples:
        >>> [clean(float("nan")), clean(1.5), clean("x")]
        [None, 1.5, 'x']
    """
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "isoformat"):
        return value.isoformat(sep=" ", timespec="seconds")
    return value


def fetch(con: duckdb.DuckDBPyConnection, sql: str) -> Rows:
    """Rows of a query as dicts of JSON-safe values (aggregates only: a few thousand rows)."""
    table = con.sql(sql).to_arrow_table()
    return [{k: clean(v) for k, v in row.items()} for row in table.to_pylist()]


def resolve_runs(con: duckdb.DuckDBPyConnection, requested: Sequence[str]) -> tuple[str, ...]:
    """The requested runs (all runs of the lake when none), checked against `runs`.

    Raises:
        UsageError: A requested run is not in the lake.
    """
    known = [row[0] for row in con.sql("SELECT run FROM runs ORDER BY run").fetchall()]
    for name in requested:
        if name not in known:
            raise UnknownRunError(name, known)
    return tuple(sorted(set(requested))) if requested else tuple(known)


def require_selected_steps(con: duckdb.DuckDBPyConnection, sel: Selection, text: str) -> None:
    """Raise when the selection's steps hold no step of its runs, as `extract --steps` does
    for a dump (an empty report would read as a healthy one).

    Raises:
        UsageError: No step of the selected runs is selected; the message lists their steps.
    """
    if sel.steps is None:
        return
    where = sel.where(steps=False)
    rows = con.sql(f"SELECT DISTINCT rollout_id FROM samples WHERE {where} ORDER BY 1").fetchall()
    ids = [row[0] for row in rows]
    if not any(lo <= step <= hi for step in ids for lo, hi in sel.steps):
        raise UsageError(
            f"--steps `{text}` selects no step of the lake; its steps are {describe_ids(ids)}."
        )


def _catalog(con: duckdb.DuckDBPyConnection) -> str:
    """The catalog database's quoted name, to reach its views under the TEMP ones."""
    database = con.sql("SELECT current_database()").fetchall()[0][0]
    return '"' + database.replace('"', '""') + '"'


def restrict(con: duckdb.DuckDBPyConnection, sel: Selection) -> None:
    """Shadow the base views `tokens` and `samples` with TEMP views of the selection only.

    Every view of the catalog then reads only the selected runs' and steps' partitions, even
    where a window over steps (`drift_steps`' changes, `drift_by_turn`) would stop DuckDB from
    pushing a filter on `rollout_id` down to the files. This is the mechanism `drift_settings`
    overrides use (docs/drift.md): the temp schema is searched first.
    """
    for table in (schema.TOKENS, schema.SAMPLES):
        source = f"{_catalog(con)}.main.{table}"
        con.execute(
            f"CREATE OR REPLACE TEMP VIEW {table} AS SELECT * FROM {source} WHERE {sel.where()}"
        )


# Per-sample and per-step views that several sections and audits read (drift_alarms reads
# drift_steps; truncated_steps reads step_stats): computed once per
# report into TEMP tables of the same name, which shadow the catalog's views as `restrict`'s
# do. Dependencies first, so each is computed from the tables before it.
CACHED_VIEWS = ("sample_stats", "group_stats", "step_stats", "drift_samples", "drift_steps")


def cache_views(con: duckdb.DuckDBPyConnection) -> None:
    """Compute `CACHED_VIEWS` once over the selection (after `restrict`): same SQL, same rows."""
    for name in CACHED_VIEWS:
        con.execute(
            f"CREATE OR REPLACE TEMP TABLE {name} AS SELECT * FROM {_catalog(con)}.main.{name}"
        )


def runs_overview(con: duckdb.DuckDBPyConnection, sel: Selection) -> Rows:
    """One row per run: steps, samples, tokens within the selection, and the `runs` metadata."""
    return fetch(
        con,
        f"""
        WITH s AS (
            SELECT run, count(DISTINCT rollout_id) FILTER (WHERE NOT evaluation) AS steps,
                count(DISTINCT rollout_id) FILTER (WHERE evaluation) AS eval_steps,
                count(*) FILTER (WHERE NOT evaluation) AS samples
            FROM samples WHERE {sel.where()} GROUP BY run
        ), t AS (
            SELECT run, count(*) AS tokens FROM tokens WHERE {sel.where()} GROUP BY run
        )
        SELECT r.run, coalesce(s.steps, 0) AS steps, coalesce(s.eval_steps, 0) AS eval_steps,
            coalesce(s.samples, 0) AS samples, coalesce(t.tokens, 0) AS tokens,
            r.source_dir, r.extracted_at, r.tool, r.schema_version
        FROM runs AS r LEFT JOIN s USING (run) LEFT JOIN t USING (run)
        WHERE {sel.where(steps=False, alias="r")} ORDER BY r.run
        """,
    )


def pooled_drift(source: str, where: str) -> str:
    """Per run, the drift of the steps of `source` (`drift_steps`' rows) kept by `where`,
    pooled exactly (`run_summary`)."""
    return f"""
        SELECT run, count(*) AS drift_steps, sum(tokens)::BIGINT AS tokens,
            sum(tokens * mean_abs_lp_diff_tm) / sum(tokens) AS mean_abs_lp_diff,
            sum(tokens * k3_kl) / sum(tokens) AS k3_kl,
            min(ess) AS ess_min, arg_min(rollout_id, ess) AS ess_min_step
        FROM {source} WHERE {where} AND tokens > 0 GROUP BY run
        """


def run_summary(con: duckdb.DuckDBPyConnection, sel: Selection) -> Rows:
    """One row per run over the whole selection, pooled exactly from the per-step views.

    `drift_steps`' token means (TM |δ|, k3) are weighted back into sums by the step's token
    count, so Σ(tokens · mean) / Σ tokens is the mean over every selected token, not a mean of
    step means. ESS is a ratio of step means (TM(w)² / TM(w²)) that no column pools, so its
    lowest step is shown, with that step. Rewards are the means over every selected sample of
    `sample_stats` (training: the step's reward, `step_reward`; eval `reward`), the samples
    `step_stats` averages.
    """
    if not sel.runs:
        return []
    where = sel.where()
    return fetch(
        con,
        f"""
        WITH d AS ({pooled_drift("drift_steps", where)}), r AS (
            SELECT run,
                avg(step_reward(framework, evaluation, reward, raw_reward))
                    FILTER (WHERE NOT evaluation) AS reward_mean,
                avg(reward) FILTER (WHERE evaluation) AS eval_reward_mean
            FROM (SELECT * FROM sample_stats WHERE {where})
            LEFT JOIN (SELECT run, framework FROM runs) USING (run)
            GROUP BY run
        )
        SELECT run, coalesce(d.drift_steps, 0) AS drift_steps, coalesce(d.tokens, 0) AS tokens,
            d.mean_abs_lp_diff, d.k3_kl, d.ess_min, d.ess_min_step, r.reward_mean,
            r.eval_reward_mean
        FROM (SELECT UNNEST([{", ".join(sql_views.quote_literal(run) for run in sel.runs)}]) AS run)
        LEFT JOIN d USING (run) LEFT JOIN r USING (run) ORDER BY run
        """,
    )


def audits(con: duckdb.DuckDBPyConnection, sel: Selection) -> list[AuditSection]:
    """Every audit under `sql/audits/`, its offending rows restricted to the selection."""
    results = []
    for path in sql_views.iter_audit_files():
        text = path.read_text(encoding="utf-8").strip().rstrip(";")
        columns = [c[0] for c in con.sql(f"SELECT * FROM ({text}) LIMIT 0").description]
        keep = sel.where(steps="rollout_id" in columns) if "run" in columns else "true"
        relation = con.sql(
            f"SELECT *, count(*) OVER () AS __rows FROM ({text}) WHERE {keep} LIMIT {AUDIT_ROWS}"
        )
        rows = relation.fetchall()
        count = rows[0][-1] if rows else 0
        section = AuditSection(path.stem, audit.describe(text), count, audit.severity(path, text))
        section.columns = columns
        section.rows = [[clean(v) for v in row[:-1]] for row in rows]
        results.append(section)
    return results


def settings(con: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    """The one row of `drift_settings` (the thresholds drawn as rules)."""
    return fetch(con, "SELECT * FROM drift_settings")[0]


def step_datasets(con: duckdb.DuckDBPyConnection, sel: Selection) -> dict[str, Rows]:
    """The per-step datasets: `step_stats`, the eval reward, `drift_steps`."""
    where = sel.where()
    return {
        "step_stats": fetch(
            con,
            f"SELECT run, rollout_id, {', '.join(STEP_STATS_COLUMNS)} FROM step_stats "
            f"WHERE {where} ORDER BY run, rollout_id",
        ),
        # sample_stats.reward is the rollout-side reward of eval samples (views.md).
        "eval_reward": fetch(
            con,
            "SELECT run, rollout_id, avg(reward) AS eval_reward_mean, count(reward) AS samples "
            f"FROM sample_stats WHERE evaluation AND {where} "
            "GROUP BY run, rollout_id HAVING count(reward) > 0 ORDER BY run, rollout_id",
        ),
        "drift_steps": fetch(
            con,
            f"SELECT run, rollout_id, {', '.join(DRIFT_STEP_COLUMNS)} FROM drift_steps "
            f"WHERE {where} ORDER BY run, rollout_id",
        ),
    }


_BUCKET_LABEL = (
    "CASE WHEN NOT isfinite(bucket_low) THEN '< ' || printf('%g', bucket_high) "
    "WHEN NOT isfinite(bucket_high) THEN '≥ ' || printf('%g', bucket_low) "
    "ELSE printf('%g to %g', bucket_low, bucket_high) END"
)
# The open tails of the histogram are drawn one bin wide beside their edge.
_BIN_WIDTH = "(SELECT histogram_half_width / 50.0 FROM drift_settings)"
_BIN_LOW = f"CASE WHEN isfinite(bin_low) THEN bin_low ELSE bin_high - {_BIN_WIDTH} END"
_BIN_HIGH = f"CASE WHEN isfinite(bin_high) THEN bin_high ELSE bin_low + {_BIN_WIDTH} END"
TAIL_BINS = (-51, 50)  # drift_histogram's open tails


def nice_ceiling(value: float) -> float:
    """The smallest 1, 2 or 5 × 10^k at or above `value` (> 0): a bin range that reads well.

    Examples:
        >>> [nice_ceiling(0.0137), nice_ceiling(0.1), nice_ceiling(3.2)]
        [0.02, 0.1, 5.0]
    """
    exponent = math.floor(math.log10(value))
    for mantissa in (1, 2, 5, 10):
        candidate = float(f"{mantissa}e{exponent}")  # exact decimal, not 10 ** -k's rounding
        if candidate >= value:
            return candidate
    raise AssertionError(value)  # unreachable: 10 × 10^k > value


def fit_histogram(con: duckdb.DuckDBPyConnection, sel: Selection) -> float:
    """Set `drift_histogram`'s range from the data and return it (nats): ± the largest p99 |δ|
    of the selected steps (`drift_steps`), rounded up by `nice_ceiling`, so at most 1 % of any
    step's tokens fall in the open tails. A TEMP `drift_settings` shadows the catalog's, as a
    user's override does; without drift the view's default stays."""
    p99 = con.sql(
        f"SELECT max(p99_abs_lp_diff) FROM drift_steps WHERE {sel.where()} AND tokens > 0"
    ).fetchall()[0][0]
    if p99 is not None and math.isfinite(p99) and p99 > 0:
        con.execute(
            "CREATE OR REPLACE TEMP VIEW drift_settings AS SELECT * REPLACE "
            f"({nice_ceiling(p99)!r}::DOUBLE AS histogram_half_width) "
            f"FROM {_catalog(con)}.main.drift_settings"
        )
    return float(con.sql("SELECT histogram_half_width FROM drift_settings").fetchall()[0][0])


ALL_STEPS = "all"  # the `step` of a breakdown row pooled over every selected step


def with_all_steps(select: str, keys: Sequence[str], share_by: Sequence[str] = ()) -> str:
    """`select`'s per-step breakdown rows, each with `step` (its step id as text), and one row
    per run and bucket pooled over all the steps, with `step` = 'all'.

    The pooling is exact from the counts the views give: Σ tokens and Σ samples (a sample lies
    in one step), a token mean as Σ(tokens · mean) / Σ tokens, and the bucket's k3 share as its
    Σ(tokens · k3) over the run's (within `share_by`, e.g. the breakdown's dimension).
    """
    group = ", ".join(["run", *keys])
    scope = ", ".join(["run", *share_by])
    return f"""
        WITH v AS ({select})
        SELECT *, rollout_id::VARCHAR AS step FROM v
        UNION ALL BY NAME
        SELECT {group}, '{ALL_STEPS}' AS step, sum(tokens)::BIGINT AS tokens,
            sum(samples)::BIGINT AS samples,
            sum(tokens * mean_abs_lp_diff) / sum(tokens) AS mean_abs_lp_diff,
            sum(tokens * k3_kl) / sum(tokens) AS k3_kl,
            sum(tokens * k3_kl) / nullif(sum(sum(tokens * k3_kl)) OVER (PARTITION BY {scope}), 0)
                AS k3_share
        FROM v GROUP BY {group}
        ORDER BY run, step = '{ALL_STEPS}' DESC, rollout_id, {", ".join(keys)}
    """


def breakdown_datasets(con: duckdb.DuckDBPyConnection, sel: Selection) -> dict[str, Rows]:
    """Where the drift is: by position, probability/entropy bucket, turn, staleness (of the
    sample and of each token), |δ| bins.

    Every breakdown but the step × position heatmap also has its rows pooled over all the
    selected steps (`with_all_steps`), which the charts show first.
    """
    where = sel.where()
    stats = ", ".join(BREAKDOWN_COLUMNS)
    return {
        "by_position": fetch(
            con,
            "SELECT run, rollout_id, rollout_id::VARCHAR AS step, position_bucket, position_low, "
            f"position_high, {stats} FROM drift_by_position WHERE {where} ORDER BY ALL",
        ),
        "by_prob": fetch(
            con,
            with_all_steps(
                f"SELECT run, rollout_id, dimension, bucket, {_BUCKET_LABEL} AS label, {stats} "
                f"FROM drift_by_prob WHERE {where}",
                ("dimension", "bucket", "label"),
                ("dimension",),
            ),
        ),
        "by_turn": fetch(
            con,
            with_all_steps(
                f"SELECT run, rollout_id, turn_index, {stats} FROM drift_by_turn WHERE {where}",
                ("turn_index",),
            ),
        ),
        "by_staleness": fetch(
            con,
            with_all_steps(
                f"SELECT run, rollout_id, staleness, mixed_version, {stats} "
                f"FROM drift_by_staleness WHERE {where}",
                ("staleness", "mixed_version"),
            ),
        ),
        "by_token_staleness": fetch(
            con,
            with_all_steps(
                f"SELECT run, rollout_id, token_staleness, {stats} FROM drift_by_weight_version"
                f" WHERE {where} AND token_staleness IS NOT NULL",
                ("token_staleness",),
            ),
        ),
        "histogram": fetch(
            con,
            f"""
            WITH v AS (
                SELECT run, rollout_id, bin, {_BIN_LOW} AS x_low, {_BIN_HIGH} AS x_high,
                    {_BUCKET_LABEL.replace("bucket_", "bin_")} AS label, tokens
                FROM drift_histogram WHERE {where} AND tokens > 0
            )
            SELECT *, rollout_id::VARCHAR AS step,
                tokens / sum(tokens) OVER (PARTITION BY run, rollout_id) AS fraction
            FROM v
            UNION ALL BY NAME
            SELECT run, bin, x_low, x_high, label, '{ALL_STEPS}' AS step,
                sum(tokens)::BIGINT AS tokens, sum(tokens) / sum(sum(tokens)) OVER (PARTITION BY run) AS fraction
            FROM v GROUP BY run, bin, x_low, x_high, label
            ORDER BY run, step = '{ALL_STEPS}' DESC, rollout_id, bin
            """,
        ),
    }


def worst_tokens(con: duckdb.DuckDBPyConnection, sel: Selection, top: int) -> dict[str, Rows]:
    """The top drifting token texts of each step (`drift_by_token`, by share of k3); `latest`
    marks each run's own last selected step."""
    where = sel.where()
    return {
        "top_tokens": fetch(
            con,
            "SELECT run, rollout_id, rollout_id::VARCHAR AS step, token_id, "
            "coalesce(to_json(token_text)::VARCHAR, '#' || token_id) AS label, tokens, "
            "mean_abs_lp_diff, k3_kl, k3_share, k3_rank, "
            "rollout_id = max(rollout_id) OVER (PARTITION BY run) AS latest "
            f"FROM drift_by_token WHERE {where} AND k3_rank <= {top}",
        ),
    }


def worst_samples(con: duckdb.DuckDBPyConnection, sel: Selection, per_run: int) -> Rows:
    """The `per_run` samples of each run that carry the largest share of their step's Σ|δ|
    (`drift_samples`: tokens · mean |δ| over the step's sum), so a 1-token sample with a large
    mean does not lead; `abs_share` is that share (fraction)."""
    return fetch(
        con,
        f"""
        WITH d AS (
            SELECT *, tokens * mean_abs_lp_diff
                / nullif(sum(tokens * mean_abs_lp_diff) OVER (PARTITION BY run, rollout_id), 0)
                AS abs_share
            FROM drift_samples WHERE {sel.where()}
        )
        SELECT d.run, d.rollout_id, d.batch_position, d.sample_index, d.tokens,
            d.mean_abs_lp_diff, d.max_abs_lp_diff, d.abs_share, s.response_length
        FROM d
        JOIN samples AS s ON s.run = d.run AND s.rollout_id = d.rollout_id
            AND NOT s.evaluation AND s.batch_position = d.batch_position
        QUALIFY row_number() OVER (
            PARTITION BY d.run
            ORDER BY d.abs_share DESC NULLS LAST, d.rollout_id, d.batch_position
        ) <= {int(per_run)}
        ORDER BY d.run, d.abs_share DESC NULLS LAST, d.rollout_id, d.batch_position
        """,
    )


# Token status codes of a strip cell (the page greys every code but COVERED).
MASKED, NO_PAIR, NONFINITE, COVERED = 0, 1, 2, 3
_STATUS = f"""CASE WHEN coalesce(t.loss_mask, 0) = 0 THEN {MASKED}
    WHEN t.lp_diff IS NULL THEN {NO_PAIR}
    WHEN NOT (isfinite(t.lp_diff) AND isfinite(t.train_log_prob)
              AND isfinite(t.rollout_log_prob)) THEN {NONFINITE}
    ELSE {COVERED} END"""


def _json_array(expression: str) -> str:
    """SQL building one sample's JSON array of `expression`, in position order."""
    return f"'[' || string_agg({expression}, ',' ORDER BY t.position) || ']'"


def _number(column: str) -> str:
    # 5 significant digits: a strip cell needs no more, and the page stays small.
    return f"CASE WHEN isfinite({column}) THEN printf('%.5g', {column}) ELSE 'null' END"


STRIP_ARRAYS = {
    "position": "t.position::VARCHAR",
    "token_id": "t.token_id::VARCHAR",
    "text": "coalesce(to_json(v.token_text)::VARCHAR, 'null')",
    "train": _number("t.train_log_prob"),
    "rollout": _number("t.rollout_log_prob"),
    "delta": _number("t.lp_diff"),
    "status": _STATUS,
}


def strip_tokens(con: duckdb.DuckDBPyConnection, samples: Rows) -> list[dict[str, Any]]:
    """Every response token of the given samples, as one JSON array per field and sample.

    One query for all of them, reading only their runs' and steps' partitions (batch
    positions pruning row groups): a query a sample planned over every file of a lake of many
    steps again and again. The arrays are built in SQL, so no Python loop touches a token.
    """
    import json

    keys = [
        (str(sample["run"]), int(sample["rollout_id"]), int(sample["batch_position"]))
        for sample in samples
    ]
    found: dict[tuple[str, int, int], tuple[Any, ...]] = {}
    if keys:
        arrays = ", ".join(f"{_json_array(sql)} AS {name}" for name, sql in STRIP_ARRAYS.items())
        quote = sql_views.quote_literal
        runs = ", ".join(sorted({quote(run) for run, _, _ in keys}))
        steps = ", ".join(sorted({str(step) for _, step, _ in keys}))
        which = " OR ".join(
            f"(t.run = {quote(run)} AND t.rollout_id = {step} AND t.batch_position = {position})"
            for run, step, position in keys
        )
        rows = con.sql(
            f"SELECT t.run, t.rollout_id, t.batch_position, {arrays} FROM tokens AS t "
            "LEFT JOIN vocab AS v ON v.run = t.run AND v.token_id = t.token_id "
            f"WHERE t.run IN ({runs}) AND t.rollout_id IN ({steps}) AND NOT t.evaluation "
            f"AND ({which}) GROUP BY t.run, t.rollout_id, t.batch_position"
        ).fetchall()
        found = {(str(r[0]), int(r[1]), int(r[2])): tuple(r[3:]) for r in rows}
    strips = []
    for sample, key in zip(samples, keys, strict=True):
        row = found.get(key, (None,) * len(STRIP_ARRAYS))
        values = {
            name: json.loads(text or "[]") for name, text in zip(STRIP_ARRAYS, row, strict=True)
        }
        strips.append({**sample, "cells": values})
    return strips
