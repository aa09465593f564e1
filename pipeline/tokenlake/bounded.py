"""Bounded reads of the files tokenlake reads whole or line by line: dump sidecars (trajectory,
tokenizer, dashboard), run manifests, `--meta` tag files. Every byte of them, and what kind
of file they are, is attacker-controlled.

- `read_file` returns the bytes of a regular file of at most a stated number of bytes. A
  FIFO, a device, a socket or a directory is refused before it is read and without blocking
  (checked by `stat`, opened with `O_NONBLOCK`, checked again by `fstat` on what was opened);
  where tokenlake wrote the file itself (a manifest), a symbolic link is refused too.
- `json_depth` finds how deeply JSON text nests, so that a parser never recurses into
  200 000 open brackets (`RecursionError`); `loads` refuses JSON beyond a stated depth.
- `lines` yields the lines of a byte range, each at most a stated length: a longer one is
  skipped chunk by chunk, never buffered.

Every refusal is a `BoundedReadError` naming the file and, for a file too large, its size and
the limit.
"""

from __future__ import annotations

import errno
import io
import json
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenlake.errors import BoundedReadError, DumpFormatError, UnreadableError, shown

MiB = 1 << 20
READ_CHUNK = MiB  # bytes read at a time by `lines`
_DEPTH_CHUNK = 256 << 10  # bytes scanned at a time by `json_depth`: ~10 MB of numpy temporaries
_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def amount(size: int) -> str:
    """A limit as the docs state it.

    Examples:
        >>> amount(64 << 20), amount(1 << 30), amount(1000)
        ('64 MiB', '1 GiB', '1,000 bytes')
    """
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift} {unit}"
    return f"{size:,} bytes"


def kind_of(mode: int) -> str | None:
    """`a FIFO (named pipe)`, `a directory`, ... for a mode that is not a regular file's."""
    for test, kind in _KINDS:
        if test(mode):
            return kind
    return None if stat.S_ISREG(mode) else "not a regular file"


def linked_out(path: Path | str, root: Path) -> str | None:
    """Why a file of the dump `root` reached through a symbolic link that leads out
    of it (the file is a link, or a folder on its way) is not read, or None. Links within the
    dump are followed; one out of it would let a dump read any file its reader may (another
    run's steps, a private file). A missing file is None: opening it says so."""
    if _no_link_below(Path(path), root):
        return None  # the common case: an lstat per folder below the dump, nothing resolved
    try:
        target = Path(path).resolve(strict=True)
    except FileNotFoundError:
        return None
    except (OSError, RuntimeError):  # a loop of links
        return "is a symbolic link that does not resolve (a loop?)"
    if target.is_relative_to(root.resolve()):
        return None
    return f"is a symbolic link out of the dump (to `{target}`); tokenlake never follows one"


def _no_link_below(path: Path, root: Path) -> bool:
    """Whether `path` is written under `root` with no symbolic link on its way down from it."""
    try:
        relative = path.relative_to(root)
    except ValueError:
        return False
    current = root
    for part in relative.parts:
        current = current / part
        if current.is_symlink():
            return False
    return True


def open_regular(
    path: Path | str, *, follow: bool = True, within: Path | None = None
) -> io.BufferedReader:
    """`path` opened for reading, if it is a regular file (a symbolic link to one unless
    `follow` is False, and only to one inside the dump `within` when given); never blocks on
    a FIFO and never opens a device."""
    try:
        mode = os.stat(path, follow_symlinks=follow).st_mode
    except OSError as exc:
        raise _unreadable(path, exc) from exc
    if stat.S_ISLNK(mode):
        raise BoundedReadError(path, "is a symbolic link; tokenlake reads only a file it wrote")
    _require_regular(path, mode)
    outside = None if within is None else linked_out(path, within)
    if outside is not None:
        raise BoundedReadError(path, outside)
    nofollow = 0 if follow else os.O_NOFOLLOW
    try:  # O_NONBLOCK: a file swapped for a FIFO since the stat must not block the open
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | nofollow)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow:
            raise BoundedReadError(
                path, "is a symbolic link; tokenlake reads only a file it wrote"
            ) from exc
        raise _unreadable(path, exc) from exc
    try:
        _require_regular(path, os.fstat(descriptor).st_mode)
    except BaseException:
        os.close(descriptor)
        raise
    return os.fdopen(descriptor, "rb")


def _require_regular(path: Path | str, mode: int) -> None:
    kind = kind_of(mode)
    if kind is not None:
        raise BoundedReadError(path, f"is {kind}, not a regular file")


def _unreadable(path: Path | str, exc: OSError) -> BoundedReadError:
    return UnreadableError(path, exc)


def too_large(path: Path | str, size: int, limit: int, what: str) -> BoundedReadError:
    """The refusal of a file of `size` bytes over its `limit` (`what`: `a run manifest`)."""
    return BoundedReadError(
        path, f"is {size:,} bytes; {what} may be at most {amount(limit)}", size=size, limit=limit
    )


def read_file(
    path: Path | str, limit: int, what: str, *, follow: bool = True, within: Path | None = None
) -> bytes:
    """The whole content of a regular file of at most `limit` bytes (memory: its size).

    Args:
        what: The kind of file, as messages name it (`a run manifest`).
        follow: Whether a symbolic link to a regular file is read (False where tokenlake
            wrote the file itself).
        within: The dump the file belongs to: a link out of it is refused.

    Raises:
        BoundedReadError: Not a regular file, unreadable, or larger than `limit` (also when
            it grows past `limit` while it is read).
    """
    with open_regular(path, follow=follow, within=within) as handle:
        size = os.fstat(handle.fileno()).st_size
        if size > limit:
            raise too_large(path, size, limit, what)
        try:
            data = handle.read(limit + 1)
        except OSError as exc:
            raise _unreadable(path, exc) from exc
    if len(data) > limit:
        raise too_large(path, len(data), limit, what)
    return data


class JsonTooDeep(ValueError):
    """JSON text nested deeper than its stated limit (refused before it is parsed)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(f"nested more than {limit} levels deep")


class JsonTooWide(ValueError):
    """JSON text holding more containers and strings than its bytes allow (refused before it
    is parsed): each becomes a Python object of ~50-70 bytes, so `[{}, {}, ...]` would take
    ~20 x its text."""

    def __init__(self, objects: int, size: int) -> None:
        self.objects, self.size = objects, size
        super().__init__(
            f"holds {objects:,} containers and strings in {size:,} bytes, more than one per"
            f" {BYTES_PER_JSON_OBJECT} bytes (parsed, each takes ~64 bytes)"
        )


# With `wide=False`, `loads` allows one container or string per this many bytes of text (and
# JSON_OBJECTS_FLOOR more): their Python objects then take at most ~2 x the text, and the rest
# (numbers) at most ~9 x (`[0.1,0.1,...]`; real logged values ~3-6 x, docs/security.md).
BYTES_PER_JSON_OBJECT = 32
JSON_OBJECTS_FLOOR = 1024


def loads(
    data: bytes | str,
    max_depth: int,
    wide: bool = True,
    shape: JsonShape | None = None,
    **options: Any,
) -> Any:
    """`json.loads(data, **options)`, refusing JSON nested deeper than `max_depth` first, and
    with `wide=False` JSON of more containers and strings than `BYTES_PER_JSON_OBJECT` allows.

    Raises:
        JsonTooDeep: Nested deeper than `max_depth` (a ValueError, as json's own errors).
        JsonTooWide: Too many containers and strings for its bytes (a ValueError too).

    `shape`, when given, is the `json_shape` (or `json_layout`) of `data`, found already.
        ValueError: Not JSON (`json.JSONDecodeError`, `UnicodeDecodeError`).

    Examples:
        >>> loads(b'{"a": [1, "]]]"]}', 2)
        {'a': [1, ']]]']}
        >>> loads("[" * 200_000, 64)
        Traceback (most recent call last):
        ...
        tokenlake.bounded.JsonTooDeep: nested more than 64 levels deep
    """
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    shape = json_shape(raw, max_depth) if shape is None else shape
    if shape.depth > max_depth:
        raise JsonTooDeep(max_depth)
    if not wide and too_wide(shape, len(raw)):
        raise JsonTooWide(shape.objects, len(raw))
    try:
        return json.loads(data, **options)
    except RecursionError:  # below max_depth but deeper than this thread's stack allows
        raise JsonTooDeep(max_depth) from None


def too_wide(shape: JsonShape, size: int) -> bool:
    """Whether JSON text of `size` bytes holds more containers and strings than
    `loads(wide=False)` allows."""
    return shape.objects > size // BYTES_PER_JSON_OBJECT + JSON_OBJECTS_FLOOR


@dataclass(frozen=True)
class JsonShape:
    """What a JSON text's bytes say of its parse: its deepest nesting, and how many containers
    and strings (Python objects beyond numbers) it holds."""

    depth: int
    objects: int


def json_object_line(
    path: Path, raw: bytes, label: str, max_depth: int, shape: JsonShape | None = None
) -> dict[str, Any]:
    """One line of a framework's JSON-lines log (NeMo-RL's batches, prime-rl's exports) as a
    JSON object: nested at most `max_depth` deep, and at most one container or string per 32
    bytes, both counted before it is parsed (`loads(wide=False)`); `shape` is the line's, if found already.

    Raises:
        DumpFormatError: Naming the file and the line (`label`): not UTF-8, not JSON, too
            deep or too wide, or not an object.
    """
    try:
        record = loads(raw, max_depth, wide=False, shape=shape)
    except JsonTooWide as exc:  # `[{}, {}, ...]`: ~20 x the line once parsed
        raise DumpFormatError(path, str(exc), sample=label) from None
    except UnicodeDecodeError as exc:
        raise DumpFormatError(
            path, f"byte {exc.start + 1} of the line is not UTF-8", sample=label
        ) from None
    except ValueError as exc:  # not JSON, or nested too deep
        raise DumpFormatError(path, f"is not JSON ({shown(str(exc))})", sample=label) from None
    if not isinstance(record, dict):
        raise DumpFormatError(path, f"is {shown(record)}, not a JSON object", sample=label)
    return record


def json_depth(data: bytes, stop: int | None = None) -> int:
    """The deepest nesting of JSON text (`json_shape`)."""
    return json_shape(data, stop).depth


def json_shape(data: bytes, stop: int | None = None) -> JsonShape:
    """The deepest nesting of `[`/`{` in JSON text, brackets inside strings not counted, and
    its containers and strings; the scan ends early once the depth passes `stop`. Vectorised:
    ~0.9 GB/s for lines of long number lists, ~130 MB/s for text full of strings and
    backslashes (measured on a busy 2-core machine).

    Exact for valid JSON, and for any text up to where a JSON parser would stop, so a parser
    never nests deeper than this says.

    Examples:
        >>> json_depth(b'[{"a": "[[[\\\\"[["}, [[]]]')
        3
        >>> json_shape(b'[{}, "a,b", 1, {"k": ["[", 2]}]')
        JsonShape(depth=3, objects=7)
    """
    if len(data) <= SMALL_JSON:
        return _small_json_shape(data)
    return _vectorised_json_shape(data, stop)


def json_layout(data: bytes, flat_lists: list[tuple[int, int]]) -> JsonShape:
    """`json_shape(data)` (the whole text, scanned as a long one is), and in the same pass
    each flat list outside strings appended to `flat_lists`: the offsets of its `[` and
    its `]`, with no bracket, brace, quote or backslash between them (a list of numbers,
    `true`, `false` and `null`, if the text is JSON)."""
    return _vectorised_json_shape(data, None, flat_lists)


def _vectorised_json_shape(
    data: bytes, stop: int | None, flat_lists: list[tuple[int, int]] | None = None
) -> JsonShape:
    import numpy as np

    depth = deepest = objects = 0
    in_string, escaping = False, False
    open_before = -1  # where the previous chunk ended on a `[` outside strings
    for begin in range(0, len(data), _DEPTH_CHUNK):
        piece = data[begin : begin + _DEPTH_CHUNK]
        codes = np.frombuffer(piece, np.uint8)
        # a few vectorised passes over the bytes mark the structural ones; every later step
        # is per structural byte (a tenth of real JSON, a few dozen in a line of long number
        # lists)
        kept = _structural(codes)
        if escaping or b"\\" in piece:
            escaped, escaping = _escaped(codes, escaping)
            kept &= ~escaped
        offsets = np.flatnonzero(kept)
        chunk = codes[offsets]
        if b"|" in piece:  # `|` stands between `{` and `}`: marked too, but not structural
            offsets, chunk = offsets[chunk != ord("|")], chunk[chunk != ord("|")]
        quotes = chunk == ord('"')
        inside = (np.cumsum(quotes, dtype=np.int32) + in_string) % 2 == 1
        opens = ((chunk == ord("[")) | (chunk == ord("{"))) & ~inside
        closes = ((chunk == ord("]")) | (chunk == ord("}"))) & ~inside
        if flat_lists is not None and len(chunk):
            open_before = _flat_lists(chunk, inside, offsets + begin, open_before, flat_lists)
        # a container per opening bracket, a string per opening quote
        objects += int(opens.sum()) + int((quotes & inside).sum())
        steps = opens.astype(np.int32) - closes.astype(np.int32)
        levels = np.cumsum(steps, dtype=np.int32)
        if len(levels):
            deepest = max(deepest, depth + int(levels.max()))
            depth, in_string = depth + int(levels[-1]), bool(inside[-1])
        if stop is not None and deepest > stop:
            break
    return JsonShape(deepest, objects)


def _structural(codes: Any) -> Any:
    """Which bytes are `[`, `]`, `{`, `}`, `"`, `\\` (the only ones that change string or
    nesting state) or `|`: `[\\]` are 0x5B-0x5D and `{|}` 0x7B-0x7D, one bit apart, so one OR
    folds the first onto the second and a subtraction tells the three (~0.3 ns a byte, a
    `bytes.translate` table ~0.7)."""
    import numpy as np

    folded = codes | np.uint8(0x20)
    folded -= np.uint8(ord("{"))  # 0, 1, 2 for `{|}`; every other byte wraps past 2
    kept = folded <= 2
    kept |= codes == ord('"')
    return kept


# Up to this many bytes, JSON's shape is scanned by a regex (one chunk of the vectorised scan,
# which then reads it all, `stop` or not: the same answer): a manifest or a sidecar is read
# without importing numpy (~0.1 s of a command's CPU). Measured: 0.24 ms for a 10 kB manifest
# (the vectorised scan 1 ms), 77 ms at worst (256 KiB of brackets; vectorised 38 ms).
SMALL_JSON = _DEPTH_CHUNK
# A backslash with the byte it escapes, or a byte that changes string or nesting state.
_STRUCTURAL = re.compile(rb'\\.|["\[\]{}]', re.DOTALL)


def _small_json_shape(data: bytes) -> JsonShape:
    depth = deepest = objects = 0
    in_string = False
    for token in _STRUCTURAL.findall(data):
        if token == b'"':
            in_string = not in_string
            objects += in_string  # a string per opening quote
        elif in_string or len(token) == 2:  # inside a string, or an escaped byte
            continue
        elif token in (b"[", b"{"):
            depth += 1
            objects += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return JsonShape(deepest, objects)


def _flat_lists(
    chunk: Any, inside: Any, offsets: Any, open_before: int, found: list[tuple[int, int]]
) -> int:
    """Appends to `found` each `[` outside strings whose next structural byte is a `]`
    outside strings (offsets in the text); returns where the chunk ends on such a `[`, or
    -1. `chunk` holds a chunk's structural bytes, `inside` whether each is in a string."""
    import numpy as np

    bracket = (chunk == ord("[")) & ~inside
    closing = (chunk == ord("]")) & ~inside
    if open_before >= 0 and closing[0]:
        found.append((open_before, int(offsets[0])))
    pairs = np.flatnonzero(bracket[:-1] & closing[1:])
    found.extend(zip(offsets[pairs].tolist(), offsets[pairs + 1].tolist(), strict=True))
    return int(offsets[-1]) if bracket[-1] else -1


def _escaped(chunk: Any, escaping: bool) -> tuple[Any, bool]:
    """Which bytes of `chunk` a backslash escapes (the byte after an odd run of backslashes),
    given whether the previous chunk ended escaping; and whether this one does."""
    import numpy as np

    backslash = (chunk == ord("\\")).view(np.int8)
    edges = np.flatnonzero(np.diff(backslash, prepend=np.int8(0), append=np.int8(0)))
    starts, ends = edges[0::2], edges[1::2]  # each run of backslashes: [start, end)
    lengths = ends - starts
    if len(starts) and starts[0] == 0:
        lengths[0] += escaping
    odd = lengths % 2 == 1
    escaped = np.zeros(len(chunk), bool)
    escaped[ends[odd & (ends < len(chunk))]] = True
    if escaping and not (len(starts) and starts[0] == 0):
        escaped[0] = True  # the previous chunk ended on an odd run
    return escaped, bool(len(ends) and ends[-1] == len(chunk) and odd[-1])


@dataclass(frozen=True)
class Line:
    """One line of a file: where it starts, where the next begins, and its bytes."""

    start: int
    end: int  # just after its newline; for a last piece without one, the end of the range
    text: bytes | None  # None: longer than the cap, skipped unread
    complete: bool  # it ends with a newline (a last piece without one may still be written)


def lines(
    handle: io.BufferedIOBase, start: int, end: int, max_line: int, *, inside_long: bool = False
) -> Iterator[Line]:
    """The lines of bytes [start, end) of `handle` (newline not included), then the piece
    after the last newline, if any, with `complete` False.

    A line longer than `max_line` bytes comes with `text` None: it is skipped chunk by chunk,
    never buffered, so memory stays below `READ_CHUNK + max_line` whatever the file holds;
    the holes of a sparse file (zeros never written) are skipped without reading them.
    With `inside_long`, the range starts inside such a line (skipped on an earlier read): its
    rest comes as a first line with `text` None.
    """
    handle.seek(start)
    # One buffer for the whole read, reused: the file is read into it and each line copied
    # out once (chunks concatenated would copy each byte twice more and fault in fresh pages;
    # bytes concatenated would copy a long line once per chunk).
    buffer = bytearray(min(READ_CHUNK, max(end - start, 0)))
    view = memoryview(buffer)
    first = held = 0  # view[first:held]: read, not yet yielded (the start of a line)
    offset = line_start = position = start  # offset: where in the file view[0] was read from
    oversize = inside_long
    while position < end:
        # inside a skipped line: a sparse file's holes hold no newline
        if oversize and first == held:
            position = offset = _after_hole(handle, position, end)
            first = held = 0
            if position >= end:
                break
        want = min(READ_CHUNK, end - position)
        if held + want > len(view):
            view = _room(buffer, view, first, held, want)
            offset, first, held = offset + first, 0, held - first
        got = handle.readinto(view[held : held + want])
        if not got:
            break
        position += got
        searched, held = held, held + got  # what was held before holds no newline
        while (newline := buffer.find(b"\n", max(first, searched), held)) >= 0:
            after = offset + newline + 1
            long = oversize or newline - first > max_line
            yield Line(line_start, after, None if long else bytes(view[first:newline]), True)
            first, line_start, oversize = newline + 1, after, False
        if held - first > max_line:
            oversize = True
        if oversize or first == held:  # nothing worth keeping: the next read starts at view[0]
            offset, first, held = position, 0, 0
    if oversize or held > first:
        yield Line(line_start, position, None if oversize else bytes(view[first:held]), False)


def _room(buffer: bytearray, view: memoryview, first: int, held: int, want: int) -> memoryview:
    """`buffer[first:held]` moved to its start, and the buffer grown (in place, as far as it
    must: never past the longest line kept and a chunk) to hold `want` more bytes after it;
    returns a view of it."""
    kept = held - first
    view[:kept] = view[first:held]  # overlapping: copied as by memmove
    if kept + want > len(buffer):
        view.release()  # a bytearray with a view cannot be resized
        buffer.extend(bytes(kept + want - len(buffer)))
        view = memoryview(buffer)
    return view


def _after_hole(handle: io.BufferedIOBase, position: int, end: int) -> int:
    """Where the next written data of the file starts at or after `position` (at most
    `end`); `position` itself where the file system cannot say. The handle is moved there."""
    try:
        after = min(os.lseek(handle.fileno(), position, os.SEEK_DATA), end)
    except OSError as exc:  # ENXIO: only a hole follows; EINVAL: no SEEK_DATA here
        after = end if exc.errno == errno.ENXIO else position
    handle.seek(after)
    return after
