"""`tokenlake extract DIR` tells miles, slime (train dump format 1 or 2) and NeMo-RL apart by
the directory's layout, says which it read, and refuses a mixed or unrecognised directory
with one line naming what it found; `--format` forces one.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import store_of
from tests.fixture_paths import NEMO_RL_REAL, REAL_DUMPS, SLIME_REAL
from tokenlake.errors import DumpNotFoundError
from tokenlake.orchestrate.extract import ExtractOptions, extract_run
from tokenlake.read import formats, miles, nemo_rl, slime_v2

NEMO = NEMO_RL_REAL / "grpo_multiturn"
V1 = SLIME_REAL / "v1_tp2"
V2 = SLIME_REAL / "v2_dp2_cp2"
MILES = REAL_DUMPS / "basic"
NO_DUMP = (
    "is not a dump tokenlake reads: it has no `rollout_data/` directory (miles, slime), no"
    " `train_data_step{N}.jsonl` (NeMo-RL) and no `token_exports/step_{N}/rank_{R}.jsonl`"
    " (prime-rl)"
)


def run(*args: str) -> tuple[int, str, str]:
    done = subprocess.run(
        [sys.executable, "-m", "tokenlake", *args], capture_output=True, text=True, timeout=300
    )
    return done.returncode, done.stdout, done.stderr


@pytest.mark.parametrize(
    ("dump", "name"),
    [(MILES, "miles"), (V1, "slime-v1"), (V2, "slime-v2"), (NEMO, "nemo-rl")],
    ids=["miles", "slime-v1", "slime-v2", "nemo-rl"],
)
def test_each_real_dump_is_recognised_by_its_layout(dump: Path, name: str) -> None:
    listing = formats.discover(dump)
    assert listing.format == name
    assert {s.format for s in listing.steps} == {name}
    assert len(listing.steps) == (3 if name == "miles" else 4)


def test_miles_without_its_own_folders_is_told_from_slime_by_the_rollout_metadata(
    tmp_path: Path,
) -> None:
    """miles' rollout files carry a top-level `metadata` (since 2026-07-10), slime's never."""
    dump = tmp_path / "miles"
    shutil.copytree(MILES / "rollout_data", dump / "rollout_data")
    shutil.copytree(MILES / "train_data", dump / "train_data")
    assert formats.discover(dump).format == "miles"
    slime = tmp_path / "slime"
    shutil.copytree(V1, slime)
    (slime / "trajectory").mkdir()  # a folder only miles writes
    assert formats.discover(slime).format == "miles"


def test_a_per_rank_file_among_per_step_ones_is_a_mixed_directory(tmp_path: Path) -> None:
    dump = tmp_path / "mixed"
    shutil.copytree(V2, dump)
    shutil.copy(V1 / "train_data" / "0_0.pt", dump / "train_data" / "0_0.pt")
    with pytest.raises(DumpNotFoundError) as caught:
        formats.discover(dump)
    assert str(caught.value) == (
        f"`{dump}` mixes dump layouts: it holds a `rollout_data/` directory (miles, slime) and"
        " 1 per-rank train file(s) `train_data/{rid}_{rank}.pt` (miles, slime format 1) and 3"
        " per-step train file(s) `train_data/{rid}.pt` (slime format 2); give --format to read"
        " one of them"
    )


def test_nemo_rl_logs_beside_a_rollout_folder_are_one_line_from_the_cli(tmp_path: Path) -> None:
    dump = tmp_path / "both"
    shutil.copytree(V1, dump)
    shutil.copy(NEMO / "train_data_step1.jsonl", dump)
    code, out, err = run("extract", str(dump), "--lake", str(tmp_path / "lake"))
    assert (code, out) == (1, "")
    assert err == (
        f"Error: `{dump}` mixes dump layouts: it holds a `rollout_data/` directory (miles,"
        " slime) and 12 per-rank train file(s) `train_data/{rid}_{rank}.pt` (miles, slime"
        " format 1) and 1 NeMo-RL log file(s) `train_data_step{N}.jsonl`; give --format to"
        " read one of them\n"
    )
    assert not (tmp_path / "lake").exists()


def test_train_files_without_a_rollout_folder_are_named(tmp_path: Path) -> None:
    dump = tmp_path / "half"
    shutil.copytree(V2 / "train_data", dump / "train_data")
    code, out, err = run("extract", str(dump), "--lake", str(tmp_path / "lake"))
    assert (code, out) == (1, "")
    assert err == (
        f"Error: `{dump}` {NO_DUMP}; it holds 3 per-step train file(s) `train_data/{{rid}}.pt`"
        " (slime format 2)\n"
    )


def test_the_cli_says_which_format_it_read(tmp_path: Path) -> None:
    code, out, err = run("extract", str(NEMO), "--lake", str(tmp_path / "lake"), "--silent")
    assert code == 0
    assert err == "Read the dump as NeMo-RL (detected from its layout).\n"
    assert out.startswith(
        "Run `grpo_multiturn`: 4 new, 0 updated, 0 unchanged, 0 removed, 0 skipped steps;"
        " wrote 52 samples and 1,720 tokens in "
    )
    code, out, err = run(
        "extract", str(V1), "--lake", str(tmp_path / "lake"), "--silent", "--format", "slime-v1"
    )
    assert (code, err) == (0, "Read the dump as slime (train dump format 1) (as --format says).\n")


def test_an_unknown_format_is_one_line(tmp_path: Path) -> None:
    code, out, err = run("extract", str(V2), "--lake", str(tmp_path / "lake"), "--format", "verl")
    assert (code, out) == (1, "")
    assert err == (
        "Error: --format 'verl' is not a format tokenlake reads (`miles`, `slime-v1`,"
        " `slime-v2`, `nemo-rl`, `prime-rl`).\n"
    )


def test_forcing_format_1_on_a_format_2_dump_fails_each_trained_step(tmp_path: Path) -> None:
    summary = extract_run(
        V2, store_of(tmp_path / "lake"), ExtractOptions(workers=1, dump_format="slime-v1")
    )
    assert [label for label, _ in summary.failed] == ["0", "1", "2"]
    assert summary.failed[0][1] == (
        f"`{V2}/train_data/0.pt`: is a per-step train file of step 0, which the slime-v1 format"
        " does not read; extract with the matching --format (or without --format to detect"
        " it). Replace or remove the file, then extract again."
    )


def test_forcing_format_2_on_a_per_rank_dump_fails_each_trained_step(tmp_path: Path) -> None:
    summary = extract_run(
        V1, store_of(tmp_path / "lake"), ExtractOptions(workers=1, dump_format="slime-v2")
    )
    assert [label for label, _ in summary.failed] == ["0", "1", "2"]
    assert summary.failed[2][1] == (
        f"`{V1}/train_data/2_0.pt`: is a per-rank train file of step 2, which the slime-v2"
        " format does not read; extract with the matching --format (or without --format to"
        " detect it). Replace or remove the file, then extract again."
    )


def test_a_stray_per_step_file_in_a_miles_dump_fails_its_step_not_silently(
    tmp_path: Path,
) -> None:
    """Read as miles (forced), a `train_data/{rid}.pt` is never ignored into a rollout-only
    step: the step fails naming it, the others land."""
    dump = tmp_path / "miles"
    shutil.copytree(MILES, dump)
    shutil.copy(V2 / "train_data" / "1.pt", dump / "train_data" / "1.pt")
    summary = extract_run(
        dump, store_of(tmp_path / "lake"), ExtractOptions(workers=1, dump_format="miles")
    )
    assert summary.failed == [
        (
            "1",
            f"`{dump}/train_data/1.pt`: is a per-step train file of step 1, which the miles"
            " format does not read; extract with the matching --format (or without --format"
            " to detect it). Replace or remove the file, then extract again.",
        )
    ]
    assert (summary.counts["new"], summary.counts["skipped"]) == (2, 1)


def test_forcing_nemo_rl_on_a_slime_dump_finds_no_step(tmp_path: Path) -> None:
    summary = extract_run(
        V1, store_of(tmp_path / "lake"), ExtractOptions(workers=1, dump_format="nemo-rl")
    )
    assert (summary.steps, summary.failed, summary.counts["new"]) == ([], [], 0)


def test_a_runs_row_from_before_the_format_columns_reads_null_until_reextracted(
    tmp_path: Path,
) -> None:
    """A lake of schema version 3: its `runs` file lacks framework, dump_format and
    format_version (NULL); the next extraction re-reads the steps an older tokenlake wrote and
    records them."""
    from datetime import datetime, timezone

    import duckdb
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tokenlake import schema
    from tokenlake.serve import catalog
    from tokenlake.store import manifest

    lake = tmp_path / "lake"
    extract_run(V2, store_of(lake), ExtractOptions(run_name="r", workers=1))
    record = manifest.load_manifest(store_of(lake), "r")
    old_schema = pa.schema([*schema.RUNS_BASE_SCHEMA, *schema.RUN_META_SCHEMA])
    row = {"source_dir": str(V2), "extracted_at": datetime(2026, 11, 1, tzinfo=timezone.utc)}
    row |= {"tool": "tokenlake 0.3", "schema_version": 3, "train_steps": 3, "eval_steps": 1}
    pq.write_table(
        pa.Table.from_pylist([row], schema=old_schema),
        lake / "runs" / "run=r" / "run-00000001.parquet",
    )
    record.runs_file = "runs/run=r/run-00000001.parquet"
    for step in record.steps.values():
        step.schema_version = 3
    manifest.save_manifest(store_of(lake), record)
    catalog.build_catalog(store_of(lake))
    sql = "SELECT schema_version, framework, dump_format, format_version FROM runs"

    def query() -> list[tuple]:
        with duckdb.connect(str(lake / "tokenlake.duckdb"), read_only=True) as con:
            return con.execute(sql).fetchall()

    assert query() == [(3, None, None, None)]
    summary = extract_run(V2, store_of(lake), ExtractOptions(run_name="r", workers=1))
    assert summary.counts["updated"] == 4
    assert query() == [(schema.SCHEMA_VERSION, "slime", "slime-v2", 2)]


def test_every_format_has_its_step_reader_in_the_table() -> None:
    assert list(formats.STEP_READERS) == list(formats.FORMATS)
    assert formats.STEP_READERS["miles"] is formats.STEP_READERS["slime-v1"] is miles.read_step
    assert formats.STEP_READERS["slime-v2"] is slime_v2.read_step
    assert formats.STEP_READERS["nemo-rl"] is nemo_rl.read_step


@pytest.mark.parametrize(
    ("dump", "samples", "train_files"),
    [(MILES, 8, 4), (V1, 16, 4), (V2, 16, 1), (NEMO, 16, 1)],
    ids=["miles", "slime-v1", "slime-v2", "nemo-rl"],
)
def test_read_step_gives_each_format_s_first_step_as_one_step_read(
    dump: Path, samples: int, train_files: int
) -> None:
    """Every sample checked and joined to its train row; one train file per rank (slime format
    2 and NeMo-RL: one per step)."""
    step = formats.read_step(formats.discover(dump).steps[0])
    assert len(step.samples) == len(step.checked) == samples
    assert sorted(step.train_rows) == list(range(samples))
    assert step.train_files == train_files
