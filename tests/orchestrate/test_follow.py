"""`extract --follow`: a live run is extracted step by step as its files complete.

The live dump is fed from a copy of the real `basic` dump (train steps 0 and 1 with 4 rank
files each, and `eval_0`), one file at a time and each file in two writes, as `torch.save`
writes in place. The end state must equal a one-shot extraction of the finished dump.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import store_of
from tests.fixture_paths import REAL_DUMPS
from tests.follower import ROUND_WAIT, Follower
from tokenlake import layout, schema
from tokenlake.orchestrate.extract import ExtractOptions, ExtractSummary, extract_run
from tokenlake.orchestrate.follow import FollowState, follow_round
from tokenlake.orchestrate.verify import verify_lake
from tokenlake.store import manifest

pytestmark = pytest.mark.slow  # every test extracts real dump files

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = REAL_DUMPS
# (file, whether the files written so far settle after it). Each file is written in two parts,
# with a whole round between them. Step 1 settles as rollout-only before its train files arrive.
# miles' order: the conversation sidecar, then the rollout file, then (later) every rank.
WRITE_ORDER = [
    ("trajectory/0.jsonl", False),
    ("rollout_data/0.pt", False),
    *((f"train_data/0_{rank}.pt", rank == 3) for rank in range(4)),
    ("rollout_data/eval_0.pt", False),
    ("trajectory/1.jsonl", False),
    ("rollout_data/1.pt", True),
    *((f"train_data/1_{rank}.pt", False) for rank in range(4)),
]
OLD = 7200.0


def empty_dump(path: Path) -> Path:
    """A dump directory as miles creates it at start: the folders, no files yet."""
    (path / "rollout_data").mkdir(parents=True)
    (path / "train_data").mkdir()
    (path / "trajectory").mkdir()
    return path.resolve()


def rows(lake: Path, table: str) -> list[tuple]:
    import duckdb

    with duckdb.connect(str(lake / layout.CATALOG_FILE), read_only=True) as con:
        found = con.execute(f"SELECT * FROM {table}").fetchall()
    return sorted(tuple(map(repr, row)) for row in found)


def one_shot(tmp_path: Path, run: str) -> Path:
    lake = tmp_path / "one-shot"
    extract_run(FIXTURES / "basic", store_of(lake), ExtractOptions(run_name=run, workers=1))
    return lake


def step_train_files(lake: Path) -> list[tuple]:
    import duckdb

    with duckdb.connect(str(lake / layout.CATALOG_FILE), read_only=True) as con:
        return con.execute(
            "SELECT rollout_id, evaluation, min(step_train_files), bool_and(has_train_row)"
            " FROM samples GROUP BY ALL ORDER BY ALL"
        ).fetchall()


def counts(summary: ExtractSummary) -> tuple[int, ...]:
    return tuple(summary.counts.values())  # new, updated, unchanged, removed, skipped


def write_in_two_parts(source: Path, target: Path, between: Callable[[], None]) -> None:
    data = source.read_bytes()
    with open(target, "wb") as handle:
        handle.write(data[: len(data) // 2])
        handle.flush()
        between()  # a reader now sees a young, truncated file
        handle.write(data[len(data) // 2 :])


def test_follow_a_run_while_it_is_written(tmp_path: Path) -> None:
    live, lake = empty_dump(tmp_path / "live"), tmp_path / "lake"
    follower = Follower(live, lake, "live", poll_seconds=0.01)
    for name, settles in WRITE_ORDER:
        write_in_two_parts(FIXTURES / "basic" / name, live / name, follower.whole_round)
        if settles:
            follower.settle()
    follower.quiet()
    follower.stop()
    assert follower.errors == []
    rounds = follower.rounds
    assert sum(r.counts["new"] for r in rounds) == 3
    # Step 1 went in rollout-only first, and was extracted again once its ranks were complete.
    step_1 = [(r.train_files, r.samples) for s in rounds for r in s.steps if r.rollout_id == 1]
    assert step_1[0] == (0, 8) and step_1[-1] == (4, 8)

    reference = one_shot(tmp_path, "live")
    assert verify_lake(store_of(lake)) == (3, [])
    for table in (schema.TOKENS, schema.SAMPLES):
        assert rows(lake, table) == rows(reference, table), table


def test_young_truncated_file_is_picked_up_once_complete(tmp_path: Path) -> None:
    live, lake = tmp_path / "live", tmp_path / "lake"
    shutil.copytree(FIXTURES / "basic", live)
    partial = live / "train_data" / "0_1.pt"
    full = partial.read_bytes()
    partial.write_bytes(full[:1000])  # being written now
    state = FollowState()

    summary = follow_round(
        live, store_of(lake), "live", state, ExtractOptions(settle_seconds=0.0), None
    )
    assert counts(summary) == (2, 0, 0, 0, 1)
    assert summary.failed == [
        (
            "0",
            f"rank 1: Cannot read `{partial.resolve()}`: the zip archive is incomplete (no central"
            " directory at its end), so the file is truncated. It was modified less than a minute"
            " ago and is probably still being written; extract again later.",
        )
    ]
    summary = follow_round(
        live, store_of(lake), "live", state, ExtractOptions(settle_seconds=0.0), None
    )  # unchanged: not retried
    assert (counts(summary), summary.failed) == ((0, 0, 2, 0, 0), [])

    partial.write_bytes(full)  # the writer finishes
    summary = follow_round(
        live, store_of(lake), "live", state, ExtractOptions(settle_seconds=0.0), None
    )
    assert counts(summary) == (1, 0, 2, 0, 0)
    reference = one_shot(tmp_path, "live")
    for table in (schema.TOKENS, schema.SAMPLES):
        assert rows(lake, table) == rows(reference, table), table


def test_file_completed_while_its_failed_read_was_reported_is_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer finishes the file between the failed read and the end of the round: the
    step was judged on the old content, so the next round must try it again."""
    from tokenlake.orchestrate import scheduler as extract_module

    live, lake = tmp_path / "live", tmp_path / "lake"
    shutil.copytree(FIXTURES / "basic", live)
    partial = live / "train_data" / "0_1.pt"
    full = partial.read_bytes()
    partial.write_bytes(full[:1000])
    real_extract_steps = extract_module.extract_steps

    def extract_then_finish_writing(batch, lake, run):  # type: ignore[no-untyped-def]
        outcomes = real_extract_steps(batch, lake, run)
        if any(outcome.error is not None for outcome in outcomes):
            partial.write_bytes(full)
        return outcomes

    state = FollowState()
    with monkeypatch.context() as patched:
        patched.setattr(extract_module, "extract_steps", extract_then_finish_writing)
        assert counts(
            follow_round(
                live, store_of(lake), "live", state, ExtractOptions(settle_seconds=0.0), None
            )
        ) == (2, 0, 0, 0, 1)
    assert counts(
        follow_round(live, store_of(lake), "live", state, ExtractOptions(settle_seconds=0.0), None)
    ) == (1, 0, 2, 0, 0)


def test_old_unreadable_file_is_an_error_until_it_changes(tmp_path: Path) -> None:
    live, lake = tmp_path / "live", tmp_path / "lake"
    shutil.copytree(FIXTURES / "basic", live)
    bad = live / "rollout_data" / "1.pt"
    bad.write_bytes(b"")
    stamp = time.time() - OLD
    os.utime(bad, (stamp, stamp))
    state = FollowState()
    summary = follow_round(
        live, store_of(lake), "live", state, ExtractOptions(settle_seconds=0.0), None
    )
    assert summary.failed == [
        (
            "1",
            f"Cannot read `{bad.resolve()}`: the file is empty (0 bytes). Replace or remove the"
            " file, then extract again.",
        )
    ]
    summary = follow_round(
        live, store_of(lake), "live", state, ExtractOptions(settle_seconds=0.0), None
    )
    assert (counts(summary), summary.failed) == ((0, 0, 2, 0, 0), [])  # reported once
    shutil.copy(FIXTURES / "basic" / "rollout_data" / "1.pt", bad)
    assert counts(
        follow_round(live, store_of(lake), "live", state, ExtractOptions(settle_seconds=0.0), None)
    ) == (1, 0, 2, 0, 0)


def test_rollout_only_step_is_extracted_again_when_all_ranks_appear(tmp_path: Path) -> None:
    live, lake = tmp_path / "live", tmp_path / "lake"
    shutil.copytree(FIXTURES / "basic", live)
    parked = tmp_path / "parked"
    parked.mkdir()
    for path in sorted((live / "train_data").glob("1_*.pt")):
        shutil.move(path, parked / path.name)
    state = FollowState()
    assert counts(
        follow_round(live, store_of(lake), "live", state, ExtractOptions(settle_seconds=0.0), None)
    ) == (3, 0, 0, 0, 0)
    assert state.expected_ranks == frozenset({0, 1, 2, 3})  # learnt from step 0
    assert step_train_files(lake) == [
        (0, False, 4, True),
        (0, True, 0, False),
        (1, False, 0, False),
    ]

    # Half the ranks, before the files settle (a settled step is extracted with the ranks it
    # has): not complete, the lake keeps the rollout-only step.
    for rank in (0, 1):
        shutil.move(parked / f"1_{rank}.pt", live / "train_data" / f"1_{rank}.pt")
    assert counts(
        follow_round(
            live, store_of(lake), "live", state, ExtractOptions(settle_seconds=math.inf), None
        )
    ) == (0, 0, 1, 0, 0)
    assert step_train_files(lake)[2] == (1, False, 0, False)

    for rank in (2, 3):
        shutil.move(parked / f"1_{rank}.pt", live / "train_data" / f"1_{rank}.pt")
    assert counts(
        follow_round(
            live, store_of(lake), "live", state, ExtractOptions(settle_seconds=math.inf), None
        )
    ) == (0, 1, 1, 0, 0)
    assert step_train_files(lake)[2] == (1, False, 4, True)
    assert verify_lake(store_of(lake)) == (3, [])


def test_step_deleted_from_a_followed_run_is_removed(tmp_path: Path) -> None:
    live, lake = tmp_path / "live", tmp_path / "lake"
    shutil.copytree(FIXTURES / "basic", live)
    state = FollowState()
    follow_round(live, store_of(lake), "live", state, ExtractOptions(settle_seconds=0.0), None)
    for path in [live / "rollout_data" / "1.pt", *(live / "train_data").glob("1_*.pt")]:
        path.unlink()
    assert counts(
        follow_round(live, store_of(lake), "live", state, ExtractOptions(settle_seconds=0.0), None)
    ) == (0, 0, 2, 1, 0)
    assert sorted(manifest.load_manifest(store_of(lake.resolve()), "live").steps) == ["0", "eval_0"]


def _start_follow(dump: Path, lake: Path, workers: int) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "tokenlake", "extract", str(dump), "--lake", str(lake)]
    command += ["--follow", "--poll", "0.1", "--settle", "0.2", "--workers", str(workers)]
    # Its own process group, so SIGINT reaches it and its workers, as Ctrl-C in a terminal does;
    # faulthandler, so a follower that hangs can be made to print where (`_ctrl_c`).
    return subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, env={**os.environ, "PYTHONFAULTHANDLER": "1"},
    )  # fmt: skip


def _ctrl_c(process: subprocess.Popen[str]) -> tuple[str, str]:
    os.killpg(process.pid, signal.SIGINT)
    try:
        return process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)  # faulthandler prints every thread's stack
        _, err = process.communicate(timeout=30)
        pytest.fail(f"still running 60 s after a Ctrl-C; its stacks:\n{err}")


def _killed_if_stuck(process: subprocess.Popen[str]) -> threading.Timer:
    """A blocking read of the child's output ends (with EOF) if the child hangs."""
    timer = threading.Timer(ROUND_WAIT, process.kill)
    timer.daemon = True
    timer.start()
    return timer


def test_ctrl_c_ends_follow_cleanly(tmp_path: Path) -> None:
    dump = tmp_path / "run 'a'"
    shutil.copytree(FIXTURES / "basic", dump)
    lake = tmp_path / "lake"
    process = _start_follow(dump, lake, workers=1)
    assert process.stdout is not None
    with_deadline = _killed_if_stuck(process)
    first = process.stdout.readline()  # the first round's summary: every step is in the lake
    with_deadline.cancel()
    out, err = _ctrl_c(process)
    out = first + out
    assert process.returncode == 0
    assert err.splitlines() == [
        f"Following {dump} every 0.1 s; Ctrl-C stops.",
        "Stopped; the lake holds every step extracted so far.",
    ]
    assert out.startswith(f"Run `{dump.name}`: 3 new, 0 updated, 0 unchanged, 0 removed, 0 skipped")
    assert len(out.splitlines()) == 1
    assert verify_lake(store_of(lake)) == (3, [])


def test_ctrl_c_during_a_parallel_extraction_leaves_a_consistent_lake(tmp_path: Path) -> None:
    dump = tmp_path / "run"
    shutil.copytree(FIXTURES / "cp2", dump)
    lake = tmp_path / "lake"
    process = _start_follow(dump, lake, workers=2)
    assert process.stderr is not None
    assert process.stderr.readline() == f"Following {dump} every 0.1 s; Ctrl-C stops.\n"
    deadline = time.monotonic() + ROUND_WAIT
    # The lake is made: the first round is starting (importing its engines), extracting or done.
    while not (lake / "_manifest").exists():
        assert time.monotonic() < deadline and process.poll() is None
        time.sleep(0.01)
    out, err = _ctrl_c(process)
    assert process.returncode == 0
    assert "Traceback" not in err
    assert err.endswith("Stopped; the lake holds every step extracted so far.\n")
    checked, problems = verify_lake(store_of(lake))
    assert problems == []
    summary = extract_run(
        dump, store_of(lake), ExtractOptions(workers=1)
    )  # an ordinary run completes it
    assert summary.counts["unchanged"] == checked
    assert summary.counts["new"] == 3 - checked
