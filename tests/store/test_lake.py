"""The lake's layout has one owner (pipeline/tokenlake/layout.py): naming, run names, atomic writes, sweeps."""

from __future__ import annotations

import errno
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tokenlake import layout, schema
from tokenlake import layout as lake_module
from tokenlake.errors import LakeError, UsageError
from tokenlake.layout import check_run_name, manifest_name, new_name
from tokenlake.schema import METRICS, RUNS, SAMPLES, TOKENS, VOCAB
from tokenlake.store import manifest
from tokenlake.store.local import LocalStore, atomic_write

ROOT = Path(__file__).resolve().parents[2]
DEAD_PID = 2**22 + 17  # above Linux's pid_max default: never a running process


def test_files_are_named_by_the_layout(tmp_path: Path) -> None:
    lake = LocalStore(tmp_path)
    path = lake.new_file(schema.TOKENS, "qwen", schema.TRAIN_STEM, 3, "0a1b2c3d")
    assert lake.relative(path) == "tokens/run=qwen/rollout_id=3/train-0a1b2c3d.parquet"
    assert re.fullmatch(
        r"runs/run=qwen/run-[0-9a-f]{8}\.parquet",
        lake.relative(lake.new_file(schema.RUNS, "qwen", "run")),
    )
    assert lake.manifest_path("qwen") == tmp_path / "_manifest" / "qwen.json"
    assert lake.catalog_path == tmp_path / "tokenlake.duckdb"


def test_a_listed_file_outside_the_lake_is_refused(tmp_path: Path) -> None:
    with pytest.raises(LakeError) as info:
        LocalStore(tmp_path).file("../../x/important")
    assert str(info.value) == (
        f"Lake `{tmp_path}/../../x/important`: is listed by a manifest but lies outside the lake"
    )


@pytest.mark.parametrize("name", ["a?b", "a*", "a[1]", "x{1,2}"])
def test_run_names_duckdb_would_glob_are_refused(name: str) -> None:
    with pytest.raises(UsageError) as info:
        check_run_name(name)
    glob = next(c for c in name if c in "?*[]{}")
    assert str(info.value) == (
        f"Run name `{name}` holds `{glob}`, which DuckDB reads as a file pattern"
        " (`? * [ ] { }` are not allowed). Choose another with --run-name."
    )


def test_a_long_run_name_is_refused_with_the_limit() -> None:
    with pytest.raises(UsageError) as info:
        check_run_name("r" * 260)
    assert str(info.value) == (
        f"Run name `{'r' * 60}…` is 260 bytes long; the limit is 250 bytes (UTF-8), as it"
        " becomes a file name. Choose another with --run-name."
    )
    assert check_run_name("r" * 250) == "r" * 250


def test_a_run_name_with_control_characters_is_quoted_escaped() -> None:
    with pytest.raises(UsageError) as info:
        check_run_name("a\x1b[2J\nb\x7f")
    assert str(info.value) == (
        "Run name `a\\x1b[2J\\nb\\x7f` cannot be a partition directory: it must be non-empty,"
        " not start with `.`, and contain no `/`, `\\`, `=`, `%` or control characters."
        " Choose another with --run-name."
    )


def test_a_run_name_in_another_encoding_is_refused() -> None:
    name = b"caf\xe9".decode("utf-8", "surrogateescape")  # a latin-1 directory name
    with pytest.raises(UsageError) as info:
        check_run_name(name)
    assert str(info.value) == (
        "Run name `caf\\udce9` is not valid UTF-8 (the dump directory's name is in another"
        " encoding). Choose another with --run-name."
    )


@pytest.mark.parametrize("name", ["../../x/important", "..", ".hidden", "a/b", "a\x1bb"])
def test_a_run_name_that_leaves_its_folder_is_refused(name: str) -> None:
    with pytest.raises(UsageError, match="cannot be a partition directory"):
        LocalStore("/tmp/l").manifest_path(name)


def test_atomic_write_uses_a_name_only_tokenlake_makes(tmp_path: Path) -> None:
    seen: list[str] = []

    def write(tmp: Path) -> None:
        seen.append(tmp.name)
        tmp.write_text("done")

    atomic_write(tmp_path / "f.json", write, durable=True)
    assert (tmp_path / "f.json").read_text() == "done"
    assert re.fullmatch(rf"\.tokenlake-{os.getpid()}-[0-9a-f]{{8}}\.tmp", seen[0])
    assert os.listdir(tmp_path) == ["f.json"]


def test_atomic_write_on_a_full_disk_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(tmp: Path) -> None:
        tmp.write_text("half")
        Path(f"{tmp}.wal").write_text("log")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(LakeError) as info:
        atomic_write(tmp_path / "f.json", full, problem="manifest cannot be written")
    assert str(info.value) == (
        f"Lake `{tmp_path / 'f.json'}`: manifest cannot be written (No space left on device)"
    )
    assert os.listdir(tmp_path) == []


def test_every_writer_goes_through_the_one_atomic_write() -> None:
    """Nothing else in the package renames files into place or builds a partition path."""
    # synth writes dumps, remote_stage a remote dump's local stage: neither writes a lake
    owners = {"layout.py", "local.py", "synth.py", "remote_stage.py"}
    paths = sorted((ROOT / "pipeline").rglob("*.py"))
    assert {"layout.py", "local.py", "write.py"} <= {p.name for p in paths}, ROOT
    for path in paths:
        text = path.read_text(encoding="utf-8")
        if path.name not in owners:
            assert "os.replace(" not in text, path.name
            assert '.tmp"' not in text, path.name
        if path.name != "layout.py":
            assert "def partition_dir" not in text and '"_manifest' not in text, path.name


def test_sweeps_delete_only_what_the_scheme_made(tmp_path: Path) -> None:
    lake = LocalStore(tmp_path)
    partition = tmp_path / "tokens" / "run=r" / "rollout_id=0"
    partition.mkdir(parents=True)
    (tmp_path / "_manifest").mkdir()
    listed = partition / "train-0a1b2c3d.parquet"
    ours = [
        partition / "train-feedbeef.parquet",  # written, never committed
        partition / f".tokenlake-{DEAD_PID}-0a1b2c3d.tmp",
        tmp_path / f".tokenlake-{DEAD_PID}-0a1b2c3d.tmp.wal",
    ]
    theirs = [
        partition / "notes.txt",
        partition / ".name.123.tmp",
        tmp_path / ".name.123.tmp",
        partition / ".eval-0bad0bad.parquet.123.tmp",  # not a name of tokenlake's scheme
        tmp_path / f".tokenlake.duckdb.{DEAD_PID}.tmp",
        tmp_path / f".report.{DEAD_PID}.tmp",
        tmp_path / "_manifest" / f".x.json.{DEAD_PID}.tmp",
        tmp_path / f".tokenlake-{os.getpid()}-0a1b2c3d.tmp",  # its writer still runs
    ]
    for path in [listed, *ours, *theirs]:
        path.write_text("x")
    record = manifest.RunManifest(run="r", source_dir="")
    record.steps["0"] = manifest.StepRecord(
        0, False, [], {"tokens": lake.relative(listed)}, 1, 1, 0, ""
    )
    assert lake.delete_unlisted(record) == 2
    assert lake.delete_stale_temporaries() == 1
    assert [p for p in ours if p.exists()] == []
    assert [p for p in [listed, *theirs] if not p.exists()] == []


def test_delete_unlisted_of_some_tables_leaves_the_others(tmp_path: Path) -> None:
    """`tag` sweeps only the `runs` files it writes: another table's unlisted file stays."""
    lake = LocalStore(tmp_path)
    stale_row = tmp_path / "runs" / "run=r" / "run-0a1b2c3d.parquet"
    stale_step = tmp_path / "tokens" / "run=r" / "rollout_id=0" / "train-0a1b2c3d.parquet"
    for path in (stale_row, stale_step):
        path.parent.mkdir(parents=True)
        path.write_text("x")
    record = manifest.RunManifest(run="r", source_dir="")
    assert lake.delete_unlisted(record, ("runs",)) == 1
    assert (stale_row.exists(), stale_step.exists()) == (False, True)


def test_empty_partitions_are_removed_and_foreign_folders_kept(tmp_path: Path) -> None:
    lake = LocalStore(tmp_path)
    (tmp_path / "tokens" / "run=r" / "rollout_id=0").mkdir(parents=True)
    (tmp_path / "tokens" / "run=r" / "backup").mkdir()
    (tmp_path / "tokens" / "run=r" / "rollout_id=0" / "train-0a1b2c3d.parquet").write_text("x")
    lake.delete_unlisted(manifest.RunManifest(run="r", source_dir=""))
    assert sorted(p.name for p in (tmp_path / "tokens" / "run=r").iterdir()) == ["backup"]


def test_the_lock_admits_one_writer(tmp_path: Path) -> None:
    with LocalStore(tmp_path).lock():
        with pytest.raises(LakeError) as info, LocalStore(tmp_path).lock():
            pass
    assert str(info.value) == (
        f"Lake `{tmp_path}`: another tokenlake command (an extraction, a tag, a drop) is writing to it; wait for it to finish"
    )


def test_partition_values_come_from_the_end_of_the_path() -> None:
    path = "/d/run=ghost/rollout_id=7/lake/samples/run=a b/rollout_id=12/eval-0a1b2c3d.parquet"
    found = {
        col: re.search(pattern, path).group(1)  # type: ignore[union-attr]
        for col, pattern in lake_module.partition_patterns(schema.SAMPLES).items()
    }
    assert found == {"run": "a b", "rollout_id": "12"}


def test_a_stale_temporary_of_a_killed_process_is_recognised(tmp_path: Path) -> None:
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True
    )
    pid = int(child.stdout)
    (tmp_path / f".tokenlake-{pid}-0a1b2c3d.tmp").write_text("x")
    assert LocalStore(tmp_path).delete_stale_temporaries() == 1


def _documented_layout() -> list[str]:
    text = (ROOT / "docs" / "columns.md").read_text(encoding="utf-8")
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    return [line.split()[0] for line in block.strip().splitlines()[1:]]  # after `LAKE/`


def test_the_documented_layout_is_the_one_the_code_makes() -> None:
    documented = _documented_layout()
    made = {
        new_name(table, "<run>", stem, 7 if table in (TOKENS, SAMPLES) else None, "0a1b2c3d")
        .replace("rollout_id=7", "rollout_id=<step>")
        .replace("0a1b2c3d", "<gen>")
        for table, stem in [
            (TOKENS, "train"),
            (TOKENS, "eval"),
            (RUNS, "run"),
            (VOCAB, "vocab"),
            (METRICS, "metrics"),
        ]
    }
    made |= {"samples/run=<run>/rollout_id=<step>/{train,eval}-<gen>.parquet"}
    rollup = new_name(schema.ROLLUP_TABLES[0], "<run>", "train", 7, "0a1b2c3d")
    made |= {
        rollup.replace(schema.ROLLUP_TABLES[0], "<rollup>")
        .replace("rollout_id=7", "rollout_id=<step>")
        .replace("train-0a1b2c3d", "{train,eval}-<gen>")
    }
    made |= {manifest_name("<run>"), f"{layout.USER_VIEWS_DIR}/<name>.sql", layout.CATALOG_FILE}
    made = {m.replace("_manifest/<run>.json", f"{layout.MANIFEST_DIR}/<run>.json") for m in made}
    assert sorted(documented) == sorted(made)
