"""What the CLI reads and prints, checked: option values, step selections, SQL text, and
every printed line made safe for a terminal.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from tokenlake.errors import UsageError

INT64_MAX = 2**63 - 1
# One printed line is at most this long: a dump can carry megabytes in a name or a value.
MAX_LINE = 2000
MAX_LINES = 40
# Control characters, and surrogates (bytes of a non-UTF-8 file name, which no terminal
# encoding can print): both shown as escapes.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def _escape(char: str) -> str:
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # os.fsdecode's surrogateescape: the original byte
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_controls(text: str) -> str:
    r"""Control characters (newlines too) and surrogates as `\x..` escapes: the one guard of
    text a terminal must not interpret, for `safe_text` and each cell of `query`'s table.

    Examples:
        >>> escape_controls("a\x1b]0;pwned\x07\rb\n")
        'a\\x1b]0;pwned\\x07\\x0db\\x0a'
    """
    return _CONTROL.sub(lambda m: _escape(m.group()), text)


def safe_text(text: str, *, one_line: bool = False, limit: int = MAX_LINE) -> str:
    """Text fit for a terminal: control characters as `\\x..`, each line cut to `limit`.

    The CLI's last line of defence: whatever a message quotes from a dump (names, values),
    it can neither move the cursor nor print megabytes. With `one_line`, a newline is escaped
    too (a value cannot forge a line of its own); otherwise at most `MAX_LINES` lines remain.

    Examples:
        >>> safe_text("a\\rb\\x1b[2Kc")
        'a\\\\x0db\\\\x1b[2Kc'
        >>> safe_text("x" * 30, limit=10)
        'xxxxxxxxxx... (20 more characters)'
        >>> safe_text("a\\nb", one_line=True)
        'a\\\\x0ab'
    """
    lines = [text.replace("\n", "\\x0a")] if one_line else text.split("\n")
    if len(lines) > MAX_LINES:
        lines = [*lines[:MAX_LINES], f"... ({len(lines) - MAX_LINES:,} more lines)"]
    out = []
    for line in lines:
        line = escape_controls(line)  # lines are split at newlines already
        if len(line) > limit:
            line = f"{line[:limit]}... ({len(line) - limit:,} more characters)"
        out.append(line)
    return "\n".join(out)


def say(text: str, *, err: bool = False, one_line: bool = False) -> None:
    """Print a message (summary, warning, error) through `safe_text`."""
    click.echo(safe_text(text, one_line=one_line), err=err)


@dataclass(frozen=True)
class StepSelection:
    """A `--steps` selection: inclusive ranges, tested lazily (`0-10000000000` costs nothing).

    Examples:
        >>> selection = parse_steps("0-2,7")
        >>> [s for s in range(10) if s in selection]
        [0, 1, 2, 7]
    """

    text: str
    ranges: tuple[tuple[int, int], ...]

    def __str__(self) -> str:
        return self.text

    def __contains__(self, step: object) -> bool:
        return isinstance(step, int) and any(lo <= step <= hi for lo, hi in self.ranges)


def parse_steps(text: str | None) -> StepSelection | None:
    """Parse `0-9,12` into a lazy step selection; malformed or reversed ranges are errors."""
    if text is None:
        return None
    ranges = []
    for part in text.split(","):
        low, sep, high = part.strip().partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            raise UsageError(f"--steps `{text}` is not a list of steps or ranges like `0-9,12`.")
        lo, hi = int(low), int(high) if sep else int(low)
        if max(lo, hi) > INT64_MAX:
            raise UsageError(f"--steps `{text}`: a step id is at most {INT64_MAX}.")
        if lo > hi:
            raise UsageError(
                f"--steps `{text}`: range `{part.strip()}` is reversed; write `{hi}-{lo}`."
            )
        ranges.append((lo, hi))
    return StepSelection(text, tuple(ranges))


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


MAX_WORKERS = 256
MAX_SECONDS = 86400.0


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
    for pair in pairs:
        name, sep, value = pair.partition("=")
        try:
            settings[name.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep:
            raise UsageError(f"--set `{pair}` is not `name=number`, e.g. `--set alarm_k3_kl=0.01`.")
        if not math.isfinite(settings[name.strip()]):
            raise UsageError(f"--set `{pair}`: the value must be a finite number.")
    return settings


def plural(n: int, word: str) -> str:
    """`1 step`, `2 steps`.

    Examples:
        >>> plural(1, "step"), plural(0, "problem")
        ('1 step', '0 problems')
    """
    return f"{n:,} {word}" if n == 1 else f"{n:,} {word}s"


class LakeLocationType(click.ParamType):
    """A lake: a directory (a Path) or an object-store URL such as `s3://bucket/lake`, kept as
    text (a Path would fold its `//`). `file://` URLs are directories."""

    name = "lake"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from tokenlake.load.lake import is_url, local_path

        if isinstance(value, Path) or not is_url(str(value)):
            return local_path(str(value))
        return str(value)


LAKE = LakeLocationType()


class DumpLocationType(LakeLocationType):
    """A dump: a directory, or an object-store URL (`s3://bucket/dump`) kept as text."""

    name = "dump"


DUMP = DumpLocationType()
