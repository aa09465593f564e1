"""Every file tokenlake reads has a size bound, and what lies beyond it is one line.

Sidecars (trajectory, tokenizer, dashboard metrics) over their bound are a warning and the
steps still land; a manifest over its bound, or one that is a FIFO, a link to `/dev/zero` or
200 000-deep JSON, is one damaged-manifest line. The 8 and 16 GiB files are sparse
(`os.truncate`: no disk used) and extracted in a child process under a memory limit and a
time limit, so reading one whole would fail the test instead of the machine. Lone surrogate
escapes in the dashboard telemetry are stored as U+FFFD; `--meta` refuses a 5,000-digit
integer in one line.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import duckdb
import pytest

from tests.fixture_paths import REAL_DUMPS
from tests.limits import run_cli_limited
from tokenlake.read import trajectory

pytestmark = pytest.mark.slow  # each test extracts a real fixture dump

# Writable memory (RLIMIT_DATA, see tests/limits.py): an extraction of `basic` needs ~200 MB,
# reading one of the files whole would need 8 GiB.
MEMORY_LIMIT = 1 << 30
TIME_LIMIT = 180.0
HUGE = 8 << 30
BASIC_STEPS = [(0, False, 82), (0, True, 42), (1, False, 82)]
LANDED = "3 new, 0 updated, 0 unchanged, 0 removed, 0 skipped"
DAMAGED_END = ". Remove the run with `tokenlake drop LAKE {run}` or extract it again"


def copy_dump(tmp_path: Path) -> Path:
    target = tmp_path / "basic"
    shutil.copytree(REAL_DUMPS / "basic", target)
    return target.resolve()


def sparse(path: Path, size: int = HUGE, start: bytes = b"") -> Path:
    """`path` holding `start`, then zeros up to `size` bytes that take no disk."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(start)
    os.truncate(path, size)
    return path


def extract(dump: Path, lake: Path, *extra: str) -> tuple[int, str, list[str]]:
    """`tokenlake extract` in a child process under MEMORY_LIMIT and TIME_LIMIT."""
    args = ["extract", str(dump), "--lake", str(lake), "--workers", "1", "--silent", *extra]
    return cli(*args)


def cli(*args: str) -> tuple[int, str, list[str]]:
    done = run_cli_limited(list(args), MEMORY_LIMIT, TIME_LIMIT, "RLIMIT_DATA")
    out = re.sub(r" in \d+\.\d s ", " in T s ", done.stdout)
    return done.returncode, out, done.stderr.splitlines()


def summary(lake: Path, counts: str = LANDED, samples: int = 20, tokens: int = 206) -> str:
    return (
        f"Run `basic`: {counts} steps; wrote {samples:,} samples and {tokens:,} tokens"
        f" in T s -> {lake.resolve()}\n"
    )


def rows(lake: Path, sql: str) -> list[tuple[Any, ...]]:
    with duckdb.connect(str(lake / "tokenlake.duckdb"), read_only=True) as con:
        return con.execute(sql).fetchall()


def landed(lake: Path) -> list[tuple[Any, ...]]:
    sql = "SELECT rollout_id, evaluation, count(*) FROM tokens GROUP BY ALL ORDER BY ALL"
    return rows(lake, sql)


# --- sidecars beyond their bound: a warning, and the steps land ------------------------------


def test_an_8_gib_trajectory_file_is_one_warning_and_the_steps_land(tmp_path: Path) -> None:
    dump, lake = copy_dump(tmp_path), tmp_path / "lake"
    huge = sparse(dump / "trajectory" / "0.jsonl")
    code, out, err = extract(dump, lake)
    assert (code, out) == (0, summary(lake))
    assert err == [
        f"Warning: `{huge}` is 8,589,934,592 bytes; a trajectory file may be at most 1 GiB;"
        " the step's conversations are NULL."
    ]
    assert landed(lake) == BASIC_STEPS
    sql = "SELECT rollout_id, count(messages_json) FROM samples WHERE NOT evaluation GROUP BY 1"
    assert sorted(rows(lake, sql)) == [(0, 0), (1, 2)]  # step 1's own file is still read


def test_a_trajectory_file_that_is_a_folder_is_one_warning_and_the_steps_land(
    tmp_path: Path,
) -> None:
    # It was passed over in silence, as if the step had no conversations.
    dump, lake = copy_dump(tmp_path), tmp_path / "lake"
    folder = dump / "trajectory" / "0.jsonl"
    folder.unlink()
    folder.mkdir()
    code, out, err = extract(dump, lake)
    assert (code, out) == (0, summary(lake))
    assert err == [
        f"Warning: `{folder}` is a directory, not a regular file; the step's conversations are"
        " NULL."
    ]
    assert landed(lake) == BASIC_STEPS
    sql = "SELECT rollout_id, count(messages_json) FROM samples WHERE NOT evaluation GROUP BY 1"
    assert sorted(rows(lake, sql)) == [(0, 0), (1, 2)]  # step 1's own file is still read


def test_an_8_gib_tokenizer_is_one_line_and_the_steps_land(tmp_path: Path) -> None:
    dump, lake = copy_dump(tmp_path), tmp_path / "lake"
    huge = sparse(dump / "tokenizer" / "tokenizer.json")
    code, out, err = extract(dump, lake)
    assert (code, out) == (0, summary(lake))
    assert err == [
        f"Ignored `{huge}`: is 8,589,934,592 bytes; a `tokenizer.json` may be at most 64 MiB;"
        " token texts are NULL until it is fixed"
    ]
    assert landed(lake) == BASIC_STEPS
    assert rows(lake, "SELECT count(*) FROM vocab") == [(0,)]


@pytest.mark.parametrize(
    ("make", "kind"),
    [(os.mkdir, "a directory"), (os.mkfifo, "a FIFO (named pipe)")],
    ids=["folder", "fifo"],
)
def test_a_tokenizer_json_that_is_not_a_file_is_one_line_and_the_steps_land(
    tmp_path: Path, make: Any, kind: str
) -> None:
    # It was passed over in silence, as if the dump had saved no tokenizer: every token text
    # NULL with no word of why.
    dump, lake = copy_dump(tmp_path), tmp_path / "lake"
    tokenizer = dump / "tokenizer" / "tokenizer.json"
    tokenizer.unlink()
    make(tokenizer)
    code, out, err = extract(dump, lake)
    assert (code, out) == (0, summary(lake))
    assert err == [
        f"Ignored `{tokenizer}`: is {kind}, not a regular file; token texts are NULL until it"
        " is fixed"
    ]
    assert landed(lake) == BASIC_STEPS
    assert rows(lake, "SELECT count(*) FROM vocab") == [(0,)]


@pytest.mark.parametrize(
    ("target", "refusal"),
    [
        (
            "gone.json",
            "it does not exist (the OS says: [Errno 2] No such file or directory); check the"
            " path, and that nothing moves or deletes it meanwhile",
        ),
        (
            "tokenizer.json",
            "the operating system refused it (the OS says: [Errno 40] Too many levels of"
            " symbolic links); fix what the OS says",
        ),
    ],
    ids=["broken", "loop"],
)
def test_a_tokenizer_json_that_is_a_dead_link_is_one_line_once(
    tmp_path: Path, target: str, refusal: str
) -> None:
    # It was passed over in silence, as if the dump had saved no tokenizer.
    dump, lake = copy_dump(tmp_path), tmp_path / "lake"
    tokenizer = dump / "tokenizer" / "tokenizer.json"
    tokenizer.unlink()
    tokenizer.symlink_to(target)
    code, out, err = extract(dump, lake)
    assert (code, out) == (0, summary(lake))
    assert err == [
        f"Ignored `{tokenizer}`: cannot be read: {refusal}; token texts are NULL until it is fixed"
    ]
    assert landed(lake) == BASIC_STEPS
    assert rows(lake, "SELECT count(*) FROM vocab") == [(0,)]
    assert extract(dump, lake)[2] == []  # said once: the link is unchanged


def test_a_16_gib_metrics_line_without_newline_is_skipped_once(tmp_path: Path) -> None:
    dump, lake = copy_dump(tmp_path), tmp_path / "lake"
    first = json.dumps({"ts": 1.0, "step_key": "s", "step": 0, "metrics": {"a": 1.5}}) + "\n"
    huge = sparse(dump / "dashboard" / "metrics.jsonl", 16 << 30, first.encode() + b"{")
    code, out, err = extract(dump, lake)
    assert (code, out) == (0, summary(lake))
    assert err == [
        f"Warning: `{huge}` at byte {len(first)}: longer than 1048576 bytes; line skipped."
    ]
    assert landed(lake) == BASIC_STEPS
    assert rows(lake, "SELECT metric, value FROM metrics") == [("a", 1.5)]
    stored = json.loads((lake / "_manifest" / "basic.json").read_text())["metrics_sources"]
    assert stored["metrics.jsonl"]["offset"] == 16 << 30  # consumed: never read again
    assert stored["metrics.jsonl"]["inside_long"] is True
    with open(huge, "ab") as handle:  # the writer ends the line, then logs the next step
        handle.write(b'"x": 1}\n' + json.dumps({"ts": 2.0, "metrics": {"a": 2.5}}).encode())
        handle.write(b"\n")
    code, out, err = extract(dump, lake)
    assert (code, err) == (0, [])  # the rest of the long line is skipped without a word
    assert out == summary(lake, "0 new, 0 updated, 3 unchanged, 0 removed, 0 skipped", 0, 0)
    assert rows(lake, "SELECT metric, value FROM metrics ORDER BY value") == [
        ("a", 1.5),
        ("a", 2.5),
    ]


META_NULL = "its run metadata is left NULL."


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (sparse, "is 8,589,934,592 bytes; a dashboard `meta.json` may be at most 1 MiB"),
        (os.mkfifo, "is a FIFO (named pipe), not a regular file"),
        (lambda path: path.symlink_to("/dev/zero"), "is a character device, not a regular file"),
    ],
    ids=["8-gib", "fifo", "dev-zero"],
)
def test_a_hostile_meta_json_is_one_warning_and_the_run_publishes(
    tmp_path: Path, make: Any, problem: str
) -> None:
    dump, lake = copy_dump(tmp_path), tmp_path / "lake"
    meta = dump / "dashboard" / "meta.json"
    meta.parent.mkdir()
    make(meta)
    code, out, err = extract(dump, lake)
    assert (code, out, err) == (0, summary(lake), [f"Warning: `{meta}` {problem}; {META_NULL}"])
    assert landed(lake) == BASIC_STEPS
    assert rows(lake, "SELECT run, start_ts, args_json FROM runs") == [("basic", None, None)]


# --- manifests: one damaged-manifest line -----------------------------------------------------


def damaged(path: Path, problem: str) -> list[str]:
    return [
        f"Error: Lake `{path}`: manifest is damaged: {problem}{DAMAGED_END.format(run=path.stem)}"
    ]


def lake_with_a_bad_manifest(tmp_path: Path, make: Any) -> tuple[Path, Path]:
    """A lake of `basic`, with `_manifest/other.json` made by `make(path)`."""
    lake = tmp_path / "lake"
    assert extract(REAL_DUMPS / "basic", lake)[0] == 0
    bad = lake / "_manifest" / "other.json"
    make(bad)
    return lake, bad


def _deep(path: Path) -> None:
    path.write_text('{"run": ' + "[" * 200_000 + "]" * 200_000 + "}")


MANIFESTS = {
    "8-gib": (
        lambda path: sparse(path),
        "it is 8,589,934,592 bytes; a run manifest may be at most 64 MiB",
    ),
    "fifo": (os.mkfifo, "it is a FIFO (named pipe), not a regular file"),
    "dev-zero": (
        lambda path: path.symlink_to("/dev/zero"),
        "it is a symbolic link; tokenlake reads only a file it wrote",
    ),
    "200000-deep": (_deep, "it is nested more than 16 levels deep"),
    "5000-digits": (
        lambda path: path.write_text('{"version": ' + "1" * 5000 + "}"),
        "it holds an integer of 5,000 digits",
    ),
}


@pytest.mark.parametrize("kind", sorted(MANIFESTS))
def test_a_hostile_manifest_is_one_line(tmp_path: Path, kind: str) -> None:
    make, problem = MANIFESTS[kind]
    lake, bad = lake_with_a_bad_manifest(tmp_path, make)
    for args in (["verify", str(lake)], ["views", str(lake)]):
        assert cli(*args) == (1, "", damaged(bad, problem)), args
    code, out, err = extract(REAL_DUMPS / "pp2", lake)
    assert (code, out, err) == (1, "", damaged(bad, problem))
    assert not (lake / "tokens" / "run=pp2").exists()  # refused before any work
    assert cli("drop", str(lake), "other")[0] == 0  # the way out the line names
    assert cli("verify", str(lake))[:2] == (0, "3 steps checked, 0 problems\n")


# --- trajectory lines: per line and in total --------------------------------------------------


def _line(index: int, messages: list[str]) -> str:
    return json.dumps({"sample_index": index, "messages": messages}) + "\n"


def test_many_small_trajectory_lines_over_the_file_bound_are_one_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trajectory, "MAX_FILE_BYTES", 1 << 20)
    path = tmp_path / "0.jsonl"
    path.write_text(_line(0, ["a"]) + _line(5, ["x"]) * 40_000)  # 1.5 MB of small lines
    warnings: list[str] = []
    assert trajectory.messages_by_position(path, [{"index": 0}], warnings) == [None]
    assert warnings == [
        f"`{path}` is {path.stat().st_size:,} bytes; a trajectory file may be at most 1 MiB;"
        " the step's conversations are NULL."
    ]


def test_a_trajectory_line_over_the_line_bound_is_skipped_with_one_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trajectory, "MAX_LINE_BYTES", 100)
    path = tmp_path / "0.jsonl"
    long = _line(1, ["y" * 200])
    path.write_text(_line(0, ["a"]) + long + _line(2, ["b"]) + long.rstrip("\n"))
    warnings: list[str] = []
    samples = [{"index": 0}, {"index": 1}, {"index": 2}]
    assert trajectory.messages_by_position(path, samples, warnings) == ['["a"]', None, '["b"]']
    assert warnings == [
        f"`{path}`: 2 line(s) longer than 100 bytes skipped (line 2, 4); their samples'"
        " conversations are NULL."
    ]


def test_lines_for_absent_samples_are_not_kept(tmp_path: Path) -> None:
    import tracemalloc

    path = tmp_path / "0.jsonl"
    path.write_text(_line(0, ["a"]) + _line(7, ["x" * 100]) * 100_000)  # 12 MB, index 7 absent
    tracemalloc.start()
    got = trajectory.messages_by_position(path, [{"index": 0}])
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert got == ['["a"]']
    assert peak < 4 << 20  # a line at a time, plus a 1 MiB read buffer


# --- text UTF-8 cannot hold: stored as U+FFFD -------------------------------------------------


def test_lone_surrogates_in_dashboard_telemetry_are_stored_as_replacement_characters(
    tmp_path: Path,
) -> None:
    dump, lake = copy_dump(tmp_path), tmp_path / "lake"
    board = dump / "dashboard"
    board.mkdir()
    (board / "meta.json").write_text(
        '{"start_ts": 1.0, "args": {"wandb_project": "p\\udcff", "k\\udcff": "v\\ud800"}}'
    )
    (board / "metrics.jsonl").write_text(
        '{"ts": 1.0, "step_key": "s\\udcff", "step": 0, "metrics": {"loss\\udcff": 0.5}}\n'
    )
    code, out, err = extract(dump, lake)
    assert (code, out, err) == (0, summary(lake), [])
    sql = "SELECT wandb_project, args_json FROM runs"
    assert rows(lake, sql) == [("p\ufffd", '{"k\ufffd": "v\ufffd", "wandb_project": "p\ufffd"}')]
    assert rows(lake, "SELECT step_key, metric, value FROM metrics") == [
        ("s\ufffd", "loss\ufffd", 0.5)
    ]
    assert extract(dump, lake)[0] == 0  # and a re-extraction has nothing to fail on


# --- --meta: an integer too long to be a tag value --------------------------------------------


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_a_5000_digit_integer_in_a_meta_file_is_one_line(tmp_path: Path, suffix: str) -> None:
    if suffix == ".yaml":
        pytest.importorskip("yaml")
    meta = tmp_path / f"run{suffix}"
    digits = "7" * 5000
    meta.write_text(f'{{"seed": {digits}}}' if suffix == ".json" else f"seed: {digits}\n")
    lake = tmp_path / "lake"
    code, out, err = extract(REAL_DUMPS / "basic", lake, "--meta", str(meta))
    assert (code, out) == (1, "")
    assert err == [
        f"Error: --meta `{meta}`: an integer of 5,000 digits is longer than a tag value may be"
        " (1000 characters)."
    ]
    assert not lake.exists()
