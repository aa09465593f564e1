"""What the CLI reads and prints, checked: option values, step selections, SQL text, and
every printed line made safe for a terminal.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from tokenlake.errors import UsageError
from tokenlake.terminal import safe_text


def say(text: str, *, err: bool = False, one_line: bool = False) -> None:
    """Print a message (summary, warning, error) through `safe_text`."""
    click.echo(safe_text(text, one_line=one_line), err=err)


def bounded(low: float, high: float, *, low_open: bool = False) -> Callable[..., Any]:
    """A click callback: the option's value must be finite and within [low, high].

    Click parses the number; this turns NaN, infinities and out-of-range values into one line.
    """

    def check(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
        if value is None:
            return value
        below = value <= low if low_open else value < low
        if not math.isfinite(value) or below or value > high:
            bound = f"more than {low:g}" if low_open else f"at least {low:g}"
            raise UsageError(f"--{param.name} {value}: give a number {bound} and at most {high:g}.")
        return value

    return check


_SQL_COMMENT = re.compile(r"--[^\n]*|/\*.*?\*/", re.DOTALL)


def read_sql(sql: str | None, file: Path | None) -> str:
    """The query text: the SQL argument, `-` for stdin, or `--file`; never empty.

    Examples:
        >>> read_sql("SELECT 1", None)
        'SELECT 1'
    """
    if (sql is None) == (file is None):
        raise UsageError(
            "Give the SQL as an argument, `-` to read it from stdin, or --file Q.sql (one of them)."
        )
    if file is not None:
        try:
            sql = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            raise UsageError(f"Cannot read --file `{file}`: {reason}.") from exc
    elif sql == "-":
        sql = sys.stdin.read()
    assert sql is not None
    if not _SQL_COMMENT.sub("", sql).strip(" \t\r\n;"):
        raise UsageError("The SQL is empty; give a query, e.g. `SELECT * FROM step_stats`.")
    return sql


def parse_settings(pairs: tuple[str, ...]) -> dict[str, float]:
    """`--set name=value` pairs as drift_settings overrides."""
    settings: dict[str, float] = {}
    given: dict[str, str] = {}  # name -> the value as typed
    for pair in pairs:
        name, sep, value = pair.partition("=")
        name = name.strip()
        if name in given:  # the last would silently win, as if the first were not typed
            raise UsageError(
                f"--set `{name}` is given twice, as `{given[name].strip()}` and `{value.strip()}`."
            )
        try:
            settings[name] = float(value)
        except ValueError:
            sep = ""
        if not sep:
            raise UsageError(f"--set `{pair}` is not `name=number`, e.g. `--set alarm_k3_kl=0.01`.")
        if not math.isfinite(settings[name]):
            raise UsageError(f"--set `{pair}`: the value must be a finite number.")
        given[name] = value
    return settings


class LakeLocationType(click.ParamType):
    """A lake: a directory (a Path) or an object-store URL such as `s3://bucket/lake`, kept as
    text (a Path would fold its `//`). `file://` URLs are directories."""

    name = "lake"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from tokenlake.layout import is_url, local_path

        if isinstance(value, str) and not value.strip():
            # Path("") is the current folder: an unset `$LAKE` would read or write there.
            self.fail(f"the {self.name}'s location is empty; give its folder (`.` for this one).")
        if isinstance(value, Path) or not is_url(str(value)):
            return local_path(str(value))
        return str(value)


LAKE = LakeLocationType()


class DumpLocationType(LakeLocationType):
    """A dump: a directory, or an object-store URL (`s3://bucket/dump`) kept as text."""

    name = "dump"


DUMP = DumpLocationType()


# What an option looks like on a command line: `-o`, `-oFILE`, `--format`, `--format=csv`.
# Anything else that starts with `-` (`-- a comment\nSELECT ...`, `- x`) is free text.
_OPTION_SHAPE = re.compile(r"-[A-Za-z0-9]\S*|--[A-Za-z0-9][-\w]*(=.*)?", re.DOTALL)


def is_free_text(token: str) -> bool:
    """Whether a command-line token that starts with `-` cannot be an option: an argument's
    text, such as SQL beginning with a `--` comment.

    Examples:
        >>> is_free_text("-- Steps where drift is large\\nSELECT 1"), is_free_text("--- x")
        (True, True)
        >>> is_free_text("--format"), is_free_text("--set=a=1"), is_free_text("-o"), is_free_text("-")
        (False, False, False, False)
    """
    return token.startswith("-") and token != "-" and _OPTION_SHAPE.fullmatch(token) is None


class FreeTextArgs(click.Command):
    """A command whose arguments may begin with `-` when they cannot be an option.

    Click reads every token that starts with `-` as an option, so `tokenlake query LAKE "$(cat
    q.sql)"` with a `-- comment` first line failed as "No such option". Here a token of free
    text (`is_free_text`) goes to the arguments, in its place among them; an option-shaped
    token the command lacks (`--fromat`) still fails with click's line and its suggestion,
    and the values an option takes stay with it (`--set x=-1`, `--worst -1`).
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, self._free_text_as_arguments(ctx, args))

    def _free_text_as_arguments(self, ctx: click.Context, args: list[str]) -> list[str]:
        """`args` as options first, then `--`, then the arguments in their order."""
        if not any(is_free_text(token) for token in args):
            return args  # click's own parse, untouched
        takes = self._values_taken(ctx)
        options: list[str] = []
        arguments: list[str] = []
        rest = list(args)
        while rest:
            token = rest.pop(0)
            if token == "--":
                arguments += rest
                break
            if not _is_option(token, takes):
                arguments.append(token)
                continue
            long = token.startswith("--")
            name, attached = (
                (token.split("=", 1)[0], "=" in token) if long else (token[:2], len(token) > 2)
            )
            taken = 0 if attached else takes.get(name, 0)
            options += [token, *rest[:taken]]
            del rest[:taken]
        return [*options, "--", *arguments]

    def _values_taken(self, ctx: click.Context) -> dict[str, int]:
        """How many tokens each option name of the command takes after it."""
        takes: dict[str, int] = {}
        for param in self.get_params(ctx):
            if isinstance(param, click.Option):
                count = 0 if param.is_flag or param.count else param.nargs
                takes.update(dict.fromkeys(param.opts, count))
                takes.update(dict.fromkeys(param.secondary_opts, 0))
        return takes


def _is_option(token: str, takes: dict[str, int]) -> bool:
    """Whether click should read `token` as an option: a known short one with its value
    attached (`-oout file.csv`), or anything of an option's shape (unknown ones fail there)."""
    if not token.startswith("-") or token == "-":
        return False
    return (not token.startswith("--") and token[:2] in takes) or not is_free_text(token)
