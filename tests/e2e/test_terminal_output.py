"""What a terminal shows: cells cut to a readable width, warnings as the CLI's own lines,
counts in words, the generator's presets listed."""

from __future__ import annotations

import pyarrow as pa
from click.testing import CliRunner

from tokenlake.cli import main
from tokenlake.generator.synth_spec import PRESETS
from tokenlake.serve.query import MAX_CELL_CHARS, format_table


def test_long_cells_are_cut_for_a_terminal_and_kept_whole_elsewhere() -> None:
    long = "x" * 100 + "\nsecond line"
    table = pa.table({"id": [1], "text": [long]})
    assert format_table(table, "table").splitlines() == [
        "id  text",
        "--  " + "-" * MAX_CELL_CHARS,
        " 1  " + "x" * (MAX_CELL_CHARS - 1) + "…",
        "(1 row)",
        "(cells cut at 40 characters: `--format csv`, `json` or `parquet` keep them whole)",
    ]
    assert format_table(table, "json") == '{"id": 1, "text": "' + "x" * 100 + '\\nsecond line"}\n'


def test_short_cells_are_shown_whole_and_newlines_escaped() -> None:
    table = pa.table({"text": ["a\nb"], "n": [1234]})
    assert format_table(table, "table").splitlines() == [
        "text       n",
        "------  ----",
        "a\\x0ab  1234",
        "(1 row)",
    ]


def test_generate_help_lists_every_preset() -> None:
    result = CliRunner().invoke(main, ["generate", "--help"])
    text = " ".join(result.stdout.split())
    listed = text.split("one of: ", 1)[1].split(" (docs/generator.md", 1)[0]
    assert listed.replace("- ", "-").split(", ") == sorted(PRESETS)
