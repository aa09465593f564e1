"""Lists of numbers in a JSON line, decoded straight into numpy arrays.

A NeMo-RL or prime-rl line holds each sample's per-token lists (`token_ids`, log-probs, masks)
as JSON text; `json` makes one Python object of each number (about 50 MB/s), which a reader
then turns into an array. Here the line's shape scan (`bounded.json_layout`, the one that
enforces the depth and width caps) also finds its flat lists; each long one whose text is
exactly `n1,n2,...` (JSON numbers, or only `true`/`false`, or only `null`; `, ` as `json.dumps`
separates them) is decoded as a whole: its text checked against JSON's grammar (numbers by
byte counts and per-entry array steps for what `json.dumps` writes; words by comparing with
the text the list must then be; else by a regex), numbers parsed by pyarrow's correctly
rounded cast, as `float()` and `int()` would, once their value is taken. The line is then
parsed by `json` with a placeholder (`Infinity`) for each decoded list; each placeholder where
the reader asked for an array (`wanted`) becomes the array `np.asarray` makes of the list
(`ListArray`: int64, float64 or bool), or for a list of `null`s the list itself; one at a
top-level key the reader never reads (`unread`) is dropped, its numbers never parsed; any
other becomes the very list `json` makes of its text. A list of another shape (mixed kinds,
an integer beyond 18 digits, other spacing) is left in the text for `json`.

Anything unexpected (a placeholder lost to a duplicate key, a `NaN` or `Infinity` of the
line's own, text `json` refuses, a cast refusing an entry the grammar allows, a line that
does not start with `{`) and the line is parsed
the exact way (`bounded.json_object_line`), so the result, or the error, is always what
`json` gives (tests/read/test_jsonarrays.py compares the two).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from tokenlake import bounded
from tokenlake.steptypes import ListArray

# Shorter lists are left to `json`: their decoding's fixed cost (a few dozen array calls)
# would outweigh it; a line shorter than this holds few worth it.
MIN_LIST_BYTES = 256
MIN_LINE_BYTES = 4096
# A longer list is left to `json`: decoding holds up to ~23 x its text (measured for one-digit
# integers: 18.5 x in numpy, 4 x in pyarrow; floats ~7.5 x), so at most ~92 MiB beside the line.
MAX_LIST_BYTES = 4 << 20
# An integer of at most 18 digits is within int64 (and a float64 converts it exactly as
# Python does); a longer one leaves its list to `json`.
_MAX_INT_DIGITS = 18
_PLACEHOLDER = b"Infinity"  # a JSON value `json` hands to `parse_constant`
Wanted = tuple[tuple[str | int, ...], ...]  # where a reader takes arrays: keys and indexes


class Numbers(NamedTuple):
    """A list's text of numbers checked against JSON's grammar, parsed only when its value
    is taken (`_value`): how (`int64` or `float64`), and where its commas are."""

    text: bytes
    kind: str
    commas: np.ndarray | None


class FlatList(NamedTuple):
    """One decoded list: its `[` and `]` in the line, and its value (numbers: once taken)."""

    start: int
    end: int
    value: ListArray | list[None] | Numbers


class _Doubt(Exception):
    """The fast read might differ from `json`'s: the line is parsed the exact way."""


def object_line(
    path: Path, raw: bytes, label: str, max_depth: int, wanted: Wanted, unread: tuple[str, ...] = ()
) -> dict[str, Any]:
    """`bounded.json_object_line(path, raw, label, max_depth)`, with the lists at `wanted`
    (`("token_ids",)`: `record["token_ids"]`; `("token_ids", 0)`: its first entry) possibly
    decoded as `ListArray`s (a list of `null`s as that list), and the top-level keys in
    `unread` (values the reader never reads) left out of the record: their text is checked
    as JSON all the same, but a list of numbers there is never parsed into values.

    Raises:
        DumpFormatError: As `bounded.json_object_line`, with its text.
    """
    record: dict[str, Any] | None
    if len(raw) < MIN_LINE_BYTES or not raw.startswith(b"{") or b"\0" in raw[:4]:
        record = bounded.json_object_line(path, raw, label, max_depth)
    else:
        flat: list[tuple[int, int]] = []
        shape = bounded.json_layout(raw, flat)
        found: list[FlatList] = []
        if shape.depth <= max_depth and not bounded.too_wide(shape, len(raw)):
            found = [item for start, end in flat if (item := _decoded(raw, start, end))]
        record = _with_arrays(raw, found, wanted, unread) if found else None
        if record is None:  # the exact parse, or its refusal of a line too deep or too wide
            record = bounded.json_object_line(path, raw, label, max_depth, shape)
    for key in unread:
        record.pop(key, None)
    return record


class _Holes:
    """`parse_constant` for the skeleton: numbers its calls, so the n-th placeholder is
    the n-th decoded list (`json` parses in text order)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, name: str) -> _Hole:
        self.calls += 1
        return _Hole(self.calls - 1)


class _Hole:
    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


def _with_arrays(
    raw: bytes, decoded: list[FlatList], wanted: Wanted, unread: tuple[str, ...]
) -> dict[str, Any] | None:
    """The line parsed with the decoded lists in place (those at `unread` dropped), or None
    when that might differ from `json`'s parse of it (then the caller parses it so)."""
    pieces, position = [], 0
    for start, end, *_ in decoded:
        pieces.append(raw[position:start])
        position = end + 1
    pieces.append(raw[position:])
    holes = _Holes()
    try:  # as json.loads(raw) decodes a line that starts with `{`
        record = json.loads(
            _PLACEHOLDER.join(pieces).decode("utf-8", "surrogatepass"), parse_constant=holes
        )
    except (ValueError, RecursionError):
        return None
    if not isinstance(record, dict) or holes.calls != len(decoded):
        return None
    try:
        settled = sum(_settle(record, where, decoded) for where in wanted)
        settled += sum(_drop(record, key) for key in unread)
        if settled < len(decoded):
            settled += _fill(record, decoded, {id(found.value) for found in decoded})
    except _Doubt:
        return None
    return record if settled == len(decoded) else None


def _fill(container: Any, decoded: list[FlatList], placed: set[int]) -> int:
    """Swaps each placeholder left in `container` (one no reader asked for) for the list
    `json` makes of its text; returns how many. The decoded lists (`placed`) and the lists
    filled in hold no placeholder: they are not looked into.

    Raises:
        _Doubt: A list's numbers refused by the parse."""
    keys = container.keys() if isinstance(container, dict) else range(len(container))
    filled = 0
    for key in keys:
        value = container[key]
        if type(value) is _Hole:
            container[key] = _exact_list(decoded[value.index])
            filled += 1
        elif isinstance(value, dict | list) and id(value) not in placed:
            filled += _fill(value, decoded, placed)
    return filled


def _settle(record: dict[str, Any], where: tuple[str | int, ...], decoded: list[FlatList]) -> int:
    """Swaps the placeholder at `where` for its list's value: 1 if there was one, else 0.

    Raises:
        _Doubt: Its numbers refused by the parse."""
    container: Any = record
    for step in where[:-1]:
        container = _entry(container, step)
    last = where[-1]
    if type(_entry(container, last)) is not _Hole:
        return 0
    container[last] = _value(decoded[_entry(container, last).index])
    return 1


def _drop(record: dict[str, Any], key: str) -> int:
    """Drops the placeholder at `record[key]`, its list unparsed: 1 if there was one, else 0."""
    if type(record.get(key)) is not _Hole:
        return 0
    del record[key]
    return 1


def _value(found: FlatList) -> ListArray | list[None]:
    """A decoded list's value, its numbers parsed now if they were not yet.

    Raises:
        _Doubt: pyarrow refused an entry (the line is then parsed by `json`)."""
    if not isinstance(found.value, Numbers):
        return found.value
    values = _cast(*found.value)
    if values is None:
        raise _Doubt
    return values.view(ListArray)


def _entry(container: Any, step: str | int) -> Any:
    if isinstance(step, str):
        return container.get(step) if isinstance(container, dict) else None
    fits = isinstance(container, list) and -len(container) <= step < len(container)
    return container[step] if fits else None


def _decoded(raw: bytes, start: int, end: int) -> FlatList | None:
    """The list `raw[start:end + 1]` (a flat list) as `np.asarray` makes it from `json`'s
    list (a list of `null`s: that list; numbers: checked, to be parsed if taken); None if it
    is not worth it or not of a decoded kind."""
    if not MIN_LIST_BYTES <= end - start <= MAX_LIST_BYTES:
        return None
    text = raw[start + 1 : end]
    # every check of numbers accepts only text starting so, every check of bools only text
    # starting with `t` or `f`, of nulls with `n`
    if text[:1] in b"-0123456789":
        numbers = _numbers(text)
        return None if numbers is None else FlatList(start, end, numbers)
    if text[:1] == b"n":
        nulls = _repeats(text, b"null") or (_words(text, (b"null",)) or _NULLS.fullmatch(text))
        return FlatList(start, end, [None] * (text.count(b",") + 1)) if nulls else None
    if not (
        _repeats(text.replace(b"false", b"true"), b"true")
        or _words(text, (b"true", b"false"))
        or _BOOLS.fullmatch(text)
    ):
        return None
    # only words and separators: `t` and `f` are left, one per entry, in order
    values = np.frombuffer(text.translate(None, b"rueals, "), np.uint8) == ord("t")
    return FlatList(start, end, values.view(ListArray))


def _numbers(text: bytes) -> Numbers | None:
    """A list's text of JSON numbers, to be parsed as an int64 or float64 array as
    `np.asarray` makes `json`'s list; None if it is not one `_cast` takes."""
    fraction = b"." in text
    commas = _plain_commas(text, fraction)  # found once for the check and the cast
    if not fraction and (commas is not None or _INTEGERS.fullmatch(text)):
        return Numbers(text, "int64", commas)
    if (
        (fraction and commas is not None)
        or _FRACTIONS.fullmatch(text)
        or (_NUMBERS.fullmatch(text) and not _minus_zero(text))
    ):
        return Numbers(text, "float64", commas)
    return None


def _exact_list(found: FlatList) -> list[Any]:
    """The list `json` makes of a decoded list's text.

    Raises:
        _Doubt: Its numbers refused by the parse."""
    value = _value(found)
    if isinstance(value, list):
        return value
    text = found.value.text if isinstance(found.value, Numbers) else b""
    if value.dtype.kind == "f" and text.count(b".") != len(value):
        return json.loads(b"[" + text + b"]")  # an entry without `.` may be an integer
    return value.tolist()


def _plain_commas(text: bytes, fraction: bool) -> np.ndarray | None:
    """Where the commas of `text` are if it is entries `-?(0|[1-9][0-9]*)`, each followed by `.[0-9]+` and
    optionally `e[-+][0-9]+` if `fraction` (else at most 18 digits), separated by `,` or each
    by `, `: what the `json` module writes for lists of ints or of floats (but a float without
    a fraction, `1e-05`). Checked by counts of bytes and a few array steps per entry, no step
    per byte: a match of `_INTEGERS` or `_FRACTIONS` costs several times more; else None."""
    others = text.translate(None, b"0123456789")  # a few bytes an entry: counted cheaply
    if others.translate(None, b",- .e+" if fraction else b",- "):
        return None
    codes = np.frombuffer(text, np.uint8)
    commas = np.flatnonzero(codes == ord(","))
    spaces = others.count(b" ")
    if spaces and not (
        spaces == len(commas)
        and commas[-1] + 1 < len(codes)
        and (codes[commas + 1] == ord(" ")).all()
    ):
        return None  # a space only right after each comma
    starts = np.concatenate((np.zeros(1, commas.dtype), commas + (2 if spaces else 1)))
    ends = np.append(commas, len(codes))  # each entry's end (its comma, or the text's)
    if (ends <= starts).any():
        return None  # an empty entry
    negative = codes[starts] == ord("-")
    exponents = _exponents(codes, ends) if fraction and b"e" in others else _NO_EXPONENTS
    if exponents is None:
        return None
    minus_exponents = int((codes[exponents.at + 1] == ord("-")).sum())
    plus_exponents = len(exponents.at) - minus_exponents
    if others.count(b"-") != int(negative.sum()) + minus_exponents or (
        (plus_exponents or b"+" in others) and others.count(b"+") != plus_exponents
    ):
        return None  # a `-` or `+` neither starting its entry nor signing its exponent
    digits = starts + negative  # where each entry's first digit should be
    if (digits >= ends).any():
        return None
    zero = codes[digits] == ord("0")
    if not fraction:
        length = ends - digits
        too_long = (length > _MAX_INT_DIGITS).any() or (zero & (length > 1)).any()
        return None if too_long else commas
    dots = np.flatnonzero(codes == ord("."))
    if len(dots) != len(starts):
        return None
    # the i-th `.` inside the i-th entry, after a digit and before one (and before its `e`)
    mantissa_ends = ends.copy()
    mantissa_ends[exponents.entry] = exponents.at
    within = (dots > digits) & (dots < mantissa_ends - 1)
    return commas if within.all() and not (zero & (dots != digits + 1)).any() else None


class _Exponents(NamedTuple):
    at: np.ndarray  # where each `e` is
    entry: np.ndarray  # the entry it is in


_NO_EXPONENTS = _Exponents(np.zeros(0, np.intp), np.zeros(0, np.intp))


def _exponents(codes: np.ndarray, ends: np.ndarray) -> _Exponents | None:
    """Each `e` of a list's text and its entry, if each is followed by `-` or `+` and a byte
    of its entry, and no entry holds two; else None. (Its sign's count and the digits are
    checked by the caller.)"""
    at = np.flatnonzero(codes == ord("e"))
    entry = np.searchsorted(ends, at)  # the first entry ending after it (it is no comma)
    if len(at) and ((at + 2 >= ends[entry]).any() or (np.diff(entry) == 0).any()):
        return None
    signs = codes[at + 1]
    if not ((signs == ord("-")) | (signs == ord("+"))).all():
        return None
    return _Exponents(at, entry)


def _repeats(text: bytes, word: bytes) -> bool:
    """Whether `text` is `word` separated by `,`, or each by `, ` (compared with that text,
    built: two passes at memory speed). With each `false` replaced by `true` beforehand, it
    tells a list of bools: the built text has a `t` only where a word starts, so each `true`
    put in stands for a whole entry, and each entry was one word."""
    for separator in (b",", b", "):
        count, rest = divmod(len(text) + len(separator), len(word) + len(separator))
        if not rest and count and text == (word + separator) * (count - 1) + word:
            return True
    return False


def _words(text: bytes, words: tuple[bytes, ...]) -> bool:
    """Whether `text` is `words` separated by `,` or each by `, ` (`true` and `false`, or
    `null`), by counts: every byte is in a counted word or a separator, and no two words
    touch (each ends with `e` or `l`, and `et`, `ef`, `ln` are in no word), so each entry
    is one word."""
    commas, spaces = text.count(b","), text.count(b" ")
    if spaces and not spaces == commas == text.count(b", "):
        return False
    counts = [text.count(word) for word in words]
    covered = sum(count * len(word) for count, word in zip(counts, words, strict=True))
    if sum(counts) != commas + 1 or covered + commas + spaces != len(text):
        return False
    return not any(touch in text for touch in (b"et", b"ef", b"ln"))


def _minus_zero(text: bytes) -> bool:
    """Whether an entry is the integer `-0` (0 to `json`; `_cast` would make it -0.0)."""
    return (b"-0," in text or text.endswith(b"-0")) and _MINUS_ZERO.search(text) is not None


def _cast(text: bytes, kind: str, commas: np.ndarray | None = None) -> np.ndarray | None:
    """The entries of a list's text that `_INTEGERS` or `_NUMBERS` matched, parsed by pyarrow
    (correctly rounded as `float()`, integers exact) into a writable array; None if its
    separators are mixed (`,` and `, `) or pyarrow refuses an entry. `commas`: where its
    commas are, if found already."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if commas is None:
        commas = np.flatnonzero(np.frombuffer(text, np.uint8) == ord(","))
        spaces = text.count(b" ")  # the matches allow a space only right after a comma
        if spaces not in (0, len(commas)):
            return None
        spaced = spaces > 0
    else:  # found by `_plain_commas`: a space after every comma, or none anywhere
        spaced = len(commas) > 0 and text[commas[0] + 1] == ord(" ")
    width = 2 if spaced else 1
    data = text.translate(None, b", ")  # the entries end to end: one C pass, no mask
    offsets = np.empty(len(commas) + 2, np.int32)
    offsets[0], offsets[-1] = 0, len(data)
    offsets[1:-1] = commas - width * np.arange(len(commas))
    count = len(commas) + 1
    strings = pa.StringArray.from_buffers(count, pa.py_buffer(offsets), pa.py_buffer(data))
    try:
        parsed = pc.cast(strings, pa.float64() if kind == "float64" else pa.int64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    return np.array(parsed.to_numpy(zero_copy_only=False))


# JSON's grammar of the entries (RFC 8259 section 6), separated as `json.dumps` writes them
# (`,` or `, `); possessive, so a match never backtracks far.
_INTEGER = rb"-?+(?:0|[1-9][0-9]{0,17}+)"  # at most 18 digits: within int64
# a number, and if it is an integer at most 18 digits: `np.asarray` makes a float64 array
# of such integers among floats, and converts a longer one differently (or not at all)
_NUMBER = (
    rb"-?+(?:(?:0|[1-9][0-9]*+)(?:\.[0-9]++(?:[eE][-+]?+[0-9]++)?+|[eE][-+]?+[0-9]++)"
    rb"|0|[1-9][0-9]{0,17}+)"
)


def _entries(entry: bytes) -> re.Pattern[bytes]:
    return re.compile(rb"(?:" + entry + rb")(?:, ?+(?:" + entry + rb"))*+")


_INTEGERS = _entries(_INTEGER)
# each number with a fraction (what Python writes for a float but `1e-05`): a third cheaper
# to match than `_NUMBERS`, which is tried when it fails
_FRACTIONS = _entries(rb"-?+(?:0|[1-9][0-9]*+)\.[0-9]++(?:[eE][-+]?+[0-9]++)?+")
_NUMBERS = _entries(_NUMBER)
_BOOLS = _entries(rb"true|false")
_NULLS = _entries(rb"null")
_MINUS_ZERO = re.compile(rb"(?:^|[ ,])-0(?:,|$)")
