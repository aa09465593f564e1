"""Free-form dump values (metadata, labels, chat prompts, dict rewards) as JSON text.

A pickle can make a value reference itself, nest 300 000 levels deep, or reuse one object so
often that a 150-byte file expands to a billion entries ("billion laughs"). `json.dumps` would
fail on the first, hit the recursion limit on the second and never finish the third, so values
are first copied into plain JSON data under fixed limits, and a value beyond them is an error
for its sample's step (a `SampleValueError` naming the field).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from tokenlake.errors import SampleValueError

MAX_DEPTH = 100  # nesting levels
MAX_VALUES = 1_000_000  # containers and scalars, counting every reuse of a shared object
MAX_CHARS = 64 * 2**20  # characters of all strings, counting every reuse
# str() refuses integers over 4 300 digits (sys.int_max_str_digits); 14 000 bits is ~4 200.
_MAX_INT_BITS = 14_000


def to_json(value: Any, field: str = "value") -> str:
    """JSON text of a dump value; numpy values and stand-in objects stay readable.

    Examples:
        >>> to_json({"a": [1, 2.5], "b": "é", (1, 2): np.int32(3)})
        '{"a": [1, 2.5], "b": "é", "[1, 2]": 3}'
        >>> loop = []
        >>> loop.append(loop)
        >>> to_json({"x": loop}, "metadata")
        Traceback (most recent call last):
        ...
        tokenlake.errors.SampleValueError: `metadata` contains itself (a reference cycle)
    """
    plain = _Copier(field).copy(value, 0)
    return clean_text(json.dumps(plain, ensure_ascii=False, allow_nan=True))


def clean_text(text: str) -> str:
    """The text with lone surrogates (which UTF-8, so Arrow and Parquet, cannot hold) replaced
    by U+FFFD, as a UTF-8 decoder does with invalid bytes; split surrogate pairs are joined.

    Examples:
        >>> clean_text("ok \\udc80 \\ud83d\\ude00") == "ok \\ufffd \\U0001f600"
        True
    """
    if text.isascii():  # O(1) in CPython: the common case costs nothing
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


class _Copier:
    """Copies a value into plain JSON data (dict with str keys, list, str, int, float, bool,
    None), counting what it copies against the limits."""

    def __init__(self, field: str) -> None:
        self.field = field
        self.values = 0
        self.chars = 0
        self.open: set[int] = set()  # ids of the containers being copied (the current path)

    def fail(self, problem: str) -> SampleValueError:
        return SampleValueError(self.field, problem)

    def copy(self, value: Any, depth: int) -> Any:
        self.values += 1
        if self.values > MAX_VALUES:
            raise self.fail(f"expands to more than {MAX_VALUES:,} values (shared references?)")
        if value is None or isinstance(value, bool | float):
            return value
        if isinstance(value, int):
            if value.bit_length() > _MAX_INT_BITS:
                raise self.fail(f"holds an integer of {value.bit_length()} bits, too long to write")
            return value
        if isinstance(value, str):
            self.chars += len(value)
            if self.chars > MAX_CHARS:
                raise self.fail(
                    f"expands to more than {MAX_CHARS:,} characters (shared references?)"
                )
            return value
        if isinstance(value, np.generic):
            return self.copy(value.item(), depth)
        if isinstance(value, bytes | bytearray | complex):
            return self.copy(repr(value), depth)
        return self.container(value, depth)

    def container(self, value: Any, depth: int) -> Any:
        if depth >= MAX_DEPTH:
            raise self.fail(f"is nested more than {MAX_DEPTH} levels deep")
        if id(value) in self.open:
            raise self.fail("contains itself (a reference cycle)")
        self.open.add(id(value))
        try:
            return self.members(value, depth + 1)
        finally:
            self.open.discard(id(value))

    def members(self, value: Any, depth: int) -> Any:
        if isinstance(value, dict):
            return {self.key(k, depth): self.copy(v, depth) for k, v in value.items()}
        if isinstance(value, list | tuple | set | frozenset):
            return [self.copy(v, depth) for v in value]
        if isinstance(value, np.ndarray):
            if value.size > MAX_VALUES - self.values:  # before `tolist` builds it
                raise self.fail(
                    f"holds an array of {value.size:,} values, more than {MAX_VALUES:,}"
                )
            return self.copy(value.tolist(), depth - 1)
        if hasattr(value, "__dict__"):  # the stand-ins of miles dataclasses (AdapterRef, ...)
            return self.copy({"__class__": type(value).__name__, **vars(value)}, depth - 1)
        return f"<{type(value).__name__}>"

    def key(self, key: Any, depth: int) -> str:
        if isinstance(key, str):
            return self.copy(key, depth)
        if key is None or isinstance(key, bool | int | float):  # as json.dumps writes them
            return json.dumps(self.copy(key, depth))
        return json.dumps(self.copy(key, depth), ensure_ascii=False, allow_nan=True)
