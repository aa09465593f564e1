"""The command line: exact text a user sees, and exit codes."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from click.testing import CliRunner

from tests.fixture_paths import REAL_DUMPS
from tokenlake.cli import main, parse_steps

FIXTURES = REAL_DUMPS


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_parse_steps_accepts_ranges_and_rejects_garbage():
    selection = parse_steps("3,0-1")
    assert [s for s in range(5) if s in selection] == [0, 1, 3]
    code, _, err = run("extract", "x", "--steps", "1-a")
    assert (code, err) == (
        1,
        "Error: --steps `1-a` is not a list of steps or ranges like `0-9,12`.\n",
    )


@pytest.mark.parametrize("steps", ["²", "0-١"], ids=["superscript-2", "arabic-1"])
def test_steps_in_digits_other_than_ascii_are_one_line(steps):
    # `"²".isdigit()` is true: `int("²")` raised a traceback; `int("١")` read it as step 1.
    code, _, err = run("extract", "x", "--steps", steps)
    assert (code, err) == (
        1,
        f"Error: --steps `{steps}` is not a list of steps or ranges like `0-9,12`.\n",
    )


def test_missing_dump_directory_is_one_line(tmp_path):
    code, out, err = run("extract", str(tmp_path / "nope"), "--lake", str(tmp_path / "lake"))
    assert code == 1
    assert out == ""
    assert err == f"Error: `{tmp_path / 'nope'}` does not exist\n"


def test_directory_that_is_not_a_dump(tmp_path):
    code, _, err = run("extract", str(tmp_path), "--lake", str(tmp_path / "lake"))
    assert code == 1
    assert err == (
        f"Error: `{tmp_path}` is not a dump tokenlake reads: it has no `rollout_data/`"
        " directory (miles, slime), no `train_data_step{N}.jsonl` (NeMo-RL) and no"
        " `token_exports/step_{N}/rank_{R}.jsonl` (prime-rl)\n"
    )


def test_run_name_that_cannot_be_a_directory(tmp_path):
    code, _, err = run(
        "extract", str(FIXTURES / "basic"), "--lake", str(tmp_path), "--run-name", "a/b"
    )
    assert code == 1
    assert err == (
        "Error: Run name `a/b` cannot be a partition directory: it must be non-empty, not start"
        " with `.`, and contain no `/`, `\\`, `=`, `%` or control characters. Choose another"
        " with --run-name.\n"
    )


@pytest.mark.slow
def test_extract_then_query_then_reextract(tmp_path):
    lake = tmp_path / "l'ake [1]"
    code, out, err = run(
        "extract",
        str(FIXTURES / "basic"),
        "--lake",
        str(lake),
        "--run-name",
        "rü n'1",
        "--workers",
        "1",
    )
    assert code == 0, err
    assert re.fullmatch(
        r"Run `rü n'1`: 3 new, 0 updated, 0 unchanged, 0 removed, 0 skipped steps; wrote 20"
        rf" samples and 206 tokens in \d+\.\d s -> {re.escape(str(lake))}\n",
        out,
    )
    # off a terminal: one plain line per step, never a carriage return
    assert "\r" not in err
    assert re.fullmatch(
        r"Step 0 done \(1/3 steps\): 82 tokens, [\d,]+ tokens/s\n"
        r"Eval step 0 done \(2/3 steps\): 42 tokens, [\d,]+ tokens/s\n"
        r"Step 1 done \(3/3 steps\): 82 tokens, [\d,]+ tokens/s\n",
        err,
    )
    code, out, _ = run(
        "query", str(lake), "SELECT run, rollout_id, n_samples, reward_mean FROM step_stats"
    )
    assert (code, out) == (
        0,
        "run     rollout_id  n_samples  reward_mean\n"
        "------  ----------  ---------  -----------\n"
        "rü n'1           0          8         0.25\n"
        "rü n'1           1          8        0.375\n"
        "(2 rows)\n",
    )
    code, out, _ = run(
        "extract", str(FIXTURES / "basic"), "--lake", str(lake), "--run-name", "rü n'1", "--silent"
    )
    assert out.startswith("Run `rü n'1`: 0 new, 0 updated, 3 unchanged, 0 removed, 0 skipped")
    code, out, _ = run("verify", str(lake))
    assert (code, out) == (0, "3 steps checked, 0 problems\n")


@pytest.mark.slow
def test_query_errors_are_one_line(tmp_path):
    run("extract", str(FIXTURES / "pp2"), "--lake", str(tmp_path), "--silent")
    code, _, err = run("query", str(tmp_path), "SELECT nope FROM tokens")
    assert code == 1
    assert err.startswith('Error: Query failed: Binder Error: Referenced column "nope" not found')
    assert err.count("\n") >= 1


@pytest.mark.slow
def test_drop_removes_one_run_and_nothing_else(tmp_path):
    for case in ("basic", "pp2"):
        run("extract", str(FIXTURES / case), "--lake", str(tmp_path), "--silent", "--workers", "1")
    code, out, _ = run("drop", str(tmp_path), "basic")
    assert (code, out) == (0, f"Dropped run `basic` from {tmp_path}\n")
    assert not (tmp_path / "tokens" / "run=basic").exists()
    code, out, _ = run("query", str(tmp_path), "SELECT DISTINCT run FROM tokens", "--format", "csv")
    assert out == '"run"\n"pp2"\n'
    code, _, err = run("drop", str(tmp_path), "basic")
    assert (code, err) == (1, f"Error: Lake `{tmp_path}`: has no run `basic` (runs: `pp2`)\n")


@pytest.mark.slow
def test_ctrl_c_prints_what_was_committed(tmp_path, monkeypatch):
    from tokenlake.orchestrate.progress import PlainReporter

    done = PlainReporter.done

    def stop(self, result):
        done(self, result)
        raise KeyboardInterrupt

    monkeypatch.setattr(PlainReporter, "done", stop)
    code, out, err = run(
        "extract", str(FIXTURES / "basic"), "--lake", str(tmp_path), "--workers", "1"
    )
    assert code == 130
    assert re.fullmatch(
        r"Run `basic`: 1 new, 0 updated, 0 unchanged, 0 removed, 0 skipped steps; wrote 8 samples"
        rf" and \d+ tokens in \d+\.\d s -> {re.escape(str(tmp_path))}\n",
        out,
    )
    assert re.fullmatch(
        r"Step 0 done \(1/3 steps\): \d+ tokens, [\d,]+ tokens/s\n"
        r"Stopping: publishing the 1 step committed so far \(manifest and catalog\)\.\n"
        r"Interrupted; the lake holds every step committed so far\.\n",
        err,
    )


SQL_WITH_COMMENT = "-- Steps where drift is large\nSELECT 1"


@pytest.mark.parametrize(
    ("args", "sql", "fmt", "settings"),
    [
        (["lake", SQL_WITH_COMMENT], SQL_WITH_COMMENT, "table", ()),
        (["lake", SQL_WITH_COMMENT, "--format", "csv"], SQL_WITH_COMMENT, "csv", ()),
        (["--set", "k3=-1", "lake", "-- x", "--format=json"], "-- x", "json", ("k3=-1",)),
        (["lake", "--", "--- y"], "--- y", "table", ()),
    ],
)
def test_query_takes_sql_that_begins_with_a_comment(args, sql, fmt, settings):
    from tokenlake.cli import query

    params = query.make_context("query", list(args)).params
    assert (str(params["lake"]), params["sql"], params["fmt"], params["settings"]) == (
        "lake",
        sql,
        fmt,
        settings,
    )


def test_an_unknown_option_beside_free_text_is_still_refused():
    code, out, err = run("query", "lake", "-- a comment\nSELECT 1", "--fromat", "csv")
    assert (code, out) == (2, "")
    assert err.endswith("Error: No such option '--fromat'. Did you mean '--format'?\n")


def test_tag_values_beginning_with_dashes_reach_the_tag_check():
    code, _, err = run("tag", "lake", "qwen", "-- not a tag")
    assert (code, err) == (
        1,
        "Error: --tag `-- not a tag` is not `key=value`, e.g. `--tag precision=fp8`.\n",
    )


@pytest.mark.parametrize(("users", "seen"), [(None, "1"), ("4", "4")])
def test_numpy_blas_threads_are_one_unless_the_user_says(monkeypatch, users, seen):
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "unset by the test")  # restored afterwards
    if users is None:
        monkeypatch.delenv("OPENBLAS_NUM_THREADS")
    else:
        monkeypatch.setenv("OPENBLAS_NUM_THREADS", users)
    code, _, err = run("query")
    assert (code, err.splitlines()[-1]) == (2, "Error: Missing argument 'LAKE'.")
    assert os.environ["OPENBLAS_NUM_THREADS"] == seen


def test_ctrl_c_while_the_command_loads_is_aborted_without_a_traceback():
    """The Ctrl-C lands while `tokenlake.cli` and its dependencies are imported: before click
    runs, whose own `Aborted!` covers the command from then on."""
    interrupted = (
        "import builtins, sys\n"
        "real = builtins.__import__\n"
        "def ctrl_c(name, *args, **kwargs):\n"
        "    if name == 'tokenlake.cli':\n"
        "        raise KeyboardInterrupt\n"
        "    return real(name, *args, **kwargs)\n"
        "builtins.__import__ = ctrl_c\n"
        "from tokenlake.__main__ import run\n"
        "run()\n"
    )
    done = subprocess.run([sys.executable, "-c", interrupted], capture_output=True, text=True)
    assert (done.returncode, done.stdout, done.stderr) == (1, "", "\nAborted!\n")
