"""The one reader of the lake's own Parquet files (a step's tables, its rollups, a run's side
tables), for every store: what each caller does with an unreadable file differs (verify names
it, a rebuild skips the step), the reading itself does not.

A file is decoded only within a bound (docs/security.md, "Size bounds for every file read"):
anyone who can write into the lake can write a few kilobytes whose pages decode to gigabytes
(a dictionary of 1 MiB strings taken once per row, a footer declaring 10^9 rows). Before any
page is decoded, the footer's row counts and column sizes give what the file decodes to; its
dictionary-encoded strings are read as dictionaries (their bytes, one index per row), and only
expanded once their expanded size is known to be within the bound too.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from tokenlake.bounded import MiB, amount
from tokenlake.errors import REFUSALS, LakeError, UnreadableError
from tokenlake.store.base import Store

if TYPE_CHECKING:  # imported where a file is decoded: the manifest's checks need neither
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

# A lake file decodes to at most this many times its bytes, plus DECODED_FLOOR. tokenlake's own
# files decode to at most 18.9x on the bench lake (mostly-NULL columns: a run-length validity
# bitmap on disk, 8 bytes a row in memory), docs/security.md.
DECODED_PER_FILE_BYTE = 64
DECODED_FLOOR = 64 * MiB
# Bytes a decoded value of each fixed-width Parquet type takes (BOOLEAN: a byte, generously).
_FIXED_WIDTHS = {"BOOLEAN": 1, "INT32": 4, "INT64": 8, "INT96": 12, "FLOAT": 4, "DOUBLE": 8}
# Per value of any column: an offset or a validity bit, and its levels while decoding.
_PER_VALUE_OVERHEAD = 8


class UnreadableLakeFile(LakeError):
    """A lake file pyarrow cannot read: truncated, another program's bytes, not a regular file,
    an OS error (`cause`), or more than it may decode to (`reason` is what the reader said)."""

    def __init__(self, url: str, reason: str, cause: Exception | None = None) -> None:
        self.reason = reason
        self.cause = cause
        super().__init__(url, f"cannot be read ({reason})")

    def refusal(self, name: str) -> str | None:
        """The OS's refusal of the file `name` as one line with its fix (never "delete it":
        its content is not at fault), or None when the OS did not refuse it."""
        if isinstance(self.cause, OSError) and self.cause.errno in REFUSALS:
            return str(UnreadableError(name, self.cause))
        return None


def decoded_bound(file_bytes: int) -> int:
    """The most bytes a lake file of `file_bytes` bytes may decode to.

    Examples:
        >>> decoded_bound(4_901)
        67422528
    """
    return DECODED_PER_FILE_BYTE * file_bytes + DECODED_FLOOR


def read_table(store: Store, name: str, max_rows: int | None = None) -> pa.Table:
    """The lake file `name` (as a manifest lists it) as one Arrow table, decoded only within
    `decoded_bound` of its size.

    Args:
        max_rows: The most rows the file may hold (what its manifest recorded), if known.

    Raises:
        UnreadableLakeFile: The file cannot be read as Parquet, or holds more rows than
            `max_rows`, or would decode to more than its bound.
    """
    return _read(store, name, max_rows, None)[1]


def read_rows(store: Store, name: str, limit: int) -> list[dict[str, Any]]:
    """The first `limit` rows of the lake file `name` as dicts of Python values, read within
    the same bound as `read_table`: what a caller that wants a row's values reads. Its
    dictionary strings give their values as they are, without the cast to the declared
    schema (which imports pyarrow.compute, ~40 ms, for the same values).

    Raises:
        UnreadableLakeFile: As `read_table`.
    """
    return _read(store, name, None, None, decode=False)[1].slice(0, limit).to_pylist()


def read_columns(store: Store, name: str, columns: Sequence[str]) -> tuple[pa.Schema, pa.Table]:
    """The columns the lake file `name` declares, and the rows of those of `columns` it holds
    (the others' pages are not decoded), within the same bound as `read_table`: what a check
    that needs a few columns of a file reads.

    Raises:
        UnreadableLakeFile: As `read_table`.
    """
    return _read(store, name, None, columns)


# A lake file of at most this many bytes is decoded from its bytes, read at once: pyarrow
# reads a Python file object in many small calls, which cost more than the decoding itself.
_READ_WHOLE_BYTES = 4 * MiB
# A file of at most this many bytes is read whole for its footer identity too: one read
# instead of two (its tail, then its footer), and its bytes kept for its rows.
_IDENTITY_WHOLE_BYTES = 64 * 1024


class LakeFile:
    """A lake file opened once for every check of it: its identity (`identity_change`) and its
    rows (`read_columns`, `read_table`) come from the same open file, and a local lake's file
    is reached by one walk that refuses links (`LocalStore.open_listed`).

    `open` gives None where `store.exists` is False; use it as a context manager.
    """

    def __init__(
        self, store: Store, name: str, descriptor: int | None = None, size: int = 0
    ) -> None:
        self.store = store
        self.name = name
        self._descriptor = descriptor  # None: each read opens the file afresh (object store)
        self._size = size  # as the descriptor was opened
        self._whole: bytes | None = None  # its bytes, once read whole
        self._refused: OSError | None = None  # the OS refused to open it: raised when read
        self._identity: str | None = None  # its footer identity, once read

    @classmethod
    def open(cls, store: Store, name: str) -> LakeFile | None:
        """The lake file `name`, or None when there is none (not a regular file).

        Raises:
            LakeError: A link is on its way, or it lies outside the lake.
        """
        from tokenlake.store.local import LocalStore

        if not isinstance(store, LocalStore):
            return cls(store, name) if store.exists(name) else None
        try:
            opened = store.open_listed(name)
        except OSError as exc:  # named by every read of it, as `_open` would have
            lake_file = cls(store, name)
            lake_file._refused = exc
            return lake_file
        return None if opened is None else cls(store, name, *opened)

    def __enter__(self) -> LakeFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._descriptor is not None:
            os.close(self._descriptor)
            self._descriptor = None

    def identity_change(self, recorded: str) -> str | None:
        """As `identity_change` of the module (the footer read once for every comparison)."""
        if self._identity is None:
            self._identity = self._footer_identity()
        return _change(self._identity, recorded)

    def _footer_identity(self) -> str:
        try:
            if self._refused is not None:
                raise self._refused
            if self._descriptor is None:
                with _open(self.store, self.name) as handle:
                    found = _identity_of(handle)
            else:
                whole = self._whole_bytes(_IDENTITY_WHOLE_BYTES)
                if whole is None:
                    found = _identity_at(self._descriptor)
                else:
                    found = _identity(len(whole), lambda at, length: whole[at : at + length])
        except _Refused as exc:
            raise UnreadableLakeFile(self.store.url(self.name), str(exc)) from exc
        except OSError as exc:
            raise UnreadableLakeFile(self.store.url(self.name), str(exc), exc) from exc
        return found

    def contents(self) -> bytes | None:
        """The local file's whole bytes as opened, read once and kept for its other checks;
        None for a file of more than 4 MiB, one on an object store, or one that cannot be read
        (its reads name why)."""
        if self._descriptor is None:
            return None
        try:
            return self._whole_bytes(_READ_WHOLE_BYTES)
        except OSError:
            return None

    def read_columns(self, columns: Sequence[str]) -> tuple[pa.Schema, pa.Table]:
        """As `read_columns` of the module."""
        return self._read(None, columns)

    def read_table(self, max_rows: int | None = None) -> pa.Table:
        """As `read_table` of the module."""
        return self._read(max_rows, None)[1]

    def _read(
        self, max_rows: int | None, columns: Sequence[str] | None
    ) -> tuple[pa.Schema, pa.Table]:
        import pyarrow as pa

        try:
            if self._refused is not None:
                raise self._refused
            if self._descriptor is None:
                with _open(self.store, self.name) as handle:
                    return _bounded_read(handle, max_rows, columns)
            data = self._whole_bytes(_READ_WHOLE_BYTES)
            if data is not None:
                return _bounded_read(pa.BufferReader(data), max_rows, columns, in_memory=True)
            with open(self._descriptor, "rb", closefd=False) as handle:
                return _bounded_read(handle, max_rows, columns)
        except _Refused as exc:
            raise UnreadableLakeFile(self.store.url(self.name), str(exc)) from exc
        except (OSError, pa.ArrowException) as exc:
            raise UnreadableLakeFile(self.store.url(self.name), str(exc), exc) from exc

    def _whole_bytes(self, limit: int) -> bytes | None:
        """The local file's bytes if it holds at most `limit` (read once, then kept)."""
        assert self._descriptor is not None
        if self._whole is None and self._size <= limit:
            data = os.pread(self._descriptor, self._size + 1, 0)
            if len(data) <= self._size:  # else it grew since it was opened: read as a file
                self._whole = data
        return self._whole if self._whole is not None and len(self._whole) <= limit else None


def _read(
    store: Store,
    name: str,
    max_rows: int | None,
    columns: Sequence[str] | None,
    decode: bool = True,
) -> tuple[pa.Schema, pa.Table]:
    import pyarrow as pa

    try:
        with _open(store, name) as handle:
            return _bounded_read(handle, max_rows, columns, decode)
    except _Refused as exc:
        raise UnreadableLakeFile(store.url(name), str(exc)) from exc
    except (OSError, pa.ArrowException) as exc:
        raise UnreadableLakeFile(store.url(name), str(exc), exc) from exc


# A file's identity as its manifest records it: its size and the blake2b of its footer.
IDENTITY = re.compile(r"[0-9]{1,20}:[0-9a-f]{32}")
_MAGIC = b"PAR1"


def footer_identity(store: Store, name: str) -> str:
    """`<size>:<blake2b of its footer>` of a lake file: what changes when its bytes are
    rewritten with another length or another footer (forged statistics, row counts, sizes).
    Reads only the file's size and its footer.

    Raises:
        UnreadableLakeFile: The file cannot be read, or ends in no Parquet footer.
    """
    try:
        with _open(store, name) as handle:
            return _identity_of(handle)
    except _Refused as exc:
        raise UnreadableLakeFile(store.url(name), str(exc)) from exc
    except OSError as exc:
        raise UnreadableLakeFile(store.url(name), str(exc), exc) from exc


def _identity_of(handle: Any) -> str:
    """`footer_identity` of an open file object (_Refused: no Parquet footer)."""

    def read_at(offset: int, length: int) -> bytes:
        handle.seek(offset)
        return bytes(handle.read(length))

    return _identity(handle.seek(0, 2), read_at)


def _identity_at(descriptor: int) -> str:
    """`footer_identity` of an open local file, read by `pread` (no file object to build)."""
    return _identity(
        os.fstat(descriptor).st_size, lambda offset, length: os.pread(descriptor, length, offset)
    )


def bytes_identity(data: bytes) -> str | None:
    """`footer_identity` of a file's whole bytes, read by the caller; None where they end in no
    Parquet footer."""
    try:
        return _identity(len(data), lambda offset, length: data[offset : offset + length])
    except _Refused:
        return None


def _identity(size: int, read_at: Callable[[int, int], bytes]) -> str:
    """`footer_identity` of a file of `size` bytes whose bytes `read_at(offset, length)` reads
    (_Refused: no Parquet footer)."""
    if size < 2 * len(_MAGIC) + 4:
        raise _Refused("it is too short to be Parquet")
    tail = read_at(size - 8, 8)
    length = int.from_bytes(tail[:4], "little")
    if tail[4:] != _MAGIC or length > size - 12:
        raise _Refused("it ends in no Parquet footer")
    footer = read_at(size - 8 - length, length)
    return f"{size}:{hashlib.blake2b(footer + tail, digest_size=16).hexdigest()}"


def identity_size(identity: str) -> int:
    """The file size a `footer_identity` states."""
    return int(identity.split(":", 1)[0])


def identity_change(store: Store, name: str, recorded: str) -> str | None:
    """How the lake file `name` differs from the one whose identity its manifest `recorded`
    as written (None: it is that file).

    Raises:
        UnreadableLakeFile: The file cannot be read, or ends in no Parquet footer.
    """
    return _change(footer_identity(store, name), recorded)


def _change(found: str, recorded: str) -> str | None:
    """How a file of identity `found` differs from the one `recorded` (None: the same)."""
    if found == recorded:
        return None
    size, found_size = identity_size(recorded), identity_size(found)
    if size != found_size:
        return f"changed since it was written: {found_size:,} bytes, written {size:,}"
    return "changed since it was written: its footer is not the one written"


def statistics_disagreement(store: Store, name: str, rows: pa.Table) -> str | None:
    """Where the footer's statistics of a lake file disagree with `rows`, its pages as
    `read_table` decoded them (None: they agree). Readers skip row groups by these statistics
    (a NULL count, a minimum and maximum per column), so a forged footer hides rows from them.

    Raises:
        UnreadableLakeFile: The footer cannot be read.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        with _open(store, name) as handle:
            footer = pq.ParquetFile(handle).metadata
    except (OSError, pa.ArrowException) as exc:
        raise UnreadableLakeFile(store.url(name), str(exc), exc) from exc
    start = 0
    for group in range(footer.num_row_groups):
        row_group = footer.row_group(group)
        part = rows.slice(start, row_group.num_rows)
        start += row_group.num_rows
        for index in range(row_group.num_columns):
            chunk = row_group.column(index)
            if chunk.statistics is None or chunk.path_in_schema not in part.column_names:
                continue  # a list's leaf: no reader skips by it
            found = _disagreement(chunk.statistics, part.column(chunk.path_in_schema))
            if found is not None:
                return (
                    f"has a footer that disagrees with its pages: row group {group},"
                    f" column `{chunk.path_in_schema}`: {found}"
                )
    return None


def _disagreement(stated: Any, column: pa.ChunkedArray) -> str | None:
    import pyarrow.compute as pc

    if stated.has_null_count and stated.null_count != column.null_count:
        return f"{stated.null_count:,} NULLs stated, {column.null_count:,} found"
    if not stated.has_min_max:
        return None
    extremes = pc.min_max(column)
    low, high = extremes["min"].as_py(), extremes["max"].as_py()
    try:
        outside = low is not None and (low < stated.min or high > stated.max)
    except TypeError:  # a type whose statistics pyarrow gives as another Python type
        return None
    if outside:
        return f"values stated in [{stated.min}, {stated.max}], found in [{low}, {high}]"
    return None


class _Refused(Exception):
    """A file refused before it is decoded: beyond its bound, or no Parquet (the message says
    why)."""


def _open(store: Store, name: str) -> Any:
    where, filesystem = store.arrow_source(name)
    if filesystem is None:
        return open(where, "rb")  # noqa: SIM115 - the caller's `with` closes it
    return filesystem.open(where, "rb")


def _bounded_read(
    handle: Any,
    max_rows: int | None,
    columns: Sequence[str] | None,
    decode: bool = True,
    in_memory: bool = False,
) -> tuple[pa.Schema, pa.Table]:
    """The file's declared columns and its rows (of `columns` only, when given); without
    `decode`, its dictionary strings are left as Arrow dictionaries (the same values).
    `in_memory`: the handle reads bytes already in memory, where pyarrow's pre-buffering
    (coalescing reads ahead) only costs CPU: a fifth of a small file's read."""
    import pyarrow.parquet as pq

    size = handle.seek(0, 2)
    handle.seek(0)
    pre_buffer = not in_memory
    # pyarrow's reader under `ParquetFile`, without the index of every nested column path
    # that `ParquetFile` builds in Python for each file (a tenth of a small file's read).
    plain = pq.ParquetReader()
    plain.open(handle, pre_buffer=pre_buffer)
    footer = plain.metadata
    if max_rows is not None and footer.num_rows > max_rows:
        raise _Refused(f"it declares {footer.num_rows:,} rows; its manifest records {max_rows:,}")
    bound = decoded_bound(size)
    # Of every column: the bound is the file's, not a part's.
    declared, dictionaries = _declared_bytes(footer)
    if declared > bound:
        raise _Refused(_too_large(declared, size, bound))
    declared_schema = plain.schema_arrow
    names = declared_schema.names  # a new list at each call
    wanted = None if columns is None else [c for c in columns if c in names]
    indices = None if wanted is None else _leaf_indices(plain.column_paths, wanted)
    if wanted is not None:
        dictionaries = [path for path in dictionaries if path.split(".")[0] in wanted]
    reader = plain
    if dictionaries:  # read as dictionaries: a reader of its own (of the same footer)
        handle.seek(0)
        reader = pq.ParquetReader()
        reader.open(handle, metadata=footer, read_dictionary=dictionaries, pre_buffer=pre_buffer)
    # A few columns decode faster on this thread than handed to Arrow's pool and back.
    table = reader.read_all(column_indices=indices, use_threads=wanted is None)
    expanded = declared + sum(_expanded_bytes(column) for column in table.columns)
    if expanded > bound:
        raise _Refused(_too_large(expanded, size, bound))
    if not dictionaries or not decode:
        return declared_schema, table
    if wanted is None:
        return declared_schema, table.cast(declared_schema)
    import pyarrow as pa

    fields = [declared_schema.field(name) for name in table.column_names]
    return declared_schema, table.cast(pa.schema(fields, metadata=declared_schema.metadata))


def _leaf_indices(paths: list[list[str]], columns: list[str]) -> list[int]:
    """The indices of the Parquet leaf columns of the top-level `columns`, column by column
    (as `ParquetFile.read(columns=...)` takes them: the table's columns in that order).

    Examples:
        >>> _leaf_indices([["a"], ["b", "list", "element"], ["c"]], ["c", "b"])
        [2, 1]
    """
    return [index for name in columns for index, path in enumerate(paths) if path[0] == name]


def _too_large(decoded: int, size: int, bound: int) -> str:
    return (
        f"it would decode to {_mib(decoded)}, more than the {_mib(bound)} a file of"
        f" {size:,} bytes may: {DECODED_PER_FILE_BYTE} x its size + {amount(DECODED_FLOOR)}"
    )


def _mib(size: int) -> str:
    """A decoded size as a message states it.

    Examples:
        >>> _mib(5_244_048_630), _mib(68_036_416)
        ('5,001 MiB', '65 MiB')
    """
    return f"{size / MiB:,.0f} MiB"


def _declared_bytes(footer: pq.FileMetaData) -> tuple[int, list[str]]:
    """What the file's columns decode to, by its footer: fixed-width values by count, others by
    their pages' uncompressed sizes (a dictionary's strings by their dictionary alone: their
    expansion is counted once read, `_expanded_bytes`). And the string columns (by path) that
    hold a dictionary in some row group: read as dictionaries, never expanded unread.

    One walk of the footer for both: each column chunk's metadata is a Python object built
    on demand, the most of what checking a small file's footer costs.
    """
    total = 0
    dictionaries = set()
    for group in range(footer.num_row_groups):
        row_group = footer.row_group(group)
        rows = row_group.num_rows
        for index in range(row_group.num_columns):
            chunk = row_group.column(index)
            kind = chunk.physical_type
            values = chunk.num_values
            values = rows if values < rows else values
            width = _FIXED_WIDTHS.get(kind)
            if kind == "FIXED_LEN_BYTE_ARRAY":
                width = footer.schema.column(index).length
            if width is not None:
                total += values * (width + _PER_VALUE_OVERHEAD)
                continue
            pages = chunk.total_uncompressed_size
            total += (pages if pages > 0 else 0) + values * _PER_VALUE_OVERHEAD
            if kind == "BYTE_ARRAY" and chunk.has_dictionary_page:
                dictionaries.add(chunk.path_in_schema)
    return total, sorted(dictionaries)


def _expanded_bytes(column: pa.ChunkedArray | pa.Array) -> int:
    """The bytes a column's dictionary-encoded strings take once expanded (0 without any)."""
    import pyarrow as pa

    if isinstance(column, pa.ChunkedArray):
        return sum(_expanded_bytes(chunk) for chunk in column.chunks)
    if isinstance(column, pa.DictionaryArray):
        lengths = _value_lengths(column.dictionary)
        if not len(lengths):
            return 0
        if column.null_count == 0:  # every index taken (and no pyarrow.compute to import)
            return int(lengths[column.indices.to_numpy(zero_copy_only=False)].sum())
        indices = column.indices.fill_null(0).to_numpy(zero_copy_only=False)
        valid = column.is_valid().to_numpy(zero_copy_only=False)
        return int(lengths[indices[valid]].sum())
    if isinstance(column, (pa.ListArray, pa.LargeListArray)):
        return _expanded_bytes(column.flatten())
    if isinstance(column, pa.StructArray):
        return sum(_expanded_bytes(column.field(i)) for i in range(column.type.num_fields))
    return 0


# The offsets' type of each string type whose lengths are read from its offsets, without
# pyarrow.compute's import (~50 ms).
_OFFSET_WIDTHS: dict[Any, str] = {}


def _offset_widths() -> dict[Any, str]:
    import pyarrow as pa

    if not _OFFSET_WIDTHS:
        _OFFSET_WIDTHS.update(
            {
                pa.string(): "<i4",
                pa.binary(): "<i4",
                pa.large_string(): "<i8",
                pa.large_binary(): "<i8",
            }
        )
    return _OFFSET_WIDTHS


def _value_lengths(strings: pa.Array) -> np.ndarray:
    """The byte length of each string (0 for a NULL).

    Examples:
        >>> import pyarrow as pa
        >>> _value_lengths(pa.array(["a", "bcd", "", "é"])).tolist()
        [1, 3, 0, 2]
        >>> _value_lengths(pa.array(["x", "yy", None])[1:]).tolist()
        [2, 0]
    """
    import numpy as np

    width = _offset_widths().get(strings.type)
    if strings.null_count == 0 and width is not None:  # a dictionary's, as a rule
        offsets = np.frombuffer(strings.buffers()[1], dtype=width)
        return np.diff(offsets[strings.offset : strings.offset + len(strings) + 1])
    import pyarrow.compute as pc

    return np.asarray(pc.binary_length(strings).fill_null(0).to_numpy(zero_copy_only=False))
