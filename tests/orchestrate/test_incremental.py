"""Extracting a run again re-reads only what changed, says so, and keeps the lake consistent.

Works on copies of the real `basic` dump (train steps 0 and 1 with 4 rank files each, plus
`eval_0`: 3 steps, 20 samples, 206 response tokens) and `removed` (a second run in the same
lake, which every test checks is left byte-identical).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.conftest import store_of
from tests.fixture_paths import REAL_DUMPS
from tokenlake import layout, schema
from tokenlake.cli import main
from tokenlake.orchestrate import extract as extract_module
from tokenlake.orchestrate.extract import ExtractOptions, extract_run
from tokenlake.orchestrate.verify import verify_lake

pytestmark = pytest.mark.slow  # every test extracts real dump files

FIXTURES = REAL_DUMPS
OLD = 7200.0


def copy_dump(tmp_path: Path, case: str = "basic") -> Path:
    target = tmp_path / case
    shutil.copytree(FIXTURES / case, target)
    for path in target.rglob("*"):
        stamp = path.stat().st_mtime - OLD
        os.utime(path, (stamp, stamp))
    return target.resolve()


def cli(*args: str) -> tuple[int, str, list[str]]:
    result = CliRunner().invoke(main, list(args))
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return (
        result.exit_code,
        re.sub(r" in \d+\.\d s ", " in T s ", result.stdout),
        result.stderr.splitlines(),
    )


def extract(dump: Path, lake: Path, *extra: str) -> tuple[int, str, list[str]]:
    return cli("extract", str(dump), "--lake", str(lake), "--workers", "1", "--silent", *extra)


def line(run: str, lake: Path, counts: tuple[int, ...], samples: int, tokens: int) -> str:
    new, updated, unchanged, removed, skipped = counts
    return (
        f"Run `{run}`: {new} new, {updated} updated, {unchanged} unchanged, {removed} removed,"
        f" {skipped} skipped steps; wrote {samples:,} samples and {tokens:,} tokens"
        f" in T s -> {lake.resolve()}\n"
    )


def stamps(lake: Path, run: str | None = None) -> dict[str, int]:
    """Name → mtime_ns of every lake file (or of one run's Parquet files and manifest)."""
    found = {}
    for path in sorted(lake.rglob("*")):
        relative = str(path.relative_to(lake))
        mine = run is None or f"run={run}/" in relative or relative == f"_manifest/{run}.json"
        if path.is_file() and mine:
            found[relative] = path.stat().st_mtime_ns
    return found


def contents(lake: Path, run: str) -> dict[str, str]:
    return {
        name: hashlib.blake2b((lake / name).read_bytes()).hexdigest() for name in stamps(lake, run)
    }


def catalog_rows(lake: Path, sql: str) -> list[tuple]:
    import duckdb

    with duckdb.connect(str(lake / layout.CATALOG_FILE), read_only=True) as con:
        return con.execute(sql).fetchall()


STEPS_SQL = (
    "SELECT rollout_id, evaluation, count(*)::INT, min(step_train_files), bool_and(has_train_row)"
    " FROM samples WHERE run = 'basic' GROUP BY ALL ORDER BY ALL"
)
ALL_STEPS = [(0, False, 8, 4, True), (0, True, 4, 0, False), (1, False, 8, 4, True)]


@pytest.fixture
def lake_with_two_runs(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """(dump, lake) with `basic` extracted, next to run `other`; and `other`'s file hashes."""
    dump, lake = copy_dump(tmp_path), tmp_path / "lake"
    assert extract(copy_dump(tmp_path, "removed"), lake, "--run-name", "other")[0] == 0
    code, out, err = extract(dump, lake)
    assert (code, err, out) == (0, [], line("basic", lake, (3, 0, 0, 0, 0), 20, 206))
    return dump, lake, contents(lake, "other")


def test_unchanged_run_rewrites_nothing(lake_with_two_runs: tuple[Path, Path, dict]) -> None:
    dump, lake, other = lake_with_two_runs
    before = stamps(lake)
    code, out, err = extract(dump, lake)
    assert (code, err, out) == (0, [], line("basic", lake, (0, 0, 3, 0, 0), 0, 0))
    assert stamps(lake) == before  # no Parquet file, manifest or catalog was rewritten
    assert contents(lake, "other") == other


def test_touched_train_file_updates_its_step_only(
    lake_with_two_runs: tuple[Path, Path, dict],
) -> None:
    dump, lake, other = lake_with_two_runs
    before = stamps(lake, "basic")
    os.utime(dump / "train_data" / "1_2.pt")
    code, out, err = extract(dump, lake)
    assert (code, err, out) == (0, [], line("basic", lake, (0, 1, 2, 0, 0), 8, 82))
    after = stamps(lake, "basic")
    changed = sorted(set(before.items()) ^ set(after.items()))
    rollups = ["rollups"] * (2 * len(schema.ROLLUP_TABLES))  # each rollup's, old and new
    assert [name.split("/")[0] for name, _ in changed if "rollout_id=1/" in name] == [
        *rollups, "samples", "samples", "tokens", "tokens",  # the old pair deleted, a new pair written
    ]  # fmt: skip
    assert {n for n, _ in changed if "rollout_id=" in n} == {
        n for n, _ in changed if "rollout_id=1/" in n
    }  # step 0 and eval_0 untouched
    assert catalog_rows(lake, STEPS_SQL) == ALL_STEPS
    assert contents(lake, "other") == other
    assert verify_lake(store_of(lake)) == (3 + 4, [])


def test_steps_written_by_an_older_schema_are_extracted_again(
    lake_with_two_runs: tuple[Path, Path, dict],
) -> None:
    """A lake from a tokenlake whose files lack today's columns (schema version 1 had no
    `turn_index`) is brought up to date by extracting again, not left half old."""
    import json

    dump, lake, other = lake_with_two_runs
    path = lake / "_manifest" / "basic.json"
    data = json.loads(path.read_text())
    assert {step["schema_version"] for step in data["steps"].values()} == {schema.SCHEMA_VERSION}
    for step in data["steps"].values():
        del step["schema_version"]  # as a manifest written before the field existed
    path.write_text(json.dumps(data))
    code, out, err = extract(dump, lake)
    assert (code, err, out) == (0, [], line("basic", lake, (0, 3, 0, 0, 0), 20, 206))
    data = json.loads(path.read_text())
    assert {step["schema_version"] for step in data["steps"].values()} == {schema.SCHEMA_VERSION}
    assert extract(dump, lake)[1] == line("basic", lake, (0, 0, 3, 0, 0), 0, 0)
    assert contents(lake, "other") == other


def test_deleted_rollout_file_removes_its_step(lake_with_two_runs: tuple[Path, Path, dict]) -> None:
    dump, lake, other = lake_with_two_runs
    (dump / "rollout_data" / "1.pt").unlink()
    code, out, err = extract(dump, lake)
    assert out == line("basic", lake, (0, 0, 2, 1, 0), 0, 0)
    # The step's train files are now orphans: listed, not extracted.
    assert (code, len(err)) == (0, 4)
    assert not (lake / "tokens" / "run=basic" / "rollout_id=1").exists()
    assert not (lake / "samples" / "run=basic" / "rollout_id=1").exists()
    assert catalog_rows(lake, STEPS_SQL) == ALL_STEPS[:2]
    assert catalog_rows(lake, "SELECT train_steps, eval_steps FROM runs WHERE run = 'basic'") == [
        (1, 1)
    ]
    assert contents(lake, "other") == other
    assert verify_lake(store_of(lake)) == (2 + 4, [])


def test_rollout_only_step_is_extracted_again_when_train_files_appear(tmp_path: Path) -> None:
    dump, lake = copy_dump(tmp_path), tmp_path / "lake"
    parked = tmp_path / "parked"
    parked.mkdir()
    for path in sorted((dump / "train_data").glob("1_*.pt")):
        shutil.move(path, parked / path.name)
    code, out, _ = extract(dump, lake)
    assert (code, out) == (0, line("basic", lake, (3, 0, 0, 0, 0), 20, 206))
    rollout_only = (1, False, 8, 0, False)  # step_train_files 0, has_train_row false
    assert catalog_rows(lake, STEPS_SQL) == [*ALL_STEPS[:2], rollout_only]
    assert catalog_rows(
        lake, "SELECT count(train_log_prob) FROM tokens WHERE rollout_id = 1 AND NOT evaluation"
    ) == [(0,)]

    for path in sorted(parked.iterdir()):  # the trainer writes them later
        shutil.move(path, dump / "train_data" / path.name)
    code, out, _ = extract(dump, lake)
    assert (code, out) == (0, line("basic", lake, (0, 1, 2, 0, 0), 8, 82))
    assert catalog_rows(lake, STEPS_SQL) == ALL_STEPS
    assert verify_lake(store_of(lake)) == (3, [])


def test_rerun_after_a_crash_before_publishing_repairs_the_catalog(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after committing steps but before the catalog was rebuilt: the next run finds
    every step unchanged, and must still rebuild the catalog and sweep the leftovers."""
    dump, lake = copy_dump(tmp_path), tmp_path / "lake"
    extract(dump, lake, "--steps", "0")
    assert [r[:2] for r in catalog_rows(lake, STEPS_SQL)] == [(0, False), (0, True)]
    with monkeypatch.context() as patched:
        patched.setattr(extract_module, "_publish", lambda lake, record, dump_format, ahead: None)
        patched.setattr(extract_module, "sweep_leftovers", lambda store: 0)
        extract_run(
            dump, store_of(lake), ExtractOptions(steps=None, workers=1)
        )  # "killed" before publishing
    partition = lake / "tokens" / "run=basic" / "rollout_id=1"
    leftovers = [
        partition / f".tokenlake-{2**22 + 17}-0bad0bad.tmp",  # of a writer that died
        partition / "train-0bad0bad.parquet",
    ]
    for path in leftovers:  # a half-written file and a written but never committed one
        path.write_bytes(b"partial")
    behind = (
        "catalog `tokenlake.duckdb` lists other files than the manifests (a command was"
        " interrupted before rebuilding it); run `tokenlake views LAKE` or extract again"
    )
    left = (
        "is not listed in any manifest: left by an interrupted extraction, drop or tag;"
        " `tokenlake extract` sweeps it"
    )
    checked, problems = verify_lake(
        store_of(lake)
    )  # the manifest is consistent; the catalog is behind
    assert (checked, [str(p) for p in problems]) == (
        3,
        [
            f"file `tokens/run=basic/rollout_id=1/.tokenlake-{2**22 + 17}-0bad0bad.tmp` {left}",
            f"file `tokens/run=basic/rollout_id=1/train-0bad0bad.parquet` {left}",
            behind,
        ],
    )
    assert [r[:2] for r in catalog_rows(lake, STEPS_SQL)] == [(0, False), (0, True)]

    code, out, _ = extract(dump, lake)
    assert (code, out) == (0, line("basic", lake, (0, 0, 3, 0, 0), 0, 0))
    assert catalog_rows(lake, STEPS_SQL) == ALL_STEPS
    assert catalog_rows(lake, "SELECT train_steps, eval_steps FROM runs") == [(2, 1)]
    assert not any(path.exists() for path in leftovers)


def test_verify_reports_what_differs(lake_with_two_runs: tuple[Path, Path, dict]) -> None:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    dump, lake, _ = lake_with_two_runs
    assert cli("verify", str(lake)) == (0, "7 steps checked, 0 problems\n", [])
    assert cli("verify", str(lake), "--run", "basic") == (0, "3 steps checked, 0 problems\n", [])

    os.utime(dump / "train_data" / "1_2.pt")  # source changed
    step_0 = {p.parent.parent.parent.name: p for p in lake.glob("*/run=basic/rollout_id=0/train-*")}
    tokens = pq.read_table(step_0["tokens"])  # token ids tampered with
    ids = tokens.column(schema.TOKEN_ID)
    tokens = tokens.set_column(
        tokens.schema.get_field_index(schema.TOKEN_ID), schema.TOKEN_ID, pc.add(ids, 1)
    )
    pq.write_table(tokens, step_0["tokens"])
    samples = pq.read_table(step_0["samples"])  # a sample lost
    pq.write_table(samples.slice(1), step_0["samples"])
    eval_file = next(lake.glob("samples/run=basic/rollout_id=0/eval-*"))
    eval_file.unlink()  # a file gone
    code, out, err = cli("verify", str(lake), "--run", "basic")
    relative = eval_file.relative_to(lake)
    assert (code, err) == (1, [])
    assert out.splitlines() == [
        "run `basic` step 0: `samples` has 7 rows; extracted 8",
        "run `basic` step 0: `samples` batch positions are not 0..n-1 exactly once",
        "run `basic` step 0: `tokens` has 82 rows; the samples' response lengths sum to 72",
        "run `basic` step 0: token ids or loss masks differ from what was extracted (checksum)",
        f"run `basic` step eval_0: file `{relative}` is missing",
        f"run `basic` step 1: source `{dump / 'train_data' / '1_2.pt'}` changed since"
        " extraction; extract again",
        "3 steps checked, 6 problems",
    ]
    assert cli("verify", str(lake), "--run", "nope") == (
        1, "", [f"Error: Lake `{lake}`: has no run `nope`"],
    )  # fmt: skip
    assert cli("verify", str(tmp_path_of(lake) / "typo")) == (
        1, "", [f"Error: Lake `{tmp_path_of(lake) / 'typo'}`: is not a lake: it has no `_manifest/`;"
                " run `tokenlake extract` first"],
    )  # fmt: skip

    # The changed source (step 1) and the missing file (eval_0) are picked up; step 0's
    # tampered files look fine to extract (sources unchanged, files present) ...
    code, out, _ = extract(dump, lake)
    assert out == line("basic", lake, (0, 2, 1, 0, 0), 12, 124)
    step_0["samples"].unlink()  # ... until they are deleted, as verify's message would say
    step_0["tokens"].unlink()
    code, out, _ = extract(dump, lake)
    assert out == line("basic", lake, (0, 1, 2, 0, 0), 8, 82)
    assert cli("verify", str(lake)) == (0, "7 steps checked, 0 problems\n", [])


def tmp_path_of(lake: Path) -> Path:
    return lake.parent


def test_a_run_whose_only_step_fails_is_not_published(tmp_path: Path) -> None:
    from tokenlake.errors import PipelineError

    dump = tmp_path / "dump"
    (dump / "rollout_data").mkdir(parents=True)
    (dump / "rollout_data" / "0.pt").write_bytes(b"not a torch file")
    os.utime(dump / "rollout_data" / "0.pt", (1, 1))  # old: corruption, not a live write
    lake = tmp_path / "lake"
    with pytest.raises(PipelineError):
        extract_run(dump, store_of(lake), ExtractOptions(run_name="broken", strict=True))
    summary = extract_run(dump, store_of(lake), ExtractOptions(run_name="broken"))
    assert summary.counts["skipped"] == 1
    assert sorted(p.name for p in lake.iterdir()) == ["_manifest"]
    assert sorted(p.name for p in (lake / "_manifest").iterdir()) == [".tokenlake.lock"]


def test_ctrl_c_mid_run_reports_what_was_committed(tmp_path: Path) -> None:
    from tokenlake.orchestrate.follow import follow_run

    def stop_after_first(result) -> None:  # type: ignore[no-untyped-def]
        raise KeyboardInterrupt

    dump = FIXTURES / "basic"
    with pytest.raises(KeyboardInterrupt) as caught:
        extract_run(
            dump,
            store_of(tmp_path / "a"),
            ExtractOptions(run_name="basic", workers=1),
            progress=stop_after_first,
        )
    summary = caught.value.summary  # type: ignore[attr-defined]
    assert [(s.rollout_id, s.evaluation) for s in summary.steps] == [(0, False)]
    assert summary.counts["new"] == 1
    assert verify_lake(store_of(tmp_path / "a")) == (1, [])  # the committed step is published

    rounds = []
    follow_run(dump, store_of(tmp_path / "b"), ExtractOptions(follow=True, run_name="basic", settle_seconds=0), progress=stop_after_first, on_round=rounds.append)  # fmt: skip
    assert [r.counts["new"] for r in rounds] == [1]  # the cut-short round is still reported
