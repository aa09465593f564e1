"""The zip container of a `torch.save` file: directory, entries, and a safe buffer.

A `.pt` file is a zip archive of stored (uncompressed) members: `<archive>/data.pkl`, the
pickle, and one `<archive>/data/<key>` member per tensor storage. `open_archive` maps the file
(or copies it while it may still be written) and parses the directory; `entry_bytes` returns a
member as a zero-copy view. The pickle itself is `pipeline.ptread`'s business.
"""

from __future__ import annotations

import io
import mmap
import struct
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

_LOCAL_HEADER = b"PK\x03\x04"
_LOCAL_HEADER_SIZE = 30


class Corrupt(Exception):
    """The archive or pickle is malformed (becomes DumpFileError); `reason` is user text."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Entry(NamedTuple):
    """One zip member: where its local header starts, its sizes and compression."""

    header_offset: int
    file_size: int
    compressed: bool


class Archive(NamedTuple):
    """An opened dump: its bytes (a private memory map or a copy) and zip directory."""

    buf: Any  # mmap.mmap or bytearray; both export a writable buffer
    entries: dict[str, Entry]
    prefix: str  # "<archive>/" of the torch record names


_EOCD = struct.Struct("<4sHHHHIIH")  # end of central directory record
_CENTRAL = struct.Struct("<4s6H3I5H2I")  # central directory file header


def _fast_directory(buf: Any) -> dict[str, Entry] | None:
    """Parse the central directory with `struct`, ~5x faster than `zipfile` on 4k entries.

    Returns None for anything unusual (zip64 sizes, more than 65534 entries, damage) so that
    `zipfile` handles it, or reports the damage.
    """
    end = buf.rfind(b"PK\x05\x06", max(0, len(buf) - _EOCD.size - 65535))
    if end < 0 or end + _EOCD.size > len(buf):
        return None
    count, cd_size, pos = _EOCD.unpack_from(buf, end)[4:7]
    if count == 0xFFFF or pos == 0xFFFFFFFF or pos + cd_size > end:
        return None
    entries: dict[str, Entry] = {}
    for _ in range(count):
        row = _CENTRAL.unpack_from(buf, pos)
        if row[0] != b"PK\x01\x02" or 0xFFFFFFFF in (row[8], row[9], row[16]):
            return None
        name_end = pos + _CENTRAL.size + row[10]
        name = bytes(buf[pos + _CENTRAL.size : name_end]).decode("utf-8", "replace")
        entries[name] = Entry(row[16], row[9], row[4] != zipfile.ZIP_STORED)
        pos = name_end + row[11] + row[12]
    return entries


def _slow_directory(buf: Any) -> dict[str, Entry]:
    """The directory through `zipfile` (zip64 and other rare layouts); copies the buffer."""
    with zipfile.ZipFile(io.BytesIO(buf)) as zf:
        return {
            i.filename: Entry(i.header_offset, i.file_size, i.compress_type != zipfile.ZIP_STORED)
            for i in zf.infolist()
        }


def entry_bytes(archive: Archive, name: str, nbytes: int | None = None) -> Any:
    """Return entry `name` as a buffer: a zero-copy memoryview if stored, else decompressed."""
    entry = archive.entries.get(name)
    if entry is None:
        raise Corrupt(f"the zip archive has no entry `{name}`")
    size = entry.file_size if nbytes is None else nbytes
    if entry.file_size < size:
        raise Corrupt(f"entry `{name}` holds {entry.file_size} bytes; its storage needs {size}")
    if entry.compressed:  # torch.save never compresses; other zip tools may
        with zipfile.ZipFile(io.BytesIO(archive.buf)) as zf:
            return memoryview(bytearray(zf.read(name)))[:size]
    buf, start = archive.buf, entry.header_offset
    if buf[start : start + 4] != _LOCAL_HEADER:
        raise Corrupt(f"entry `{name}` has no valid local zip header")
    # torch pads the local header's extra field to align data, so it differs from the central one
    name_len, extra_len = struct.unpack_from("<HH", buf, start + 26)
    data = start + _LOCAL_HEADER_SIZE + name_len + extra_len
    if data + size > len(buf):
        raise Corrupt(f"entry `{name}` runs past the end of the file")
    return memoryview(buf)[data : data + size]


def _find_prefix(names: Iterable[str]) -> str:
    """The `<archive>/` folder that holds `data.pkl` (torch names it after the file)."""
    for name in names:
        if name == "data.pkl" or (name.endswith("/data.pkl") and name.count("/") == 1):
            return name[: -len("data.pkl")]
    raise Corrupt("the zip archive has no `data.pkl` entry, so `torch.save` did not write it")


def _read_buffer(path: Path, size: int, fresh: bool) -> Any:
    """Map the file, or copy it when fresh.

    A memory map of a file that is truncated while mapped kills the process with SIGBUS on
    access, and a file still being written may be rewritten; a private copy is safe then.
    ACCESS_COPY (MAP_PRIVATE) makes arrays writable without ever writing to the file.
    """
    with open(path, "rb") as f:
        if fresh:
            buf = bytearray(size)
            got = f.readinto(buf)
            return buf[:got] if got < size else buf
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)


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
    archive = Archive(buf, entries, _find_prefix(entries))
    order_name = archive.prefix + "byteorder"
    if order_name in entries:  # absent in files from torch < 1.13: little-endian
        order = bytes(entry_bytes(archive, order_name)).decode("ascii", "replace")
        if order != "little":
            raise BigEndian(order)
    return archive


class BigEndian(Exception):
    """The file was written on a big-endian machine; not a sign of an unfinished write."""
