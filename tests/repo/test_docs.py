"""Documentation stays complete: every command, option, column and view is documented."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from tokenlake import schema
from tokenlake.cli import main
from tokenlake.serve.sql_views import iter_view_files

DOCS = Path(__file__).resolve().parents[2] / "docs"
README = DOCS.parent / "README.md"


def _commands() -> list[click.Command]:
    return list(main.commands.values())


def test_the_commands_checked_below_are_the_clis():
    """The two tests below are parametrized by `_commands()`: with none they would pass."""
    names = {command.name for command in _commands()}
    assert {"extract", "verify", "views", "audit", "query", "report", "serve"} <= names


@pytest.mark.parametrize("command", _commands(), ids=lambda c: c.name)
def test_every_command_has_help_with_an_example(command):
    assert command.help, f"`{command.name}` has no docstring"
    assert "Example:" in command.help


@pytest.mark.parametrize("command", _commands(), ids=lambda c: c.name)
def test_every_command_and_option_is_in_docs_cli(command):
    text = (DOCS / "cli.md").read_text()
    assert f"`tokenlake {command.name}" in text
    for param in command.params:
        if isinstance(param, click.Option) and param.name != "help":
            assert any(opt in text for opt in param.opts), f"{command.name} {param.opts}"


@pytest.mark.parametrize("table", schema.TABLES)
def test_every_column_is_in_docs_columns(table):
    text = (DOCS / "columns.md").read_text()
    names = [*schema.TABLE_PARTITIONS[table], *schema.TABLE_SCHEMAS[table].names]
    assert names
    for name in names:
        assert re.search(rf"`{name}`", text), f"{table}.{name} is not documented"


def test_readme_links_resolve():
    targets = re.findall(r"\]\((docs/[^)]+)\)", README.read_text())
    assert len(targets) >= 10, targets  # README links every page of docs/index.md's groups
    for target in targets:
        assert (README.parent / target).is_file(), target


def test_every_view_is_documented():
    text = (DOCS / "views.md").read_text() + (DOCS / "drift.md").read_text()
    views = list(iter_view_files())
    assert len(views) > 20, views
    for path in views:
        assert f"`{path.stem}`" in text, f"view {path.stem} is not in docs/views.md or drift.md"


def test_readme_layout_table_names_every_module():
    """README's layout table names each module of the package once: a reader finds the owner."""
    text = (DOCS.parent / "README.md").read_text(encoding="utf-8")
    table = text.split("## Layout of the code", 1)[1].split("\n## ", 1)[0]
    package = DOCS.parent / "pipeline" / "tokenlake"
    modules = sorted(
        p for p in package.rglob("*.py") if p.name != "__init__.py" or p.parent.name == "store"
    )
    assert len(modules) > 60
    missing = [str(p.relative_to(package)) for p in modules if f"`{p.name}`" not in table]
    assert missing == []
