"""The opcode check of `tokenlake.read.pt.ptcheck`, vectorised: the same verdicts, at half the cost
on pickles of tensor metadata (a rank file's: memo opcodes between short runs of opcodes).

Pickles whose opcodes are mostly short (tensor metadata, memo opcodes between them) cost the
exact scan ~25 000 Python steps per 100 KB; `vector_scan` takes every byte as a possible
opcode start, finds the opcodes reachable from byte 0 by pointer doubling and checks them as
whole arrays. Anything it cannot decide exactly (an error, MEMOIZE, DUP, a PUT right after a
GET, ...) goes back to `_Scan`, so its verdict is always `_Scan`'s. Runs of BINFLOAT are far
cheaper for `_Scan` (strided slices), so float-heavy and large pickles skip it.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any

import numpy as np

from tokenlake.read.pt.ptopcodes import (
    ATOMS,
    COUNTED,
    GETS,
    HASH_MODULUS,
    LINE,
    MAX_HUGE_INTS,
    MEMO,
    PUT_GET,
    SHARED_TEXT,
    TEXTS,
    TWO_LINES,
    WIDTH,
)

_PAST = 1 << 40  # a step past any end: the opcode ends the path
# 0: left to `_Scan`; the last four (from _C1 on) end where their arguments say
_FIX, _MEMO1, _STOP, _PASS, _C1, _C4, _LINE1, _LINE2 = range(1, 9)


def _kind_of(op: int) -> tuple[int, int]:
    """How `_Scan` handles `op` (in the order it tests an opcode) and its own width."""
    if WIDTH[op]:
        return _FIX, WIDTH[op]
    if op in PUT_GET:
        return _MEMO1, 1 + PUT_GET[op]
    if op == 0x2E or op in MEMO:
        return (_STOP if op == 0x2E else 0), _PAST  # ends the path
    if op in (0x80, 0x95):  # PROTO, FRAME: push nothing
        return _PASS, 2 if op == 0x80 else 9
    if op in COUNTED:
        return (_C1 if COUNTED[op] == 1 else _C4), 0
    kind = _LINE1 if op in LINE else _LINE2 if op in TWO_LINES else 0
    return kind, 0 if kind else _PAST


_KIND = np.array([_kind_of(op)[0] for op in range(256)], np.int8)
_STEP = np.array([_kind_of(op)[1] for op in range(256)], np.intp)


def _flags(ops: Any) -> np.ndarray:
    table = np.zeros(256, bool)
    table[list(ops)] = True
    return table


_IS_ATOM, _IS_TEXT, _IS_GET = _flags(ATOMS), _flags(TEXTS), _flags(GETS)
_IS_LONG, _IS_INT_TEXT = _flags([0x8A, 0x8B]), _flags([0x49, 0x4C])


def vector_scan(data: bytes) -> bool | None:
    """`check_opcodes`'s verdict on `data`, or None where only `_Scan` can tell."""
    codes = np.frombuffer(data, np.uint8)
    padded = data + bytes(4)  # an argument cut off by the end reads zeros
    kind = _KIND[codes]
    nxt, size = _next_opcodes(codes, kind, padded)
    ops = _path(nxt)
    if len(ops) < 2 or kind[ops[-2]] != _STOP:  # an error, a cut-off or an opcode left over
        return None
    ops = ops[:-2]
    code, size = codes[ops], size[ops]
    if _huge_ints(data, code, size, ops, nxt) > MAX_HUGE_INTS:
        return None
    return _shares(padded, kind[ops], code, size, ops)


def _words(padded: bytes, dtype: str) -> np.ndarray:
    """The 4-byte little-endian word (`<u4` or `<i4`) at every position of `padded` but its
    last 4 bytes, as one strided view: a length or memo index is one gather, not four."""
    return np.ndarray((len(padded) - 3,), dtype, padded, 0, (1,))


def _next_opcodes(
    codes: np.ndarray, kind: np.ndarray, padded: bytes
) -> tuple[np.ndarray, np.ndarray]:
    """For every byte position, where the next opcode starts if an opcode starts there (the
    position itself for STOP and what is left to `_Scan`), and the size `_Scan` gives it."""
    end = len(codes)
    nxt = np.arange(end + 1, dtype=np.intp)
    nxt[:end] += _STEP[codes]
    size = np.zeros(end, np.int64)
    # the opcodes whose arguments say where they end (one pass over the kinds, not four)
    varying = np.flatnonzero(kind >= _C1)
    kinds = kind[varying]
    pos = varying[kinds == _C1]
    size[pos] = np.frombuffer(padded, np.uint8)[pos + 1]
    nxt[pos] += 2 + size[pos]
    pos = varying[kinds == _C4]
    size[pos] = _words(padded, "<i4")[pos + 1]  # a length of 2**31 or more reads negative
    after = pos + 5 + size[pos]  # int64: a 4-byte length must not wrap an int32
    nxt[pos] = np.where(size[pos] < 0, end, after)
    newlines = np.append(np.flatnonzero(codes == 10), end)  # `end`: no newline left
    for k, lines in ((_LINE1, 1), (_LINE2, 2)):
        pos = varying[kinds == k]
        at = np.minimum(np.searchsorted(newlines, pos + 1) + lines - 1, len(newlines) - 1)
        stop = newlines[at]
        nxt[pos] = np.where(stop < end, stop + 1, end)
        size[pos] = stop - pos
    np.minimum(nxt, end, out=nxt)  # STOP, what is left to `_Scan`, what the end cuts off
    return nxt, size


def _path(nxt: np.ndarray) -> np.ndarray:
    """The positions reachable from 0, in order, the last the end. Chains that do not start at
    byte 0 (inside arguments) mostly die out within a few opcodes: three rounds keep only the
    targets of targets of targets (every kept position's next opcode is kept too); then the
    path is followed through the kept positions (`_walk`), or found by pointer doubling
    (`_doubling`) when too many chains survived the rounds."""
    keep = np.arange(len(nxt))
    for _ in range(3):
        target = np.zeros(len(nxt), bool)
        target[nxt[keep]] = True
        target[0] = True
        keep = np.flatnonzero(target)
    jump = (np.cumsum(target) - 1)[nxt[keep]]  # from rank to rank in `keep`
    # where the next opcode is not the next kept position: a surviving chain is skipped there
    skips = np.flatnonzero(jump != np.arange(1, len(keep) + 1))
    if len(skips) <= _MAX_SKIPS:
        return keep[_walk(jump, skips.tolist())]
    return keep[_doubling(jump, keep, len(nxt) - 1)]


_MAX_SKIPS = 512  # beyond this many skips, a Python step each costs more than the doubling


def _walk(jump: np.ndarray, skips: list[int]) -> np.ndarray:
    """The ranks on the path from rank 0: a run of consecutive ranks up to the next skip,
    then on from where that skip leads. The last rank (the end, which leads to itself) is
    always a skip, so the walk ends there."""
    runs, rank = [], 0
    while True:
        skip = skips[bisect_left(skips, rank)]
        runs.append(np.arange(rank, skip + 1))
        after = int(jump[skip])
        if after <= skip:  # the end
            return np.concatenate(runs)
        rank = after


def _doubling(jump: np.ndarray, keep: np.ndarray, end: int) -> np.ndarray:
    """The ranks on the path from rank 0 by pointer doubling: after round r, the first 2**r."""
    reach = np.zeros(len(keep), bool)
    reach[0] = True
    while True:
        pos = np.flatnonzero(reach)
        if keep[pos[-1]] == end:
            return pos
        reach[jump[pos]] = True
        jump = jump[jump]


def _huge_ints(data: bytes, code: Any, size: Any, ops: Any, nxt: Any) -> int:
    count = int(np.count_nonzero(_IS_INT_TEXT[code] & (size > 19)))
    longs = ops[_IS_LONG[code] & (size >= 8)]
    if len(longs) > 2 * MAX_HUGE_INTS:
        return MAX_HUGE_INTS + 1  # left to `_Scan`
    for pos in longs.tolist():
        start = pos + (2 if data[pos] == 0x8A else 5)
        value = int.from_bytes(data[start : int(nxt[pos])], "little", signed=True)
        count += abs(value) >= HASH_MODULUS
    return count


def _shares(padded: bytes, kind: Any, code: Any, size: Any, ops: Any) -> bool | None:
    """Whether a GET fetches a memo entry not marked shareable by its last PUT before it."""
    memo = kind == _MEMO1
    where, op = ops[memo], code[memo]
    wide = (op == 0x6A) | (op == 0x72)
    index = np.frombuffer(padded, np.uint8)[where + 1].astype(np.int64)
    index[wide] = _words(padded, "<u4")[where[wide] + 1]
    if len(index) and int(index.max()) > max(len(padded) - 4, 1 << 16):
        return None
    top = np.zeros(len(ops), bool)  # what each opcode that sets `top` sets it to
    text = (kind == _LINE1) | (kind == _LINE2)
    top[text] = _IS_ATOM[code[text]] | (_IS_TEXT[code[text]] & (size[text] <= SHARED_TEXT))
    counted = (kind == _C1) | (kind == _C4)
    top[counted] = _IS_ATOM[code[counted]] | (size[counted] <= SHARED_TEXT)
    sets = ((kind != _MEMO1) & (kind != _PASS)) | (memo & _IS_GET[code])
    source = np.maximum.accumulate(np.where(sets, np.arange(len(ops)), -1))[memo]
    get = _IS_GET[op]
    if np.any((source >= 0) & memo[source] & ~get):  # a PUT right after a GET
        return None
    value = (source >= 0) & top[source] & ~get
    order = np.lexsort((where, index))  # by memo index, then position
    last_put = np.maximum.accumulate(np.where(get[order], -1, np.arange(len(order))))
    gets = np.flatnonzero(get[order])
    put = last_put[gets]
    found = (put >= 0) & (index[order][put] == index[order][gets])
    return bool(np.any(~(found & value[order][put])))
