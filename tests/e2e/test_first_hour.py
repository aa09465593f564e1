"""A new user's first hour: every mistake is one line with the exact text a
user sees, nothing a dump carries can steer the terminal, and nothing is silently a no-op."""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.conftest import store_of
from tests.fixture_paths import REAL_DUMPS
from tokenlake.cli import main
from tokenlake.orchestrate.progress import BarReporter, PlainReporter
from tokenlake.terminal import safe_text
from tokenlake.transform.tables import StepResult

ROOT = Path(__file__).resolve().parents[2]
BASIC = REAL_DUMPS / "basic"


def run(*args: str, stdin: str | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), input=stdin)
    return result.exit_code, result.stdout, result.stderr


def empty_dump(path: Path) -> Path:
    (path / "rollout_data").mkdir(parents=True)
    (path / "train_data").mkdir()
    return path


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("first-hour") / "lake"
    code, _, err = run("extract", str(BASIC), "--lake", str(root), "--silent", "--workers", "1")
    assert code == 0, err
    return root


# -- 4. Output a terminal can trust ---------------------------------------------------------


def test_control_characters_in_a_file_name_cannot_move_the_cursor(tmp_path):
    dump = empty_dump(tmp_path / "d")
    (dump / "rollout_data" / "x\r\x1b[2K0 skipped.pt").write_bytes(b"")
    code, out, err = run("extract", str(dump), "--lake", str(tmp_path / "lake"), "--silent")
    assert code == 0
    assert err == (
        f"Ignored `{dump}/rollout_data/x\\x0d\\x1b[2K0 skipped.pt`:"
        " not a rollout or train dump file name\n"
    )
    assert out.startswith("Run `d`: 0 new, 0 updated, 0 unchanged, 0 removed, 0 skipped steps;")


def test_a_two_megabyte_value_prints_a_bounded_line():
    name = "r" * 2_000_000 + "/"  # refused; the message quotes a short prefix of it
    code, _, err = run("extract", str(BASIC), "--run-name", name)
    assert code == 1
    assert err == (
        "Error: Run name `" + "r" * 60 + "…` cannot be a partition directory: it must be"
        " non-empty, not start with `.`, and contain no `/`, `\\`, `=`, `%` or control"
        " characters. Choose another with --run-name.\n"
    )


def test_the_last_line_of_defence_cuts_a_long_line():
    text = safe_text("r" * 2_000_000)
    assert text == "r" * 2000 + "... (1,998,000 more characters)"


def test_safe_text_escapes_every_control_character_and_surrogate():
    assert safe_text("a\x00b\x7fc\x9bd") == "a\\x00b\\x7fc\\x9bd"
    assert safe_text("caf\udce9") == "caf\\xe9"  # a latin-1 byte of a file name
    assert safe_text("one\ntwo", one_line=True) == "one\\x0atwo"
    assert safe_text("\n" * 100).count("\n") == 40  # at most 40 lines and a "more lines" line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("--steps", "5-2"),
            "Error: --steps `5-2`: range `5-2` is reversed; write `2-5`.\n",
        ),
        (
            ("--steps", "99999999999999999999"),
            "Error: --steps `99999999999999999999`: a step id is at most 9223372036854775807.\n",
        ),
        (
            ("--poll", "nan"),
            "Error: --poll nan: give a number more than 0 and at most 86400.\n",
        ),
        (
            ("--poll", "-1"),
            "Error: --poll -1.0: give a number more than 0 and at most 86400.\n",
        ),
        (
            ("--settle", "inf"),
            "Error: --settle inf: give a number at least 0 and at most 86400.\n",
        ),
        (
            ("--workers", "0"),
            "Error: --workers 0: give a number at least 1 and at most 256.\n",
        ),
        (
            ("--workers", "100000"),
            "Error: --workers 100000: give a number at least 1 and at most 256.\n",
        ),
    ],
)
def test_numeric_options_are_range_checked(tmp_path, args, message):
    code, out, err = run("extract", str(BASIC), "--lake", str(tmp_path / "lake"), *args)
    assert (code, out, err) == (1, "", message)
    assert not (tmp_path / "lake").exists()


@pytest.mark.parametrize(
    ("args", "parameter", "what"),
    [
        (("extract", str(BASIC), "--lake", ""), "'--lake'", "lake"),
        (("query", "", "SELECT 1"), "'LAKE'", "lake"),
        (("extract", "", "--lake", "lake"), "'DUMP_DIR'", "dump"),
    ],
)
def test_an_empty_location_is_refused_not_read_as_the_current_folder(
    tmp_path, monkeypatch, args, parameter, what
):
    # Path("") is ".": `--lake "$LAKE"` with LAKE unset wrote the lake's folders and catalog
    # into the folder the command ran in.
    monkeypatch.chdir(tmp_path)
    code, out, err = run(*args)
    assert (code, out) == (2, "")
    assert err.splitlines()[-1] == (
        f"Error: Invalid value for {parameter}: the {what}'s location is empty; give its folder"
        " (`.` for this one)."
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("option", [("--steps", "3"), ("--strict",)])
def test_options_follow_would_ignore_are_refused(tmp_path, option):
    code, _, err = run("extract", str(BASIC), "--lake", str(tmp_path), "--follow", *option)
    assert (code, err) == (
        1,
        f"Error: {option[0]} cannot be combined with --follow, which extracts every complete"
        " step and retries a bad one when it changes.\n",
    )


@pytest.mark.parametrize("value", ["nan", "1e999", "-inf"])
def test_set_takes_finite_numbers_only(tmp_path, value):
    code, _, err = run("query", str(tmp_path), "SELECT 1", "--set", f"alarm_k3_kl={value}")
    assert (code, err) == (
        1,
        f"Error: --set `alarm_k3_kl={value}`: the value must be a finite number.\n",
    )


def test_a_setting_given_twice_is_refused_naming_both_values(tmp_path):
    # The last one silently won, as if the first had not been typed; --tag refuses the same.
    code, _, err = run(
        "query", str(tmp_path), "SELECT 1", "--set", "is_cap=3", "--set", " is_cap=4"
    )
    assert (code, err) == (1, "Error: --set `is_cap` is given twice, as `3` and `4`.\n")


def test_steps_matching_nothing_lists_the_dumps_steps(tmp_path):
    code, out, err = run("extract", str(BASIC), "--lake", str(tmp_path / "lake"), "--steps", "99")
    assert (code, out) == (1, "")
    assert err == (
        f"Error: --steps `99` selects no step of `{BASIC}`; its steps are 0-1 and eval 0.\n"
    )
    assert not (tmp_path / "lake").exists()  # no empty `_manifest/` left behind


@pytest.mark.slow
def test_a_huge_step_range_is_tested_not_expanded(tmp_path):
    started = time.perf_counter()
    code, out, _ = run(
        "extract", str(BASIC), "--lake", str(tmp_path), "--steps", "1-10000000000", "--silent"
    )
    assert code == 0
    assert out.startswith("Run `basic`: 1 new, 0 updated, 0 unchanged, 0 removed, 0 skipped")
    assert time.perf_counter() - started < 300  # expanding the range would take hours


def test_fifo_device_directory_and_broken_link_named_like_dump_files(tmp_path):
    dump = empty_dump(tmp_path / "d")
    os.mkfifo(dump / "rollout_data" / "5.pt")
    (dump / "rollout_data" / "6.pt").mkdir()
    (dump / "rollout_data" / "7.pt").symlink_to("/dev/null")
    (dump / "train_data" / "1_9.pt").symlink_to(tmp_path / "gone")
    (dump / "rollout_data" / f"{10**20}.pt").write_bytes(b"")
    code, _, err = run("extract", str(dump), "--lake", str(tmp_path / "lake"), "--silent")
    assert code == 0
    assert err == (
        f"Ignored `{dump}/rollout_data/100000000000000000000.pt`: its id 100000000000000000000"
        " exceeds the largest step id or rank (9223372036854775807)\n"
        f"Ignored `{dump}/rollout_data/5.pt`: is a FIFO (named pipe), not a regular file\n"
        f"Ignored `{dump}/rollout_data/6.pt`: is a directory, not a regular file\n"
        f"Ignored `{dump}/rollout_data/7.pt`: is a character device, not a regular file\n"
        f"Ignored `{dump}/train_data/1_9.pt`: is a broken symbolic link\n"
    )


# -- 2./3. Discovery ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("copies", "message"),
    [
        (
            {"rollout_data/01.pt": "rollout_data/1.pt"},
            "`{d}/rollout_data/1.pt`: names the same step as `rollout_data/01.pt`",
        ),
        (
            {"train_data/01_0.pt": "train_data/1_0.pt"},
            "`{d}/train_data/1_0.pt`: names the same step and rank as `train_data/01_0.pt`",
        ),
    ],
)
def test_two_names_for_one_step_fail_that_step_naming_both_and_the_others_land(
    tmp_path, copies, message
):
    # Either name could be meant, so neither is picked; the whole extraction was refused,
    # and the dump's other steps did not land either.
    dump = tmp_path / "d"
    shutil.copytree(BASIC, dump)
    for name, original in copies.items():
        shutil.copyfile(dump / original, dump / name)
    code, out, err = run("extract", str(dump), "--lake", str(tmp_path / "lake"))
    assert code == 1
    assert out.startswith("Run `d`: 2 new, 0 updated, 0 unchanged, 0 removed, 1 skipped steps;")
    assert err.splitlines()[-1] == (
        "Skipped step 1: "
        + message.format(d=dump)
        + "; which one is meant is ambiguous: remove or rename one of them. Replace or remove"
        " the file, then extract again."
    )
    steps = run(
        "query",
        str(tmp_path / "lake"),
        "SELECT DISTINCT rollout_id, evaluation FROM samples ORDER BY ALL",
        "--format",
        "csv",
    )
    assert steps == (0, '"rollout_id","evaluation"\n0,false\n0,true\n', "")
    (dump / next(iter(copies))).unlink()  # the user removes one name: the step lands
    code, out, _ = run("extract", str(dump), "--lake", str(tmp_path / "lake"))
    assert (code, out.split(";")[0]) == (
        0,
        "Run `d`: 1 new, 0 updated, 2 unchanged, 0 removed, 0 skipped steps",
    )


def test_a_latin1_dump_directory_name_is_one_line(tmp_path):
    dump = empty_dump(Path(os.fsdecode(bytes(tmp_path) + b"/caf\xe9")))
    code, _, err = run("extract", str(dump), "--lake", str(tmp_path / "lake"))
    assert (code, err) == (
        1,
        f"Error: `{tmp_path}/caf\\xe9` has a path that is not valid UTF-8 (a latin-1 name?);"
        " tokenlake records the dump's path in the lake as text: rename the directory"
        " (e.g. `convmv -f latin1 -t utf8`)\n",
    )


# -- 9. No silent replacement ---------------------------------------------------------------


@pytest.mark.slow
def test_another_dump_under_an_existing_run_name_needs_replace(tmp_path):
    other = tmp_path / "other"
    shutil.copytree(BASIC, other)
    lake = tmp_path / "lake"
    assert run("extract", str(BASIC), "--lake", str(lake), "--run-name", "r", "--silent")[0] == 0
    code, out, err = run("extract", str(other), "--lake", str(lake), "--run-name", "r")
    assert (code, out) == (1, "")
    assert err == (
        f"Error: Run `r` in the lake was extracted from `{BASIC}`, not from `{other}`;"
        " give --replace to replace it, or another --run-name.\n"
    )
    code, out, _ = run(
        "extract", str(other), "--lake", str(lake), "--run-name", "r", "--replace", "--silent"
    )
    assert code == 0
    assert out.startswith("Run `r`: 3 new, 0 updated, 0 unchanged, 0 removed, 0 skipped steps")


# -- 9. query from stdin or a file; empty SQL ------------------------------------------------


@pytest.mark.slow
def test_query_reads_sql_from_stdin_and_from_a_file(lake, tmp_path):
    expected = "  n\n---\n206\n(1 row)\n"
    assert run("query", str(lake), "-", stdin="SELECT count(*) AS n FROM tokens") == (
        0,
        expected,
        "",
    )
    sql = tmp_path / "q.sql"
    sql.write_text("-- the token count\nSELECT count(*) AS n FROM tokens;\n")
    assert run("query", str(lake), "--file", str(sql)) == (0, expected, "")


@pytest.mark.parametrize(
    ("args", "stdin", "message"),
    [
        (("",), None, "Error: The SQL is empty; give a query, e.g. `SELECT * FROM step_stats`.\n"),
        (
            ("-",),
            " ;\n",
            "Error: The SQL is empty; give a query, e.g. `SELECT * FROM step_stats`.\n",
        ),
        (
            ("-",),
            "-- nothing\n/* at all */",
            "Error: The SQL is empty; give a query, e.g. `SELECT * FROM step_stats`.\n",
        ),
        (
            (),
            None,
            "Error: Give the SQL as an argument, `-` to read it from stdin, or --file Q.sql"
            " (one of them).\n",
        ),
        (
            ("--file", "missing.sql"),
            None,
            "Error: Cannot read --file `missing.sql`: No such file or directory.\n",
        ),
    ],
)
def test_empty_or_missing_sql_is_an_error(tmp_path, monkeypatch, args, stdin, message):
    monkeypatch.chdir(tmp_path)
    assert run("query", str(tmp_path), *args, stdin=stdin) == (1, "", message)


# -- 9. Small ones --------------------------------------------------------------------------


@pytest.mark.slow
def test_pyarrow_reads_rollout_id_as_bigint_with_the_documented_partitioning(lake):
    text = (ROOT / "docs" / "columns.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.DOTALL).group(1)
    scope: dict = {}
    exec(code.replace('"lake/tokens"', repr(str(lake / "tokens"))), scope)
    import pyarrow as pa

    table = scope["tokens"].to_table(columns=["run", "rollout_id"])
    assert table.schema.field("rollout_id").type == pa.int64()
    assert sorted(set(table.column("rollout_id").to_pylist())) == [0, 1]


def test_docs_say_what_staleness_the_fixtures_show():
    text = (ROOT / "docs" / "columns.md").read_text()
    assert "the real fixtures read down to −2" in text
    assert "may read −1" not in text


# -- Progress -------------------------------------------------------------------------------


def _result(step: int, tokens: int, evaluation: bool = False) -> StepResult:
    return StepResult(step, evaluation, samples=4, tokens=tokens, train_files=2, nonfinite_values=0)


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_one_plain_line_per_step():
    stream = io.StringIO()
    reporter = PlainReporter(stream)
    reporter.planned(3)
    reporter.done(_result(0, 1000))
    reporter.skipped("1")
    reporter.done(_result(0, 10, evaluation=True))
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue()
    assert re.fullmatch(r"Step 0 done \(1/3 steps\): 1,000 tokens, [\d,]+ tokens/s", lines[0])
    assert lines[1] == "Step 1 failed (2/3 steps); the reason is below."
    assert re.fullmatch(r"Eval step 0 done \(3/3 steps\): 10 tokens, [\d,]+ tokens/s", lines[2])


def test_on_a_terminal_a_bar_with_total_rate_and_eta():
    stream = _Tty()
    reporter = BarReporter(stream)
    reporter.planned(2)
    reporter.done(_result(0, 5000))
    reporter.close()
    shown = stream.getvalue().split("\r")[-1]
    assert re.search(r"1/2 \[\d\d:\d\d<\d\d:\d\d", shown), shown  # done/total, elapsed<ETA
    assert re.search(r"5,000 tokens, [\d,]+ tokens/s", shown), shown


def test_stopping_says_at_once_what_it_waits_for():
    stream = io.StringIO()
    reporter = PlainReporter(stream)
    reporter.planned(5)
    reporter.stopping(["3", "4"])
    reporter.stopping([])
    assert stream.getvalue() == (
        "Stopping: waiting for 2 steps in flight (3, 4) to finish; they are not committed"
        " (the next extraction redoes them).\n"
        "Stopping: publishing the 0 steps committed so far (manifest and catalog).\n"
    )


# -- Makefile -------------------------------------------------------------------------------


def make(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    venv = Path(sys.executable).parent.parent
    # A shell sets PWD to where make is called from; the Makefile resolves RUN and LAKE by it.
    env = {**os.environ, "PWD": str(cwd)}
    return subprocess.run(
        [
            "make",
            "--no-print-directory",
            "-C",
            str(ROOT),
            f"VENV={venv}",
            "-o",
            f"{venv}/.installed-run",
            "-o",
            f"{venv}/.installed-test",
            *args,
        ],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_make_help_shows_the_real_defaults():
    out = make("help", "LAKE=/data/my lake").stdout
    assert "$(" not in out
    assert "[LAKE=/data/my lake]: run the sql/audits checks" in out
    assert "write the small built-in example dump to example-dump/" in out


@pytest.mark.slow
def test_make_passes_names_verbatim_and_resolves_relative_paths_from_the_caller(tmp_path):
    shutil.copytree(BASIC, tmp_path / "dump")
    name = 'it\'s a "run" $HOME'
    result = make("extract", "RUN=dump", "LAKE=lake", f"RUN_NAME={name}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"Run `{name}`: 3 new,")
    assert result.stdout.rstrip().endswith(f"-> {tmp_path / 'lake'}")
    code, out, _ = run("query", str(tmp_path / "lake"), "SELECT DISTINCT run FROM samples")
    assert out.splitlines()[2] == name


def test_make_example_regenerates_only_when_the_generator_changes(tmp_path):
    example = tmp_path / "example"
    example.mkdir()
    stamp = example / ".generated"
    stamp.touch()
    target = ("-q", f"EXAMPLE_DUMP={example}", str(stamp))
    assert make(*target).returncode == 0  # up to date: `make extract` keeps the files as they are
    os.utime(stamp, (0, 0))  # older than pipeline/tokenlake/generator/synth.py: regenerate
    assert make(*target).returncode == 1


# -- 10. Extraction needs no torch -----------------------------------------------------------

_NO_TORCH = textwrap.dedent(
    """
    import sys
    sys.modules["torch"] = None  # `import torch` now raises ImportError
    from tokenlake.cli import main
    sys.exit(main(sys.argv[1:]))
    """
)


def _without_torch(*args: str, blocker: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if blocker is not None:  # every process, worker processes too, fails to import torch
        blocker.mkdir()
        (blocker / "torch.py").write_text("raise ImportError('torch is not installed here')\n")
        env["PYTHONPATH"] = os.pathsep.join([str(blocker), str(ROOT)])
    return subprocess.run(
        [sys.executable, "-c", _NO_TORCH, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
def test_extraction_runs_without_torch(tmp_path):
    result = _without_torch(
        "extract",
        str(BASIC),
        "--lake",
        str(tmp_path / "lake"),
        "--workers",
        "2",
        "--silent",
        blocker=tmp_path / "no-torch",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(
        "Run `basic`: 3 new, 0 updated, 0 unchanged, 0 removed, 0 skipped steps; wrote 20"
        " samples and 206 tokens"
    )
    assert "torch" not in result.stderr


def test_the_generator_without_torch_names_the_extra(tmp_path):
    result = _without_torch("generate", str(tmp_path / "out"))
    assert (result.returncode, result.stdout, result.stderr) == (
        1,
        "",
        "Error: Writing a synthetic dump needs `torch`, which is not installed: run"
        " `pip install 'tokenlake[synth]'` (`make setup` installs it).\n",
    )


@pytest.mark.slow
def test_a_stop_names_the_steps_still_in_flight(tmp_path):
    from tokenlake.orchestrate.scheduler import run_steps
    from tokenlake.read import dump

    todo = [(files, "new") for files in dump.discover(BASIC).steps]
    told: list[list[str]] = []
    outcomes = run_steps(todo, store_of(tmp_path), "basic", 3, told.append)
    first = next(outcomes)  # all three were handed out; one is back
    outcomes.close()  # what Ctrl-C or --strict does to the generator
    assert len(told) == 1
    assert sorted([first.label, *told[0]]) == ["0", "1", "eval_0"]


@pytest.mark.slow
def test_make_extract_takes_its_options_as_variables_and_says_so(tmp_path):
    shutil.copytree(BASIC, tmp_path / "a")
    shutil.copytree(BASIC, tmp_path / "b")
    assert make("extract", "RUN=a", "LAKE=lake", "RUN_NAME=r", cwd=tmp_path).returncode == 0
    refused = make("extract", "RUN=b", "LAKE=lake", "RUN_NAME=r", cwd=tmp_path)
    assert refused.returncode == 2  # make's own code for a failed recipe
    assert refused.stderr.splitlines()[:2] == [
        f"Error: Run `r` in the lake was extracted from `{tmp_path / 'a'}`, not from"
        f" `{tmp_path / 'b'}`; give --replace to replace it, or another --run-name.",
        "make extract takes these options as variables: RUN_NAME=name (--run-name),"
        " STEPS=0-9 (--steps), REPLACE=1 (--replace)",
    ]
    done = make("extract", "RUN=b", "LAKE=lake", "RUN_NAME=r", "REPLACE=1", "STEPS=0", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Run `r`: 2 new, 0 updated, 0 unchanged, 0 removed")
