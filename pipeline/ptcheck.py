"""Checks that bound what a hostile pickle can cost, before and after `pipeline.ptread` runs it.

Before: `check_opcodes` walks the opcode stream (at regex speed, not per opcode in Python) and
refuses what would make the C unpickler allocate far more than the file: a memo index beyond
the pickle's length (`LONG_BINPUT 2**28` alone allocates 4 GB), a length field longer than the
rest of the pickle, unknown opcodes.

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
from typing import Any

import numpy as np

from pipeline.ptzip import Corrupt

ITEMS_PER_BYTE = 4  # expanded items (container slots, array elements, 8 characters) per byte
ITEMS_SLACK = 1 << 20  # so that tiny files may still hold ordinary small values
NODE_ITEMS = 16  # a container weighs as much as 16 items: its Python object costs ~128 bytes
MAX_DEPTH = 100  # nesting deeper than this breaks json/repr in later stages; dumps use < 10

_SINGLE = b"()]}NR0125abdelostu\x81\x85\x86\x87\x88\x89\x8f\x90\x91\x92\x93\x94\x97\x98Q"
# Runs of fixed-size opcodes, most frequent first (floats, token ids); `*+` never backtracks.
_RUN = re.compile(
    rb"(?:G.{8}|M..|J....|K.|[" + re.escape(_SINGLE) + rb"]|[hq\x82].|[j\x84]....|\x83..)*+",
    re.DOTALL,
)
_COUNTED = {0x55: 1, 0x43: 1, 0x8C: 1, 0x8A: 1, 0x54: 4, 0x42: 4, 0x58: 4, 0x8B: 4}
_COUNTED8 = {0x8D, 0x8E, 0x96, 0x95}  # BINUNICODE8, BINBYTES8, BYTEARRAY8, FRAME
_LINE = {ord(c) for c in "ILFSVPg"}  # one newline-terminated argument
_TWO_LINES = {ord("c"), ord("i")}  # GLOBAL, INST


def check_opcodes(payload: Any) -> None:
    """Refuse a pickle whose opcodes would allocate beyond the pickle's own size.

    Raises:
        Corrupt: an unknown opcode, a memo index larger than the pickle, or a length field
            running past its end.
    """
    data = bytes(payload) if not isinstance(payload, bytes) else payload
    end, pos, match = len(data), 0, _RUN.match
    while True:
        pos = match(data, pos).end()  # type: ignore[union-attr]
        if pos >= end:  # truncated: the unpickler reports it (EOFError), allocating nothing
            return
        op = data[pos]
        if op == 0x2E:  # STOP: anything after it is never read
            return
        pos = _skip(data, pos, op, end)


def _skip(data: bytes, pos: int, op: int, end: int) -> int:
    """The position after the variable-size or checked opcode at `pos`."""
    if op == 0x72:  # LONG_BINPUT: the C unpickler grows its memo table to 2 × the index
        _check_memo(int.from_bytes(data[pos + 1 : pos + 5], "little"), end)
        return pos + 5
    if op == 0x80:  # PROTO
        return pos + 2
    if op in _COUNTED:
        width = _COUNTED[op]
        size = int.from_bytes(data[pos + 1 : pos + 1 + width], "little", signed=width == 4)
        return _counted(pos + 1 + width, size, end)
    if op in _COUNTED8:
        size = int.from_bytes(data[pos + 1 : pos + 9], "little")
        return pos + 9 if op == 0x95 else _counted(pos + 9, size, end)
    if op in _LINE or op in _TWO_LINES or op == 0x70:  # PUT has its index as text
        stop = data.find(b"\n", pos + 1)
        if op in _TWO_LINES and stop >= 0:
            stop = data.find(b"\n", stop + 1)
        if stop < 0:
            raise Corrupt("its pickle is corrupt (an opcode's text argument has no end)")
        if op == 0x70:
            text = data[pos + 1 : stop]
            _check_memo(int(text) if text.isdigit() and len(text) < 20 else -1, end)
        return stop + 1
    raise Corrupt(f"its pickle is corrupt (unknown opcode 0x{op:02x} at byte {pos})")


def _counted(start: int, size: int, end: int) -> int:
    if size < 0 or start + size > end:
        raise Corrupt(f"its pickle is corrupt (a {size}-byte value runs past its end)")
    return start + size


def _check_memo(index: int, end: int) -> None:
    if not 0 <= index <= end:
        raise Corrupt(f"its pickle is corrupt (memo index {index} is larger than the whole pickle)")


# --- the value graph -------------------------------------------------------------------------


class Placeholder:
    """Stands in the value graph for an object finished only after unpickling (`final`)."""

    __slots__ = ()

    def final(self) -> Any:
        raise NotImplementedError


_LEAVES = frozenset({int, float, bool, complex, type(None), np.float64, np.bool_})
_STRING_TYPES = frozenset({str, bytes, bytearray})
_FLAT = _LEAVES | _STRING_TYPES  # values without children (strings weigh by length)
_SEQUENCES = (list, tuple)
_MAPPINGS = (dict, OrderedDict)


def settle(root: Any, file_size: int) -> Any:
    """Check the expanded size of the value graph and return it with placeholders replaced.

    Raises:
        Corrupt: The graph expands beyond its budget, is cyclic, is nested too deeply, or
            holds an unfinished placeholder.
    """
    budget = ITEMS_PER_BYTE * file_size + ITEMS_SLACK
    return _Walk(budget).run(root)


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
        return Corrupt(
            f"its values expand to more than {self.budget:,} items when shared references are"
            f" followed (at most {ITEMS_PER_BYTE} per byte of the file), so it is refused as"
            " an amplification attack"
        )

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
            return int(value.size) if isinstance(value, np.ndarray) else 1
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
