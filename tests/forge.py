"""Forge hostile `.pt` files: a pickle writer that emits raw opcodes and a zip writer whose
header fields are whatever the test says (not `torch.save`, which cannot lie).

A `.pt` file is a zip archive: `<prefix>/data.pkl` (the pickle), `<prefix>/data/<key>` (one
member per storage), `<prefix>/byteorder`, `<prefix>/version`.

Example:
    p = Pickle().dict().text("x").glob("builtins", "bytes").int(10**9).tuple(1).reduce()
    write_pt(tmp / "evil.pt", p.setitem().stop())
"""

from __future__ import annotations

import bz2
import os
import struct
import time
import zlib
from pathlib import Path

# The BUILD state numpy writes for these dtypes.
NATIVE: dict[str, tuple[object, ...]] = {
    "f8": (3, "<", None, None, None, -1, -1, 0),
    "i4": (3, "<", None, None, None, -1, -1, 0),
    "u1": (3, "|", None, None, None, -1, -1, 0),
}


class Pickle:
    """Protocol-2 opcodes, appended by chained calls; `bytes(p)` is the pickle."""

    def __init__(self) -> None:
        self.out = bytearray(b"\x80\x02")

    def __bytes__(self) -> bytes:
        return bytes(self.out)

    def raw(self, data: bytes) -> Pickle:
        self.out += data
        return self

    def glob(self, module: str, name: str) -> Pickle:
        return self.raw(b"c" + module.encode() + b"\n" + name.encode() + b"\n")

    def text(self, value: str) -> Pickle:
        data = value.encode()
        return self.raw(b"X" + struct.pack("<I", len(data)) + data)

    def int(self, value: int) -> Pickle:
        if 0 <= value < 2**31:
            return self.raw(b"J" + struct.pack("<i", value))
        data = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
        return self.raw(b"\x8a" + bytes([len(data)]) + data)

    def float(self, value: float) -> Pickle:
        return self.raw(b"G" + struct.pack(">d", value))

    def binbytes(self, data: bytes) -> Pickle:  # protocol 3 BINBYTES (the C unpickler reads it)
        return self.raw(b"B" + struct.pack("<I", len(data)) + data)

    def none(self) -> Pickle:
        return self.raw(b"N")

    def true(self) -> Pickle:
        return self.raw(b"\x88")

    def false(self) -> Pickle:
        return self.raw(b"\x89")

    def mark(self) -> Pickle:
        return self.raw(b"(")

    def tuple(self, n: int | None = None) -> Pickle:
        """TUPLE1/2/3 for n items on the stack, EMPTY_TUPLE for 0, TUPLE (to MARK) for None."""
        return self.raw({0: b")", 1: b"\x85", 2: b"\x86", 3: b"\x87", None: b"t"}[n])

    def list(self) -> Pickle:
        return self.raw(b"]")

    def dict(self) -> Pickle:
        return self.raw(b"}")

    def append(self) -> Pickle:
        return self.raw(b"a")

    def appends(self) -> Pickle:
        return self.raw(b"e")

    def setitem(self) -> Pickle:
        return self.raw(b"s")

    def reduce(self) -> Pickle:
        return self.raw(b"R")

    def build(self) -> Pickle:
        return self.raw(b"b")

    def newobj(self) -> Pickle:
        return self.raw(b"\x81")

    def persid(self) -> Pickle:
        return self.raw(b"Q")

    def put(self, index: int) -> Pickle:
        return self.raw(b"q" + bytes([index]) if index < 256 else b"r" + struct.pack("<I", index))

    def get(self, index: int) -> Pickle:
        return self.raw(b"h" + bytes([index]) if index < 256 else b"j" + struct.pack("<I", index))

    def stop(self) -> Pickle:
        return self.raw(b".")

    # --- composites used by many tests -------------------------------------------------------

    def dtype(self, spec: str, state: tuple[object, ...] | None = None) -> Pickle:
        """`numpy.dtype(spec, False, True)`, then BUILD `state` if given."""
        self.glob("numpy", "dtype").text(spec).false().true().tuple(3).reduce()
        if state is not None:
            self.value(state).build()
        return self

    def array(self, shape: tuple[int, ...], spec: str, data: bytes | None) -> Pickle:
        """`_reconstruct(ndarray, (0,), b'b')`, then BUILD (1, shape, dtype, False, data)."""
        self.glob("numpy._core.multiarray", "_reconstruct").glob("numpy", "ndarray")
        self.value((0,)).binbytes(b"b").tuple(3).reduce()
        if data is not None:
            self.mark().int(1).value(shape).dtype(spec, NATIVE.get(spec)).false().binbytes(data)
            self.tuple().build()
        return self

    def value(self, obj: object) -> Pickle:
        """A plain value: None, bool, int, float, str, bytes, tuple, list (recursively)."""
        if obj is None:
            return self.none()
        if isinstance(obj, bool):
            return self.true() if obj else self.false()
        if isinstance(obj, int):
            return self.int(obj)
        if isinstance(obj, float):
            return self.float(obj)
        if isinstance(obj, str):
            return self.text(obj)
        if isinstance(obj, bytes):
            return self.binbytes(obj)
        if isinstance(obj, tuple):
            self.mark()
            for item in obj:
                self.value(item)
            return self.tuple()
        if isinstance(obj, list):
            self.list().mark()
            for item in obj:
                self.value(item)
            return self.appends()
        raise TypeError(type(obj))

    def storage(self, kind: str, key: str, numel: int) -> Pickle:
        """The persistent id torch writes for a storage: ('storage', torch.<kind>, key, 'cpu', n)."""
        self.mark().text("storage").glob("torch", kind).text(key).text("cpu").int(numel)
        return self.tuple().persid()

    def tensor(
        self,
        kind: str,
        key: str,
        numel: int,
        offset: int,
        size: tuple[int, ...],
        stride: tuple[int, ...],
    ) -> Pickle:
        """`torch._utils._rebuild_tensor_v2(storage, offset, size, stride, False, OrderedDict())`."""
        self.glob("torch._utils", "_rebuild_tensor_v2").mark().storage(kind, key, numel)
        self.int(offset).value(size).value(stride).false()
        self.glob("collections", "OrderedDict").tuple(0).reduce()
        return self.tuple().reduce()


def laughs(p: Pickle, levels: int = 9, width: int = 10) -> Pickle:
    """A "billion laughs" list: level k holds `width` references to level k-1 (memo GETs).

    About 30 bytes per level; expands to width**levels leaves.
    """
    p.list().put(0).text("lol").append()
    for level in range(1, levels + 1):
        p.raw(b"0").list().put(level).mark()  # POP the level below: it lives on in the memo
        for _ in range(width):
            p.get(level - 1)
        p.appends()
    return p


# --- the zip container ------------------------------------------------------------------------


STORED, DEFLATED, BZIP2 = 0, 8, 12


class Member:
    """One zip member; `declared` overrides the uncompressed size written in its headers."""

    def __init__(
        self, name: str, data: bytes, method: int = STORED, declared: int | None = None
    ) -> None:
        self.name = name
        self.data = data
        self.method = method
        self.declared = len(data) if declared is None else declared
        if method == DEFLATED:
            packer = zlib.compressobj(9, zlib.DEFLATED, -15)
            self.packed = packer.compress(data) + packer.flush()
        elif method == BZIP2:
            self.packed = bz2.compress(data, 9)
        else:
            self.packed = data


def write_zip(path: Path, members: list[Member]) -> Path:
    """A zip archive written field by field (CRCs are real; sizes are what members say)."""
    out, central = bytearray(), bytearray()
    for m in members:
        name = m.name.encode()
        crc = zlib.crc32(m.data)
        offset = len(out)
        out += struct.pack(
            "<4s5H3I2H",
            b"PK\x03\x04",
            20,
            0,
            m.method,
            0,
            0,
            crc,
            len(m.packed),
            m.declared,
            len(name),
            0,
        )
        out += name + m.packed
        central += struct.pack(
            "<4s6H3I5H2I",
            b"PK\x01\x02",
            20,
            20,
            0,
            m.method,
            0,
            0,
            crc,
            len(m.packed),
            m.declared,
            len(name),
            0,
            0,
            0,
            0,
            0,
            offset,
        )
        central += name
    start = len(out)
    out += central
    out += struct.pack(
        "<4s4H2IH", b"PK\x05\x06", 0, 0, len(members), len(members), len(central), start, 0
    )
    path.write_bytes(bytes(out))
    return path


def write_pt(
    path: Path,
    pickle: Pickle | bytes,
    storages: dict[str, bytes] | None = None,
    *,
    method: int = STORED,
    old: bool = True,
    extra: list[Member] | None = None,
) -> Path:
    """A `.pt` file around a forged pickle: `archive/data.pkl`, storages, byteorder, version.

    `old` backdates the file, so the reader does not call a failure "still being written".
    """
    members = [Member("archive/data.pkl", bytes(pickle), method)]
    members += [Member(f"archive/data/{k}", v, method) for k, v in (storages or {}).items()]
    members += [Member("archive/byteorder", b"little"), Member("archive/version", b"3\n")]
    write_zip(path, members + (extra or []))
    if old:
        past = time.time() - 7200
        os.utime(path, (past, past))
    return path
