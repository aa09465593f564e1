"""What each explorer page reads, as JSON-ready dicts, through the catalog's views.

Every function takes a cursor of the served catalog and binds the page's values (run names,
steps, positions) as query parameters: a run name is never pasted into SQL. Values JSON cannot
hold (NaN, infinities) are None in the aggregates; in a sample's token columns a non-finite
value becomes its text ("NaN", "Infinity", "-Infinity"), so the page can say which it was.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from tokenlake.errors import UsageError
from tokenlake.serve import audit, rollups, sql_views
from tokenlake.serve import report_data as rd
from tokenlake.serve.explore.kept import Kept, Row, RunLevel, StepKey
from tokenlake.serve.run_colours import run_colours

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

    from tokenlake.store import manifest

Rows = list[dict[str, Any]]

# The statistics a token strip can be coloured by: the `tokens` column, or the SQL computing
# it from one; `signed` ones get a colour scale symmetric around `centre`.
TOKEN_STATS: dict[str, dict[str, Any]] = {
    "lp_diff": {"sql": "t.lp_diff", "signed": True, "centre": 0.0},
    "imp_ratio": {"sql": "exp(t.lp_diff)", "signed": True, "centre": 1.0},
    "k3": {"sql": "exp(t.lp_diff) - 1 - t.lp_diff", "signed": False},
    "entropy": {"sql": "t.entropy", "signed": False},
    "advantage": {"sql": "t.advantage", "signed": True, "centre": 0.0},
    "train_log_prob": {"sql": "t.train_log_prob", "signed": False},
    "rollout_log_prob": {"sql": "t.rollout_log_prob", "signed": False},
    "ref_log_prob": {"sql": "t.ref_log_prob", "signed": False},
    "teacher_log_prob": {"sql": "t.teacher_log_prob", "signed": False},
    "token_staleness": {"sql": "t.token_staleness", "signed": False},
}

# A sample page shows at most this many tokens (a sample holds far fewer: the dumps' longest
# responses are ~100 k tokens).
MAX_SAMPLE_TOKENS = 1_000_000
METRIC_ROWS = 50_000


def rows(con: duckdb.DuckDBPyConnection, sql: str, params: Sequence[Any] = ()) -> Rows:
    """Rows of a query as dicts of JSON-safe values."""
    return _clean(con.sql(sql, params=list(params)).to_arrow_table())


def run_names(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Every run of the lake, sorted: the order that gives each run its colour."""
    return [str(r[0]) for r in con.execute("SELECT run FROM runs ORDER BY run").fetchall()]


def _known(con: duckdb.DuckDBPyConnection, runs: Sequence[str]) -> list[str]:
    known = run_names(con)
    for name in runs:
        if name not in known:
            raise UsageError(f"The lake has no run {json.dumps(name)}.")
    return sorted(set(runs))


# Per step of the lake (training and eval): its samples, and the sums that pool its rewards
# exactly into a run's (`run_summary`'s means over every sample); an eval step's reward as the
# run-over-steps page charts it (`report_data.step_datasets`).
STEP_COUNTS_SQL = """
    SELECT s.run, s.rollout_id, s.evaluation, count(*) AS samples,
        sum(step_reward(r.framework, s.evaluation, s.reward, s.raw_reward)) AS reward_sum,
        count(step_reward(r.framework, s.evaluation, s.reward, s.raw_reward)) AS rewards,
        avg(s.reward) AS eval_reward_mean, count(s.reward) AS eval_rewards
    FROM sample_stats AS s LEFT JOIN (SELECT run, framework FROM runs) AS r USING (run)
    GROUP BY ALL ORDER BY s.run, s.rollout_id, s.evaluation
"""
# Per run, the rewards pooled from `STEP_COUNTS_SQL`'s sums (a run without a reward: NULL).
POOLED_REWARDS_SQL = """
    SELECT run,
        sum(reward_sum) FILTER (WHERE NOT evaluation)
            / nullif(sum(rewards) FILTER (WHERE NOT evaluation), 0) AS reward_mean,
        sum(reward_sum) FILTER (WHERE evaluation)
            / nullif(sum(rewards) FILTER (WHERE evaluation), 0) AS eval_reward_mean
    FROM kept_steps GROUP BY run
"""
RUNS_COLUMNS = (
    "run, framework, dump_format, format_version, tool, start_ts, hf_checkpoint, wandb_project,"
    " wandb_run_id, tags_json, source_dir, extracted_at, schema_version"
)


def run_level_rows(
    con: duckdb.DuckDBPyConnection, steps: tuple[pa.Table, pa.Table] | None = None
) -> RunLevel:
    """The runs page's rows and the per-step rows they are pooled from (`RunLevel`), from the
    catalog `con` reads: its per-step rows as `steps` gives them (`step_rows.StepRowsKept`:
    `STEP_COUNTS_SQL`'s and `drift_steps`'), else read."""
    runs = tuple(run_names(con))
    counted, drift = read_step_rows(con) if steps is None else steps
    step_counts = _clean(counted)
    return RunLevel(
        runs=runs,
        step_counts=step_counts,
        drift_steps=_clean(drift),
        run_rows=_run_rows(con, runs, step_counts, _pooled(con, runs, counted, drift)),
    )


# What the per-step rows' queries name.
STEP_ROWS_READS = ("sample_stats", "drift_steps", "runs")


def read_step_rows(
    con: duckdb.DuckDBPyConnection, queries: dict[str, str] | None = None
) -> tuple[pa.Table, pa.Table]:
    """`STEP_COUNTS_SQL`'s rows and `drift_steps`' of the catalog `con` reads, or, given
    `queries` (`catalog.steps_view_queries`), of the steps whose files those read (as TEMP
    views of `con` while they are read)."""
    made: list[str] = []
    try:
        if queries is not None:
            read = tables_read(con, STEP_ROWS_READS)
            chosen = {name: query for name, query in queries.items() if name in read}
            made = list(chosen)
            read_only_step(con, chosen)
        counted = con.sql(STEP_COUNTS_SQL).to_arrow_table()
        drift = con.sql("SELECT * FROM drift_steps ORDER BY run, rollout_id").to_arrow_table()
    finally:
        for name in made:
            con.execute(f"DROP VIEW IF EXISTS temp.{name}")
    return counted, drift


def kept_rows(
    con: duckdb.DuckDBPyConnection,
    records: list[manifest.RunManifest],
    run_level: RunLevel | None = None,
) -> Kept:
    """What the pages reuse (`Kept`), from the catalog `con` reads and the manifests it was
    built from (as served): each per-step view read once (`run_level`'s rows of the same
    catalog version when given), and the rest derived from its rows."""
    level = run_level_rows(con) if run_level is None else run_level
    step_stats = rows(con, "SELECT * FROM step_stats ORDER BY run, rollout_id")
    groups: dict[tuple[str, int, bool], list[Row]] = {}
    for group in rows(con, "SELECT * FROM group_stats ORDER BY run, rollout_id, group_index"):
        key = (str(group["run"]), int(group["rollout_id"]), bool(group["evaluation"]))
        groups.setdefault(key, []).append(group)
    steps: dict[str, list[Row]] = {name: [] for name in level.runs}
    for step in level.step_counts:
        steps.setdefault(step["run"], []).append(
            {"rollout_id": step["rollout_id"], "evaluation": step["evaluation"]}
        )
    return Kept(
        runs=level.runs,
        steps=steps,
        step_stats=_by_step(step_stats),
        drift_steps=_by_step(level.drift_steps),
        groups=groups,
        step_datasets=_step_datasets(step_stats, level.step_counts, level.drift_steps),
        records=records,
        step_tables=step_page_tables(con),
        settings_digests=rollups.settings_digests(con),
    )


# What the step page's queries name: its views (`drift_by_token` reads the vocabulary).
STEP_PAGE_READS = (
    "sample_stats",
    "drift_samples",
    "drift_by_position",
    "drift_by_prob",
    "drift_by_turn",
    "drift_by_weight_version",
    "drift_by_token",
)


def step_page_tables(con: duckdb.DuckDBPyConnection) -> frozenset[str]:
    """Every view and table macro the step page reads (`tables_read`)."""
    return tables_read(con, STEP_PAGE_READS)


# A macro's name where `sql/macros/` creates it.
_MACRO = re.compile(r"CREATE\s+OR\s+REPLACE\s+MACRO\s+([a-z_][a-z0-9_]*)", re.IGNORECASE)


def tables_read(con: duckdb.DuckDBPyConnection, reads: Sequence[str]) -> frozenset[str]:
    """`reads` and every view and table macro they read, through the views and macros each
    one's definition names (a column named like one counts too: more, never fewer). The
    macros that read tables are tokenlake's own, `sql/macros/` (user views cannot make one,
    and the catalog's other two return literals), read from their files, each up to the next
    (`duckdb_functions()` would list every built-in function too: ~20 ms)."""
    definitions = dict(
        con.execute("SELECT view_name, sql FROM duckdb_views() WHERE NOT internal").fetchall()
    )
    for path in sql_views.iter_macro_files():
        text = path.read_text(encoding="utf-8")
        starts = list(_MACRO.finditer(text))
        for start, following in zip(starts, [*starts[1:], None], strict=True):
            end = len(text) if following is None else following.start()
            definitions.setdefault(start.group(1).lower(), text[start.end() : end])
    found: set[str] = set()
    named = list(reads)
    while named:
        name = named.pop()
        if name not in found:
            found.add(name)
            words = set(re.findall(r"[a-z_][a-z0-9_]*", (definitions.get(name) or "").lower()))
            named.extend(words & definitions.keys())
    return frozenset(found)


def _clean(table: pa.Table) -> Rows:
    return [{k: rd.clean(v) for k, v in row.items()} for row in table.to_pylist()]


def _by_step(found: Rows) -> dict[StepKey, Row]:
    return {(str(row["run"]), int(row["rollout_id"])): row for row in found}


def _step_datasets(step_stats: Rows, step_counts: Rows, drift_steps: Rows) -> dict[str, Rows]:
    """`report_data.step_datasets` of every run, from the per-step rows already read."""

    def columns(found: Rows, names: Sequence[str]) -> Rows:
        return [{k: row[k] for k in ("run", "rollout_id", *names)} for row in found]

    evals = [
        {
            "run": row["run"],
            "rollout_id": row["rollout_id"],
            "eval_reward_mean": row["eval_reward_mean"],
            "samples": row["eval_rewards"],
        }
        for row in step_counts
        if row["evaluation"] and row["eval_rewards"]
    ]
    return {
        "step_stats": columns(step_stats, rd.STEP_STATS_COLUMNS),
        "eval_reward": evals,
        "drift_steps": columns(drift_steps, rd.DRIFT_STEP_COLUMNS),
    }


def _pooled(
    con: duckdb.DuckDBPyConnection, runs: Sequence[str], counted: pa.Table, drift: pa.Table
) -> dict[str, Row]:
    """Per run, `report_data.run_summary`'s values, pooled from the per-step rows (as read,
    NaN included) by the same sums."""
    pooled = _by_run(_over(con, drift, "kept_drift", rd.pooled_drift("kept_drift", "true")))
    rewards = _by_run(_over(con, counted, "kept_steps", POOLED_REWARDS_SQL))
    summary: dict[str, Row] = {}
    for name in runs:
        d, r = pooled.get(name, {}), rewards.get(name, {})
        summary[name] = {
            "run": name,
            "drift_steps": d.get("drift_steps", 0),
            "tokens": d.get("tokens", 0),
            **{k: d.get(k) for k in ("mean_abs_lp_diff", "k3_kl", "ess_min", "ess_min_step")},
            "reward_mean": r.get("reward_mean"),
            "eval_reward_mean": r.get("eval_reward_mean"),
        }
    return summary


def _over(con: duckdb.DuckDBPyConnection, table: pa.Table, name: str, sql: str) -> Rows:
    """Rows of `sql` over `table` (rows already read), named `name` in it."""
    relation = con.from_arrow(table).query(name, sql)
    if relation is None:  # a statement without a result: none of this module's
        raise ValueError(f"not a query: {sql}")
    return _clean(relation.to_arrow_table())


def _by_run(found: Rows) -> dict[str, Row]:
    return {str(row["run"]): row for row in found}


def _run_rows(
    con: duckdb.DuckDBPyConnection,
    runs: Sequence[str],
    step_counts: Rows,
    summary: dict[str, Row],
) -> list[Row]:
    """The runs page's rows: each run's metadata and tags, its steps and samples
    (`report_data.runs_overview`, whose token count the summary's drift tokens replace, as on
    the page before) and its summary (`report_data.run_summary`)."""
    meta = {r["run"]: r for r in rows(con, f"SELECT {RUNS_COLUMNS} FROM runs ORDER BY run")}
    found = []
    for name in runs:
        own = [step for step in step_counts if step["run"] == name]
        training = [step for step in own if not step["evaluation"]]
        overview = {
            "steps": len(training),
            "eval_steps": len(own) - len(training),
            "samples": sum(step["samples"] for step in training),
        }
        row = {**meta[name], **overview, **summary[name]}
        row["tags"] = _tags(row.pop("tags_json", None))
        found.append(row)
    return found


def runs_page(level: RunLevel) -> dict[str, Any]:
    """Every run: its metadata and tags, steps, samples, tokens, reward and headline drift
    (from `level`). The audits it fails are `failing_audits`, which the server runs apart
    (they take longer than the rest of the page together)."""
    return {"runs": level.run_rows, "colours": run_colours(list(level.runs))}


def _tags(text: str | None) -> dict[str, str]:
    try:
        parsed = json.loads(text) if text else {}
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in parsed.items()} if isinstance(parsed, dict) else {}


def failing_audits(
    con: duckdb.DuckDBPyConnection, stopped: Callable[[], bool] = lambda: False
) -> dict[str, list[dict[str, Any]]]:
    """Per run, each audit with offending rows: name, severity, rows.

    Raises:
        UsageError: `stopped()` became true (checked before each audit file).
    """
    found: dict[str, list[dict[str, Any]]] = {}
    for path in sql_views.iter_audit_files():
        if stopped():
            raise UsageError("The audits were stopped.")
        text = path.read_text(encoding="utf-8").strip().rstrip(";")
        columns = [c[0] for c in con.execute(f"SELECT * FROM ({text}) LIMIT 0").description]
        if "run" not in columns:
            continue
        severity = audit.severity(path, text)
        counted = con.execute(f"SELECT run, count(*) FROM ({text}) GROUP BY run").fetchall()
        for run, count in counted:
            entry = {"name": path.stem, "severity": severity, "rows": int(count)}
            found.setdefault(str(run), []).append(entry)
    return found


def steps_page(con: duckdb.DuckDBPyConnection, kept: Kept, runs: Sequence[str]) -> dict[str, Any]:
    """Per step of the chosen runs: reward health, eval reward, drift (from `kept`, the
    catalog version `con` reads), the logged metrics, and the alarm thresholds."""
    for name in runs:
        if name not in kept.runs:
            raise UsageError(f"The lake has no run {json.dumps(name)}.")
    chosen = sorted(set(runs))
    if not chosen:
        raise UsageError("Choose at least one run.")
    datasets = {
        name: [row for row in found if row["run"] in chosen]
        for name, found in kept.step_datasets.items()
    }
    holes = ", ".join("?" for _ in chosen)
    metrics = rows(
        con,
        f"SELECT run, step, metric, value FROM metrics WHERE run IN ({holes})"
        f" AND step IS NOT NULL ORDER BY run, metric, step LIMIT {METRIC_ROWS}",
        chosen,
    )
    return {
        "runs": chosen,
        "all_runs": list(kept.runs),
        "colours": run_colours(list(kept.runs)),
        **datasets,
        "metrics": metrics,
        "settings": rd.settings(con),
    }


# The columns of `drift_samples` that `sample_stats` holds too (the step page's samples
# table shows sample_stats' one); its `tokens` is shown as `drift_tokens`.
SAMPLE_STATS_HOLDS = (
    "run, rollout_id, evaluation, batch_position, sample_index, mean_abs_lp_diff,"
    " max_abs_lp_diff, reward, raw_reward, staleness"
)


def step_page(
    con: duckdb.DuckDBPyConnection, kept: Kept, run: str, step: int, evaluation: bool
) -> dict[str, Any]:
    """One step: its numbers, every sample (every column of `sample_stats` and
    `drift_samples`), its groups and its drift breakdowns. Its `step_stats`, `drift_steps` and
    `group_stats` rows and the run's steps come from `kept` (the catalog version `con` reads)."""
    if run not in kept.runs:
        raise UsageError(f"The lake has no run {json.dumps(run)}.")
    key = [run, step]
    samples = rows(
        con,
        f"SELECT s.*, d.* EXCLUDE ({SAMPLE_STATS_HOLDS}, tokens), d.tokens AS drift_tokens"
        " FROM sample_stats AS s LEFT JOIN drift_samples AS d USING"
        " (run, rollout_id, evaluation, batch_position)"
        " WHERE s.run = ? AND s.rollout_id = ? AND s.evaluation = ? ORDER BY s.batch_position",
        [*key, evaluation],
    )
    if not samples:
        raise UsageError(f"Run {json.dumps(run)} has no {_kind(evaluation)} step {step}.")
    numbers = kept.step_stats.get((run, step))
    drift = kept.drift_steps.get((run, step))
    return {
        "run": run,
        "step": step,
        "evaluation": evaluation,
        "numbers": None if evaluation else numbers,
        "drift": None if evaluation else drift,
        "samples": samples,
        "groups": kept.groups.get((run, step, evaluation), []),
        "breakdowns": {} if evaluation else _breakdowns(con, key),
        "steps": kept.steps.get(run, []),
    }


def read_only_step(con: duckdb.DuckDBPyConnection, queries: dict[str, str]) -> None:
    """Make `con` read one step's files: each base view and stored rollup of
    `catalog.step_view_queries` as a TEMP view of this connection, which the catalog's views
    read in place of their own (other connections are untouched)."""
    for name, query in queries.items():
        if not re.fullmatch(r"[a-z_]+", name):  # tokenlake's own table names only
            raise ValueError(f"not a table of the lake: {name!r}")
        con.execute(f"CREATE TEMP VIEW {name} AS {query}")


def _kind(evaluation: bool) -> str:
    return "eval" if evaluation else "training"


def _one(con: duckdb.DuckDBPyConnection, sql: str, params: Sequence[Any]) -> dict[str, Any] | None:
    found = rows(con, sql, params)
    return found[0] if found else None


def _breakdowns(con: duckdb.DuckDBPyConnection, key: list[Any]) -> dict[str, Rows]:
    where = "WHERE run = ? AND rollout_id = ?"
    stats = "tokens, samples, mean_abs_lp_diff, k3_kl, k3_share"
    return {
        "position": rows(
            con,
            f"SELECT position_low, position_high, {stats} FROM drift_by_position {where}"
            " ORDER BY position_low",
            key,
        ),
        "prob": rows(
            con,
            f"SELECT dimension, bucket_low, bucket_high, {stats} FROM drift_by_prob {where}"
            " ORDER BY dimension, bucket",
            key,
        ),
        "turn": rows(
            con, f"SELECT turn_index, {stats} FROM drift_by_turn {where} ORDER BY turn_index", key
        ),
        "weight_version": rows(
            con,
            f"SELECT * EXCLUDE (run, rollout_id) FROM drift_by_weight_version {where} ORDER BY ALL",
            key,
        ),
        "token": rows(  # the view holds each token's text (from `vocab`) already
            con,
            "SELECT token_id, token_text, tokens, samples, mean_abs_lp_diff, k3_kl, k3_share"
            f" FROM drift_by_token {where} ORDER BY k3_share DESC NULLS LAST, token_id LIMIT 30",
            key,
        ),
    }


def sample_page(
    con: duckdb.DuckDBPyConnection, run: str, step: int, position: int, evaluation: bool
) -> dict[str, Any]:
    """One sample: its row, its texts and conversation, every token with every statistic,
    its neighbours, its group's siblings and the same sample index in the other runs.

    The tokens are read with the run, the step and the evaluation flag in the condition, so
    DuckDB reads only that step's file, and the batch position prunes its row groups.
    """
    _known(con, [run])
    key = [run, step, evaluation, position]
    sample = _one(
        con,
        "SELECT s.*, x.prompt_text, x.response_text, x.messages_json, x.label,"
        " x.metadata_json, x.prompt_length FROM sample_stats AS s JOIN samples AS x"
        " USING (run, rollout_id, evaluation, batch_position)"
        " WHERE s.run = ? AND s.rollout_id = ? AND s.evaluation = ? AND s.batch_position = ?",
        key,
    )
    if sample is None:
        raise UsageError(
            f"Run {json.dumps(run)} has no sample at batch position {position}"
            f" in {_kind(evaluation)} step {step}."
        )
    return {
        "run": run,
        "step": step,
        "evaluation": evaluation,
        "sample": sample,
        "messages": _messages(sample.pop("messages_json")),
        "tokens": sample_tokens(con, key),
        "stats": {
            name: {k: v for k, v in s.items() if k != "sql"} for name, s in TOKEN_STATS.items()
        },
        "neighbours": _neighbours(con, key),
        "siblings": _siblings(con, key, sample.get("group_index")),
        "other_runs": _other_runs(con, run, step, evaluation, sample.get("sample_index")),
    }


def _messages(text: str | None) -> Any:
    """The conversation as the dump holds it (JSON), or its text when it is not JSON."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def sample_tokens(con: duckdb.DuckDBPyConnection, key: list[Any]) -> dict[str, list[Any]]:
    """Every response token of one sample, one list per column, by position."""
    stats = ", ".join(f"{spec['sql']} AS {name}" for name, spec in TOKEN_STATS.items())
    table = con.sql(
        f"SELECT t.position, t.token_id, v.token_text AS text, t.loss_mask, t.turn_index, {stats}"
        " FROM tokens AS t LEFT JOIN vocab AS v ON v.run = t.run AND v.token_id = t.token_id"
        " WHERE t.run = ? AND t.rollout_id = ? AND t.evaluation = ? AND t.batch_position = ?"
        f" ORDER BY t.position LIMIT {MAX_SAMPLE_TOKENS}",
        params=key,
    ).to_arrow_table()
    columns = {name: table.column(name).to_pylist() for name in table.column_names}
    for name in TOKEN_STATS:
        columns[name] = [_token_value(v) for v in columns[name]]
    return columns


def _token_value(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value


def _neighbours(con: duckdb.DuckDBPyConnection, key: list[Any]) -> dict[str, Any]:
    found = con.execute(
        "SELECT max(batch_position) FILTER (WHERE batch_position < $4),"
        " min(batch_position) FILTER (WHERE batch_position > $4) FROM samples"
        " WHERE run = $1 AND rollout_id = $2 AND evaluation = $3",
        key,
    ).fetchall()
    previous, following = found[0] if found else (None, None)
    return {"previous": previous, "next": following}


def _siblings(con: duckdb.DuckDBPyConnection, key: list[Any], group: Any) -> Rows:
    if group is None:
        return []
    return rows(
        con,
        "SELECT batch_position, sample_index, reward, raw_reward, response_length,"
        " mean_abs_lp_diff FROM sample_stats WHERE run = ? AND rollout_id = ?"
        " AND evaluation = ? AND group_index = ? ORDER BY batch_position",
        [*key[:3], group],
    )


def _other_runs(
    con: duckdb.DuckDBPyConnection, run: str, step: int, evaluation: bool, index: Any
) -> Rows:
    if index is None:
        return []
    return rows(
        con,
        "SELECT run, batch_position FROM samples WHERE run <> ? AND rollout_id = ?"
        " AND evaluation = ? AND sample_index = ? ORDER BY run, batch_position",
        [run, step, evaluation, index],
    )
