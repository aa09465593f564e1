"""Commands of one user at the same moment on one lake and one private cache: a reader while a
tag or an extraction commits new manifests and deletes the files they replace.

Each test forces one interleaving (the other command runs inside a step of this one, between
its check and its act); none is timed.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tests.conftest import store_of
from tests.serve.test_user_view_sandbox import lake_with_views
from tokenlake.cli import main
from tokenlake.serve import catalog, catalog_cache, kept_rows
from tokenlake.serve.explore import server

TAGS = "SELECT * FROM run_tags"


@pytest.fixture
def lake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A lake of one run `r` with its catalog, and the user's cache in a folder of the test's."""
    monkeypatch.setenv("TOKENLAKE_CACHE", str(tmp_path / "cache"))
    made = lake_with_views(tmp_path, {"mine.sql": "CREATE VIEW mine AS SELECT run FROM runs"})
    catalog.build_catalog(store_of(made))
    return made


def tag(lake: Path, value: str) -> None:
    result = CliRunner().invoke(main, ["tag", str(lake), "r", f"k={value}"])
    assert (result.exit_code, result.output) == (0, f"Run `r` tags: k={value}\n")


def recompute(lake: Path) -> None:
    result = CliRunner().invoke(main, ["views", str(lake), "--recompute"])
    assert result.exit_code == 0, result.output


def once_first(
    monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, other: Callable[[], None]
) -> None:
    """`owner.name` runs `other` (another command) before its first call's own work; the other
    command's own calls of it, and later ones, are left as they are."""
    original = getattr(owner, name)
    done: list[bool] = []

    def then(*args: Any, **kwargs: Any) -> Any:
        if not done:
            done.append(True)
            other()
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, then)


def test_a_reader_that_read_the_manifests_before_a_tag_serves_the_lake_after_it(
    lake: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The tag commits its manifest and deletes the `runs` file the reader's manifests list,
    after the reader read them and before it looked at the files."""
    once_first(monkeypatch, catalog, "iter_user_view_files", lambda: tag(lake, "after"))
    with caplog.at_level(logging.WARNING), catalog.connect(store_of(lake)) as con:
        assert con.execute(TAGS).fetchall() == [("r", "k", "after")]
        assert con.execute("SELECT * FROM mine").fetchall() == [("r",)]
    assert caplog.records == []


def test_a_reader_whose_build_lost_a_file_to_a_tag_builds_again(
    lake: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The tag deletes the `runs` file after the reader checked the files its manifests list
    and before its views read them: the build fails, and is made again from the new ones."""
    once_first(monkeypatch, catalog, "create_base_views", lambda: tag(lake, "after"))
    with caplog.at_level(logging.WARNING), catalog.connect(store_of(lake)) as con:
        assert con.execute(TAGS).fetchall() == [("r", "k", "after")]
    assert caplog.records == []


def test_a_reader_that_read_the_manifests_before_rollups_were_recomputed_serves_the_new_ones(
    lake: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """`tokenlake views --recompute` replaces every rollup file after the reader read the
    manifests: its views are those of the new files, not the tokens' with a warning per step
    that the rollups are not served."""

    once_first(monkeypatch, catalog, "iter_user_view_files", lambda: recompute(lake))
    with caplog.at_level(logging.WARNING), catalog.connect(store_of(lake)) as con:
        assert con.execute("SELECT count(*), sum(token_id) FROM tokens").fetchall() == [(3, 0)]
    assert caplog.records == []


def once_after(
    monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, other: Callable[[], None]
) -> None:
    """`owner.name` runs `other` (another command) once its first call's own work is done."""
    original = getattr(owner, name)
    done: list[bool] = []

    def then(*args: Any, **kwargs: Any) -> Any:
        made = original(*args, **kwargs)
        if not done:
            done.append(True)
            other()
        return made

    monkeypatch.setattr(owner, name, then)


@pytest.mark.parametrize(
    ("command", "output"),
    [
        (["query", TAGS, "--format", "csv"], '"run","key","value"\n"r","k","after"\n'),
        (["query", "SELECT * FROM mine", "--format", "csv"], '"run"\n"r"\n'),
    ],
)
def test_a_query_whose_files_a_tag_deleted_after_it_connected_reads_the_lake_again(
    lake: Path, monkeypatch: pytest.MonkeyPatch, command: list[str], output: str
) -> None:
    """The tag commits its manifest and deletes the `runs` file the reader's views list, after
    the reader connected and before its query read them."""
    once_after(monkeypatch, catalog, "connect", lambda: tag(lake, "after"))
    result = CliRunner().invoke(main, [command[0], str(lake), *command[1:]])
    assert (result.exit_code, result.output) == (0, output)


def test_audits_whose_files_a_tag_deleted_after_they_connected_read_the_lake_again(
    lake: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tag replaces the `runs` file after the audits connected; `drift_alarms` reads it
    (here the views read the files, not rows copied into the reader's catalog)."""
    monkeypatch.setattr(kept_rows, "COPY_LIMIT", 0)
    tag(lake, "before")
    expected = CliRunner().invoke(main, ["audit", str(lake)])
    once_after(monkeypatch, catalog, "connect", lambda: tag(lake, "after"))
    result = CliRunner().invoke(main, ["audit", str(lake)])
    assert (result.exit_code, result.output) == (expected.exit_code, expected.output)
    assert result.output.endswith("\n1 of 15 audits failed; 0 warnings, 0 info.\n")


def test_a_report_whose_files_a_tag_deleted_after_it_connected_reads_the_lake_again(
    lake: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    once_after(monkeypatch, catalog, "connect", lambda: tag(lake, "after"))
    page = tmp_path / "r.html"
    result = CliRunner().invoke(main, ["report", str(lake), "-o", str(page)])
    assert result.exit_code == 0, result.output
    assert re.fullmatch(
        rf"Wrote {re.escape(str(page))} \(1\.0 MB, 1 run\) in \d+\.\d s\n", result.output
    )


def test_a_kept_catalog_deleted_between_its_lookup_and_the_read_of_its_lines_is_not_kept(
    lake: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another command of the user keeps a newer key of the lake and deletes this one after
    `cached` found its catalog and before it read the lines its build printed."""
    with catalog.connect(store_of(lake)):
        pass
    (folder,) = (lake.parent / "cache" / catalog_cache.FOLDER).iterdir()
    (key,) = [entry.name for entry in folder.iterdir() if entry.is_dir()]
    once_first(monkeypatch, Path, "is_symlink", lambda: shutil.rmtree(folder / key))
    found = catalog_cache.cached(folder, key)
    monkeypatch.undo()
    assert found is None


def test_a_lakes_folder_another_command_forgot_after_it_was_used_is_made_again(
    lake: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another command of the user, keeping the catalogs of the lakes it used last, deletes
    this lake's folder between this reader's use of it and its build there."""
    used = catalog_cache.lake_folder

    def then_forgotten(store: Any) -> Path | None:
        folder = used(store)
        assert folder is not None
        shutil.rmtree(folder)
        return folder

    monkeypatch.setattr(catalog_cache, "lake_folder", then_forgotten)
    with catalog.connect(store_of(lake)) as con:
        assert con.execute(TAGS).fetchall() == []
    monkeypatch.undo()
    (folder,) = (lake.parent / "cache" / catalog_cache.FOLDER).iterdir()
    (key,) = [entry.name for entry in folder.iterdir() if entry.is_dir()]  # kept there
    assert catalog_cache.cached(folder, key) is not None


def test_what_a_deletion_of_the_key_left_does_not_stop_the_key_from_being_kept(
    lake: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another tokenlake version deleted this key's folder while a reader still copied the
    lake's rows into it: its `rows/` folder stayed, without the catalog."""
    with catalog.connect(store_of(lake)):
        pass
    (folder,) = (lake.parent / "cache" / catalog_cache.FOLDER).iterdir()
    (key,) = [entry.name for entry in folder.iterdir() if entry.is_dir()]
    shutil.rmtree(folder / key)
    (folder / key / kept_rows.FOLDER / ".building-1-0a1b2c3d").mkdir(parents=True)
    with catalog.connect(store_of(lake)) as con:
        assert con.execute("SELECT * FROM mine").fetchall() == [("r",)]
    assert catalog_cache.cached(folder, key) is not None


def _get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=120) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


@pytest.mark.parametrize("page", ["api/sql?q=SELECT+*+FROM+run_tags", "api/runs"])
def test_an_explorer_page_whose_files_a_tag_deleted_reads_the_lake_again(
    lake: Path, monkeypatch: pytest.MonkeyPatch, page: str
) -> None:
    """The tag replaces the catalog and deletes the `runs` file the server's catalog version
    lists, before the server's next look at the catalog (here: never by itself)."""
    monkeypatch.setattr(server, "STAMP_EVERY_SECONDS", float("inf"))
    running = server.start(store_of(lake), server.ServeOptions(port=0))
    try:
        assert _get(running.url + "api/version")[0] == 200  # the server's catalog version
        tag(lake, "after")
        status, answer = _get(running.url + page)
        assert status == 200, answer
        if page.startswith("api/sql"):
            assert answer["rows"] == [["r", "k", "after"]]
        else:
            assert [run["tags"] for run in answer["runs"]] == [{"k": "after"}]
    finally:
        running.stop()


def test_the_explorers_audits_whose_files_a_tag_deleted_are_computed_again(
    lake: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tag replaces the `runs` file after the server's audits (on a thread of their own)
    took their catalog version and before `drift_alarms` read it (here the views read the
    files, not rows copied into the reader's catalog)."""
    from tokenlake.orchestrate.maintain import tag_run
    from tokenlake.serve.explore import data

    monkeypatch.setattr(kept_rows, "COPY_LIMIT", 0)
    monkeypatch.setattr(server, "STAMP_EVERY_SECONDS", float("inf"))
    once_first(
        monkeypatch, data, "failing_audits", lambda: tag_run(store_of(lake), "r", {"k": "v"})
    )
    running = server.start(store_of(lake), server.ServeOptions(port=0))
    try:
        state = {"state": server.AUDITS_COMPUTING}
        for _ in range(600):  # the audits' own thread: done within a minute of a loaded machine
            status, page = _get(running.url + "api/runs")
            assert status == 200, page
            state = page["audits"]
            if state["state"] != server.AUDITS_COMPUTING:
                break
            time.sleep(0.1)
        assert state == {"state": server.AUDITS_READY}
        assert [run["tags"] for run in page["runs"]] == [{"k": "v"}]
    finally:
        running.stop()


def each_of_first(
    monkeypatch: pytest.MonkeyPatch,
    owner: Any,
    name: str,
    others: list[Callable[[], None]],
    after: bool,
) -> None:
    """The first `len(others)` calls of `owner.name` each run the next of `others` (another
    command), before or `after` the call's own work; the other commands' own calls of it, and
    later ones, are left as they are."""
    original = getattr(owner, name)
    pending = list(others)
    running: list[bool] = []

    def then(*args: Any, **kwargs: Any) -> Any:
        if running or not pending:
            return original(*args, **kwargs)
        other = pending.pop(0)
        running.append(True)
        try:
            if not after:
                other()
            made = original(*args, **kwargs)
            if after:
                other()
        finally:
            running.pop()
        return made

    monkeypatch.setattr(owner, name, then)


def test_a_query_three_tags_overtake_in_a_row_reads_the_lake_a_fourth_time(
    lake: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tags = [lambda value=value: tag(lake, value) for value in ("one", "two", "three")]
    each_of_first(monkeypatch, catalog, "connect", tags, after=True)
    result = CliRunner().invoke(main, ["query", str(lake), TAGS, "--format", "csv"])
    assert (result.exit_code, result.output) == (0, '"run","key","value"\n"r","k","three"\n')


def test_a_query_overtaken_at_every_read_stops_after_four_with_the_last_ones_line(
    lake: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tags = [lambda value=value: tag(lake, value) for value in ("one", "two", "three", "four")]
    each_of_first(monkeypatch, catalog, "connect", tags, after=True)
    result = CliRunner().invoke(main, ["query", str(lake), TAGS, "--format", "csv"])
    assert result.exit_code == 1
    assert result.output.startswith(f"Error: Lake `{lake}`: a query cannot read it: ")
