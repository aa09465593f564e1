"""Checks that bound what a hostile pickle can cost, before and after `tokenlake.read.pt.ptread` runs it.

Before: `check_opcodes` walks the opcode stream (at regex speed, not per opcode in Python) and
refuses what would make the C unpickler allocate far more than the file: a memo index beyond
the pickle's length (`LONG_BINPUT 2**28` alone allocates 4 GB), a length field longer than the
rest of the pickle, unknown opcodes. Pickles of tensor metadata are first tried by
`tokenlake.read.pt.ptvector` (whole-array, the same verdicts; it leaves what it cannot decide here).

After: `settle` walks the unpickled value graph once, following shared references only once,
and refuses a graph that expands to more than `ITEMS_PER_BYTE` items per file byte (a
"billion laughs" of shared lists, a stride-0 tensor claiming 10**10 elements, the same long
string referenced a million times), a cycle, or nesting deeper than `MAX_DEPTH`; it also
swaps placeholders (numpy arrays built under validation) for their final values.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import is_dataclass
from typing import Any, Protocol

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
    SINGLE,
    TEXTS,
    TWO_LINES,
    WIDTH,
)
from tokenlake.read.pt.ptvector import vector_scan
from tokenlake.read.pt.ptzip import Corrupt

ITEMS_PER_BYTE = 4  # expanded items (container slots, array elements, 8 characters) per byte
ITEMS_SLACK = 1 << 20  # so that tiny files may still hold ordinary small values
NODE_ITEMS = 16  # a container weighs as much as 16 items: its Python object costs ~128 bytes
MAX_DEPTH = 100  # nesting deeper than this breaks json/repr in later stages; dumps use < 10

# Runs of fixed-size opcodes but BINFLOAT (counted by `_Scan._run`); `*+` never backtracks.
# Memo opcodes are left out: each is checked. (A capture group to learn the run's last opcode
# would slow every iteration; what a run pushed last counts as not shareable.)
_RUN = re.compile(
    rb"(?:M..|J....|K.|[" + re.escape(SINGLE) + rb"]|\x82.|\x84....|\x83..)*+",
    re.DOTALL,
)
# All fixed-size opcodes, BINFLOAT too: for runs that mix floats with other opcodes.
_MIXED = re.compile(
    rb"(?:G.{8}|M..|J....|K.|[" + re.escape(SINGLE) + rb"]|\x82.|\x84....|\x83..)*+",
    re.DOTALL,
)
_FLOATS = 4096  # BINFLOATs checked per strided slice (torch.save appends 1000 at a time)
_FEW = 128  # fewer floats in a row cost less through the regex than a slice and a regex call
_COUNTED8 = {0x8D, 0x8E, 0x96, 0x95}  # BINUNICODE8, BINBYTES8, BYTEARRAY8, FRAME
# `tokenlake.read.pt.ptvector` decides pickles up to this size whose BINFLOATs fill less than a
# quarter (runs of floats cost `_Scan` far less than a vectorised pass over every byte).
VECTOR_MAX = 1 << 20  # its pass takes ~40 bytes per pickle byte for a moment


class ListHook(Protocol):
    """What the scan tells about lists (`tokenlake.read.pt.ptlists.Finder`)."""

    framed: bool  # set when the pickle has a FRAME opcode

    def at(self, bracket: int, start: int) -> int:
        """At an EMPTY_LIST (at `bracket`) whose PUT ends at `start`: where the list's run of
        number opcodes (and their MARK, APPENDS, APPEND) ends, or `start`."""
        ...


def check_opcodes(payload: Any, lists: ListHook | None = None) -> bool:
    """Refuse a pickle whose opcodes would allocate beyond the pickle's own size.

    With `lists` (a rollout's pickle: numbers, not tensor metadata), the exact scan runs and
    calls `lists.at` at each EMPTY_LIST followed by a PUT; it steps over the numbers `at`
    says the list holds (fixed-size opcodes that push nothing shareable: the verdict is the
    same), and sets `lists.framed` if the pickle has FRAME opcodes.

    Returns:
        Whether the pickle references a container, array or long string more than once
        (memo GET, DUP). Without that, its values are a tree no larger than the pickle, and
        `settle` need not walk them.

    Raises:
        Corrupt: an unknown opcode, a memo index larger than the pickle, or a length field
            running past its end.
    """
    data = bytes(payload) if not isinstance(payload, bytes) else payload
    if lists is None and len(data) <= VECTOR_MAX and data.count(b"G") * 36 < len(data):
        verdict = vector_scan(data)
        if verdict is not None:
            return verdict
    scan = _Scan(data, lists)
    shares = scan.run()
    if lists is not None:
        lists.framed = scan.framed
    return shares


class _Scan:
    """One pass over the opcodes; remembers which memo entries are safe to share."""

    def __init__(self, data: bytes, lists: ListHook | None = None) -> None:
        self.data, self.end = data, len(data)
        self.atom: dict[int, bool] = {}  # memo index -> shareable
        self.top = False  # whether the object the last opcode pushed is shareable
        self.shares = False
        self.huge_ints = 0
        self.limit = max(self.end, 1 << 16)  # the largest memo index allowed
        self.lists = lists
        self.framed = False

    def run(self) -> bool:
        data, end, pos, atom, width, limit = self.data, self.end, 0, self.atom, WIDTH, self.limit
        match = _RUN.match
        top = shares = False  # self.top and self.shares, as locals while inline
        lists, single = self.lists, -1  # single: the last fixed-size opcode stepped alone
        while pos < end:
            op = data[pos]
            step = width[op]
            if step:  # fixed-size opcodes: push nothing shareable
                after = pos + step
                if after < end and width[data[after]]:
                    after = match(data, pos).end() if op != 0x47 else self._run(pos)  # type: ignore[union-attr]
                if after == pos or after > end:  # cut off by the end: the unpickler reports it
                    break
                top, single, pos = False, pos, after
            elif op in PUT_GET and pos + PUT_GET[op] < end:  # the most frequent memo opcodes
                size = PUT_GET[op]
                index = (
                    data[pos + 1]
                    if size == 1
                    else int.from_bytes(data[pos + 1 : pos + 5], "little")
                )
                if index > limit:
                    self._memo(pos, op)  # raises: the index is out of bounds
                if op in GETS:
                    top = atom.get(index, False)
                    shares |= not top
                else:
                    atom[index] = top
                    if lists is not None and single == pos - 1 and data[single] == 0x5D:
                        pos = lists.at(single, pos + 1 + size)  # EMPTY_LIST, then its PUT
                        top = False  # what a run of numbers leaves
                        continue
                pos += 1 + size
            elif op == 0x2E:  # STOP: anything after it is never read
                break
            else:
                self.top, self.shares = top, shares
                pos = self._memo(pos, op) if op in MEMO else self._skip(pos, op)
                top, shares = self.top, self.shares
        return shares  # at the end of a truncated pickle the unpickler reports EOFError

    def _run(self, pos: int) -> int:
        """The end of the run of fixed-size opcodes at `pos`. BINFLOATs (a quarter of a
        rollout pickle's opcodes) are counted by their opcode bytes, 9 apart, in strided
        slices (`_floats`); the other opcodes go through the regex. Fewer than 128
        floats in a row (floats mixed with other opcodes): the regex of all, to the run's end."""
        data, end = self.data, self.end
        while True:
            start = pos
            if data[pos] == 0x47:  # BINFLOAT
                pos = self._floats(pos)
                if pos - start < 9 * _FEW:
                    return _MIXED.match(data, pos).end()  # type: ignore[union-attr]
            else:
                pos = _RUN.match(data, pos).end()  # type: ignore[union-attr]
            if pos == start or pos >= end or not WIDTH[data[pos]]:  # run over, or cut off
                return pos

    def _floats(self, pos: int) -> int:
        """The end of the BINFLOATs in a row at `pos`: slices of 128, 256, ... 4096 opcode bytes
        (a slice costs its length, whatever the run's)."""
        data, end, count = self.data, self.end, _FEW
        while True:
            count = min((end - pos) // 9, count)
            floats = count - len(data[pos : pos + 9 * count : 9].lstrip(b"G"))
            pos += 9 * floats
            if floats < count or not floats:
                return pos
            count = min(2 * count, _FLOATS)

    def _memo(self, pos: int, op: int) -> int:
        """PUT/GET/MEMOIZE/DUP: bound the index (the C unpickler grows its table to 2 × it)
        and note when a non-shareable object is referenced again."""
        data = self.data
        width = MEMO[op]
        if op == 0x32:  # DUP
            self.shares |= not self.top
            return pos + 1
        if op == 0x94:  # MEMOIZE: the next free index
            index, after = len(self.atom), pos + 1
        elif width:
            index, after = (
                int.from_bytes(data[pos + 1 : pos + 1 + width], "little"),
                pos + 1 + width,
            )
        else:  # PUT / GET with a decimal index
            stop = data.find(b"\n", pos + 1)
            text = data[pos + 1 : stop] if stop > 0 else b""
            index, after = (int(text) if text.isdigit() and len(text) < 20 else -1), stop + 1
        if not 0 <= index <= self.limit:
            raise Corrupt(
                f"its pickle is corrupt (memo index {index} is larger than the whole pickle)"
            )
        if op in GETS:
            self.top = self.atom.get(index, False)
            self.shares |= not self.top
        else:
            self.atom[index] = self.top
        return after

    def _huge(self, value: int) -> None:
        if abs(value) >= HASH_MODULUS:
            self.huge_ints += 1
            if self.huge_ints > MAX_HUGE_INTS:
                raise Corrupt(
                    f"its pickle holds more than {MAX_HUGE_INTS} integers of 2**61 or more;"
                    " tokenlake refuses them (such integers can be chosen to share a hash"
                    " and stall any dict or set holding them)"
                )

    def _skip(self, pos: int, op: int) -> int:
        """The position after the variable-size opcode at `pos`."""
        data, end = self.data, self.end
        if op == 0x80:  # PROTO
            return pos + 2
        if op in COUNTED or op in _COUNTED8:
            width = COUNTED.get(op, 8)
            size = int.from_bytes(data[pos + 1 : pos + 1 + width], "little", signed=width == 4)
            if op == 0x95:  # FRAME: a hint, no object
                self.framed = True
                return pos + 9
            self.top = op in ATOMS or size <= SHARED_TEXT
            after = _counted(pos + 1 + width, size, end)
            if op in (0x8A, 0x8B) and size >= 8:
                self._huge(int.from_bytes(data[pos + 1 + width : after], "little", signed=True))
            return after
        if op in LINE or op in TWO_LINES:
            stop = data.find(b"\n", pos + 1)
            if op in TWO_LINES and stop >= 0:
                stop = data.find(b"\n", stop + 1)
            if stop < 0:
                raise Corrupt("its pickle is corrupt (an opcode's text argument has no end)")
            self.top = op in ATOMS or (op in TEXTS and stop - pos <= SHARED_TEXT)
            if op in (0x49, 0x4C) and stop - pos > 19:  # INT / LONG as text, 19+ digits
                self._huge(HASH_MODULUS)
            return stop + 1
        raise Corrupt(f"its pickle is corrupt (unknown opcode 0x{op:02x} at byte {pos})")


def _counted(start: int, size: int, end: int) -> int:
    if size < 0 or start + size > end:
        raise Corrupt(f"its pickle is corrupt (a {size}-byte value runs past its end)")
    return start + size


def too_big(budget: int) -> Corrupt:
    """The refusal of a value graph (or the tensors of a file) beyond `budget` items."""
    return Corrupt(
        f"its values expand to more than {budget:,} items when shared references are"
        f" followed (at most {ITEMS_PER_BYTE} per byte of the file), so it is refused as"
        " an amplification attack"
    )


def budget_of(file_size: int) -> int:
    return ITEMS_PER_BYTE * file_size + ITEMS_SLACK


# --- the value graph -------------------------------------------------------------------------


class Placeholder:
    """Stands in the value graph for an object finished only after unpickling (`final`)."""

    __slots__ = ()

    def final(self) -> Any:
        raise NotImplementedError

    def weight(self, value: Any) -> int:
        """The items `final`'s value counts for in the graph's budget."""
        return int(value.size) if isinstance(value, np.ndarray) else 1


_LEAVES = frozenset({int, float, bool, complex, type(None), np.float64, np.bool_})
_STRING_TYPES = frozenset({str, bytes, bytearray})
_FLAT = _LEAVES | _STRING_TYPES  # values without children (strings weigh by length)
_SEQUENCES = (list, tuple)
_MAPPINGS = (dict, OrderedDict)


def settle(root: Any, file_size: int) -> Any:
    """Check the expanded size of the value graph and return it with placeholders replaced.

    Needed only when the pickle shares references (`check_opcodes`) or builds numpy objects.

    Raises:
        Corrupt: The graph expands beyond its budget, is cyclic, is nested too deeply, or
            holds an unfinished placeholder.
    """
    return _Walk(budget_of(file_size)).run(root)


class _Walk:
    """Iterative post-order walk; each shared node is weighed once and counted per reference."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.weight: dict[int, int] = {}  # id -> expanded items, for finished nodes
        self.swap: dict[int, Any] = {}  # id -> replacement (placeholders, rebuilt tuples)
        self.keep: list[Any] = []  # keeps walked nodes alive so ids stay unique

    def run(self, root: Any) -> Any:
        holder = [root]
        self._visit(holder)
        return holder[0]

    def _too_big(self) -> Corrupt:
        return too_big(self.budget)

    def _visit(self, root: Any) -> None:
        stack: list[tuple[Any, list[Any] | None, int]] = [(root, None, 0)]
        on_path: set[int] = set()
        while stack:
            node, kids, own = stack.pop()
            key = id(node)
            if kids is not None:  # second time: every child is weighed
                on_path.discard(key)
                self.weight[key] = self._finish(node, kids, own)
                continue
            if key in self.weight:
                continue
            if key in on_path:
                raise Corrupt("its pickle holds a cyclic reference (a container inside itself)")
            if len(on_path) >= MAX_DEPTH:
                raise Corrupt(f"its values are nested more than {MAX_DEPTH} levels deep")
            on_path.add(key)
            self.keep.append(node)
            if len(self.keep) * NODE_ITEMS > self.budget:  # stop before the walk itself grows
                raise self._too_big()
            kids, own = _kids_and_weight(node)
            stack.append((node, kids, own))
            stack.extend((child, None, 0) for child in kids)

    def _finish(self, node: Any, kids: list[Any], own: int) -> int:
        """Weigh a node whose children are done, and apply replacements."""
        if isinstance(node, Placeholder):
            value = node.final()
            self.swap[id(node)] = value
            return node.weight(value)
        total = own
        for child in kids:
            total += self.weight[id(child)]
        if total > self.budget:
            raise self._too_big()
        if any(id(c) in self.swap for c in kids):
            self._replace(node)
        return total

    def _replace(self, node: Any) -> None:
        new = self.swap.get
        if isinstance(node, list):
            node[:] = [new(id(c), c) for c in node]
        elif isinstance(node, tuple):
            self.swap[id(node)] = tuple(new(id(c), c) for c in node)
        elif isinstance(node, _MAPPINGS):
            if any(id(k) in self.swap for k in node):
                raise Corrupt("its pickle uses a numpy array as a dict key")
            for k, v in node.items():
                node[k] = new(id(v), v)
        elif isinstance(node, (set, frozenset)):
            raise Corrupt("its pickle puts a numpy array into a set")
        else:  # a stand-in dataclass: its attributes
            for k, v in vars(node).items():
                object.__setattr__(node, k, new(id(v), v))


def _kids_and_weight(node: Any) -> tuple[list[Any], int]:
    """The children that need a visit (containers, arrays, placeholders) and the items the
    node weighs itself (its slots, leaf strings by length); one C-speed type scan for lists
    of numbers and strings."""
    if isinstance(node, np.ndarray):
        return [], int(node.size)
    items = _children(node)
    weight = len(items) + NODE_ITEMS
    types = set(map(type, items))
    if types <= _LEAVES:
        return [], weight
    weight += sum(len(x) >> 3 for x in items if type(x) in _STRING_TYPES)
    if types <= _FLAT:
        return [], weight
    return [c for c in items if type(c) not in _FLAT], weight


def _children(node: Any) -> Any:
    if isinstance(node, _SEQUENCES) or isinstance(node, (set, frozenset)):
        return node
    if isinstance(node, _MAPPINGS):
        return [*node.keys(), *node.values()]
    if is_dataclass(node) and not isinstance(node, type):
        return list(vars(node).values())
    return ()
