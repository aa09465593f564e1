"""Fast, safe reader for `torch.save` dump files, without torch: the unpickler and `load`.

`torch.load(weights_only=True)` is safe but unpickles in pure Python, which is ~10x slower on
rollout files holding millions of Python floats. `load` runs the C unpickler instead, with a
`find_class` that resolves only the allow-list of `tokenlake.read.pt.ptglobals` (dump-format.md 2.4
and 3.6), and turns every tensor into a numpy array that is a zero-copy view on a private copy
of the file (`tokenlake.read.pt.pttensor`; the zip container is `tokenlake.read.pt.ptzip`).

Every byte is hostile (docs/live-runs.md, "Hostile files"): every allowed callable checks the
exact types of its arguments, numpy objects are built only from plain dtypes and exactly the
bytes they need (`tokenlake.read.pt.ptnumpy`), and `tokenlake.read.pt.ptcheck` bounds what the pickle
costs before and after it runs.

Examples:
    >>> from pathlib import Path
    >>> load(Path("no/such/file.pt"))
    Traceback (most recent call last):
    ...
    tokenlake.errors.DumpNotFoundError: `no/such/file.pt` does not exist
"""

from __future__ import annotations

import io
import os
import pickle
import secrets
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from tokenlake.errors import (
    DumpFileError,
    DumpNotFoundError,
    PipelineError,
    UnreadableError,
    UnsafePickleError,
    shown,
)
from tokenlake.read.pt.ptcheck import budget_of, check_opcodes, settle
from tokenlake.read.pt.ptglobals import ALLOWED, Forbidden
from tokenlake.read.pt.ptlists import Decoded, DecodedList, Finder, decode, placeholder
from tokenlake.read.pt.pttensor import (
    Rebuild,
    TorchDType,
    tensor_view,
    tensor_view_v3,
    widen_bf16,
)
from tokenlake.read.pt.ptzip import (
    Archive,
    BigEndian,
    Changed,
    Corrupt,
    entry_bytes,
    open_archive,
    stored_start,
)

# A file modified less than this long ago may still be written in place (dump-format.md 7).
FRESH_SECONDS = 60.0


class _RestrictedUnpickler(pickle.Unpickler):
    """C unpickler that resolves only `ALLOWED` and maps storages onto the archive."""

    def __init__(
        self, file: io.BufferedIOBase, archive: Archive, lists: tuple[Decoded, bytes] | None = None
    ) -> None:
        super().__init__(file)
        self._archive = archive
        self._lists = lists  # the decoded lists and the nonce of their persistent ids
        self._storages: dict[str, np.ndarray] = {}
        # per load: the bf16 cache of v3, and how many tensor elements may still be claimed
        # (no bound methods here: a reference cycle would keep the file's copy alive until
        # the garbage collector runs)
        budget = [budget_of(len(archive.buf)), budget_of(len(archive.buf))]
        self._v2 = Rebuild(budget, tensor_view)
        self._v3 = Rebuild(budget, partial(tensor_view_v3, {}))
        self.numpy = False  # whether the pickle names numpy (its objects need `settle`)

    def find_class(self, module: str, name: str) -> Any:
        """Resolve an allow-listed global; anything else stops the load before it runs."""
        if module == "__builtin__":  # protocol-2 pickles spell `builtins` the Python 2 way
            module = "builtins"
        key = f"{module}.{name}"
        if key == "torch._utils._rebuild_tensor_v3":
            return self._v3
        if key == "torch._utils._rebuild_tensor_v2":
            return self._v2
        self.numpy |= module.startswith("numpy")
        if key not in ALLOWED:
            # 120: a real global's whole dotted name, so the user sees what the file needs
            raise Forbidden(shown(key, 120, literal=False))
        return ALLOWED[key]

    def persistent_load(self, pid: Any) -> np.ndarray:
        """('storage', class, key, location, numel) -> 1-d numpy array on the file's bytes;
        a decoded list's id (`tokenlake.read.pt.ptlists`) -> its placeholder."""
        if type(pid) is bytes and self._lists is not None:
            return placeholder(self._lists[0], self._lists[1], pid)  # type: ignore[return-value]
        # exact types first: `==` on a hostile object could run anything it overloads
        if not (
            type(pid) is tuple
            and len(pid) == 5
            and type(pid[0]) is str
            and pid[0] == "storage"
            and type(pid[1]) is TorchDType
            and type(pid[2]) is str
            and type(pid[4]) is int
            and pid[4] >= 0
        ):
            raise Corrupt(f"its pickle holds an unknown persistent id (a `{type(pid).__name__}`)")
        _, kind, key, _location, numel = pid
        storage = self._storages.get(key)
        if storage is None:
            storage = self._storages[key] = self._load_storage(kind, key, numel)
        return storage

    def _load_storage(self, kind: TorchDType, key: str, numel: int) -> np.ndarray:
        """Read one storage; bf16 is widened here so every tensor of it shares the copy."""
        dtype = kind.dtype
        archive = self._archive
        name = f"{archive.prefix}data/{key}"
        nbytes = numel * dtype.itemsize
        start = stored_start(archive, name, nbytes)
        if start is None:  # compressed (inflated into memory of its own), or an error
            raw = entry_bytes(archive, name, nbytes)
            array = np.frombuffer(raw, dtype=dtype, count=numel) if numel else np.empty(0, dtype)
        elif numel:  # in place on the file's private copy, no memoryview in between
            array = np.frombuffer(archive.buf, dtype=dtype, count=numel, offset=start)
        else:
            array = np.empty(0, dtype)
        return widen_bf16(array) if kind.bf16 else array


# (key of a list in the top-level dict, keys of its dicts): where a reader wants the decoded
# lists of numbers as arrays (`load`'s `arrays_under`)
ArraysUnder = tuple[str, frozenset[str]]
_FAILED = object()  # the fast load did not apply


def _unpickle(archive: Archive, arrays_under: ArraysUnder | None = None) -> Any:
    """Unpickle `data.pkl` of an opened archive, within the bounds of `tokenlake.read.pt.ptcheck`."""
    payload = bytes(entry_bytes(archive, archive.prefix + "data.pkl"))
    lists = Finder(payload) if arrays_under is not None else None
    shares = check_opcodes(payload, lists)
    if lists is not None and arrays_under is not None and not shares:
        value = _unpickle_decoded(archive, lists, arrays_under)
        if value is not _FAILED:
            return value
    unpickler = _RestrictedUnpickler(_stream(payload), archive)
    value = unpickler.load()
    if shares or unpickler.numpy:  # else a tree no larger than the pickle: nothing to walk
        value = settle(value, len(archive.buf))
    return value


def _stream(payload: bytes) -> io.BufferedReader:
    # BufferedReader adds `peek`, which lets the C unpickler prefetch instead of calling
    # `read` once per opcode.
    return io.BufferedReader(io.BytesIO(payload), buffer_size=1 << 20)


def _unpickle_decoded(archive: Archive, lists: Finder, arrays_under: ArraysUnder) -> Any:
    """The value with its plain lists of numbers decoded as whole arrays
    (`tokenlake.read.pt.ptlists`), or `_FAILED`: no such list, or the pickle used one as
    anything but a value (the exact load then gives the value, or the error, the unpickler
    gives). Only for pickles that share no container: a list is then in one place only."""
    nonce = secrets.token_bytes(16)
    decoded = decode(lists, nonce)
    if decoded is None:
        return _FAILED
    try:
        unpickler = _RestrictedUnpickler(_stream(decoded.payload), archive, (decoded, nonce))
        value = unpickler.load()
        placed = _place_arrays(value, arrays_under)
        if placed < len(decoded.arrays) or unpickler.numpy:  # lists elsewhere: as lists
            value = settle(value, len(archive.buf))
        return value
    except Exception:  # the exact load reports it, with the unpickler's own words
        return _FAILED


def _place_arrays(value: Any, arrays_under: ArraysUnder) -> int:
    """Put the arrays of the decoded lists at value[list_key][i][key] in their place; how
    many. (The pickle shares no container, so each list is in that one place only.)"""
    list_key, keys = arrays_under
    items = value.get(list_key) if type(value) is dict else None
    if type(items) is not list:
        return 0
    placed = 0
    for item in items:
        if type(item) is dict:
            for key in keys:
                found = item.get(key)
                if type(found) is DecodedList:
                    item[key] = found.array
                    placed += 1
    return placed


def _stat(path: Path) -> os.stat_result:
    """`os.stat`, with a missing file reported as DumpNotFoundError, any other refusal of the
    OS (a folder above it not searchable) as UnreadableError."""
    try:
        return path.stat()
    except FileNotFoundError as exc:
        raise DumpNotFoundError(path, "does not exist") from exc
    except OSError as exc:
        raise UnreadableError(path, exc) from None


def load(path: Path, arrays_under: ArraysUnder | None = None) -> Any:
    """Load a `torch.save` file as plain Python objects with numpy arrays for tensors.

    Tensors become numpy arrays with their dtype, shape and strides; they are zero-copy views
    on a private, writable copy of the file (an anonymous memory map; a bytearray for files
    younger than `FRESH_SECONDS` or of at most `ptzip.HEAP_MAX` bytes). bfloat16 tensors become float32 (exact); float16 stays
    float16. Miles dataclasses become `AdapterRef`, `RewardSpec` and `SpecInfo` from
    `tokenlake.read.pt.ptglobals`.

    Args:
        path: A `.pt` file written by `torch.save` (zip format).
        arrays_under: `(list_key, keys)`: the lists of numbers at
            `value[list_key][i][key]` (a rollout's per-token lists) come back as `ListArray`
            (int64 or float64, what `np.array` makes of the list) when the pickle holds them in
            the plain shape; they are decoded without a Python object per number. Every other
            value is exactly what it is without the argument.

    Returns:
        The unpickled object.

    Raises:
        DumpNotFoundError: The file does not exist.
        UnsafePickleError: The pickle names a global outside the allow-list; nothing ran.
        DumpFileError: The file is empty, truncated, not a torch zip archive, big-endian, or
            its pickle or storages are corrupt or hostile (docs/live-runs.md). `still_writing`
            is set for files modified less than `FRESH_SECONDS` ago, and for files that changed
            size while they were read.
    """
    path = Path(path)
    st = _stat(path)
    fresh = time.time() - st.st_mtime < FRESH_SECONDS
    try:
        if st.st_size == 0:
            raise Corrupt("the file is empty (0 bytes)")
        return _unpickle(open_archive(path, st.st_size, fresh), arrays_under)
    except Forbidden as exc:
        raise UnsafePickleError(path, exc.global_name) from None
    except BigEndian as exc:
        order = shown(str(exc), literal=False)  # the file's `byteorder` entry: any bytes
        reason = (
            f"it was written on a big-endian machine (`byteorder` is `{order}`);"
            " tokenlake reads only little-endian dumps"
        )
        raise DumpFileError(path, reason) from None
    except Corrupt as exc:
        changed = isinstance(exc, Changed)
        raise DumpFileError(path, exc.reason, still_writing=fresh or changed) from None
    except PipelineError:
        raise
    except Exception as exc:  # any other failure inside the pickle is a corrupt file
        if isinstance(exc, OSError) and exc.errno is not None:  # but the OS refused it
            raise UnreadableError(path, exc) from None
        # 200: the unpickler's own sentence whole (it may quote the file's bytes, so cut)
        text = shown(str(exc), 200, literal=False)
        reason = f"its pickle is corrupt ({type(exc).__name__}: {text})"
        raise DumpFileError(path, reason, still_writing=fresh) from None
