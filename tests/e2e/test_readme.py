"""The README's worked example prints exactly what the README shows."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from tokenlake.cli import main
from tokenlake.generator import synth

README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.mark.slow
def test_worked_example_output_is_true(tmp_path):
    text = README.read_text()
    block = re.search(r"```\n\$ make extract\n(.*?)```", text, re.DOTALL).group(1)
    summary = re.search(r"^Run `example`.*$", block, re.MULTILINE).group(0)
    query_line = re.search(r'^\$ \.venv/bin/tokenlake query lake "(.*)"$', block, re.MULTILINE)
    expected_table = block[query_line.end() + 1 :]

    dump = tmp_path / "example-dump"
    synth.write_dump(dump, synth.PRESETS["example"])
    runner = CliRunner()
    result = runner.invoke(
        main,
        [
            "extract",
            str(dump),
            "--lake",
            str(tmp_path / "lake"),
            "--run-name",
            "example",
            "--silent",
            "--workers",
            "1",
        ],
    )
    assert result.exit_code == 0, result.output
    pattern = re.escape(summary.split(" in ")[0]) + r" in \d+\.\d s -> .*\n"
    assert re.fullmatch(pattern, result.stdout)

    result = runner.invoke(main, ["query", str(tmp_path / "lake"), query_line.group(1)])
    assert result.stdout == expected_table
