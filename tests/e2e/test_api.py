"""tokenlake.open_lake / tokenlake.Lake: the frames equal the catalog's views, exactly."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest

import tokenlake
from tokenlake import lake as api
from tokenlake import schema
from tokenlake.errors import LakeError, UnknownRunError, UsageError
from tokenlake.generator import synth
from tokenlake.store import manifest

SPEC = replace(synth.PRESETS["example"], miles_dashboard=True)
KEYS = {
    schema.TOKENS: ["run", "rollout_id", "evaluation", "batch_position", "position"],
    schema.SAMPLES: ["run", "rollout_id", "evaluation", "batch_position"],
    schema.RUNS: ["run"],
    schema.METRICS: ["run", "ts", "metric"],
}


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> tokenlake.Lake:
    folder = tmp_path_factory.mktemp("api")
    synth.write_dump(folder / "dump", SPEC)
    opened = tokenlake.open_lake(folder / "lake", create=True)
    opened.extract(folder / "dump", run_name="a", tags={"precision": "fp8"})
    opened.extract(folder / "dump", run_name="b", steps=[1, 2])
    return opened


def test_open_lake_is_the_api_class():
    assert tokenlake.open_lake is api.open_lake and tokenlake.Lake is api.Lake
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        tokenlake.nope  # noqa: B018


@pytest.mark.parametrize(
    ("location", "line"),
    [
        ("", "The lake's location is empty; give its folder (`.` for this one) or its URL."),
        ("  ", "The lake's location is empty; give its folder (`.` for this one) or its URL."),
        (None, "A lake's location is a folder or a URL (str or os.PathLike), not None."),
        (123, "A lake's location is a folder or a URL (str or os.PathLike), not 123."),
        (
            b"/tmp/lake",
            "A lake's location is a folder or a URL (str or os.PathLike), not b'/tmp/lake'.",
        ),
    ],
    ids=["empty", "blank", "none", "int", "bytes"],
)
def test_a_location_that_names_no_folder_is_one_usage_error(tmp_path, monkeypatch, location, line):
    # "" was the current folder (Path("") is "."), so an unset variable opened, or extracted
    # into, wherever the notebook ran; None, 123 and b"..." an AttributeError.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError) as info:
        tokenlake.open_lake(location, create=True)
    assert str(info.value) == line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize("table", list(KEYS))
def test_frames_equal_the_sql_views(lake, table):
    frame = getattr(lake, table)().collect().sort(KEYS[table])
    view = lake.sql(f"SELECT * FROM {table}").pl().sort(KEYS[table])
    # DuckDB labels timestamps with its TimeZone setting (the machine's zone): same instants.
    view = view.with_columns(pl.col(pl.Datetime).dt.convert_time_zone("UTC"))
    assert frame.columns == view.columns
    assert frame.schema == view.schema
    assert frame.equals(view)
    assert frame.height > 0


@pytest.mark.slow
def test_runs_frame_holds_meta_and_tags(lake):
    rows = lake.runs().select("run", "wandb_project", "tags_json", "train_steps").collect()
    assert rows.sort("run").rows() == [
        ("a", "tokenlake-synth", '{"precision": "fp8"}', 3),
        ("b", "tokenlake-synth", None, 2),
    ]


@pytest.mark.slow
def test_selections_read_only_the_listed_files(lake):
    frame = lake.tokens(run="b", steps=[2, 7], columns=["token_id", "run"]).collect()
    assert frame.columns == ["run", "rollout_id", "token_id"]
    expected = lake.sql("SELECT count(*) FROM tokens WHERE run = 'b' AND rollout_id = 2")
    assert frame.height == expected.fetchall()[0][0]
    assert frame["rollout_id"].unique().to_list() == [2]
    assert lake.samples(run=["a", "b"], steps=[]).collect().height == 0
    with pytest.raises(UnknownRunError, match="Unknown run `nope`; the lake has runs: `a`, `b`"):
        lake.metrics(run="nope")  # as the CLI says it, never an empty frame
    with pytest.raises(LakeError, match="has no column `lp_dif`"):
        lake.tokens(columns=["lp_dif"])


@pytest.mark.slow
def test_reading_takes_no_lock(lake):
    with lake.store.lock():  # an extraction holds the writer lock meanwhile
        assert lake.tokens(steps=[0]).collect().height == 1943
        assert lake.sql("SELECT count(*) FROM samples").fetchall() == [(176,)]


@pytest.mark.slow
def test_a_superseded_file_makes_the_call_read_the_manifests_again(lake, monkeypatch):
    current = manifest.load_all(lake.store)
    stale = manifest.load_all(lake.store)
    stale[0].steps["0"].files[schema.TOKENS] = "tokens/run=a/rollout_id=0/train-deadbeef.parquet"
    answers = [stale, current]
    monkeypatch.setattr(manifest, "load_all", lambda root: answers.pop(0))
    assert lake.tokens(run="a", steps=[0]).collect().height == 1943
    answers[:] = [stale, stale]
    with pytest.raises(LakeError) as info:
        lake.tokens(run="a", steps=[0])
    assert str(info.value) == (
        f"Lake `{lake.root / 'tokens/run=a/rollout_id=0/train-deadbeef.parquet'}`: is listed"
        " by its run's manifest but is gone; read again"
    )


@pytest.mark.slow
def test_sql_sees_a_new_catalog_after_an_extraction(tmp_path):
    synth.write_dump(tmp_path / "dump", synth.PRESETS["example"])
    lake = tokenlake.open_lake(tmp_path / "lake", create=True)
    lake.extract(tmp_path / "dump", run_name="x", steps=[0])
    assert lake.sql("SELECT count(*) FROM runs").fetchall() == [(1,)]
    lake.extract(tmp_path / "dump", run_name="y", steps=[0])
    assert lake.sql("SELECT list(run ORDER BY run) FROM runs").fetchall() == [(["x", "y"],)]
    lake.close()


@pytest.mark.slow
def test_extract_takes_steps_as_the_other_calls_do(tmp_path):
    # `.extract(steps="1")` or `steps=1` raised TypeError (`1 in "1"`): `.tokens`, `.report`
    # and `tokenlake extract --steps` read those; `steps=["1"]` selected nothing.
    synth.write_dump(tmp_path / "dump", synth.PRESETS["example"])
    lake = tokenlake.open_lake(tmp_path / "lake", create=True)
    assert lake.extract(tmp_path / "dump", run_name="x", steps="1-2").counts["new"] == 2
    assert lake.extract(tmp_path / "dump", run_name="x", steps=0).counts["new"] == 2  # eval 0
    with pytest.raises(UsageError) as refused:
        lake.extract(tmp_path / "dump", run_name="x", steps=["1"])
    assert str(refused.value) == (
        "steps: `'1'` is not a step id; give ints, a range, or a string like `0-9,12`."
    )
    assert sorted(lake.samples().select("rollout_id").unique().collect()["rollout_id"]) == [
        0,
        1,
        2,
    ]
    lake.close()


@pytest.mark.slow
def test_tags_from_python_are_checked_as_the_cli_checks_them(tmp_path):
    # `.extract(tags={"seed": 3})` and `.tag(run, {"seed": 3})` wrote the int into the run's
    # manifest, which every later command then refused as damaged; a key or value `--tag`
    # refuses landed; `remove="abc"` removed the tags `a`, `b` and `c`; a run name that is
    # not a string was an AttributeError.
    synth.write_dump(tmp_path / "dump", synth.PRESETS["example"])
    lake = tokenlake.open_lake(tmp_path / "lake", create=True)
    lake.extract(tmp_path / "dump", run_name="x", steps=[0], tags={"seed": 3, "ema": True})
    assert lake.tag("x", {"lr": 0.5, "a": "1", "b": "2"}).tags == {
        "seed": "3",
        "ema": "true",
        "lr": "0.5",
        "a": "1",
        "b": "2",
    }
    refused = {
        "none": lambda: lake.tag("x", {"note": None}),
        "key": lambda: lake.tag("x", {"bad key": "v"}),
        "newline": lambda: lake.extract(tmp_path / "dump", run_name="x", tags={"a": "1\n2"}),
        "letters": lambda: lake.tag("x", {}, remove="ab"),
        "run": lambda: lake.drop(5),
    }
    errors = {}
    for name, call in refused.items():
        with pytest.raises(UsageError) as info:
            call()
        errors[name] = str(info.value)
    assert errors == {
        "none": "tags: value of `note` is a null; give a string, number or boolean.",
        "key": "tags: key `bad key` must start with a letter or `_` and hold only letters,"
        " digits and `_.-/` (at most 64 characters).",
        "newline": "tags: value of `a` holds a control character (newline, tab).",
        "letters": "--remove `ab`: give a list of keys.",
        "run": "Run name 5 is not a string.",
    }
    assert lake.verify() == (2, [])  # step 0 and eval 0
    assert lake.runs().select("tags_json").collect().item() == (
        '{"a": "1", "b": "2", "ema": "true", "lr": "0.5", "seed": "3"}'
    )
    lake.close()


@pytest.mark.slow
def test_one_column_by_name_is_that_column(lake):
    # `columns="token_id"` was read as its letters: "has no column `t`".
    frame = lake.tokens(run="a", steps=1, columns="token_id").collect()
    assert frame.columns == ["run", "rollout_id", "token_id"]
    assert frame.height == lake.tokens(run="a", steps=1).collect().height > 0


@pytest.mark.slow
def test_report_takes_runs_and_steps_as_the_other_calls_do(lake, tmp_path):
    # `steps="1-2"` raised TypeError (`'<=' between str and int`), `runs="a"` was read as
    # the runs `a` (its letters), `worst=-1` or `"3"` made a report.
    summary = lake.report(tmp_path / "r.html", runs="a", steps="1-2")
    assert summary.runs == ("a",)
    with pytest.raises(UsageError) as refused:
        lake.report(tmp_path / "r.html", worst=-1)
    assert str(refused.value) == "worst is -1; give a whole number of samples from 0."


@pytest.mark.parametrize(
    ("fields", "line"),
    [
        ({"workers": "2"}, "workers is '2'; give a whole number at least 1 and at most 256."),
        ({"workers": 0}, "workers is 0; give a whole number at least 1 and at most 256."),
        (
            {"settle_seconds": float("nan")},
            "settle_seconds is nan; give a number at least 0 and at most 86400.",
        ),
        ({"poll_seconds": -1}, "poll_seconds is -1; give a number more than 0 and at most 86400."),
        (
            {"dump_format": "xyz"},
            "--format 'xyz' is not a format tokenlake reads (`miles`, `slime-v1`, `slime-v2`,"
            " `nemo-rl`, `prime-rl`).",
        ),
    ],
    ids=["workers-text", "workers-0", "settle-nan", "poll-negative", "format"],
)
def test_extract_options_are_checked_as_the_cli_checks_them(tmp_path, fields, line):
    # `workers="2"` was a TypeError, `dump_format="xyz"` a KeyError; `workers=0`, a NaN
    # settle time and a negative poll were taken.
    lake = tokenlake.open_lake(tmp_path / "lake", create=True)
    with pytest.raises(UsageError) as refused:
        lake.extract(tmp_path / "dump", **fields)
    assert str(refused.value) == line


def test_an_empty_lake_gives_typed_empty_frames(tmp_path):
    Path(tmp_path / "_manifest").mkdir()
    lake = tokenlake.open_lake(tmp_path)
    frame = lake.metrics().collect()
    assert frame.height == 0
    assert frame.schema == pl.Schema(
        {
            "run": pl.String,
            "step_key": pl.String,
            "step": pl.Int64,
            "metric": pl.String,
            "value": pl.Float64,
            "ts": pl.Datetime("us", "UTC"),
        }
    )


@pytest.mark.slow
def test_a_key_value_folder_above_the_lake_is_not_a_partition(lake, tmp_path):
    moved = tokenlake.open_lake(shutil.copytree(lake.root, tmp_path / "run=ghost" / "lake"))
    for table in (schema.TOKENS, schema.METRICS):
        frame = getattr(moved, table)().collect().sort(KEYS[table])
        assert frame.equals(getattr(lake, table)().collect().sort(KEYS[table]))
    assert moved.tokens(steps=[2]).select("run").unique().collect().sort("run")[
        "run"
    ].to_list() == [
        "a",
        "b",
    ]
