"""A shared lake's writer plants symbolic links and special files: tokenlake never follows one.

A partition folder that is a link to another lake (`tokens/run=evil -> /other/lake/...`), a
step folder that is one, and a lock file that is a FIFO or a link: each command refuses with
one line, and the link's target keeps every file.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixture_paths import REAL_DUMPS
from tests.limits import cli_process
from tests.store.test_hostile_lake import cli, extract, snapshot
from tokenlake import schema
from tokenlake.errors import LakeError
from tokenlake.store import manifest
from tokenlake.store.local import LocalStore

pytestmark = pytest.mark.slow  # each test extracts a real fixture dump

LINK_RULE = (
    "is a symbolic link; tokenlake never follows a link inside a lake. Remove the link (what it"
    " points to is not touched)"
)


def link_error(lake: Path, relative: str) -> str:
    return f"Error: Lake `{lake}`: `{relative}` {LINK_RULE}"


@pytest.fixture
def lakes(tmp_path: Path) -> tuple[Path, Path]:
    """A lake with runs `basic` and `evil`, and another lake with run `basic`."""
    lake, other = tmp_path / "lake", tmp_path / "other"
    assert extract(REAL_DUMPS / "basic", lake)[0] == 0
    assert extract(REAL_DUMPS / "basic", lake, "--run-name", "evil")[0] == 0
    assert extract(REAL_DUMPS / "basic", other)[0] == 0
    return lake, other


def plant_link(lake: Path, relative: str, target: Path) -> None:
    shutil.rmtree(lake / relative)
    (lake / relative).symlink_to(target, target_is_directory=True)


def parquet_files(folder: Path) -> list[str]:
    found = sorted(str(p.relative_to(folder)) for p in folder.rglob("*.parquet"))
    assert found  # a check over no files would pass whatever happened
    return found


def test_drop_through_a_linked_run_folder_deletes_nothing(lakes: tuple[Path, Path]) -> None:
    lake, other = lakes
    before = snapshot(other)
    assert len(parquet_files(other / "tokens")) == 3
    plant_link(lake, "tokens/run=evil", other / "tokens" / "run=basic")
    assert cli("drop", str(lake), "evil") == (1, "", [link_error(lake, "tokens/run=evil")])
    assert snapshot(other) == before
    assert (lake / "_manifest" / "evil.json").is_file()  # refused before anything is deleted
    (lake / "tokens" / "run=evil").unlink()  # what the line says to do
    assert cli("drop", str(lake), "evil") == (0, f"Dropped run `evil` from {lake}\n", [])
    assert snapshot(other) == before


def test_the_extraction_sweep_never_enters_a_linked_run_folder(lakes: tuple[Path, Path]) -> None:
    lake, other = lakes
    before = snapshot(other)
    plant_link(lake, "tokens/run=basic", other / "tokens" / "run=basic")
    assert extract(REAL_DUMPS / "basic", lake) == (1, "", [link_error(lake, "tokens/run=basic")])
    assert snapshot(other) == before


def test_a_linked_step_folder_is_refused_and_never_swept(lakes: tuple[Path, Path]) -> None:
    lake, other = lakes
    before = snapshot(other)
    step = "samples/run=evil/rollout_id=1"
    plant_link(lake, step, other / "samples" / "run=basic" / "rollout_id=1")
    assert cli("drop", str(lake), "evil") == (1, "", [link_error(lake, step)])
    # the sweep itself (were it reached some other way) deletes nothing behind the link
    files = 7 + 3 * len(schema.ROLLUP_TABLES)  # its tables' files, and its 3 steps' rollups
    assert (
        LocalStore(lake).delete_unlisted(manifest.RunManifest(run="evil", source_dir="")) == files
    )
    assert (lake / step).is_symlink()  # the run's other files are gone
    assert snapshot(other) == before


def test_a_sweep_reached_without_the_check_refuses_a_linked_run_folder(
    lakes: tuple[Path, Path],
) -> None:
    lake, other = lakes
    before = snapshot(other)
    plant_link(lake, "tokens/run=evil", other / "tokens" / "run=basic")
    with pytest.raises(LakeError) as info:
        LocalStore(lake).delete_unlisted(manifest.RunManifest(run="evil", source_dir=""))
    assert f"Error: {info.value}" == link_error(lake, "tokens/run=evil")
    assert snapshot(other) == before


def test_verify_reports_a_linked_run_and_reads_nothing_through_it(
    lakes: tuple[Path, Path],
) -> None:
    lake, other = lakes
    plant_link(lake, "tokens/run=evil", other / "tokens" / "run=basic")
    code, out, err = cli("verify", str(lake))
    assert (code, err) == (1, [])
    assert out == (
        f"run `evil`: not checked: Lake `{lake}`: `tokens/run=evil` {LINK_RULE}\n"
        "3 steps checked, 1 problem\n"
    )


STEPS_SQL = "SELECT run, rollout_id, count(*) FROM drift_steps GROUP BY ALL ORDER BY ALL"


ALL_STEPS = [("basic", 0, 1), ("basic", 1, 1), ("evil", 0, 1), ("evil", 1, 1)]


def test_a_linked_run_folder_leaves_that_run_out_and_serves_the_others(
    lakes: tuple[Path, Path],
) -> None:
    lake, other = lakes
    before, catalog = snapshot(other), (lake / "tokenlake.duckdb").read_bytes()
    plant_link(lake, "tokens/run=evil", other / "tokens" / "run=basic")
    warning = f"Warning: run `evil`: not served: {link_error(lake, 'tokens/run=evil')[7:]}"
    assert cli("views", str(lake)) == (0, f"Rebuilt {lake / 'tokenlake.duckdb'}\n", [warning])
    assert (lake / "tokenlake.duckdb").read_bytes() != catalog
    code, out, err = cli_process("query", str(lake), STEPS_SQL, "--format", "csv")
    expected = '"run","rollout_id","count_star()"\n"basic",0,1\n"basic",1,1\n'
    assert (code, out, err) == (0, expected, [warning])
    assert snapshot(other) == before


def test_a_linked_rollup_file_serves_its_step_from_its_tokens(lakes: tuple[Path, Path]) -> None:
    lake, other = lakes
    before = snapshot(other)
    (planted,) = (lake / "rollups/drift_step_parts/run=evil/rollout_id=1").glob("*.parquet")
    (target,) = (other / "rollups/drift_step_parts/run=basic/rollout_id=1").glob("*.parquet")
    planted.unlink()
    planted.symlink_to(target)
    name = planted.relative_to(lake).as_posix()
    code, out, err = cli_process("query", str(lake), STEPS_SQL, "--format", "csv")
    assert out.count("\n") == 5  # a header and every step, step 1 of `evil` from its tokens
    assert (code, err) == (
        0,
        [
            f"Warning: run `evil` step 1: rollups not served, its views read its tokens:"
            f" Lake `{lake}`: `{name}` {LINK_RULE}",
            "Warning: 1 of 6 steps have no rollups of this tokenlake version: the views read the"
            " tokens (slower) until `tokenlake views LAKE` computes them",
        ],
    )
    from tests.store.test_hostile_lake import rows

    assert rows(lake, STEPS_SQL) == ALL_STEPS  # the catalog file: built before the link
    assert snapshot(other) == before


def test_a_linked_rollups_folder_serves_every_run_from_its_tokens(
    lakes: tuple[Path, Path], tmp_path: Path
) -> None:
    lake, _ = lakes
    audited = cli_process("audit", str(lake))
    assert audited[2] == []
    (lake / "rollups").rename(tmp_path / "elsewhere")
    (lake / "rollups").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    code, out, err = cli_process("audit", str(lake))
    assert (code, out) == audited[:2]  # the same verdicts, from the tokens
    assert err == [
        *(
            f"Warning: run `{run}`: rollups not served, its views read its tokens: Lake `{lake}`:"
            f" `rollups` {LINK_RULE}"
            for run in ("basic", "evil")
        ),
        "Warning: 6 of 6 steps have no rollups of this tokenlake version: the views read the"
        " tokens (slower) until `tokenlake views LAKE` computes them",
    ]


def test_a_linked_manifest_folder_is_never_written_through(
    lakes: tuple[Path, Path],
) -> None:
    lake, other = lakes
    before = snapshot(other)
    plant_link(lake, "_manifest", other / "_manifest")
    assert extract(REAL_DUMPS / "basic", lake) == (1, "", [link_error(lake, "_manifest")])
    assert snapshot(other) == before


def run_views(lake: Path) -> tuple[int, str, str]:
    """`tokenlake views` in its own process, bounded: a lock that blocks must fail the test."""
    done = subprocess.run(
        [sys.executable, "-m", "tokenlake", "views", str(lake)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode, done.stdout, done.stderr


def test_a_lock_file_that_is_a_fifo_is_one_line_not_a_hang(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    assert extract(REAL_DUMPS / "basic", lake)[0] == 0
    lock = lake / "_manifest" / ".tokenlake.lock"
    lock.unlink()
    os.mkfifo(lock)
    assert run_views(lake) == (
        1,
        "",
        f"Error: Lake `{lake}`: `_manifest/.tokenlake.lock` is a FIFO, not the lock file"
        " tokenlake makes (a regular file); remove it\n",
    )
    lock.unlink()
    assert run_views(lake)[0] == 0


def test_a_lock_file_that_is_a_link_creates_nothing_outside_the_lake(tmp_path: Path) -> None:
    lake, outside = tmp_path / "lake", tmp_path / "outside" / "created-by-tokenlake"
    assert extract(REAL_DUMPS / "basic", lake)[0] == 0
    outside.parent.mkdir()
    lock = lake / "_manifest" / ".tokenlake.lock"
    lock.unlink()
    lock.symlink_to(outside)
    assert run_views(lake) == (
        1,
        "",
        f"{link_error(lake, '_manifest/.tokenlake.lock')}\n",
    )
    assert not outside.exists() and list(outside.parent.iterdir()) == []
    assert extract(REAL_DUMPS / "basic", lake) == (
        1,
        "",
        [link_error(lake, "_manifest/.tokenlake.lock")],
    )
    assert not outside.exists()


def test_a_lock_file_that_is_a_directory_is_one_line(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    assert extract(REAL_DUMPS / "basic", lake)[0] == 0
    lock = lake / "_manifest" / ".tokenlake.lock"
    lock.unlink()
    lock.mkdir()
    assert cli("views", str(lake)) == (
        1,
        "",
        [
            f"Error: Lake `{lake}`: `_manifest/.tokenlake.lock` is a directory, not the lock"
            " file tokenlake makes (a regular file); remove it"
        ],
    )


def test_the_python_api_reads_the_runs_a_link_does_not_touch(
    lakes: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    import tokenlake

    lake, other = lakes
    plant_link(lake, "tokens/run=evil", other / "tokens" / "run=basic")
    frame = tokenlake.open_lake(lake).tokens(columns=["token_id"]).collect()
    assert frame.group_by("run").len().rows() == [("basic", 206)]
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        f"run `evil`: not served: {link_error(lake, 'tokens/run=evil')[7:]}"
    ]
