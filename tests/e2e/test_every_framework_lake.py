"""One lake holding a run of every framework, eval and rollout-only steps included, and every
command and every public `Lake` method run on it.

The lake is where NULLs are everywhere the schema allows them: NeMo-RL's validation samples
have no tokens (NULL lengths), its runs no group index, rank or truncation flag; a rollout-only
step has no train values; an eval step no rewards of some frameworks. Each command must answer
on it with its usual lines and exit code, never a traceback.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.fixture_paths import NEMO_RL_REAL, REAL_DUMPS, SLIME_REAL
from tokenlake import Lake, open_lake
from tokenlake.cli import main

pytestmark = pytest.mark.slow  # extracts five real dumps

# run name -> the dump it is extracted from (a rollout-only copy is made in the fixture)
RUNS = {
    "miles": REAL_DUMPS / "removed",  # 3 training steps, an eval step, removed samples
    "rollout-only": None,  # `basic` without step 1's train files
    "slime1": SLIME_REAL / "v1_tp2",
    "slime2": SLIME_REAL / "v2_dp2_cp2",
    "nemo": NEMO_RL_REAL / "grpo_multiturn",  # with validation lines (val_data_step2)
}
STEPS = 19  # 4 + 3 + 4 + 4 + 4, eval steps included
TOKENS = {"miles": 278, "nemo": 1720, "rollout-only": 206, "slime1": 1265, "slime2": 1194}
STEP_STATS = (
    "run           rollout_id  n_samples  reward_mean  mean_abs_lp_diff\n"
    "------------  ----------  ---------  -----------  ----------------\n"
    "miles                  0          8         0.25          0.306057\n"
    "miles                  1          8        0.375          0.378796\n"
    "miles                  2          8          0.5          0.333293\n"
    "nemo                   1         16          0.5         0.0374393\n"
    "nemo                   2         16       0.1875         0.0374435\n"
    "nemo                   3         16         0.25         0.0407175\n"
    "rollout-only           0          8         0.25          0.309365\n"
    "rollout-only           1          8         NULL              NULL\n"
    "slime1                 0         16         0.25         0.0382898\n"
    "slime1                 1         16        0.375          0.051943\n"
    "slime1                 2         16         0.25         0.0378136\n"
    "slime2                 0         16       0.3125         0.0466185\n"
    "slime2                 1         16         0.25          0.045089\n"
    "slime2                 2         16       0.3125         0.0345635\n"
    "(14 rows)\n"
)
STEP_STATS_SQL = (
    "SELECT run, rollout_id, n_samples, reward_mean, mean_abs_lp_diff FROM step_stats"
    " ORDER BY run, rollout_id"
)


def cli(*args: object) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert not isinstance(result.exception, Exception) or isinstance(
        result.exception, SystemExit
    ), f"{args}: {result.exception!r}"
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("every-framework")
    rollout_only = root / "rollout-only"
    shutil.copytree(REAL_DUMPS / "basic", rollout_only)
    for train_file in rollout_only.glob("train_data/1_*.pt"):
        train_file.unlink()  # step 1 keeps its rollout file only
    lake = root / "lake"
    for run, dump in RUNS.items():
        source = dump or rollout_only
        code, out, err = cli("extract", source, "--lake", lake, "--run-name", run, "--workers", 1)
        assert code == 0, err
        assert out.startswith(f"Run `{run}`: ") and ", 0 skipped steps; wrote " in out
        assert f" and {TOKENS[run]:,} tokens in " in out
    return lake


@pytest.fixture
def lake(template: Path, tmp_path: Path) -> Path:
    """A private copy of the lake, for a test that changes it."""
    copy = tmp_path / "lake"
    shutil.copytree(template, copy)
    assert cli("views", copy)[0] == 0  # its views point at the copy
    return copy


def test_verify_counts_no_token_rows_for_samples_logged_without_tokens(template: Path) -> None:
    assert cli("verify", template) == (0, f"{STEPS} steps checked, 0 problems\n", "")
    assert cli("verify", template, "--run", "nemo") == (0, "4 steps checked, 0 problems\n", "")


def test_verify_deep_compares_every_steps_rollups(template: Path) -> None:
    assert cli("verify", template, "--deep") == (0, f"{STEPS} steps checked, 0 problems\n", "")


def test_query_prints_nulls_as_null(template: Path) -> None:
    assert cli("query", template, STEP_STATS_SQL) == (0, STEP_STATS, "")


@pytest.mark.parametrize("fmt", ["csv", "json", "parquet"])
def test_query_writes_every_sample_in_every_format(
    template: Path, tmp_path: Path, fmt: str
) -> None:
    out = tmp_path / f"samples.{fmt}"
    sql = "SELECT * FROM samples ORDER BY run, rollout_id, evaluation, batch_position"
    assert cli("query", template, sql, "--format", fmt, "-o", out) == (0, "", "")
    import polars as pl

    if fmt == "json":  # JSON Lines; a column NULL in the first rows has numbers later
        frame = pl.read_ndjson(out, infer_schema_length=None)
    else:
        frame = pl.read_csv(out) if fmt == "csv" else pl.read_parquet(out)
    assert frame.height == 212
    validation = frame.filter((pl.col("run") == "nemo") & pl.col("evaluation"))
    assert validation["response_length"].to_list() == [None, None, None, None]


def test_every_view_answers(template: Path) -> None:
    with open_lake(template) as opened:
        names = [
            name
            for (name,) in opened.sql(
                "SELECT view_name FROM duckdb_views() WHERE NOT internal ORDER BY 1"
            ).fetchall()
        ]
        assert len(names) > 20
        for name in names:
            opened.sql(f'SELECT * FROM "{name}"').fetchall()


def test_audit_reads_every_run(template: Path) -> None:
    code, out, err = cli("audit", template)
    assert (code, err) == (1, "")
    assert out.splitlines()[-1] == "1 of 15 audits failed; 4 warnings, 2 info."


def test_report_draws_every_run_and_each_alone(template: Path, tmp_path: Path) -> None:
    code, out, err = cli("report", template, "-o", tmp_path / "all.html")
    assert (code, err) == (0, "")
    assert re.fullmatch(rf"Wrote {tmp_path}/all\.html \(\d\.\d MB, 5 runs\) in \d+\.\d s\n", out)
    for run in RUNS:
        code, out, _ = cli("report", template, "--run", run, "-o", tmp_path / f"{run}.html")
        assert (code, out.split(" (")[0]) == (0, f"Wrote {tmp_path}/{run}.html"), run
    only = ("--run", "rollout-only", "--steps", "1", "--worst", 0, "-o", tmp_path / "one.html")
    code, out, _ = cli("report", template, *only)
    assert code == 0, out


def test_views_and_recompute(lake: Path) -> None:
    assert cli("views", lake) == (0, f"Rebuilt {lake}/tokenlake.duckdb\n", "")
    assert cli("views", lake, "--recompute") == (
        0,
        f"Computed the rollups of {STEPS} steps from their tokens.\n"
        f"Rebuilt {lake}/tokenlake.duckdb\n",
        "",
    )
    assert cli("query", lake, STEP_STATS_SQL) == (0, STEP_STATS, "")


def test_tag_then_drop(lake: Path) -> None:
    assert cli("tag", lake, "nemo", "precision=bf16") == (
        0,
        "Run `nemo` tags: precision=bf16\n",
        "",
    )
    assert cli("drop", lake, "nemo") == (0, f"Dropped run `nemo` from {lake}\n", "")
    assert cli("verify", lake) == (0, f"{STEPS - 4} steps checked, 0 problems\n", "")


# Every public method of `Lake`, each called by a test below: a new one must be added here.
LAKE_METHODS = {
    "audit",
    "build_views",
    "close",
    "drop",
    "extract",
    "follow",
    "metrics",
    "query",
    "query_text",
    "report",
    "root",
    "runs",
    "samples",
    "serve",  # tests/serve/test_explorer.py serves a lake through it
    "sql",
    "tag",
    "tokens",
    "verify",
}


def test_the_api_tests_cover_every_public_method() -> None:
    public = {name for name in dir(Lake) if not name.startswith("_")}
    assert public == LAKE_METHODS


def test_reading_methods(template: Path, tmp_path: Path) -> None:
    with open_lake(template) as opened:
        assert opened.root == template
        assert opened.verify() == (STEPS, [])
        assert opened.verify(deep=True) == (STEPS, [])
        tokens = opened.tokens().group_by("run").len().sort("run").collect().rows()
        assert tokens == sorted(TOKENS.items())
        validation = opened.samples(run="nemo", steps=[2], columns=["evaluation", "reward"])
        assert validation.filter("evaluation").collect()["reward"].to_list() == [0.0, 1.0, 0.0, 1.0]
        assert opened.runs().select("run").sort("run").collect()["run"].to_list() == sorted(RUNS)
        assert opened.metrics().collect().height == 0
        assert opened.query(STEP_STATS_SQL).num_rows == 14
        assert opened.sql("SELECT count(*) FROM samples").fetchall() == [(212,)]
        assert opened.query_text("SELECT count(*) AS n FROM samples", "csv") == '"n"\n212\n'
        assert [r.name for r in opened.audit() if r.rows.num_rows and r.severity == "error"] == [
            "framework_gates"  # the miles fixtures' noise log-probs fail miles' own gate
        ]
        summary = opened.report(tmp_path / "r.html", runs=["nemo", "rollout-only"])
        assert summary.runs == ("nemo", "rollout-only")


def test_writing_methods(lake: Path) -> None:
    with Lake(lake) as opened:
        assert opened.tag("slime2", {"precision": "fp8"}).tags == {"precision": "fp8"}
        assert opened.build_views(recompute=True).rollups_computed == STEPS
        again = opened.extract(NEMO_RL_REAL / "grpo_multiturn", run_name="nemo", workers=1)
        assert again.counts["unchanged"] == 4
        rounds: list[dict[str, int]] = []
        opened.follow(
            NEMO_RL_REAL / "grpo_multiturn",
            run_name="nemo",
            workers=1,
            on_round=lambda summary: rounds.append(dict(summary.counts)),
            should_stop=lambda: bool(rounds),
        )
        assert rounds == [{"new": 0, "updated": 0, "unchanged": 4, "removed": 0, "skipped": 0}]
        opened.drop("nemo")
        assert opened.verify() == (STEPS - 4, [])
