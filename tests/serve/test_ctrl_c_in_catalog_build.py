"""A Ctrl-C while a reader builds its catalog, whose views two threads make (one a second
DuckDB connection, `sql_views.create_sql_views`), stops the command as any Ctrl-C does:
click's `Aborted!` and exit 1. The thread is stopped and waited for first: closing its
connection while it runs a statement fails ("connection is busy"), which read as a damaged
catalog, and a statement left running as Python exits aborts the process.

The command runs in a subprocess that signals itself at a named crash point
(`tokenlake.processes.crash_point`), so the moment is exact, not a timed guess.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import store_of
from tests.serve.test_user_view_sandbox import lake_with_views
from tokenlake.processes import KILL_SIGNAL_VARIABLE, KILL_VARIABLE
from tokenlake.serve import catalog

pytestmark = pytest.mark.slow  # runs the CLI in a subprocess

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    made = lake_with_views(tmp_path_factory.mktemp("ctrl-c"), {})
    catalog.build_catalog(store_of(made))
    return made


@pytest.mark.parametrize(
    "moment",
    [
        "views:layer",  # the main thread, while the other makes its views
        "views:helper",  # sent by the other thread: the main one is in a statement or waits
    ],
)
def test_a_ctrl_c_while_the_views_are_made_aborts_the_command(
    lake: Path, tmp_path: Path, moment: str
) -> None:
    env = {**os.environ, "TOKENLAKE_CACHE": str(tmp_path / "cache")}  # nothing kept: a build
    env[KILL_VARIABLE], env[KILL_SIGNAL_VARIABLE] = moment, "INT"
    done = subprocess.run(
        [sys.executable, "-m", "tokenlake", "audit", str(lake)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (done.returncode, done.stderr) == (1, "\nAborted!\n")
    assert done.stdout == ""
