"""`drop`, `tag` and `views` killed (SIGKILL) at each of their steps leave a consistent lake.

Each command runs as `python -m tokenlake` in a subprocess with `TOKENLAKE_TEST_KILL_AT`
naming the step where it kills itself (`tokenlake.processes.crash_point`). Then: `verify` says
what is true, a query never serves a row the manifests no longer list, running the command
again completes, and nothing of the killed command is left behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import store_of
from tests.fixture_paths import REAL_DUMPS
from tokenlake import layout, schema
from tokenlake.processes import KILL_SIGNAL_VARIABLE, KILL_VARIABLE
from tokenlake.store import manifest

pytestmark = pytest.mark.slow  # extracts two real fixture dumps, runs the CLI many times

BEHIND = (
    "catalog `tokenlake.duckdb` lists other files than the manifests (a command was"
    " interrupted before rebuilding it); run `tokenlake views LAKE` or extract again"
)
RUNS_SQL = "SELECT run, count(*) AS n FROM tokens GROUP BY run ORDER BY run"


def tokenlake(
    *args: str, kill_at: str | None = None, sig: str = "KILL"
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in (KILL_VARIABLE, KILL_SIGNAL_VARIABLE)}
    if kill_at is not None:
        env[KILL_VARIABLE], env[KILL_SIGNAL_VARIABLE] = kill_at, sig
    command = [sys.executable, "-m", "tokenlake", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def lake(basic_and_pp2_lake: Path) -> Path:
    return basic_and_pp2_lake


def query_runs(lake: Path) -> str:
    done = tokenlake("query", str(lake), RUNS_SQL)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    return done.stdout


def verify(lake: Path) -> tuple[int, str]:
    done = tokenlake("verify", str(lake))
    assert done.stderr == ""
    return done.returncode, done.stdout


def leftovers(lake: Path) -> list[str]:
    """Files no manifest lists, besides the lock, the manifests and the catalog."""
    listed = {
        name
        for record in manifest.load_all(store_of(lake))
        for table in schema.LAKE_TABLES
        for name in record.files(table)
    }
    kept = {layout.CATALOG_FILE, "_manifest/.tokenlake.lock"}
    found = []
    for path in sorted(lake.rglob("*")):
        name = str(path.relative_to(lake))
        if path.is_file() and name not in listed and name not in kept:
            if not (name.startswith("_manifest/") and name.endswith(".json")):
                found.append(name)
    return found


def verified(steps: int, problems: list[str], lake: Path) -> tuple[int, str]:
    """What `verify` says: a line for each file no manifest lists (in a run's folder), then
    `problems`, then the count."""
    left = [
        f"file `{name}` is not listed in any manifest: left by an interrupted extraction, drop"
        " or tag; `tokenlake extract` sweeps it"
        for name in leftovers(lake)
        if "/run=" in name
    ]
    lines = [*left, *problems]
    count = f"{len(lines)} problem{'s' if len(lines) != 1 else ''}"
    return (1 if lines else 0), "".join(f"{line}\n" for line in lines) + (
        f"{steps} steps checked, {count}\n"
    )


BOTH = "run      n\n-----  ---\nbasic  206\npp2    194\n(2 rows)\n"
PP2_ONLY = "run    n\n---  ---\npp2  194\n(1 row)\n"


def test_the_lake_before_any_kill(lake: Path) -> None:
    assert query_runs(lake) == BOTH
    assert verify(lake) == (0, "6 steps checked, 0 problems\n")


@pytest.mark.parametrize(
    ("point", "problems"),
    [
        ("drop:emptied", [BEHIND]),  # committed: the catalog still lists the run's files
        ("catalog:built", [BEHIND]),  # killed inside the rebuild: a temporary catalog left
        ("drop:catalog", []),  # the run's files are unlisted leftovers now
        ("drop:files", []),  # only the empty manifest is left
    ],
)
def test_drop_killed_at_each_step(lake: Path, point: str, problems: list[str]) -> None:
    killed = tokenlake("drop", str(lake), "basic", kill_at=point)
    assert (killed.returncode, killed.stdout) == (-signal.SIGKILL, "")
    # basic's manifest lists nothing now: only pp2's 3 steps are checked; basic's files are
    # leftovers until deleted (`drop:files` deleted them)
    assert verify(lake) == verified(3, problems, lake)
    left = [name for name in leftovers(lake) if "/run=" in name]
    assert all("/run=basic/" in name for name in left)
    assert len(left) == (0 if point == "drop:files" else 38)  # basic's 3 steps, run row, vocab
    assert query_runs(lake) == PP2_ONLY  # never a row of the dropped run
    again = tokenlake("drop", str(lake), "basic")
    assert (again.returncode, again.stdout, again.stderr) == (
        0,
        f"Dropped run `basic` from {lake}\n",
        "",
    )
    assert verify(lake) == (0, "3 steps checked, 0 problems\n")
    assert query_runs(lake) == PP2_ONLY
    assert not (lake / "_manifest" / "basic.json").exists()
    assert [p for p in lake.rglob("run=basic")] == []
    assert leftovers(lake) == []


@pytest.mark.parametrize("point", ["drop:emptied", "catalog:built", "drop:catalog", "drop:files"])
def test_a_ctrl_c_during_a_drop_comes_once_the_run_is_gone(lake: Path, point: str) -> None:
    """A Ctrl-C (not a kill) after a drop's commit point is held until the run is gone:
    `Aborted!`, and nothing of the run is left, its catalog rebuilt."""
    stopped = tokenlake("drop", str(lake), "basic", kill_at=point, sig="INT")
    assert (stopped.returncode, stopped.stdout, stopped.stderr) == (1, "", "\nAborted!\n")
    assert leftovers(lake) == []
    assert not (lake / "_manifest" / "basic.json").exists()
    assert verify(lake) == (0, "3 steps checked, 0 problems\n")
    assert query_runs(lake) == PP2_ONLY


def test_an_unchanged_extraction_after_a_killed_drop_rebuilds_the_catalog(lake: Path) -> None:
    killed = tokenlake("drop", str(lake), "basic", kill_at="drop:emptied")
    assert killed.returncode == -signal.SIGKILL
    done = tokenlake("extract", str(REAL_DUMPS / "pp2"), "--lake", str(lake), "--silent")
    assert done.returncode == 0 and "0 new, 0 updated, 3 unchanged" in done.stdout
    assert verify(lake) == (0, "3 steps checked, 0 problems\n")
    import duckdb  # a plain DuckDB client (BI) reads the rebuilt catalog

    with duckdb.connect(str(lake / layout.CATALOG_FILE), read_only=True) as con:
        assert con.execute("SELECT DISTINCT run FROM tokens").fetchall() == [("pp2",)]


TAGS_SQL = "SELECT run, tags_json FROM runs ORDER BY run"
TAGGED = (
    'run    tags_json\n-----  --------------------\nbasic  {"precision": "fp8"}\npp2    NULL\n'
    "(2 rows)\n"
)
UNTAGGED = "run    tags_json\n-----  ---------\nbasic  NULL\npp2    NULL\n(2 rows)\n"


@pytest.mark.parametrize(
    ("point", "problems", "seen"),
    [
        ("tag:row", [], UNTAGGED),  # a new runs row, not listed yet
        ("tag:manifest", [BEHIND], TAGGED),  # committed; readers follow the manifest
        ("catalog:built", [BEHIND], TAGGED),
        ("tag:catalog", [], TAGGED),  # the old runs row is an unlisted leftover
    ],
)
def test_tag_killed_at_each_step(lake: Path, point: str, problems: list[str], seen: str) -> None:
    killed = tokenlake("tag", str(lake), "basic", "precision=fp8", kill_at=point)
    assert (killed.returncode, killed.stdout) == (-signal.SIGKILL, "")
    # the runs row not yet listed (`tag:row`) or no longer listed (after): a leftover
    left = [name for name in leftovers(lake) if "/run=" in name]
    assert len(left) == 1 and left[0].startswith("runs/run=basic/run-")
    assert verify(lake) == verified(6, problems, lake)
    done = tokenlake("query", str(lake), TAGS_SQL)
    assert (done.returncode, done.stdout, done.stderr) == (0, seen, "")
    again = tokenlake("tag", str(lake), "basic", "precision=fp8")
    assert (again.returncode, again.stdout, again.stderr) == (
        0,
        "Run `basic` tags: precision=fp8\n",
        "",
    )
    assert verify(lake) == (0, "6 steps checked, 0 problems\n")
    assert tokenlake("query", str(lake), TAGS_SQL).stdout == TAGGED
    assert leftovers(lake) == []


@pytest.mark.parametrize("point", ["tag:row", "tag:manifest", "catalog:built", "tag:catalog"])
def test_a_ctrl_c_during_a_tag_comes_once_it_is_committed_whole(lake: Path, point: str) -> None:
    """A Ctrl-C (not a kill) between a tag's files is held until the tag is done: `Aborted!`,
    and the lake holds the tag whole, nothing left behind, its catalog rebuilt."""
    stopped = tokenlake("tag", str(lake), "basic", "precision=fp8", kill_at=point, sig="INT")
    assert (stopped.returncode, stopped.stdout, stopped.stderr) == (1, "", "\nAborted!\n")
    assert leftovers(lake) == []
    assert verify(lake) == (0, "6 steps checked, 0 problems\n")
    assert tokenlake("query", str(lake), TAGS_SQL).stdout == TAGGED


def test_views_killed_before_the_new_catalog_is_in_place(lake: Path) -> None:
    before = (lake / layout.CATALOG_FILE).read_bytes()
    killed = tokenlake("views", str(lake), kill_at="catalog:built")
    assert (killed.returncode, killed.stdout) == (-signal.SIGKILL, "")
    assert (lake / layout.CATALOG_FILE).read_bytes() == before  # the old one, whole
    assert verify(lake) == (0, "6 steps checked, 0 problems\n")
    assert [p.name.endswith(".tmp") for p in lake.glob(".tokenlake-*")] == [True]
    again = tokenlake("views", str(lake))
    assert (again.returncode, again.stdout, again.stderr) == (
        0,
        f"Rebuilt {lake / layout.CATALOG_FILE}\n",
        "",
    )
    assert list(lake.glob(".tokenlake-*")) == []  # the killed build's temporary is swept
    assert query_runs(lake) == BOTH
    assert leftovers(lake) == []


def test_a_manifest_deleted_behind_the_catalogs_back(lake: Path) -> None:
    """The state a `drop` that deletes the manifest first leaves when killed: found, never
    served, and repaired by the next extraction even if nothing changed."""
    (lake / "_manifest" / "basic.json").unlink()
    assert len([name for name in leftovers(lake) if "/run=basic/" in name]) == 38
    assert verify(lake) == verified(3, [BEHIND], lake)
    assert query_runs(lake) == PP2_ONLY
    done = tokenlake("extract", str(REAL_DUMPS / "pp2"), "--lake", str(lake), "--silent")
    assert done.returncode == 0 and "0 new, 0 updated, 3 unchanged" in done.stdout
    assert verify(lake) == (0, "3 steps checked, 0 problems\n")
