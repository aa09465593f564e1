"""The zip container of a `torch.save` file: directory, entries, and a safe buffer.

A `.pt` file is a zip archive of stored (uncompressed) members: `<archive>/data.pkl`, the
pickle, and one `<archive>/data/<key>` member per tensor storage. `open_archive` reads the file
into private memory and parses the directory; `entry_bytes` returns a member as a zero-copy view
of that memory. The pickle itself is `tokenlake.read.pt.ptread`'s business.

The file is never memory-mapped: a mapped file that shrinks kills the process with SIGBUS on the
next access, and dumps are written in place. Reading costs one copy of the file (memory ≤ its
size). Compressed members (other zip tools; `torch.save` never compresses) are inflated straight
from that copy, each to at most its declared size, and all of them together to at most
`MAX_INFLATE_RATIO` times the file's size.
"""

from __future__ import annotations

import bz2
import io
import mmap
import os
import struct
import zipfile
import zlib
from collections.abc import Iterable
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

from tokenlake.errors import shown

_LOCAL_HEADER = b"PK\x03\x04"
_LOCAL_HEADER_SIZE = 30
# Compressed members may inflate to at most this many times the file's size, all together.
MAX_INFLATE_RATIO = 8
_READ_CHUNK = 1 << 26  # readinto in 64 MB pieces (one syscall per piece)
# Files up to this size are copied into a bytearray, from memory the allocator has at hand: a
# map of their own costs a system call, a page fault per 4 KiB and an unmap (a 140 kB rank file
# 110 us against 23, 1 MiB 600 us against 100, read in a loop).
HEAP_MAX = 4 << 20


class Corrupt(Exception):
    """The archive or pickle is malformed (becomes DumpFileError); `reason` is user text."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Changed(Corrupt):
    """The file changed size while it was read: it is being written or truncated right now."""


class Entry(NamedTuple):
    """One zip member: where its local header starts, its sizes and compression method."""

    header_offset: int
    file_size: int
    method: int  # zipfile.ZIP_STORED, ZIP_DEFLATED, ZIP_BZIP2, ...
    compress_size: int = 0

    @property
    def compressed(self) -> bool:
        return self.method != zipfile.ZIP_STORED


class Archive(NamedTuple):
    """An opened dump: its bytes (a private copy) and zip directory."""

    buf: Any  # anonymous mmap.mmap or bytearray; both export a writable buffer
    entries: dict[str, Entry]
    prefix: str  # "<archive>/" of the torch record names
    inflated: list[int]  # bytes inflated from compressed members so far (a one-item counter)


_EOCD = struct.Struct("<4sHHHHIIH")  # end of central directory record
# Central directory file header, only the fields read: signature, method, compressed and
# uncompressed sizes, the name's, extra field's and comment's lengths, local header offset.
_CENTRAL = struct.Struct("<4s6xH8xIIHHH8xI")
_ZIP32_MAX = 0xFFFFFFFF  # a size or offset of this value means its zip64 field holds it
_new_entry = partial(tuple.__new__, Entry)  # Entry(...) without its Python-level __new__


def _fast_directory(buf: Any) -> dict[str, Entry] | None:
    """Parse the central directory with `struct`, ~5x faster than `zipfile` on 4k entries.

    Returns None for anything unusual (zip64 sizes, more than 65534 entries, damage) so that
    `zipfile` handles it, or reports the damage.
    """
    end = buf.rfind(b"PK\x05\x06", max(0, len(buf) - _EOCD.size - 65535))
    if end < 0 or end + _EOCD.size > len(buf):
        return None
    count, cd_size, pos = _EOCD.unpack_from(buf, end)[4:7]
    if count == 0xFFFF or pos == _ZIP32_MAX or pos + cd_size > end:
        return None
    entries: dict[str, Entry] = {}
    unpack, fixed = _CENTRAL.unpack_from, _CENTRAL.size
    for _ in range(count):
        sig, method, packed, size, name_len, extra_len, comment_len, offset = unpack(buf, pos)
        if sig != b"PK\x01\x02" or _ZIP32_MAX in (packed, size, offset):
            return None
        name_end = pos + fixed + name_len
        name = buf[pos + fixed : name_end].decode("utf-8", "replace")
        entries[name] = _new_entry((offset, size, method, packed))
        pos = name_end + extra_len + comment_len
    return entries


def _slow_directory(buf: Any) -> dict[str, Entry]:
    """The directory through `zipfile` (zip64 and other rare layouts); copies the buffer."""
    with zipfile.ZipFile(io.BytesIO(buf)) as zf:
        return {
            i.filename: Entry(i.header_offset, i.file_size, i.compress_type, i.compress_size)
            for i in zf.infolist()
        }


def entry_bytes(archive: Archive, name: str, nbytes: int | None = None) -> Any:
    """Return entry `name` as a buffer: a zero-copy memoryview if stored, else inflated."""
    entry, data, size = _locate(archive, name, nbytes)
    if entry.compressed:  # torch.save never compresses; other zip tools may
        return _inflate(archive, entry, name, data, size)
    return memoryview(archive.buf)[data : data + size]


def stored_start(archive: Archive, name: str, nbytes: int) -> int | None:
    """Where the first `nbytes` of entry `name` begin in `archive.buf` when it is stored and
    they lie inside the file (a tensor's storage is read in place from there); else None, and
    `entry_bytes` inflates it or says what is wrong. Once per tensor storage: inline."""
    entry = archive.entries.get(name)
    if entry is None or entry.method != zipfile.ZIP_STORED or entry.file_size < nbytes:
        return None
    buf, start = archive.buf, entry.header_offset
    if start + _LOCAL_HEADER_SIZE > len(buf):
        return None
    sig, name_len, extra_len = _LOCAL.unpack_from(buf, start)
    data = start + _LOCAL_HEADER_SIZE + name_len + extra_len
    return data if sig == _LOCAL_HEADER and data + nbytes <= len(buf) else None


def _locate(archive: Archive, name: str, nbytes: int | None) -> tuple[Entry, int, int]:
    """A member's entry, where its data begins and the bytes wanted of it, all checked: a
    stored member's bytes lie inside the file."""
    entry = archive.entries.get(name)
    if entry is None:
        raise Corrupt(f"the zip archive has no entry `{shown(name, literal=False)}`")
    size = entry.file_size if nbytes is None else nbytes
    if entry.file_size < size:
        raise Corrupt(
            f"entry `{shown(name, literal=False)}` holds {entry.file_size} bytes;"
            f" its storage needs {size}"
        )
    data = _data_start(archive.buf, entry, name)
    if not entry.compressed and data + size > len(archive.buf):
        raise Corrupt(f"entry `{shown(name, literal=False)}` runs past the end of the file")
    return entry, data, size


_LOCAL = struct.Struct("<4s22xHH")  # local file header: signature, name and extra lengths


def _data_start(buf: Any, entry: Entry, name: str) -> int:
    """Where a member's data begins, after its local header."""
    start = entry.header_offset
    if start + _LOCAL_HEADER_SIZE > len(buf):
        raise Corrupt(f"entry `{shown(name, literal=False)}` has no valid local zip header")
    # torch pads the local header's extra field to align data, so it differs from the central one
    sig, name_len, extra_len = _LOCAL.unpack_from(buf, start)
    if sig != _LOCAL_HEADER:
        raise Corrupt(f"entry `{shown(name, literal=False)}` has no valid local zip header")
    return start + _LOCAL_HEADER_SIZE + name_len + extra_len


def _inflate(archive: Archive, entry: Entry, name: str, data: int, size: int) -> memoryview:
    """Decompress the first `size` bytes of a member, never producing more than that."""
    budget = MAX_INFLATE_RATIO * len(archive.buf) - archive.inflated[0]
    if entry.file_size > budget:
        raise Corrupt(
            f"entry `{shown(name, literal=False)}` would inflate to {entry.file_size} bytes,"
            f" more than {MAX_INFLATE_RATIO} times the file's size allows (a zip bomb)"
        )
    archive.inflated[0] += entry.file_size
    if entry.method == zipfile.ZIP_DEFLATED:
        inflater: Any = zlib.decompressobj(-15)
    elif entry.method == zipfile.ZIP_BZIP2:
        inflater = bz2.BZ2Decompressor()
    else:
        raise Corrupt(
            f"entry `{shown(name, literal=False)}` uses zip compression method {entry.method}"
        )
    packed = memoryview(archive.buf)[data : min(len(archive.buf), data + entry.compress_size)]
    try:
        out = inflater.decompress(packed, size)  # max_length: a bomb stops at `size` bytes
    except (zlib.error, OSError, EOFError, ValueError) as exc:
        raise Corrupt(
            f"entry `{shown(name, literal=False)}` cannot be decompressed ({exc})"
        ) from exc
    if len(out) != size:
        raise Corrupt(
            f"entry `{shown(name, literal=False)}` decompresses to fewer than its {size} bytes"
        )
    return memoryview(bytearray(out))


def _find_prefix(names: Iterable[str]) -> str:
    """The `<archive>/` folder that holds `data.pkl` (torch names it after the file)."""
    for name in names:
        if name == "data.pkl" or (name.endswith("/data.pkl") and name.count("/") == 1):
            return name[: -len("data.pkl")]
    raise Corrupt("the zip archive has no `data.pkl` entry, so `torch.save` did not write it")


def _read_buffer(path: Path, size: int, fresh: bool) -> Any:
    """Read the whole file into private memory (never a file mapping: see the module doc).

    Large old files go into an anonymous memory map (page-aligned, returned to the system when
    freed); fresh ones, and files of at most `HEAP_MAX` bytes, into a bytearray. A file whose
    size differs from `size` before or after the read is being written or truncated right now:
    `Changed`.
    """
    with open(path, "rb") as f:
        buf: Any = bytearray(size) if fresh or size <= HEAP_MAX else _anonymous(size)
        view, got = memoryview(buf), 0
        while got < size:
            n = f.readinto(view[got : got + _READ_CHUNK])
            if not n:
                break
            got += n
        view.release()
        now = os.fstat(f.fileno()).st_size
    if got != size or now != size:
        raise Changed(
            f"the file changed size while it was read ({size} bytes when opened, {now} after)"
        )
    return buf


def _anonymous(size: int) -> mmap.mmap:
    """Private anonymous memory, released to the system when freed.

    MAP_PRIVATE, not `mmap`'s default MAP_SHARED: shared anonymous memory is shmem, whose pages
    cost more to fault in. No MADV_HUGEPAGE: in an extraction (memory fragmented by the other
    stages) the kernel compacts memory to find huge pages, and reading the `bench` dump took
    0.6 CPU-seconds with ordinary pages, 0.8 with shmem and 0.95-1.6 with huge pages.
    MAP_POPULATE: the whole file is copied in at once, so the kernel maps every page in one
    call instead of one fault per 4 KiB page (a 6.7 MB rank file read 3.6 -> 3.0 ms).
    """
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
    return mmap.mmap(-1, size, flags=flags)


def _directory(buf: Any) -> dict[str, Entry]:
    """The zip directory, with a message that says why when there is none."""
    try:
        return _fast_directory(buf) or _slow_directory(buf)
    except (zipfile.BadZipFile, struct.error, OSError, ValueError, EOFError) as exc:
        if buf[:4] == _LOCAL_HEADER:
            raise Corrupt(
                "the zip archive is incomplete (no central directory at its end), so the"
                " file is truncated"
            ) from exc
        raise Corrupt("it is not a zip archive, so `torch.save` did not write it") from exc


def open_archive(path: Path, size: int, fresh: bool) -> Archive:
    """Open the zip directory and check that this is a little-endian torch archive."""
    buf = _read_buffer(path, size, fresh)
    entries = _directory(buf)
    archive = Archive(buf, entries, _find_prefix(entries), [0])
    order_name = archive.prefix + "byteorder"
    if order_name in entries:  # absent in files from torch < 1.13: little-endian
        order = bytes(entry_bytes(archive, order_name)).decode("ascii", "replace")
        if order != "little":
            raise BigEndian(order)
    return archive


class BigEndian(Exception):
    """The file was written on a big-endian machine; not a sign of an unfinished write."""
