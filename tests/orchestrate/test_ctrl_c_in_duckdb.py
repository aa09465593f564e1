"""A Ctrl-C that lands while DuckDB runs a query (a step's rollups, a catalog build, a user's
query) stops the command: DuckDB turns it into RuntimeError('Query interrupted'), which a
step's catch-all would otherwise report as that step's bug while the run, or a `--follow`,
went on."""

from __future__ import annotations

import os
import signal
import threading

import duckdb
import pytest

from tests.conftest import store_of
from tests.fixture_paths import REAL_DUMPS
from tokenlake.errors import ctrl_c_from_duckdb
from tokenlake.orchestrate.extract import ExtractInterrupted, ExtractOptions, extract_run
from tokenlake.serve import rollups
from tokenlake.store import manifest

# About a minute of work on one thread, if the Ctrl-C were missed. One thread: DuckDB stops a
# query between chunks of its own work, but waits for another thread's task to end, and a
# range() task of a big range runs for seconds to hours (the test hung the suite that way).
LONG = "SELECT count(*) FROM range(10000000000) AS t(x) WHERE x % 7 = 3"


def test_a_ctrl_c_during_a_duckdb_query_is_a_keyboard_interrupt():
    con = duckdb.connect(config={"threads": 1})
    timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt), ctrl_c_from_duckdb():
            con.sql(LONG).fetchall()
    finally:
        timer.cancel()
        con.close()


def test_other_duckdb_errors_pass_through():
    with pytest.raises(duckdb.Error, match="no_such_table"), ctrl_c_from_duckdb():
        duckdb.connect().sql("SELECT * FROM no_such_table")


def _interrupted(*args, **kwargs):
    raise RuntimeError("Query interrupted")  # what DuckDB raises on a Ctrl-C


def test_a_ctrl_c_in_a_steps_rollups_stops_the_extraction(tmp_path, monkeypatch):
    monkeypatch.setattr(rollups, "_rows", _interrupted)
    with pytest.raises(ExtractInterrupted) as stopped:
        extract_run(
            REAL_DUMPS / "basic", store_of(tmp_path / "lake"), ExtractOptions(run_name="basic")
        )
    assert stopped.value.summary.failed == []  # not one step's "unexpected error"
    assert manifest.load_manifest(store_of(tmp_path / "lake"), "basic") is None


def test_any_command_interrupted_in_duckdb_says_aborted(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from tokenlake.cli import main
    from tokenlake.lake import Lake

    monkeypatch.setattr(Lake, "audit", _interrupted)
    result = CliRunner().invoke(main, ["audit", str(tmp_path)])
    assert (result.exit_code, result.output) == (1, "\nAborted!\n")


def test_follow_stops_after_a_round_that_swallowed_a_ctrl_c(tmp_path, monkeypatch):
    from tokenlake.orchestrate import follow
    from tokenlake.orchestrate.extract import ExtractSummary

    rounds = []

    def swallowing_round(dump_dir, lake, run, state, options, progress, clock):
        rounds.append(run)
        if len(rounds) > 2:
            raise AssertionError("the follower went on after a Ctrl-C")
        try:  # a library that takes the signal and carries on
            os.kill(os.getpid(), signal.SIGINT)
            threading.Event().wait(5)
        except KeyboardInterrupt:
            pass
        return ExtractSummary(run=run, lake=lake)

    monkeypatch.setattr(follow, "follow_round", swallowing_round)
    follow.follow_run(tmp_path / "dump", store_of(tmp_path / "lake"), ExtractOptions(run_name="r"))
    assert rounds == ["r"]
