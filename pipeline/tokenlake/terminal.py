"""Text fit for a terminal: whatever a message quotes from a dump or a lake (names, values) is
escaped and cut here, so it can neither move the cursor nor print megabytes."""

from __future__ import annotations

import re

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


def plural(n: int, word: str) -> str:
    """`1 step`, `2 steps`.

    Examples:
        >>> plural(1, "step"), plural(0, "problem")
        ('1 step', '0 problems')
    """
    return f"{n:,} {word}" if n == 1 else f"{n:,} {word}s"
