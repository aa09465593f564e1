"""One front door: `tokenlake.Lake` does what each command does, with the same words.

Every CLI command is a few lines over one method of the lake; a Python user holding the same
object gets the same results and the same errors (the text after the CLI's `Error: `).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from click.testing import CliRunner

import tokenlake
from tests.fixture_paths import REAL_DUMPS
from tokenlake.cli import main
from tokenlake.errors import LakeError, PipelineError, UsageError
from tokenlake.orchestrate.extract import ExtractOptions
from tokenlake.orchestrate.maintain import TagResult, ViewsResult
from tokenlake.store.local import LocalStore

BASIC = REAL_DUMPS / "basic"


def cli(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def error_of(call) -> str:  # noqa: ANN001 - any call
    with pytest.raises(PipelineError) as caught:
        call()
    return f"Error: {caught.value}\n"


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> tokenlake.Lake:
    folder = tmp_path_factory.mktemp("front")
    opened = tokenlake.Lake(folder / "lake")
    summary = opened.extract(BASIC, run_name="basic", tags={"team": "rl"})
    assert summary.run == "basic"
    assert repr(summary.counts) == (
        "{'new': 3, 'updated': 0, 'unchanged': 0, 'removed': 0, 'skipped': 0}"
    )  # as docs/python.md shows it
    return opened


def test_the_lake_holds_a_store_resolved_once(tmp_path: Path) -> None:
    lake = tokenlake.Lake(tmp_path / "nowhere")  # nothing is read or checked yet
    assert isinstance(lake.store, LocalStore)
    assert tokenlake.Lake(lake.store).store is lake.store
    assert repr(lake) == f"Lake({str(tmp_path / 'nowhere')!r})"


@pytest.mark.slow
def test_query_verify_and_audit_answer_as_the_commands_do(lake: tokenlake.Lake) -> None:
    table = lake.query("SELECT count(*) AS n FROM tokens")
    assert table.to_pylist() == [{"n": 206}]
    code, out, _ = cli(
        "query", str(lake.root), "SELECT count(*) AS n FROM tokens", "--format", "csv"
    )
    assert (code, out) == (0, '"n"\n206\n')
    checked, problems = lake.verify("basic")
    assert (checked, problems) == (3, [])
    assert cli("verify", str(lake.root), "--run", "basic")[:2] == (
        0,
        "3 steps checked, 0 problems\n",
    )
    assert [r.name for r in lake.audit()] == [r.name for r in lake.audit({})]


@pytest.mark.slow
def test_tag_drop_and_views_are_methods(tmp_path: Path) -> None:
    with tokenlake.Lake(tmp_path / "lake") as lake:
        lake.extract(BASIC, ExtractOptions(run_name="one", steps=[0]))
        assert lake.tag("one", {"precision": "fp8"}) == TagResult({"precision": "fp8"}, ())
        assert lake.tag("one", {}, remove=["precision"]) == TagResult({}, ())
        assert lake.build_views() == ViewsResult(tmp_path / "lake" / "tokenlake.duckdb", 0, ())
        assert lake.build_views(recompute=True).rollups_computed == 2  # step 0, its eval file
        assert lake.sql("SELECT count(*) FROM runs").fetchall() == [(1,)]
        lake.drop("one")
        assert lake.sql("SELECT count(*) FROM runs").fetchall() == [(0,)]


def test_options_are_refused_as_the_cli_refuses_them(tmp_path: Path) -> None:
    lake = tokenlake.Lake(tmp_path / "lake")
    cases = [
        ({"ray_address": "auto"}, ["--ray-address", "auto"]),
        ({"follow": True, "executor": "ray"}, ["--follow", "--executor", "ray"]),
        ({"follow": True, "strict": True}, ["--follow", "--strict"]),
    ]
    for fields, flags in cases:
        said = error_of(lambda f=fields: lake.extract(BASIC, **f))
        code, _, err = cli("extract", str(BASIC), "--lake", str(tmp_path / "lake"), *flags)
        assert (code, err) == (1, said)
    assert error_of(lambda: lake.extract(BASIC, executor="spark")) == (
        "Error: Unknown executor `spark`; choose `local` or `ray`.\n"
    )
    with pytest.raises(TypeError, match="run_nme"):
        lake.extract(BASIC, run_nme="typo")  # a misspelled option is never ignored
    assert not (tmp_path / "lake").exists()  # refused before anything was written


def test_errors_are_the_commands_errors(tmp_path: Path) -> None:
    stray = tmp_path / "stray"
    stray.mkdir()
    lake = tokenlake.Lake(stray)
    for said, args in [
        (error_of(lake.verify), ["verify", str(stray)]),
        (error_of(lambda: lake.drop("x")), ["drop", str(stray), "x"]),
        (error_of(lambda: lake.query("SELECT 1")), ["query", str(stray), "SELECT 1"]),
        (error_of(lake.build_views), ["views", str(stray)]),
    ]:
        assert cli(*args)[0] == 1
        assert cli(*args)[2] == said
    assert error_of(lake.verify) == (
        f"Error: Lake `{stray}`: is not a lake: it has no `_manifest/`; run `tokenlake extract`"
        " first\n"
    )
    with pytest.raises(LakeError):
        tokenlake.open_lake(stray)  # the notebook's checked way in


def test_an_options_object_is_one_value_for_every_caller() -> None:
    options = ExtractOptions(run_name="r", workers=2)
    assert options.check() is options
    assert dataclasses.replace(options, follow=True).follow is True
    with pytest.raises(UsageError, match="--steps cannot be combined with --follow"):
        ExtractOptions(follow=True, steps=[1]).check()


@pytest.mark.slow
def test_frames_take_steps_and_runs_as_the_cli_does(lake: tokenlake.Lake) -> None:
    def rows(**selection: object) -> int:
        return lake.samples(**selection).collect().height

    every = rows()
    assert rows(run="basic", steps="0-1") == rows(steps=[0, 1]) == rows(steps=range(0, 2))
    assert 0 < rows(steps=1) < rows(steps="0-1") == every  # steps 0, 1 and eval 0
    assert rows(run=["basic"]) == every
    said = error_of(lambda: lake.tokens(run="nope"))
    assert said == "Error: Unknown run `nope`; the lake has runs: `basic`\n"
    code, _, err = cli("report", str(lake.root), "--run", "nope", "-o", str(lake.root / "r.html"))
    assert (code, err) == (1, said)
    assert error_of(lambda: lake.samples(steps=["1"])) == (
        "Error: steps: `'1'` is not a step id; give ints, a range, or a string like `0-9,12`.\n"
    )
    assert error_of(lambda: lake.samples(steps="0-x")) == (
        "Error: --steps `0-x` is not a list of steps or ranges like `0-9,12`.\n"
    )
    assert error_of(lambda: lake.samples(steps="50-60")) == (
        "Error: --steps `50-60` selects no step of the lake; its steps are 0-1.\n"
    )


@pytest.mark.slow
def test_a_report_of_no_step_is_an_error(lake: tokenlake.Lake, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    code, _, err = cli("report", str(lake.root), "--steps", "50-60", "-o", str(out))
    assert (code, err) == (
        1,
        "Error: --steps `50-60` selects no step of the lake; its steps are 0-1.\n",
    )
    assert not out.exists()


@pytest.mark.slow
def test_sql_binds_parameters(lake: tokenlake.Lake) -> None:
    query = "SELECT count(*) FROM samples WHERE run = ? AND rollout_id = ?"
    assert lake.sql(query, params=["basic", 0]).fetchall() == [
        (lake.samples(steps=0).collect().height,)
    ]
    hostile = "basic' OR '1'='1"
    assert lake.sql(
        "SELECT count(*) FROM samples WHERE run = $run", {"run": hostile}
    ).fetchall() == [(0,)]
