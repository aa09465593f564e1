"""The `tokenlake` commands the docs show, run as written, in a shell, against a test lake.

Every command of docs/*.md that reads or changes a lake (in a code block, `$ tokenlake ...`
or `tokenlake ...`, or inline, `` `tokenlake query LAKE "$(cat sql/...)"` ``) and names
nothing the reader must fill in (`SQL`, `RUN`, `...`) runs in a folder holding the lake as
`lake/` and a copy of the repository's `sql/`, `LAKE` read as `lake`, an optional `[--run
qwen]` both left out and given. Each must exit 0 (`audit`: 0 or 1, its verdict), and where a
code block shows the output, print exactly that.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import store_of
from tests.fixture_paths import REAL_DUMPS
from tokenlake.orchestrate.extract import ExtractOptions, extract_run

pytestmark = pytest.mark.slow  # extracts a real dump four times, runs the CLI in a shell

REPO = Path(__file__).resolve().parents[2]
DOCS = sorted((REPO / "docs").glob("*.md"))
LAKE_COMMANDS = ("query", "audit", "verify", "views", "report", "tag", "drop")
# The run names the docs' commands use, each a run of the test lake.
RUN_NAMES = ("qwen", "qwen-fp8", "qwen-fp16", "qwen-bf16")
# The commands the docs show refused, with the line they print.
REFUSED = {
    "tokenlake drop lake ../../x/important": (
        "Error: Run name `../../x/important` cannot be a partition directory: it must be"
        " non-empty, not start with `.`, and contain no `/`, `\\`, `=`, `%` or control"
        " characters. Choose another with --run-name.\n"
    ),
}
_NAMES = "|".join(LAKE_COMMANDS)
_INLINE = re.compile(rf"`(tokenlake (?:{_NAMES}) [^`]*)`")
_PROMPTED = re.compile(rf"^(?:\$ )?(tokenlake (?:{_NAMES}) .*)$")
_OPTIONAL = re.compile(r"\s*\[([^\]]*)\]")
_PLACEHOLDER = re.compile(r"[A-Z][A-Z_]*(=[A-Z_]+)?|.*(\.\.\.|…).*")
_READ_FILE = re.compile(r"\$\(cat ([^)]+)\)|< *(\S+)")


@dataclass(frozen=True)
class Documented:
    where: str  # docs/cli.md:188
    command: str
    output: str | None  # what the docs show it print, when they do


def documented_commands() -> list[Documented]:
    found: list[Documented] = []
    for page in DOCS:
        lines = page.read_text(encoding="utf-8").splitlines()
        in_block = False
        for number, line in enumerate(lines, 1):
            if line.startswith("```"):
                in_block = not in_block
                continue
            where = f"docs/{page.name}:{number}"
            if in_block:
                match = _PROMPTED.match(line)
                if match:
                    output = _shown_output(lines, number) if line.startswith("$ ") else None
                    found.append(Documented(where, match.group(1), output))
            else:
                found += [Documented(where, m.group(1), None) for m in _INLINE.finditer(line)]
    return found


def _shown_output(lines: list[str], number: int) -> str | None:
    """The lines after a `$ ` command in its code block, up to the next command or the end."""
    shown = []
    for line in lines[number:]:
        if line.startswith(("$ ", "```")):
            break
        shown.append(line)
    return "\n".join(shown) + "\n" if shown else None


def runnable(command: str, folder: Path) -> list[str]:
    """The shell commands `command` stands for (none: it names something to fill in)."""
    command = re.sub(r"\s+#.*$", "", command).replace(" LAKE", " lake")
    optional = _OPTIONAL.search(command)
    variants = [command]
    if optional:
        variants = [_OPTIONAL.sub("", command), _OPTIONAL.sub(r" \1", command)]
    return [v for v in variants if _complete(v, folder)]


def _complete(command: str, folder: Path) -> bool:
    words = shlex.split(command)
    if words[2] != "lake" or any(_PLACEHOLDER.fullmatch(word) for word in words):
        return False  # another lake (`s3://...`), or words to fill in
    files = [a or b for a, b in _READ_FILE.findall(command)]
    return all((folder / name).is_file() for name in files)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder as a user has it: the lake as `lake/`, the repository's `sql/` beside it."""
    root = tmp_path_factory.mktemp("documented")
    for run in RUN_NAMES:
        options = ExtractOptions(run_name=run, workers=1)
        assert extract_run(REAL_DUMPS / "basic", store_of(root / "lake"), options).failed == []
    shutil.copytree(REPO / "sql", root / "sql")
    return root


def in_shell(command: str, folder: Path) -> subprocess.CompletedProcess[str]:
    """`command` as a user's shell runs it, `tokenlake` being this checkout's."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return subprocess.run(
        ["bash", "-c", command],
        cwd=folder,
        env={**os.environ, "PATH": path},
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_docs_show_the_one_audit_command() -> None:
    commands = [d.command for d in documented_commands()]
    assert 'tokenlake query LAKE "$(cat sql/audits/large_lp_diff.sql)"' in commands


def in_order(folder: Path) -> list[tuple[Documented, str]]:
    """Each runnable command once, in the docs' order, `drop`s last (they remove runs the
    others name)."""
    seen: dict[str, Documented] = {}
    for doc in documented_commands():
        for command in runnable(doc.command, folder):
            seen.setdefault(command, doc)
    return sorted(((d, c) for c, d in seen.items()), key=lambda dc: " drop " in dc[1])


def test_every_documented_lake_command_runs_as_written(folder: Path) -> None:
    ran: list[str] = []
    for doc, command in in_order(folder):
        done = in_shell(command, folder)
        where = f"{doc.where}: {command}\n{done.stderr}"
        if command in REFUSED:
            assert (done.returncode, done.stderr) == (1, REFUSED[command]), where
        else:
            verdicts = (0, 1) if command.startswith("tokenlake audit") else (0,)
            assert done.returncode in verdicts and "Traceback" not in done.stderr, where
        if doc.output is not None:
            assert done.stdout == doc.output, where
        ran.append(command)
    assert 'tokenlake query lake "$(cat sql/audits/large_lp_diff.sql)"' in ran
    assert len(ran) == 14, ran
