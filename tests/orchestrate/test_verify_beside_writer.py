"""`verify` while another command of the user writes to the lake.

An extraction's steps in flight are files no manifest lists yet, and a commit (an extraction's,
a tag's) deletes the files the manifests it replaces listed: what verify read then would be
reported as a lake left damaged. It says instead that the lake was written meanwhile.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.conftest import local_store
from tokenlake.cli import main
from tokenlake.orchestrate import verify
from tokenlake.store import object_lock

WRITTEN = (
    "Error: Lake `{lake}`: another tokenlake command (an extraction, a tag, a drop) wrote to it"
    " while verify read it, so the 1 problem seen may be its work in flight; run verify again"
    " once it has finished\n"
)


def _in_flight(lake: Path) -> str:
    """A step file as an extraction writes it before its commit: made by the naming scheme,
    listed by no manifest. Returns its name in the lake."""
    listed = sorted((lake / "tokens" / "run=basic").glob("rollout_id=*/*.parquet"))[0]
    shutil.copyfile(listed, listed.with_name("train-0a1b2c3d.parquet"))
    return listed.with_name("train-0a1b2c3d.parquet").relative_to(lake).as_posix()


def test_a_file_no_manifest_lists_is_a_leftover_when_no_writer_runs(
    basic_and_pp2_lake: Path,
) -> None:
    name = _in_flight(basic_and_pp2_lake)
    result = CliRunner().invoke(main, ["verify", str(basic_and_pp2_lake)])
    assert result.exit_code == 1
    assert result.output.splitlines()[0] == verify.leftover_text(name)
    assert result.output.endswith(", 1 problem\n")


def test_verify_beside_a_writer_holding_the_lock_says_so(basic_and_pp2_lake: Path) -> None:
    _in_flight(basic_and_pp2_lake)
    with local_store(basic_and_pp2_lake).lock():  # an extraction writing its next step
        result = CliRunner().invoke(main, ["verify", str(basic_and_pp2_lake)])
    assert result.exit_code == 1
    assert result.output == WRITTEN.format(lake=basic_and_pp2_lake)


def test_verify_beside_a_commit_says_so(
    basic_and_pp2_lake: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tag commits a new manifest while verify reads (and deletes the `runs` file the old
    one listed): no writer holds the lock when verify ends, but the manifests changed."""
    _in_flight(basic_and_pp2_lake)
    leftovers = verify._leftovers

    def then_tagged(store, records, run):  # type: ignore[no-untyped-def]
        found = leftovers(store, records, run)
        tag = [sys.executable, "-m", "tokenlake", "tag", str(basic_and_pp2_lake), "basic", "k=v"]
        subprocess.run(tag, check=True, capture_output=True)  # another command of the user
        return found

    monkeypatch.setattr(verify, "_leftovers", then_tagged)
    result = CliRunner().invoke(main, ["verify", str(basic_and_pp2_lake)])
    assert result.exit_code == 1
    assert result.output == WRITTEN.format(lake=basic_and_pp2_lake)


def test_a_writer_holding_the_lock_of_a_consistent_lake_changes_nothing(
    basic_and_pp2_lake: Path,
) -> None:
    with local_store(basic_and_pp2_lake).lock():
        result = CliRunner().invoke(main, ["verify", str(basic_and_pp2_lake)])
    assert (result.exit_code, result.output) == (0, "6 steps checked, 0 problems\n")


def test_a_local_lake_without_a_lock_file_has_no_writer(tmp_path: Path) -> None:
    store = local_store(tmp_path)
    assert store.writer_busy() is False
    with store.lock():
        assert store.writer_busy() is True
    assert store.writer_busy() is False


class _MemoryLake:
    """What `object_lock` reads of an object-store lake: its filesystem and keys."""

    def __init__(self) -> None:
        from fsspec.implementations.memory import MemoryFileSystem

        self.fs = MemoryFileSystem()
        self.location = "memory://lake"

    def key(self, relative: str) -> str:
        return f"/lake/{relative}"


@pytest.mark.parametrize(
    ("lock", "running"),
    [
        (None, False),
        ({"expires": 4102444800.0, "host": "elsewhere", "pid": 1}, True),  # year 2100
        ({"expires": 1.0, "host": "elsewhere", "pid": 1}, False),  # expired
        ({"expires": "soon", "host": "elsewhere", "pid": 1}, False),  # not a time
        ({"expires": 1e300, "host": "elsewhere", "pid": 1}, True),
        ([1, 2], False),  # not an object
    ],
)
def test_an_object_store_writer_runs_while_its_lease_does(lock: object, running: bool) -> None:
    lake = _MemoryLake()
    if lock is not None:
        lake.fs.pipe_file(lake.key("_manifest/.tokenlake.lock"), json.dumps(lock).encode())
    assert object_lock.lease_running(lake, "_manifest/.tokenlake.lock") is running  # type: ignore[arg-type]
