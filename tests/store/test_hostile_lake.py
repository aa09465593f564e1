"""The lake stays whole, and every mistake with a lake is one line.

A full disk (a tiny tmpfs where mounting is allowed), a broken catalog, lakes under paths
that look like partitions, hostile run names, a broken tokenizer, foreign files beside and
inside the lake, a read-only or busy lake, a catalog locked by a DuckDB client, damaged
manifests and a moved lake.
"""

from __future__ import annotations

import builtins
import errno
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tests.conftest import store_of
from tests.fixture_paths import REAL_DUMPS
from tests.limits import cli_process
from tokenlake import schema
from tokenlake.cli import main
from tokenlake.errors import UsageError
from tokenlake.orchestrate.extract import ExtractOptions
from tokenlake.orchestrate.follow import follow_run
from tokenlake.store.local import LocalStore

pytestmark = pytest.mark.slow  # each test extracts a real fixture dump

BASIC_STEPS = [("basic", 0, False, 82), ("basic", 0, True, 42), ("basic", 1, False, 82)]
STEPS_SQL = "SELECT run, rollout_id, evaluation, count(*) FROM tokens GROUP BY ALL ORDER BY ALL"
NAME_RULES = (
    "cannot be a partition directory: it must be non-empty, not start with `.`, and contain"
    " no `/`, `\\`, `=`, `%` or control characters. Choose another with --run-name."
)


def cli(*args: str) -> tuple[int, str, list[str]]:
    result = CliRunner().invoke(main, list(args))
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    out = re.sub(r" in \d+\.\d s ", " in T s ", result.stdout)
    return result.exit_code, out, result.stderr.splitlines()


def extract(dump: Path, lake: Path, *extra: str) -> tuple[int, str, list[str]]:
    return cli("extract", str(dump), "--lake", str(lake), "--workers", "1", "--silent", *extra)


def counts_line(lake: Path, counts: str, samples: int = 0, tokens: int = 0) -> str:
    return (
        f"Run `basic`: {counts} steps; wrote {samples:,} samples and {tokens:,} tokens"
        f" in T s -> {lake.resolve()}\n"
    )


def rows(lake: Path, sql: str = STEPS_SQL) -> list[tuple[Any, ...]]:
    import duckdb

    with duckdb.connect(str(lake / "tokenlake.duckdb"), read_only=True) as con:
        return con.execute(sql).fetchall()


def copy_dump(tmp_path: Path, name: str = "basic") -> Path:
    target = tmp_path / name
    shutil.copytree(REAL_DUMPS / "basic", target)
    return target.resolve()


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 440 KB tmpfs: room for the Parquet files and manifests, not for the catalog."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=440k", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


# --- 8.3: disk full, broken catalog ------------------------------------------------------


def test_full_disk_at_the_catalog_is_one_line_and_a_rerun_repairs(tiny_disk: Path) -> None:
    lake = tiny_disk / "lake"
    code, out, err = extract(REAL_DUMPS / "basic", lake)
    assert (code, out) == (1, "")
    assert err == [
        f"Error: Lake `{lake}/tokenlake.duckdb`: catalog cannot be written (No space left on"
        " device); free space, then run `tokenlake views LAKE`"
    ]
    assert sorted(p.name for p in lake.iterdir()) == [
        "_manifest",
        "rollups",
        "runs",
        "samples",
        "tokens",
        "vocab",
    ]
    code, out, err = cli("verify", str(lake))
    assert (code, err) == (1, [])
    assert out.splitlines() == [
        "catalog `tokenlake.duckdb` is missing; run `tokenlake views LAKE` or extract again",
        "3 steps checked, 1 problem",
    ]
    subprocess.run(["mount", "-o", "remount,size=4m", str(tiny_disk)], check=True)
    code, out, err = extract(REAL_DUMPS / "basic", lake)  # space is back
    assert (code, out, err) == (
        0,
        counts_line(lake, "0 new, 0 updated, 3 unchanged, 0 removed, 0 skipped"),
        [],
    )
    assert rows(lake) == BASIC_STEPS
    assert cli("verify", str(lake))[:2] == (0, "3 steps checked, 0 problems\n")


def test_a_catalog_without_its_views_never_replaces_the_old_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lake = tmp_path / "lake"
    extract(REAL_DUMPS / "basic", lake)
    before = (lake / "tokenlake.duckdb").read_bytes()
    monkeypatch.setattr(
        "tokenlake.serve.catalog.create_sql_views", lambda con, queries=None: []
    )  # views "lost"
    code, out, err = cli("views", str(lake))
    assert (code, out) == (1, "")
    assert len(err) == 1
    assert err[0].startswith(
        f"Error: Lake `{lake}/tokenlake.duckdb`: catalog lacks views `audit_tokens`,"
    )
    assert err[0].endswith(f"`{schema.ROLLUP_TABLES[-1]}` after its build")
    assert (lake / "tokenlake.duckdb").read_bytes() == before
    assert sorted(p.name for p in lake.iterdir() if p.name.startswith(".")) == []


def test_duckdb_failing_on_a_full_disk_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import duckdb

    lake = tmp_path / "lake"
    extract(REAL_DUMPS / "basic", lake)

    def full(con: Any, queries: Any = None) -> list[str]:
        raise duckdb.IOException('IO Error: Could not write file "x": No space left on device')

    monkeypatch.setattr("tokenlake.serve.catalog.create_sql_views", full)
    assert cli("views", str(lake)) == (
        1,
        "",
        [
            f"Error: Lake `{lake}/tokenlake.duckdb`: catalog cannot be written (No space left"
            " on device); free space, then run `tokenlake views LAKE`"
        ],
    )


def test_verify_checks_the_catalog_and_a_reextract_repairs_it(tmp_path: Path) -> None:
    import duckdb

    lake = tmp_path / "lake"
    extract(REAL_DUMPS / "basic", lake)
    (lake / "tokenlake.duckdb").unlink()
    duckdb.connect(str(lake / "tokenlake.duckdb")).close()  # a catalog with no view at all
    code, out, _ = cli("verify", str(lake))
    assert (code, out.splitlines()) == (
        1,
        [
            "catalog `tokenlake.duckdb` lacks views `tokens`, `samples`, `runs`, `vocab`,"
            " `metrics` ...; run `tokenlake views LAKE` or extract again",
            "3 steps checked, 1 problem",
        ],
    )
    code, out, err = extract(REAL_DUMPS / "basic", lake)
    assert (code, out, err) == (
        0,
        counts_line(lake, "0 new, 0 updated, 3 unchanged, 0 removed, 0 skipped"),
        [],
    )
    assert rows(lake) == BASIC_STEPS
    assert cli("verify", str(lake))[:2] == (0, "3 steps checked, 0 problems\n")


def test_verify_names_a_source_no_file_can_have_in_one_line(tmp_path: Path) -> None:
    # A manifest (anyone may write one) listing a source with a NUL byte or a name longer
    # than the OS allows made verify end in a ValueError or OSError traceback.
    lake = tmp_path / "lake"
    extract(REAL_DUMPS / "basic", lake)
    path = lake / "_manifest" / "basic.json"
    record = json.loads(path.read_text())
    steps = record["steps"]
    steps["0"]["sources"][0]["name"] = "rollout_data/0\x00.pt"
    steps["1"]["sources"][0]["name"] = "x" * 5000
    path.write_text(json.dumps(record))
    code, out, err = cli("verify", str(lake))
    dump = REAL_DUMPS / "basic"
    assert (code, err) == (1, [])
    assert out.splitlines() == [
        f"run `basic` step 0: source `{dump}/rollout_data/0\\x00.pt` cannot be the name of a"
        " file (it holds a NUL byte); extract again",
        f"run `basic` step 1: source `{str(dump / ('x' * 5000))[:1000]}…` cannot be the name of"
        " a file (the path is longer than the system allows); extract again",
        "3 steps checked, 2 problems",
    ]


# --- 8.3: partition values, run names --------------------------------------------------


@pytest.mark.parametrize("where", ["run=ghost/lake", "rollout_id=7/lake"])
def test_partition_values_come_from_the_lake_only(tmp_path: Path, where: str) -> None:
    lake = tmp_path / where
    assert extract(REAL_DUMPS / "basic", lake)[0] == 0
    assert rows(lake) == BASIC_STEPS
    assert rows(lake, "SELECT run, rollout_id FROM samples WHERE rollout_id = 1 LIMIT 1") == [
        ("basic", 1)
    ]


def test_drop_cannot_reach_outside_the_lake(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    extract(REAL_DUMPS / "basic", lake)
    important = tmp_path / "x" / "important.json"  # = lake/_manifest/../../x/important.json
    important.parent.mkdir()
    important.write_text("keep me")
    code, out, err = cli("drop", str(lake), "../../x/important")
    assert (code, out, err) == (1, "", [f"Error: Run name `../../x/important` {NAME_RULES}"])
    assert important.read_text() == "keep me"


@pytest.mark.parametrize(
    "command",
    [("extract", str(REAL_DUMPS / "basic"), "--run-name"), ("verify", "--run"), ("drop",)],
)
def test_every_command_validates_run_names_alike(tmp_path: Path, command: tuple[str, ...]) -> None:
    lake = tmp_path / "lake"
    extract(REAL_DUMPS / "basic", lake)
    name = "a?b"
    if command[0] == "extract":
        args = [*command, name, "--lake", str(lake)]
    elif command[0] == "verify":
        args = ["verify", str(lake), "--run", name]
    else:
        args = ["drop", str(lake), name]
    assert cli(*args) == (
        1,
        "",
        [
            "Error: Run name `a?b` holds `?`, which DuckDB reads as a file pattern"
            " (`? * [ ] { }` are not allowed). Choose another with --run-name."
        ],
    )


def test_follow_validates_run_names_alike(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"^Run name `r\*` holds `\*`"):
        follow_run(
            REAL_DUMPS / "basic",
            store_of(tmp_path / "lake"),
            ExtractOptions(follow=True, run_name="r*"),
            should_stop=lambda: True,
        )


def test_a_260_character_run_name_states_the_limit(tmp_path: Path) -> None:
    code, out, err = extract(REAL_DUMPS / "basic", tmp_path / "lake", "--run-name", "r" * 260)
    assert (code, out) == (1, "")
    assert err == [
        f"Error: Run name `{'r' * 60}…` is 260 bytes long; the limit is 250 bytes (UTF-8),"
        " as it becomes a file name. Choose another with --run-name."
    ]
    assert not (tmp_path / "lake").exists()


# --- 8.3: tokenizer, foreign files ----------------------------------------------------


def test_a_broken_tokenizer_is_a_warning_and_texts_are_null(tmp_path: Path) -> None:
    dump, lake = copy_dump(tmp_path), tmp_path / "lake"
    tokenizer = dump / "tokenizer" / "tokenizer.json"
    good = tokenizer.read_bytes()
    tokenizer.write_text("{ not a tokenizer")
    code, out, err = extract(dump, lake)
    assert (code, out) == (
        0,
        counts_line(lake, "3 new, 0 updated, 0 unchanged, 0 removed, 0 skipped", 20, 206),
    )
    assert len(err) == 1
    assert err[0].startswith(f"Ignored `{tokenizer}`: is not a readable tokenizer (")
    assert err[0].endswith("); token texts are NULL until it is fixed")
    assert rows(lake) == BASIC_STEPS
    assert rows(lake, "SELECT count(*), count(token_text) FROM drift_by_token")[0][1] == 0
    assert extract(dump, lake)[2] == []  # said once per version of the file
    tokenizer.write_bytes(good)
    assert extract(dump, lake)[0] == 0
    assert rows(lake, "SELECT count(*) > 0 FROM vocab WHERE run = 'basic'") == [(True,)]


def test_a_dump_folder_named_like_a_table_never_receives_files(tmp_path: Path) -> None:
    shutil.copytree(REAL_DUMPS / "basic", tmp_path / "tokens")
    before = snapshot(tmp_path)
    code, out, err = extract(tmp_path / "tokens", tmp_path)
    assert (code, out) == (1, "")
    assert err == [
        f"Error: Lake `{tmp_path}`: holds the dump `{tmp_path / 'tokens'}`; a lake and a dump"
        " never share a folder: choose a --lake outside every dump"
    ]
    elsewhere = tmp_path / "other"
    (elsewhere / "samples").mkdir(parents=True)  # somebody's folder, not a lake's
    code, out, err = extract(REAL_DUMPS / "basic", elsewhere)
    assert err == [
        f"Error: Lake `{elsewhere}`: is not a lake but holds `samples`, where the lake would"
        " write; choose another --lake"
    ]
    assert snapshot(tmp_path) == before


def test_other_programs_temporary_files_are_never_deleted(tmp_path: Path) -> None:
    dump = tmp_path / "basic"  # a copy: the real fixture is shared with tests running meanwhile
    shutil.copytree(REAL_DUMPS / "basic", dump)
    lake = tmp_path / "lake"
    extract(dump, lake)
    theirs = [
        lake / ".notes.123.tmp",
        lake / "_manifest" / ".basic.json.1.tmp",
        lake / "tokens" / "run=basic" / "rollout_id=0" / ".name.42.tmp",
        lake / "tokens" / "run=basic" / "README.txt",
        # tokenlake's temporary names hold ASCII digits; `\d` also matched `١٢` (drop deleted it)
        lake / "tokens" / "run=basic" / "rollout_id=0" / ".tokenlake-١٢-0a1b2c3d.tmp",
        lake / "tokens" / "run=basic" / "rollout_id=٣" / "README.txt",
        # nor a newline (`$` matched before one): drop deleted these two
        lake / "tokens" / "run=basic" / "rollout_id=0" / "train-0a1b2c3d.parquet\n",
        lake / "tokens" / "run=basic" / "rollout_id=0" / ".tokenlake-12-0a1b2c3d.tmp\n",
        # tokenlake writes a step id as `str(int)`: no sign, no leading zero (drop deleted them)
        lake / "tokens" / "run=basic" / "rollout_id=01" / "train-0a1b2c3d.parquet",
        lake / "tokens" / "run=basic" / "rollout_id=-1" / "train-0a1b2c3d.parquet",
    ]
    for path in (theirs[5], *theirs[-2:]):  # not step folders tokenlake makes either
        path.parent.mkdir()
    for path in theirs:
        path.write_text("theirs")
    extract(dump, lake, "--run-name", "other")
    os.utime(dump / "rollout_data" / "1.pt", ns=(1, 1))  # step 1 is rewritten
    assert extract(dump, lake)[0] == 0
    code, out, _ = cli("verify", str(lake), "--run", "basic")
    assert (code, out) == (0, "3 steps checked, 0 problems\n")  # neither is its leftover
    assert cli("drop", str(lake), "basic")[0] == 0
    assert [p.read_text() for p in theirs] == ["theirs"] * 10


# --- 8.3 and 9: one line for every mistake with a lake ---------------------------------


def test_views_on_a_read_only_lake_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lake = tmp_path / "lake"
    extract(REAL_DUMPS / "basic", lake)
    real_open = builtins.open

    def read_only(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if str(file).startswith(str(lake)) and set(mode) & set("wax+"):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(file))
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", read_only)
    assert cli("views", str(lake)) == (
        1,
        "",
        [
            f"Error: Lake `{lake}`: cannot be written (`{lake}/_manifest/.tokenlake.lock`:"
            " Read-only file system)"
        ],
    )


def test_views_while_an_extraction_writes_is_one_line(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    extract(REAL_DUMPS / "basic", lake)
    with LocalStore(lake).lock():  # what a running extraction holds
        assert cli("views", str(lake)) == (
            1,
            "",
            [
                f"Error: Lake `{lake}`: another tokenlake command (an extraction, a tag, a drop) is writing to it; wait"
                " for it to finish"
            ],
        )


def test_views_requires_a_lake(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("x")
    not_a_lake = "is not a lake: it has no `_manifest/`; run `tokenlake extract` first"
    for path, message in [
        (tmp_path / "missing", not_a_lake),
        (tmp_path / "empty", not_a_lake),
        (tmp_path / "file", "is a file, not a lake directory"),
        (
            REAL_DUMPS / "basic",
            "is a miles dump (it has `rollout_data/`), not a lake; give the --lake directory"
            " of `tokenlake extract`",
        ),
    ]:
        assert cli("views", str(path)) == (1, "", [f"Error: Lake `{path}`: {message}"])
    assert list((tmp_path / "empty").iterdir()) == []


@pytest.mark.parametrize("command", ["query", "audit"])
def test_a_catalog_held_read_write_does_not_stop_a_reader(tmp_path: Path, command: str) -> None:
    """Readers build their views privately, so a client holding the file changes nothing."""
    lake = tmp_path / "lake"
    extract(REAL_DUMPS / "basic", lake)
    args = [
        command,
        str(lake),
        *(["SELECT count(*) AS n FROM samples"] if command == "query" else []),
    ]
    expected = cli(*args)
    catalog = lake / "tokenlake.duckdb"
    # Holds the catalog open for writing until killed, however long the command takes.
    holder = subprocess.Popen(
        [sys.executable, "-c", "import duckdb, sys; c = duckdb.connect(sys.argv[1]);"
         " print('ready', flush=True); sys.stdin.read()", str(catalog)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"ready\n"
        assert cli(*args) == expected
    finally:
        holder.kill()
        holder.wait()
    assert expected[0] == (1 if command == "audit" else 0)  # basic's noise fails miles' own gate


DAMAGE = {
    "bad-json": (lambda text: text[:-3], "it is not JSON (Expecting value: line"),
    "missing-key": (lambda text: text.replace('"source_dir"', '"source"'), "key `source"),
    "unknown-key": (
        lambda text: text.replace('"runs_file"', '"rows_file"'),
        "key `rows_file` is unknown",
    ),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_manifest_is_named_with_the_way_out(tmp_path: Path, damage: str) -> None:
    lake = tmp_path / "lake"
    extract(REAL_DUMPS / "basic", lake)
    path = lake / "_manifest" / "basic.json"
    change, problem = DAMAGE[damage]
    path.write_text(change(path.read_text()))
    start = f"Error: Lake `{path}`: manifest is damaged: {problem}"
    end = ". Remove the run with `tokenlake drop LAKE basic` or extract it again"
    for args in (
        ["verify", str(lake)],
        ["views", str(lake)],
        ["extract", str(REAL_DUMPS / "pp2"), "--lake", str(lake), "--silent"],
    ):
        code, out, err = cli(*args)
        assert (code, out, len(err)) == (1, "", 1), args
        assert err[0].startswith(start) and err[0].endswith(end), (args, err[0])
    assert not (lake / "tokens" / "run=pp2").exists()  # refused before any work
    moved = tmp_path / "moved"  # a query reads the manifests when it must rebuild the views
    lake.rename(moved)
    code, out, err = cli("query", str(moved), "SELECT 1")
    assert (code, out) == (1, "")
    assert err[-1] == start.replace(str(lake), str(moved)) + err[-1].split(problem)[1]
    assert err[-1].endswith(end)
    moved.rename(lake)
    code, out, _ = extract(REAL_DUMPS / "basic", lake)  # extracting it again repairs it
    assert (code, out) == (
        0,
        counts_line(lake, "3 new, 0 updated, 0 unchanged, 0 removed, 0 skipped", 20, 206),
    )
    assert cli("verify", str(lake))[:2] == (0, "3 steps checked, 0 problems\n")


def test_a_manifest_under_a_name_no_run_has_says_to_remove_the_file(tmp_path: Path) -> None:
    # Its way out was `tokenlake drop LAKE x*y` or extracting it again, both refused for
    # that name (`*` is a glob to DuckDB): the lake stayed unreadable.
    lake = tmp_path / "lake"
    extract(REAL_DUMPS / "basic", lake)
    planted = lake / "_manifest" / "x*y.json"
    shutil.copy(lake / "_manifest" / "basic.json", planted)
    line = (
        f"Error: Lake `{planted}`: manifest is damaged: its `run` is not `x*y`, the name of the"
        " file. Its name is no run name tokenlake makes, so no tokenlake command replaces it:"
        " remove the file"
    )
    for args in (["query", str(lake), "SELECT 1"], ["verify", str(lake)]):
        assert cli(*args) == (1, "", [line]), args
    planted.unlink()
    assert cli("verify", str(lake))[:2] == (0, "3 steps checked, 0 problems\n")


def test_a_moved_lake_is_read_where_it_is_now(tmp_path: Path) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    extract(REAL_DUMPS / "basic", old)
    old.rename(new)
    code, out, _ = cli("query", str(new), STEPS_SQL, "--format", "csv")
    assert (code, out) == (
        0,
        '"run","rollout_id","evaluation","count_star()"\n'
        '"basic",0,false,82\n"basic",0,true,42\n"basic",1,false,82\n',
    )
    assert cli("audit", str(new))[0] in (0, 1)  # runs its queries, no traceback
    assert cli("views", str(new))[:2] == (0, f"Rebuilt {new / 'tokenlake.duckdb'}\n")
    assert rows(new) == BASIC_STEPS


# --- a file of other columns under a tokenlake name --------------------------------------


def _forge(path: Path) -> None:
    """Another program's Parquet file, with a control character in its one value."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"x": ["evil\x1b[2J"] * 3}), path)


@pytest.mark.parametrize(
    ("table", "first_column", "way_out"),
    [
        ("tokens", "evaluation", "delete it and extract again"),
        (
            "drift_sample_parts",
            "batch_position",
            "`tokenlake views LAKE --recompute` computes the rollups again",
        ),
    ],
)
def test_a_foreign_file_under_a_tokenlake_name_is_one_line_and_verify_names_it(
    tmp_path: Path, table: str, first_column: str, way_out: str
) -> None:
    lake = tmp_path / "lake"
    extract(REAL_DUMPS / "basic", lake)
    folder = schema.ROLLUP_DIR + "/" if table != "tokens" else ""
    (forged,) = (lake / f"{folder}{table}/run=basic/rollout_id=1").glob("train-*.parquet")
    _forge(forged)
    name = forged.relative_to(lake).as_posix()

    code, out, _ = cli("verify", str(lake))
    assert (code, out.splitlines()) == (
        1,
        [
            f"run `basic` step 1: file `{name}` does not hold the columns of `{table}`:"
            f" `{first_column}` is missing; {way_out}",
            "3 steps checked, 1 problem",
        ],
    )
    # Its manifest records another identity: readers leave out what it touches, saying so.
    view = "drift_samples" if table != "tokens" else "tokens"
    code, out, err = cli_process("query", str(lake), f"SELECT count(*) FROM {view}")
    changed = f"`{name}` is not the file its manifest records (its size or footer changed)"
    assert (code, err[0]) == (
        0,
        f"Warning: run `basic` step 1: not served: {changed}; `tokenlake verify LAKE` names it"
        if table == "tokens"
        else f"Warning: run `basic` step 1: rollups not served, its views read its tokens:"
        f" {changed}; `tokenlake verify LAKE` names it",
    )
    # A manifest of an older tokenlake records no identities: the reader stops at the file.
    written = (lake / "_manifest/basic.json").read_text()
    record = json.loads(written)
    for step in record["steps"].values():
        del step["identities"]
    (lake / "_manifest/basic.json").write_text(json.dumps(record))
    code, out, err = cli("report", str(lake), "-o", str(tmp_path / "report.html"))
    assert (code, out, len(err)) == (1, "", 1)
    assert err[0].startswith(f"Error: Lake `{lake}`: the report cannot read it: ")
    assert err[0].endswith(f'{forged}"; `tokenlake verify LAKE` names the damaged files')
    assert "\x1b" not in err[0]
    assert not (tmp_path / "report.html").exists()
    code, out, err = cli("query", str(lake), f"SELECT max(batch_position) FROM {view}")
    assert (code, out, len(err)) == (1, "", 1)
    assert err[0].startswith(f"Error: Lake `{lake}`: a query cannot read it: ")
    assert err[0].endswith("; `tokenlake verify LAKE` names the damaged files")
    (lake / "_manifest/basic.json").write_text(written)

    if table == "tokens":
        forged.unlink()
        assert extract(REAL_DUMPS / "basic", lake)[0] == 0
    else:
        assert cli("views", str(lake), "--recompute")[0] == 0
    assert cli("verify", str(lake))[:2] == (0, "3 steps checked, 0 problems\n")


def test_a_directory_under_a_token_files_name_is_never_read_as_its_rows(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    extract(REAL_DUMPS / "basic", lake)
    (planted,) = (lake / "tokens/run=basic/rollout_id=1").glob("train-*.parquet")
    planted.unlink()
    planted.mkdir()  # pyarrow reads a directory as a dataset of the files it holds
    for other in (lake / "samples/run=basic/rollout_id=0").glob("*.parquet"):
        shutil.copy(other, planted)
    step_1 = lake / schema.ROLLUP_DIR / "drift_step_parts/run=basic/rollout_id=1"
    kept = snapshot(step_1)
    name = planted.relative_to(lake).as_posix()

    # The other steps get their rollups; this one keeps its own, and says why in one line.
    code, out, err = cli("views", str(lake), "--recompute")
    assert (code, out, err) == (
        0,
        f"Computed the rollups of 2 steps from their tokens.\nRebuilt {lake / 'tokenlake.duckdb'}\n",
        [
            f"Warning: run `basic` step 1: rollups not computed: Lake `{planted}`: cannot be read"
            f" ([Errno 21] not a regular file: '{planted}'); extract the run again",
            f"Warning: run `basic` step 1: not served: `{name}` is missing; `tokenlake verify"
            " LAKE` names it",
        ],
    )
    assert snapshot(step_1) == kept
    assert cli("verify", str(lake))[:2] == (
        1,
        f"run `basic` step 1: file `{name}` is missing\n3 steps checked, 1 problem\n",
    )
