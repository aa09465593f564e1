"""An extraction stopped by Ctrl-C or SIGTERM at any moment leaves nothing uncommitted behind.

`tokenlake extract` runs in a subprocess that signals itself at a named crash point
(`tokenlake.processes.crash_point`: `$TOKENLAKE_TEST_KILL_AT`, `$TOKENLAKE_TEST_KILL_SIGNAL`),
so the moment is exact, not a timed guess: before any step runs, in the middle of a step's
files, with a step written but not committed, just after a commit, and after publishing. After
each, no file that a manifest does not list is in the lake (a glob over `tokens/**` reads only
committed rows), and `verify` agrees. A SIGKILL cannot be handled: what it leaves, `verify`
names, one line per file, and the next `extract` sweeps.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import store_of
from tests.fixture_paths import SLIME_REAL
from tokenlake import layout, schema
from tokenlake.processes import KILL_SIGNAL_VARIABLE, KILL_VARIABLE
from tokenlake.store import manifest

pytestmark = pytest.mark.slow  # runs the CLI in a subprocess many times

ROOT = Path(__file__).resolve().parents[2]
DUMP = SLIME_REAL / "v2_dp2_cp2"  # slime format 2: 3 training steps and eval 0
INTERRUPTED = "Interrupted; the lake holds every step committed so far.\n"
NOTHING = (
    "Run `v2_dp2_cp2`: 0 new, 0 updated, 0 unchanged, 0 removed, 0 skipped steps; wrote 0"
    " samples and 0 tokens in T s -> {lake}\n"
)
LEFT = (
    "file `{name}` is not listed in any manifest: left by an interrupted extraction, drop or tag;"
    " `tokenlake extract` sweeps it\n"
)


def tokenlake(*args: str, at: str | None = None, sig: str = "KILL") -> tuple[int, str, str]:
    """Exit code, stdout (its seconds as `T`) and stderr of `python -m tokenlake`."""
    env = {k: v for k, v in os.environ.items() if k not in (KILL_VARIABLE, KILL_SIGNAL_VARIABLE)}
    if at is not None:
        env[KILL_VARIABLE], env[KILL_SIGNAL_VARIABLE] = at, sig
    command = [sys.executable, "-m", "tokenlake", *args]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    return done.returncode, re.sub(r" in \d+\.\d s -> ", " in T s -> ", done.stdout), done.stderr


def extract(
    lake: Path, *extra: str, at: str | None = None, sig: str = "KILL"
) -> tuple[int, str, str]:
    return tokenlake("extract", str(DUMP), "--lake", str(lake), "--workers", "1", "--silent",
                     *extra, at=at, sig=sig)  # fmt: skip


def unlisted(lake: Path) -> list[str]:
    """Files in the lake no manifest lists, besides the manifests, the lock and the catalog."""
    listed = {
        name
        for record in manifest.load_all(store_of(lake))
        for table in schema.LAKE_TABLES
        for name in record.files(table)
    }
    found = []
    for path in sorted(lake.rglob("*")):
        name = path.relative_to(lake).as_posix()
        if path.is_file() and name not in listed and name != layout.CATALOG_FILE:
            if not name.startswith(f"{layout.MANIFEST_DIR}/"):
                found.append(name)
    return found


def glob_tokens(lake: Path) -> int:
    """Rows a reader that skips the catalog sees: polars over `tokens/**` (0: no file)."""
    import polars as pl

    if not list((lake / "tokens").rglob("*.parquet")):
        return 0
    frame = pl.scan_parquet(str(lake / "tokens" / "**" / "*.parquet"), hive_partitioning=True)
    return int(frame.select(pl.len()).collect().item())


def committed_tokens(lake: Path) -> int:
    return sum(
        step.tokens
        for record in manifest.load_all(store_of(lake))
        for step in record.steps.values()
    )


def verify(lake: Path) -> tuple[int, str, str]:
    return tokenlake("verify", str(lake))


@pytest.mark.parametrize("sig", ["INT", "TERM"])
@pytest.mark.parametrize(
    ("point", "steps"),
    [
        ("extract:planned", 0),  # nothing written yet
        ("step:file-written", 0),  # the first step's tokens file written, not its others
        # the first step's files all written: a Ctrl-C still commits the finished steps
        ("extract:written", 1),
        ("extract:committed", 1),  # the first step committed, the next not started
        ("extract:published", 4),  # every step committed and published, sweep not done
    ],
)
def test_a_stopped_extraction_leaves_only_committed_files(
    tmp_path: Path, point: str, steps: int, sig: str
) -> None:
    lake = tmp_path / "lake"
    code, out, err = extract(lake, at=point, sig=sig)
    counts = {0: "0 new", 1: "1 new", 4: "4 new"}[steps]
    written = {0: "0 samples and 0 tokens", 1: "16 samples and 345 tokens",
               4: "56 samples and 1,194 tokens"}[steps]  # fmt: skip
    assert (code, out, err) == (
        130,
        f"Run `v2_dp2_cp2`: {counts}, 0 updated, 0 unchanged, 0 removed, 0 skipped steps;"
        f" wrote {written} in T s -> {lake}\n",
        INTERRUPTED,
    )
    assert unlisted(lake) == []
    assert glob_tokens(lake) == committed_tokens(lake)
    noun = "step" if steps == 1 else "steps"
    assert verify(lake) == (0, f"{steps} {noun} checked, 0 problems\n", "")
    code, out, err = extract(lake)  # completes the run
    assert (code, err) == (
        0,
        "Read the dump as slime (train dump format 2) (detected from its layout).\n",
    )
    assert out.startswith(f"Run `v2_dp2_cp2`: {4 - steps} new, 0 updated, {steps} unchanged")
    assert verify(lake) == (0, "4 steps checked, 0 problems\n", "")


@pytest.mark.parametrize("sig", ["INT", "TERM"])
def test_a_stopped_extraction_keeps_the_steps_committed_before(tmp_path: Path, sig: str) -> None:
    lake = tmp_path / "lake"
    assert extract(lake, "--steps", "0")[0] == 0
    before = committed_tokens(lake)
    code, out, err = extract(lake, at="step:file-written", sig=sig)  # a step written half
    assert (code, err) == (130, INTERRUPTED)
    assert out.startswith("Run `v2_dp2_cp2`: 0 new, 0 updated, 2 unchanged, 0 removed")
    assert unlisted(lake) == []
    assert glob_tokens(lake) == committed_tokens(lake) == before
    assert verify(lake) == (0, "2 steps checked, 0 problems\n", "")


# Killed in the middle of step 0's files (its tokens written), or with the first job's steps
# written but not committed: every step of this small dump, eval 0 included (12 files each).
@pytest.mark.parametrize(
    ("point", "files", "rows"), [("step:file-written", 1, 345), ("extract:written", 48, 1194)]
)
def test_verify_names_what_a_killed_extraction_left_and_extract_sweeps_it(
    tmp_path: Path, point: str, files: int, rows: int
) -> None:
    lake = tmp_path / "lake"
    assert extract(lake, at=point)[0] == -signal.SIGKILL
    left = unlisted(lake)
    assert len(left) == files
    assert all(name.endswith(".parquet") and "/run=v2_dp2_cp2/rollout_id=" in name for name in left)
    assert glob_tokens(lake) == rows  # a reader that globs sees rows no step committed
    lines = "".join(LEFT.format(name=name) for name in left)
    assert verify(lake) == (
        1,
        f"{lines}0 steps checked, {files} problem{'s' if files > 1 else ''}\n",
        "",
    )
    code, out, _ = extract(lake)
    assert code == 0 and out.startswith("Run `v2_dp2_cp2`: 4 new,")
    assert unlisted(lake) == []
    assert verify(lake) == (0, "4 steps checked, 0 problems\n", "")


def test_an_extraction_of_another_run_sweeps_leftovers_of_every_run(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    assert extract(lake, "--run-name", "first", at="extract:written")[0] == -signal.SIGKILL
    assert len(unlisted(lake)) == 48  # the first job: every step, 12 files each
    other = tmp_path / "v1"
    shutil.copytree(SLIME_REAL / "v1_tp2", other)
    code, _, err = tokenlake("extract", str(other), "--lake", str(lake), "--silent")
    assert code == 0, err
    assert unlisted(lake) == []
    assert not (lake / "tokens" / "run=first").exists()
    assert verify(lake) == (0, "4 steps checked, 0 problems\n", "")
