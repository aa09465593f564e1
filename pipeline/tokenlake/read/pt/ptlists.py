"""Plain lists of numbers in a pickle, decoded straight into numpy arrays.

A rollout pickle holds each sample's per-token lists (`tokens`, `loss_mask`,
`rollout_log_probs`) as runs of BININT1/BININT2/BININT or BINFLOAT opcodes; the C unpickler
makes one Python object of each, which a reader then turns into an array. The opcode check
(`tokenlake.read.pt.ptcheck`) asks a `Finder` at each list start it meets (an EMPTY_LIST and
its PUT, both real opcodes); it keeps the lists of exactly the plain shape (MARK ... APPENDS chunks of numbers
of one kind, and possibly one last item with APPEND), whose numbers the check then steps
over, and `decode` decodes them as whole arrays, with the
values the unpickler gives (BINFLOAT is the big-endian double's bits; the integers are exact).
The pickle is rewritten with a persistent id in place of each list's EMPTY_LIST and items;
the unpickler resolves it to a `DecodedList`, an inert placeholder that `settle` swaps for the
list (or, where a reader asked, its `ListArray`). Anything that treats the placeholder as
anything but a value in a container fails, and the file is then loaded the exact way
(`tokenlake.read.pt.ptread`), so the result is always what the unpickler makes.
"""

from __future__ import annotations

import re
from itertools import chain
from operator import itemgetter
from typing import Any, NamedTuple

import numpy as np

from tokenlake.read.pt.ptcheck import NODE_ITEMS, Placeholder
from tokenlake.read.pt.ptzip import Corrupt
from tokenlake.steptypes import ListArray

# A run of one integer opcode (BININT1, BININT2, BININT); runs of BINFLOAT are counted by their
# opcode bytes, 9 apart, in strided slices (no regex step per float).
_INT_RUN = re.compile(rb"(?:K.)++|(?:M..)++|(?:J....)++", re.DOTALL)
# opcode -> (width with its argument, the argument's dtype)
_ITEMS = {0x47: (9, ">f8"), 0x4B: (2, "u1"), 0x4D: (3, "<u2"), 0x4A: (5, "<i4")}
_INTS = frozenset({0x4B, 0x4D, 0x4A})
_COUNT = itemgetter(1)  # of a run (first opcode, count, opcode)
MIN_ITEMS = 64  # shorter lists cost the unpickler less than their decoding
# A list whose runs of one integer opcode average under _RUN_BYTES bytes (8 BININT2s) is left to
# the unpickler, decided after _FEW_RUNS runs of a chunk.
_RUN_BYTES, _FEW_RUNS = 24, 16
_FLOAT_SLICE = 4096  # BINFLOATs looked at per strided slice (a chunk holds at most 1000)


class Span(NamedTuple):
    """One plain list: its EMPTY_LIST at `bracket`, its items from `start` (after the PUT) to
    `end`."""

    bracket: int
    start: int
    end: int


class Decoded(NamedTuple):
    """The plain lists of a pickle, and the pickle rewritten to fetch them by persistent id."""

    payload: bytes
    arrays: list[ListArray]


class Finder:
    """The plain lists of one pickle, as the opcode check meets them (`ptcheck.ListHook`)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.framed = False
        self.spans: list[Span] = []
        self.runs: list[list[tuple[int, int, int]]] = []  # each list's (first, count, opcode)

    def at(self, bracket: int, start: int) -> int:
        """Note a plain list whose items start at `start`; where its items end (else `start`)."""
        runs: list[tuple[int, int, int]] = []
        end = _plain_list(self.data, start, runs)
        if end is None:
            return start
        self.spans.append(Span(bracket, start, end))
        self.runs.append(runs)
        return end


def decode(finder: Finder, nonce: bytes) -> Decoded | None:
    """The plain lists the opcode check found, decoded, and the pickle rewritten to fetch each
    by a persistent id; None when there are none (or FRAME lengths forbid a rewrite).

    `nonce` (16 random bytes) goes into each persistent id, so that no id the file holds
    itself can fetch a decoded list.
    """
    if not finder.spans or finder.framed:
        return None
    data, arrays, ints = finder.data, [], _IntRuns()
    for runs in finder.runs:
        arrays.append(_float_array(data, runs) if runs[0][2] == 0x47 else ints.add(runs))
    ints.fill(data)
    return Decoded(_rewrite(data, finder.spans, nonce), arrays)


def _plain_list(data: bytes, start: int, runs: list[tuple[int, int, int]]) -> int | None:
    """The end of a plain list of at least MIN_ITEMS numbers of one kind whose items start at
    `start` (after its PUT), its runs (first opcode, count, opcode) noted in `runs`; else
    None. The list's items are chunks of MARK, numbers, APPENDS; a last single number may come
    with APPEND. Each opcode's first byte gives its width, so the walk follows the real
    opcodes from the list's start."""
    size = len(data)
    if start + 1 >= size or data[start] != 0x28:  # MARK
        return None
    is_float = data[start + 1] == 0x47
    pos = start
    while pos + 1 < size and data[pos] == 0x28 and (data[pos + 1] == 0x47) == is_float:
        after = _floats(data, pos + 1, runs) if is_float else _ints(data, pos + 1, runs)
        if after <= pos + 1 or after >= size or data[after] != 0x65:  # APPENDS
            return None
        pos = after + 1
    if pos + 1 < size and data[pos] in _ITEMS and (data[pos] == 0x47) == is_float:
        after = _floats(data, pos, runs, 1) if is_float else _ints(data, pos, runs, 1)
        if after == pos or after >= size or data[after] != 0x61:  # one item, then APPEND
            return None
        pos = after + 1
    if pos >= size or data[pos] in _ITEMS or data[pos] == 0x28:  # more items: not one kind
        return None
    if sum(map(_COUNT, runs)) < MIN_ITEMS:
        return None
    return pos


def _floats(data: bytes, pos: int, runs: list[tuple[int, int, int]], most: int = 0) -> int:
    """The end of the BINFLOATs in a row at `pos` (at most `most`, if given), noted in `runs`."""
    first, count, size = pos, _FLOAT_SLICE, len(data)
    while True:
        count = min((size - pos) // 9, count)
        found = count - len(data[pos : pos + 9 * count : 9].lstrip(b"G"))
        pos += 9 * found
        if found < count or not found:
            break
    if most and pos - first > 9 * most:
        pos = first + 9 * most
    if pos > first:
        runs.append((first, (pos - first) // 9, 0x47))
    return pos


def _ints(data: bytes, pos: int, runs: list[tuple[int, int, int]], most: int = 0) -> int:
    """The end of the integer opcodes in a row at `pos` (at most `most` opcodes, if given),
    noted in `runs` as runs of one opcode; -1 if the runs are too short to be worth it (token
    ids of a large vocabulary alternating between BININT2 and BININT: a regex call per number
    or two costs more than the unpickler)."""
    match, width, begin, made = _INT_RUN.match, _ITEMS, pos, 0
    while True:
        found = match(data, pos)
        if found is None:
            return pos
        end = found.end()
        op = data[pos]
        count = (end - pos) // width[op][0]
        if most:
            count = min(count, most)
            end = pos + count * width[op][0]
        runs.append((pos, count, op))
        if most:
            return end
        made += 1
        if made > _FEW_RUNS and end - begin < _RUN_BYTES * made:
            return -1
        pos = end


def _rewrite(data: bytes, spans: list[Span], nonce: bytes) -> bytes:
    """The pickle with each list's EMPTY_LIST replaced by SHORT_BINBYTES(nonce + number) and
    BINPERSID, its PUT kept (so the memo holds what the list was), and its items dropped."""
    parts, at = [], 0
    for number, span in enumerate(spans):
        pid = nonce + number.to_bytes(4, "little")
        parts += [data[at : span.bracket], b"C", bytes([len(pid)]), pid, b"Q"]
        parts.append(data[span.bracket + 1 : span.start])
        at = span.end
    parts.append(data[at:])
    return b"".join(parts)


def _float_array(data: bytes, runs: list[tuple[int, int, int]]) -> ListArray:
    """A list of BINFLOATs as float64: each run's 8-byte big-endian arguments, 9 bytes apart,
    copied from one strided view (the bits the unpickler reads, NaN payloads included)."""
    doubles = _view(data, ">f8")
    out = np.empty(sum(map(_COUNT, runs)), np.float64)
    at = 0
    for first, count, _ in runs:
        out[at : at + count] = doubles[first + 1 : first + 1 + 9 * count : 9]
        at += count
    return out.view(ListArray)


class _IntRuns:
    """The integer lists of a pickle, decoded together: one gather for all their numbers."""

    def __init__(self) -> None:
        self.runs: list[tuple[int, int, int]] = []
        self.out = np.empty(0, np.int64)
        self.lists: list[tuple[ListArray, int, int]] = []  # (array to fill, first run, end)

    def add(self, runs: list[tuple[int, int, int]]) -> ListArray:
        """An array for one list, filled by `fill`."""
        array = np.empty(sum(map(_COUNT, runs)), np.int64).view(ListArray)
        self.lists.append((array, len(self.runs), len(self.runs) + len(runs)))
        self.runs.extend(runs)
        return array

    def fill(self, data: bytes) -> None:
        if not self.runs:
            return
        flat = np.fromiter(chain.from_iterable(self.runs), np.int64, 3 * len(self.runs))
        first, count, op = flat.reshape(-1, 3).T
        total = int(count.sum())
        width = np.select([op == 0x4B, op == 0x4D], [2, 3], 5)
        run_at = np.cumsum(count) - count  # each run's first number among all
        where = np.repeat(first + 1 - width * run_at, count)
        where += np.repeat(width, count) * np.arange(total)  # each number's argument
        values = np.empty(total, np.int64)
        values[:] = _view(data, "<u2")[where]  # BININT2s (most token ids); the rest below
        for code in (0x4B, 0x4A):
            chosen = op == code
            if chosen.any():
                items = _numbers_of(run_at[chosen], count[chosen])
                values[items] = _view(data, _ITEMS[code][1])[where[items]]
        for array, start, end in self.lists:
            a, b = int(run_at[start]), int(run_at[end - 1] + count[end - 1])
            array[:] = values[a:b]


def _view(data: bytes, dtype: str) -> np.ndarray:
    """The `dtype` number starting at every byte of `data` (one strided view, no copy)."""
    return np.ndarray((len(data) - np.dtype(dtype).itemsize + 1,), dtype, data, 0, (1,))


def _numbers_of(run_at: np.ndarray, count: np.ndarray) -> np.ndarray:
    """The indexes of the numbers of some runs (their first index, their count)."""
    return np.repeat(run_at - (np.cumsum(count) - count), count) + np.arange(int(count.sum()))


class DecodedList(Placeholder):
    """What the unpickler holds for a decoded list: inert (no items, no hash, no attributes a
    pickle could set), so any opcode that would use or change the list fails, and the file is
    loaded the exact way. A reader's `arrays_under` takes its array (`ptread`); `settle`
    swaps any other for the list."""

    __slots__ = ("array",)
    array: ListArray
    __hash__ = None  # type: ignore[assignment]  # a list is no dict key either

    def __init__(self, array: ListArray) -> None:
        object.__setattr__(self, "array", array)

    def __setattr__(self, name: str, value: Any) -> None:
        raise Corrupt("its pickle sets an attribute of a list")

    def final(self) -> Any:
        return self.array.tolist()

    def weight(self, value: Any) -> int:
        return len(value) + NODE_ITEMS  # what `settle` weighs the list itself at


def placeholder(decoded: Decoded, nonce: bytes, pid: bytes) -> DecodedList:
    """The list a persistent id of `_rewrite` names; any other bytes id is corrupt."""
    if len(pid) != len(nonce) + 4 or pid[: len(nonce)] != nonce:
        raise Corrupt("its pickle holds an unknown persistent id (a `bytes`)")
    number = int.from_bytes(pid[len(nonce) :], "little")
    if number >= len(decoded.arrays):
        raise Corrupt("its pickle holds an unknown persistent id (a `bytes`)")
    return DecodedList(decoded.arrays[number])
