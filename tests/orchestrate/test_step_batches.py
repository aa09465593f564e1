"""Consecutive small steps are extracted as one job whose rollups are computed together
(`scheduler.step_batches`, `step.extract_steps`, `rollups.compute_steps`): the lake is the same,
bit for bit, as when every step is a job alone; a job's dump files stay within its bound; a bad
step in a job costs only itself."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from tests.conftest import store_of
from tokenlake.cli import main
from tokenlake.generator import synth
from tokenlake.orchestrate import scheduler
from tokenlake.orchestrate.extract import ExtractOptions, extract_run
from tokenlake.orchestrate.step import StepStatus
from tokenlake.read import dump
from tokenlake.serve import rollups
from tokenlake.store import manifest


def _step(rollout_id: int, size: int, evaluation: bool = False) -> scheduler.Todo:
    """A step listed on an object store with one object of `size` bytes."""
    folder = "eval_data" if evaluation else "rollout_data"
    remote = dump.RemoteFiles("s3://b/d", ((f"{folder}/{rollout_id}.pt", size, 0),))
    files = dump.StepFiles(
        rollout_id, evaluation, Path(f"d/{folder}/{rollout_id}.pt"), remote=remote
    )
    return files, StepStatus.NEW


def _labels(batches: list[list[scheduler.Todo]]) -> list[list[str]]:
    return [[files.label for files, _ in batch] for batch in batches]


def test_a_job_holds_consecutive_steps_within_its_bytes_and_steps():
    todo = [_step(i, size) for i, size in enumerate([3, 3, 3, 9, 2, 2, 2, 2, 2, 11])]
    batches = scheduler.step_batches(todo, budget=10, most=4)
    # 3+3+3 (a 9 would pass 10), the 9 alone, four of 2 (the most), 2, the 11 over the budget
    assert _labels(batches) == [["0", "1", "2"], ["3"], ["4", "5", "6", "7"], ["8"], ["9"]]
    for batch in batches:
        sizes = [files.remote.objects[0][1] for files, _ in batch]  # type: ignore[union-attr]
        assert len(batch) == 1 or (sum(sizes) <= 10 and len(batch) <= 4)


def test_a_train_step_and_its_eval_file_can_be_one_job():
    todo = [_step(0, 1), _step(0, 1, evaluation=True), _step(1, 1), _step(1, 1, evaluation=True)]
    assert _labels(scheduler.step_batches(todo)) == [["0", "eval_0", "1", "eval_1"]]


def test_every_worker_gets_a_job_and_a_step_of_unknown_size_is_alone(tmp_path):
    todo = [_step(i, 1) for i in range(6)]
    assert _labels(scheduler.step_batches(todo, workers=2)) == [
        ["0", "1", "2"],
        ["3", "4", "5"],
    ]
    gone = dump.StepFiles(9, False, tmp_path / "rollout_data" / "9.pt")  # nothing to look at
    batches = scheduler.step_batches([todo[0], (gone, StepStatus.NEW), todo[1]])
    assert _labels(batches) == [["0"], ["9"], ["1"]]


def test_steps_that_fit_one_job_are_extracted_in_this_process_unless_workers_are_given():
    cores = os.cpu_count() or 1
    quarter = scheduler.BATCH_BYTES // 4
    assert scheduler.chosen_workers([_step(i, quarter) for i in range(4)]) == 1
    assert scheduler.chosen_workers([_step(i, quarter) for i in range(5)]) == cores  # 4 MiB + 1/4
    assert scheduler.chosen_workers([_step(i, 1) for i in range(scheduler.BATCH_STEPS)]) == 1
    assert (
        scheduler.chosen_workers([_step(i, 1) for i in range(scheduler.BATCH_STEPS + 1)]) == cores
    )
    gone = dump.StepFiles(9, False, Path("/nonexistent/rollout_data/9.pt"))  # size unknown
    assert scheduler.chosen_workers([_step(0, 1), (gone, StepStatus.NEW)]) == cores


def test_the_cli_extracts_a_small_dump_without_a_worker_process_and_says_so_in_its_help(
    tmp_path, monkeypatch
):
    def no_pool(processes: int) -> None:
        raise AssertionError(f"a pool of {processes} was started")

    monkeypatch.setattr(scheduler, "_worker_pool", no_pool)
    dump_dir = tmp_path / "dump"
    synth.write_dump(dump_dir, synth.PRESETS["example"])
    args = ["extract", str(dump_dir), "--lake", str(tmp_path / "lake"), "--silent"]
    result = CliRunner().invoke(main, args)
    assert (result.exit_code, result.stderr) == (0, "")
    assert result.stdout.startswith("Run `dump`: 4 new, 0 updated, 0 unchanged, 0 removed")
    with pytest.raises(AssertionError, match="a pool of 1 was started"):
        again = ["extract", str(dump_dir), "--lake", str(tmp_path / "other"), "--workers", "2"]
        CliRunner().invoke(main, again, catch_exceptions=False)
    shown = " ".join(CliRunner().invoke(main, ["extract", "--help"]).stdout.split())
    budget = f"1 for a dump of at most {scheduler.BATCH_STEPS} steps and {scheduler.BATCH_BYTES >> 20} MiB"
    assert f"[default: (the core count; {budget})]" in shown


def _files(lake: Path) -> dict[tuple[str, str], tuple[object, ...]]:
    """Every step's files by (step, table): the rows, the file's identity (its size and
    footer), the record's rollup digests."""
    (record,) = manifest.load_all(store_of(lake))
    found = {}
    for label, step in record.steps.items():
        for table, name in step.files.items():
            rows = pq.read_table(lake / name)
            identity = step.identities[table]
            found[label, table] = (rows, identity, step.rollup_version, step.rollup_settings)
    return found


@pytest.fixture(scope="module", params=["rollout-only", "example-6"])
def mixed_dump(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    """Three steps and an eval file, one rollout-only (no drift tokens); six multi-turn steps
    and an eval file, enough groups that a hash aggregate over several steps gives them in
    another order than over one."""
    folder = tmp_path_factory.mktemp("mixed") / "dump"
    preset = synth.PRESETS["rollout-only"]
    if request.param == "example-6":
        preset = replace(synth.PRESETS["example"], steps=6)
    synth.write_dump(folder, preset)
    return folder


def test_steps_extracted_together_write_what_steps_extracted_alone_write(
    mixed_dump, tmp_path, monkeypatch
):
    together = []
    compute_steps = rollups.compute_steps

    def spied(steps, run):
        together.append(len(steps))
        return compute_steps(steps, run)

    monkeypatch.setattr(rollups, "compute_steps", spied)
    options = ExtractOptions(run_name="r", workers=1)
    batched = extract_run(mixed_dump, store_of(tmp_path / "batched"), options)
    assert together == [len(batched.steps)]  # every step, eval files too, in one job
    monkeypatch.setattr(scheduler, "BATCH_STEPS", 1)
    together.clear()
    alone = extract_run(mixed_dump, store_of(tmp_path / "alone"), options)
    assert together == [1] * len(alone.steps)

    assert batched.counts == alone.counts
    mine, theirs = _files(tmp_path / "batched"), _files(tmp_path / "alone")
    assert mine.keys() == theirs.keys()
    assert {table for _, table in mine} >= set(rollups.rollup_names())
    for key, (rows, *recorded) in mine.items():
        other_rows, *other_recorded = theirs[key]
        assert rows.equals(other_rows, check_metadata=False), key  # same rows, same order
        assert recorded == other_recorded, key  # the same bytes where a file's size and
        # footer tell (the source's path in its metadata is the same dump's)


def test_a_bad_step_in_a_job_costs_only_itself(mixed_dump, tmp_path):
    copy = tmp_path / "dump"
    import shutil

    shutil.copytree(mixed_dump, copy)
    (copy / "rollout_data" / "2.pt").write_bytes(b"not a pickle")
    summary = extract_run(copy, store_of(tmp_path / "lake"), ExtractOptions(workers=1))
    assert [label for label, _ in summary.failed] == ["2"]
    assert sorted(s.rollout_id for s in summary.steps) == sorted(
        s.rollout_id for s in dump.discover(copy).steps if s.label != "2"
    )
