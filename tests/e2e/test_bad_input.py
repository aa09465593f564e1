"""Bad input gets one clear line naming the file (step, rank, sample) and what to do.

Every case starts from a copy of the real `basic` dump (steps 0 and 1 with 4 rank files each,
plus `eval_0`), breaks one thing, runs `tokenlake extract` in-process, and asserts the exact
lines the user sees. Other steps still extract; `--strict` makes a bad step fatal.
"""

from __future__ import annotations

import errno
import hashlib
import os
import pickle
import re
import shutil
import stat
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tests.conftest import store_of
from tests.fixture_paths import REAL_DUMPS
from tokenlake import layout
from tokenlake.cli import main
from tokenlake.orchestrate.verify import verify_lake

FIXTURES = REAL_DUMPS
OLD = 7200.0  # seconds: older than pt.FRESH_SECONDS, so a bad file is not "still written"
REPLACE = "Replace or remove the file, then extract again."
ALL_STEPS = "Run `{run}`: 3 new, 0 updated, 0 unchanged, 0 removed, 0 skipped steps"


def copy_dump(tmp_path: Path, name: str = "basic", case: str = "basic") -> Path:
    """A writable copy of a real fixture dump whose files are all old."""
    target = tmp_path / name
    shutil.copytree(FIXTURES / case, target)
    for path in target.rglob("*"):
        age(path)
    return target.resolve()


def age(path: Path, seconds: float = OLD) -> Path:
    stamp = path.stat().st_mtime - seconds
    os.utime(path, (stamp, stamp))
    return path


def extract(dump: Path, lake: Path, *extra: str) -> tuple[int, str, list[str]]:
    """Run `tokenlake extract`; returns exit code, stdout (timing masked), stderr lines."""
    args = ["extract", str(dump), "--lake", str(lake), "--workers", "1", "--silent", *extra]
    result = CliRunner().invoke(main, args)
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    out = re.sub(r" in \d+\.\d s ", " in T s ", result.stdout)
    return result.exit_code, out, result.stderr.splitlines()


def summary_line(run: str, lake: Path, counts: str, samples: int, tokens: int) -> str:
    return (
        f"Run `{run}`: {counts} steps; wrote {samples:,} samples and {tokens:,} tokens"
        f" in T s -> {lake.resolve()}\n"
    )


def rewrite_pt(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Load a dump file with torch, change it, save it back (in the test's copy), age it."""
    import torch

    data = torch.load(path, weights_only=False)
    change(data)
    torch.save(data, path)
    age(path)


def lake_steps(lake: Path, run: str) -> list[tuple[int, bool, int]]:
    """(rollout_id, evaluation, samples) per step, through the catalog."""
    import duckdb

    with duckdb.connect(str(lake / layout.CATALOG_FILE), read_only=True) as con:
        return con.execute(
            "SELECT rollout_id, evaluation, count(*)::INT FROM samples WHERE run = ?"
            " GROUP BY ALL ORDER BY ALL",
            [run],
        ).fetchall()


STEP_0_AND_EVAL = [(0, False, 8), (0, True, 4)]
EVAL_AND_STEP_1 = [(0, True, 4), (1, False, 8)]


# --- unreadable files -------------------------------------------------------------------------


@pytest.mark.slow
def test_truncated_train_file_skips_its_step_only(tmp_path: Path) -> None:
    dump = copy_dump(tmp_path)
    bad = dump / "train_data" / "0_1.pt"
    bad.write_bytes(bad.read_bytes()[:1000])
    age(bad)
    code, out, err = extract(dump, tmp_path / "lake")
    assert err == [
        f"Skipped step 0: rank 1: Cannot read `{bad}`: the zip archive is incomplete (no central"
        f" directory at its end), so the file is truncated. {REPLACE}"
    ]
    counts = "2 new, 0 updated, 0 unchanged, 0 removed, 1 skipped"
    assert (code, out) == (1, summary_line("basic", tmp_path / "lake", counts, 12, 124))
    assert lake_steps(tmp_path / "lake", "basic") == EVAL_AND_STEP_1
    assert verify_lake(store_of(tmp_path / "lake")) == (2, [])


@pytest.mark.slow
def test_young_truncated_file_is_still_being_written(tmp_path: Path) -> None:
    dump = copy_dump(tmp_path)
    bad = dump / "train_data" / "1_3.pt"
    bad.write_bytes(bad.read_bytes()[:1000])  # modified just now
    code, _, err = extract(dump, tmp_path / "lake")
    assert code == 1
    assert err == [
        f"Skipped step 1: rank 3: Cannot read `{bad}`: the zip archive is incomplete (no central"
        " directory at its end), so the file is truncated. It was modified less than a minute"
        " ago and is probably still being written; extract again later."
    ]


@pytest.mark.slow
def test_strict_makes_a_bad_step_fatal(tmp_path: Path) -> None:
    dump = copy_dump(tmp_path)
    bad = dump / "train_data" / "0_1.pt"
    bad.write_bytes(bad.read_bytes()[:1000])
    age(bad)
    code, out, err = extract(dump, tmp_path / "lake", "--strict")
    assert (code, out) == (1, "")
    assert err == [
        f"Error: Step 0: rank 1: Cannot read `{bad}`: the zip archive is incomplete (no central"
        f" directory at its end), so the file is truncated. {REPLACE}"
    ]
    # Step 0 comes first: nothing was committed, so no run (and no catalog) is published.
    assert not (tmp_path / "lake" / "tokenlake.duckdb").exists()
    assert not (tmp_path / "lake" / "_manifest" / "basic.json").exists()


@pytest.mark.slow
def test_file_of_random_bytes(tmp_path: Path) -> None:
    dump = copy_dump(tmp_path)
    bad = dump / "rollout_data" / "1.pt"
    bad.write_bytes(os.urandom(3000))
    age(bad)
    code, out, err = extract(dump, tmp_path / "lake")
    assert err == [
        f"Skipped step 1: Cannot read `{bad}`: it is not a zip archive, so `torch.save` did not"
        f" write it. {REPLACE}"
    ]
    counts = "2 new, 0 updated, 0 unchanged, 0 removed, 1 skipped"
    assert (code, out) == (1, summary_line("basic", tmp_path / "lake", counts, 12, 124))
    assert lake_steps(tmp_path / "lake", "basic") == STEP_0_AND_EVAL


@pytest.mark.slow
def test_empty_file(tmp_path: Path) -> None:
    dump = copy_dump(tmp_path)
    bad = dump / "train_data" / "1_2.pt"
    bad.write_bytes(b"")
    age(bad)
    code, _, err = extract(dump, tmp_path / "lake")
    assert code == 1
    assert err == [
        f"Skipped step 1: rank 2: Cannot read `{bad}`: the file is empty (0 bytes). {REPLACE}"
    ]
    assert lake_steps(tmp_path / "lake", "basic") == STEP_0_AND_EVAL


def _system_pickle(marker: Path) -> bytes:
    """Protocol-2 pickle of ``{"x": os.system("touch <marker>")}``."""
    command = f"touch {marker}".encode()
    call = b"cos\nsystem\nX" + len(command).to_bytes(4, "little") + command + b"\x85R"
    return b"\x80\x02}X\x01\x00\x00\x00x" + call + b"s."


@pytest.mark.slow
def test_pickle_outside_the_allow_list_is_refused_and_never_runs(tmp_path: Path) -> None:
    armed = tmp_path / "armed"
    pickle.loads(_system_pickle(armed))  # the payload is live: a plain unpickler runs it
    assert armed.exists()

    dump = copy_dump(tmp_path)
    marker = tmp_path / "marker"
    bad = dump / "train_data" / "1_3.pt"
    bad.unlink()
    with zipfile.ZipFile(bad, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("archive/data.pkl", _system_pickle(marker))
        archive.writestr("archive/byteorder", b"little")
    age(bad)
    code, _, err = extract(dump, tmp_path / "lake")
    assert code == 1
    assert err == [
        f"Skipped step 1: rank 3: Cannot read `{bad}`: its pickle references `os.system`, which"
        " is not on tokenlake's allow-list of safe classes (nothing from the file was"
        f" executed). {REPLACE}"
    ]
    assert not marker.exists()
    assert lake_steps(tmp_path / "lake", "basic") == STEP_0_AND_EVAL


@pytest.mark.slow
def test_stray_files_are_listed_and_ignored(tmp_path: Path) -> None:
    dump = copy_dump(tmp_path)
    strays = [
        dump / "rollout_data" / "notes.txt",
        dump / "rollout_data" / "1.pt.tmp",
        dump / "rollout_data" / "eval_x.pt",
        dump / "train_data" / "0_1.pt.bak",
    ]
    for path in strays:
        path.write_bytes(b"not a dump")
    (dump / "rollout_data" / "old").mkdir()
    code, out, err = extract(dump, tmp_path / "lake")
    assert err == [
        f"Ignored `{path}`: not a rollout or train dump file name"
        for path in sorted([*strays, dump / "rollout_data" / "old"])
    ]
    counts = "3 new, 0 updated, 0 unchanged, 0 removed, 0 skipped"
    assert (code, out) == (0, summary_line("basic", tmp_path / "lake", counts, 20, 206))


def test_names_miles_never_writes_are_not_steps(tmp_path: Path) -> None:
    """Only ASCII digits name a step or rank, and a name ends at `.pt`: `١.pt` (an Arabic-Indic
    one) and `1_0.pt` with a newline after it are strays, not step 1 and its rank 0."""
    dump = copy_dump(tmp_path)
    arabic = dump / "rollout_data" / "\u0661.pt"
    newline = dump / "train_data" / "1_0.pt\n"
    (dump / "rollout_data" / "1.pt").rename(arabic)
    (dump / "train_data" / "1_0.pt").rename(newline)
    code, out, err = extract(dump, tmp_path / "lake")
    stray = "not a rollout or train dump file name"
    unjoined = "step 1 has no `rollout_data/1.pt` to join it to"
    assert err == [
        f"Ignored `{arabic}`: {stray}",
        f"Ignored `{dump}/train_data/1_0.pt\\x0a`: {stray}",
        *(f"Ignored `{dump}/train_data/1_{rank}.pt`: {unjoined}" for rank in (1, 2, 3)),
    ]
    counts = "2 new, 0 updated, 0 unchanged, 0 removed, 0 skipped"
    assert (code, out) == (0, summary_line("basic", tmp_path / "lake", counts, 12, 124))


# --- files that load but break the format -----------------------------------------------------


@pytest.mark.slow
def test_train_row_for_a_sample_absent_from_the_rollout_dump(tmp_path: Path) -> None:
    dump = copy_dump(tmp_path)
    bad = dump / "train_data" / "1_0.pt"
    rewrite_pt(bad, lambda d: d["rollout_data"]["sample_indices"].__setitem__(0, 999))
    code, _, err = extract(dump, tmp_path / "lake")
    assert code == 1
    assert err == [
        f"Skipped step 1: rank 0: `{bad}`: train row 0 refers to `sample_index` 999, which is"
        f" absent from the step's rollout dump (mixed or corrupt dumps). {REPLACE}"
    ]
    assert lake_steps(tmp_path / "lake", "basic") == STEP_0_AND_EVAL


@pytest.mark.slow
@pytest.mark.parametrize(
    ("key", "value", "problem"),
    [
        ("rollout_id", 0, "holds `rollout_id` 0, but its name says 1"),
        ("rank", 2, "holds `rank` 2, but its name says 0"),
        ("rank", None, "holds `rank` None, but its name says 0"),
    ],
    ids=["another-step", "another-rank", "no-rank"],
)
def test_train_file_copied_from_another_step_or_rank(
    tmp_path: Path, key: str, value: Any, problem: str
) -> None:
    """A train file whose own `rollout_id` or `rank` is not its name's (mixed dumps, a file
    copied over another) fails its step, as a rollout file of another step does."""
    dump = copy_dump(tmp_path)
    bad = dump / "train_data" / "1_0.pt"
    rewrite_pt(bad, lambda d: d.__setitem__(key, value))
    code, _, err = extract(dump, tmp_path / "lake")
    assert code == 1
    assert err == [f"Skipped step 1: rank 0: `{bad}`: {problem}. {REPLACE}"]
    assert lake_steps(tmp_path / "lake", "basic") == STEP_0_AND_EVAL


@pytest.mark.slow
def test_ranks_that_disagree_on_the_batch_global_raw_reward(tmp_path: Path) -> None:
    """Every rank holds the step's whole `raw_reward`; a rank whose list differs (a file of
    another run) fails the step rather than the first file's list being taken unseen."""
    dump = copy_dump(tmp_path)
    bad = dump / "train_data" / "1_2.pt"  # the other DP shard: not compared row by row
    rewrite_pt(bad, lambda d: d["rollout_data"]["raw_reward"].__setitem__(3, 0.25))
    code, _, err = extract(dump, tmp_path / "lake")
    assert code == 1
    assert err == [
        f"Skipped step 1: rank 2: `{bad}`: `raw_reward` at batch position 3 is 0.25, but 1.0 in"
        f" `1_0.pt`; it is batch-global, every rank holds the same (mixed or corrupt dumps)."
        f" {REPLACE}"
    ]
    assert lake_steps(tmp_path / "lake", "basic") == STEP_0_AND_EVAL


@pytest.mark.slow
def test_ranks_that_disagree_on_a_samples_lengths(tmp_path: Path) -> None:
    dump = copy_dump(tmp_path)
    bad = dump / "train_data" / "1_1.pt"  # TP peer of rank 0: holds the same rows
    rewrite_pt(bad, lambda d: d["rollout_data"]["total_lengths"].__setitem__(0, 20))
    code, _, err = extract(dump, tmp_path / "lake")
    assert code == 1
    assert err == [
        f"Skipped step 1: rank 1: `{bad}` (batch position 2, sample_index 10): (response_length,"
        " total_length) = (12, 20) disagrees with (12, 19) in `1_0.pt` (mixed or corrupt"
        f" dumps). {REPLACE}"
    ]


@pytest.mark.slow
def test_loss_mask_of_the_wrong_length(tmp_path: Path) -> None:
    dump = copy_dump(tmp_path)
    bad = dump / "train_data" / "1_0.pt"

    def shorten(data: dict[str, Any]) -> None:
        masks = data["rollout_data"]["loss_masks"]
        masks[0] = masks[0][:-1]

    rewrite_pt(bad, shorten)
    code, _, err = extract(dump, tmp_path / "lake")
    assert code == 1
    assert err == [
        f"Skipped step 1: rank 0: `{bad}` (batch position 2, sample_index 10): `loss_masks` has"
        f" length 11; `response_lengths` says 12. {REPLACE}"
    ]


@pytest.mark.slow
def test_rollout_log_probs_of_the_wrong_length(tmp_path: Path) -> None:
    dump = copy_dump(tmp_path)
    bad = dump / "rollout_data" / "1.pt"
    rewrite_pt(bad, lambda d: d["samples"][3]["rollout_log_probs"].pop())
    code, _, err = extract(dump, tmp_path / "lake")
    # Flagged like a train-side field of the wrong length, not a skipped step; the
    # train-side copy (the one the lake shows) is intact, so the values stay.
    assert (code, err) == (0, [])
    import duckdb

    with duckdb.connect(str(tmp_path / "lake" / layout.CATALOG_FILE), read_only=True) as con:
        flags = con.execute(
            "SELECT batch_position FROM samples WHERE rollout_id = 1 AND NOT evaluation"
            " AND alignment_failed"
        ).fetchall()
        shown = con.execute(
            "SELECT count(rollout_log_prob) FROM tokens WHERE rollout_id = 1 AND NOT evaluation"
            " AND batch_position = 3"
        ).fetchone()
    assert flags == [(3,)]
    assert shown == (4,)


@pytest.mark.slow
def test_trainer_field_of_the_wrong_length_is_an_alignment_failure(tmp_path: Path) -> None:
    """dump-format.md 4.5: a CP-sliced field that is not R long is nulled and flagged; the
    sample's other fields are kept."""
    import duckdb

    dump = copy_dump(tmp_path)
    for rank in (0, 1):  # both TP peers, so the copy that wins is the short one either way
        path = dump / "train_data" / f"1_{rank}.pt"
        rewrite_pt(
            path,
            lambda d: d["rollout_data"]["log_probs"].__setitem__(
                0, d["rollout_data"]["log_probs"][0][:-1]
            ),
        )
    code, _, err = extract(dump, tmp_path / "lake")
    assert (code, err) == (0, [])
    with duckdb.connect(str(tmp_path / "lake" / layout.CATALOG_FILE), read_only=True) as con:
        flags = con.execute(
            "SELECT batch_position, alignment_failed FROM samples WHERE rollout_id = 1"
            " AND NOT evaluation AND alignment_failed"
        ).fetchall()
        nulls = con.execute(
            "SELECT count(*), count(train_log_prob), count(lp_diff), count(rollout_log_prob)"
            " FROM tokens"
            " WHERE rollout_id = 1 AND NOT evaluation AND batch_position = 2"
        ).fetchone()
    assert flags == [(2, True)]
    assert nulls == (12, 0, 0, 12)  # only the short field (and lp_diff from it) is nulled


@pytest.mark.slow
def test_nan_and_inf_are_kept_and_counted(tmp_path: Path) -> None:
    import duckdb

    dump = copy_dump(tmp_path)

    def poison(data: dict[str, Any]) -> None:
        log_probs = data["rollout_data"]["log_probs"][0]  # sample_index 10: 12 tokens, mask all 1
        log_probs[0] = float("nan")
        log_probs[1] = float("inf")

    for rank in (0, 1):
        rewrite_pt(dump / "train_data" / f"1_{rank}.pt", poison)
    code, out, err = extract(dump, tmp_path / "lake")
    counts = "3 new, 0 updated, 0 unchanged, 0 removed, 0 skipped"
    line = summary_line("basic", tmp_path / "lake", counts, 20, 206)
    # NaN and inf in train_log_prob, and so in lp_diff: 4 values.
    assert (code, err, out) == (0, [], line[:-1] + " (4 NaN/inf values kept)\n")
    with duckdb.connect(str(tmp_path / "lake" / layout.CATALOG_FILE), read_only=True) as con:
        rows = con.execute(
            "SELECT position, isnan(train_log_prob), isinf(train_log_prob), isinf(lp_diff)"
            " FROM tokens WHERE rollout_id = 1 AND NOT evaluation AND batch_position = 2"
            " AND position < 2 ORDER BY position"
        ).fetchall()
    assert rows == [(0, True, False, False), (1, False, True, True)]


# --- the dump directory -----------------------------------------------------------------------


def _directory(path: Path) -> Path:
    (path / "train_data").mkdir(parents=True)
    return path


def _file(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")
    return path


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda tmp: tmp / "nope", "does not exist"),
        (
            _directory,
            "is not a dump tokenlake reads: it has no `rollout_data/` directory (miles, slime),"
            " no `train_data_step{N}.jsonl` (NeMo-RL) and no"
            " `token_exports/step_{N}/rank_{R}.jsonl` (prime-rl)",
        ),
        (lambda tmp: _file(tmp / "0.pt"), "is not a directory"),
    ],
    ids=["missing", "not-a-dump", "a-file"],
)
def test_dump_directory_that_is_missing_or_not_a_dump(
    tmp_path: Path, make: Callable[[Path], Path], reason: str
) -> None:
    dump = make(tmp_path / "in")
    code, out, err = extract(dump, tmp_path / "lake")
    assert (code, out, err) == (1, "", [f"Error: `{dump}` {reason}"])
    assert not (tmp_path / "lake").exists()


def _listing(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every entry under root: (mode, size, mtime_ns)."""
    return {
        str(p.relative_to(root)): (p.stat().st_mode, p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
    }


@pytest.mark.slow
def test_read_only_dump_directory_works_and_is_not_touched(tmp_path: Path) -> None:
    dump = copy_dump(tmp_path)
    for path in [dump, *dump.rglob("*")]:
        path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    before = _listing(dump)
    try:
        code, out, err = extract(dump, tmp_path / "lake")
        after = _listing(dump)
    finally:
        for path in [dump, *dump.rglob("*")]:
            path.chmod(path.stat().st_mode | stat.S_IWUSR)
    counts = "3 new, 0 updated, 0 unchanged, 0 removed, 0 skipped"
    assert (code, err, out) == (0, [], summary_line("basic", tmp_path / "lake", counts, 20, 206))
    assert after == before


# --- the lake directory -----------------------------------------------------------------------


def _snapshot(lake: Path) -> dict[str, str]:
    """Every file of the lake (hidden ones too) with a hash of its bytes."""
    return {
        str(p.relative_to(lake)): hashlib.blake2b(p.read_bytes()).hexdigest()
        for p in sorted(lake.rglob("*"))
        if p.is_file()
    }


def test_lake_path_that_is_a_file(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    lake.write_text("my notes")
    code, out, err = extract(FIXTURES / "basic", lake)
    assert (code, out) == (1, "")
    assert err == [f"Error: Lake `{lake}`: is a file, not a directory; choose another --lake"]
    assert lake.read_text() == "my notes"


@pytest.mark.slow
def test_lake_whose_manifest_folder_is_a_file(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    extract(FIXTURES / "basic", lake)
    shutil.rmtree(lake / "_manifest")
    (lake / "_manifest").write_text("x")
    before = _snapshot(lake)
    code, out, err = extract(FIXTURES / "removed", lake)
    assert (code, out) == (1, "")
    assert err == [f"Error: Lake `{lake}`: cannot be written (`{lake / '_manifest'}`: File exists)"]
    assert _snapshot(lake) == before


@pytest.mark.slow
@pytest.mark.parametrize("failing", [".parquet", ".json"], ids=["step-file", "manifest"])
def test_full_lake_is_a_clear_error_and_leaves_the_lake_intact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    dump = copy_dump(tmp_path)
    lake = (tmp_path / "lake").resolve()
    extract(dump, lake)
    before = _snapshot(lake)
    os.utime(dump / "train_data" / "1_2.pt")  # step 1 must be extracted again
    real_replace = os.replace

    def full_disk(src: Any, dst: Any) -> None:
        if str(dst).endswith(failing):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(src))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", full_disk)
    monkeypatch.setattr("tokenlake.orchestrate.step.secrets.token_hex", lambda n: "feedbeef")
    code, out, err = extract(dump, lake)
    monkeypatch.undo()
    target = (
        lake / "tokens/run=basic/rollout_id=1/train-feedbeef.parquet"
        if failing == ".parquet"
        else lake / "_manifest/basic.json"
    )
    what = "cannot be written" if failing == ".parquet" else "manifest cannot be written"
    assert (code, out) == (1, "")
    assert err == [
        f"Error: Lake `{target}`: {what} (No space left on device). Steps committed before"
        " this are kept; free space or fix permissions, then extract again"
    ]
    assert _snapshot(lake) == before  # no half step, no temporary file
    assert verify_lake(store_of(lake))[1][0].message.endswith(
        "changed since extraction; extract again"
    )
    code, out, err = extract(dump, lake)  # space is back: the next run completes
    counts = "0 new, 1 updated, 2 unchanged, 0 removed, 0 skipped"
    assert (code, err, out) == (0, [], summary_line("basic", lake, counts, 8, 82))
    assert verify_lake(store_of(lake)) == (3, [])


# --- names ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_quotes_spaces_and_unicode_in_paths_and_run_names(tmp_path: Path) -> None:
    import duckdb

    dump = copy_dump(tmp_path, name='it\'s a "run" ü')
    lake = tmp_path / 'l\'ake "x" [1] ü'
    code, out, err = extract(dump, lake)
    counts = "3 new, 0 updated, 0 unchanged, 0 removed, 0 skipped"
    assert (code, err) == (0, [])
    assert out == summary_line(dump.name, lake, counts, 20, 206)
    name = "qwen 'grpo' \"v2\" ü"
    code, out, _ = extract(FIXTURES / "removed", lake, "--run-name", name)
    assert code == 0 and out.startswith(f"Run `{name}`: 4 new")
    with duckdb.connect(str(lake / layout.CATALOG_FILE), read_only=True) as con:
        runs = con.execute("SELECT run, count(*) FROM tokens GROUP BY run ORDER BY run").fetchall()
    assert [r for r, _ in runs] == sorted([dump.name, name])
    assert verify_lake(store_of(lake)) == (3 + 4, [])
