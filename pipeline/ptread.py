"""Fast, safe reader for `torch.save` dump files, without torch.

`torch.load(weights_only=True)` is safe but unpickles in pure Python, which is ~10x slower on
rollout files holding millions of Python floats. `load` runs the C unpickler instead, with a
`find_class` that resolves only an explicit allow-list (dump-format.md 2.4 and 3.6), and turns
every tensor into a numpy array that is a zero-copy view on a memory map of the file.

Examples:
    >>> from pathlib import Path
    >>> load(Path("no/such/file.pt"))
    Traceback (most recent call last):
    ...
    pipeline.errors.DumpNotFoundError: `no/such/file.pt` does not exist
"""

from __future__ import annotations

import io
import mmap
import os
import pickle
import struct
import time
import zipfile
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from pipeline.errors import DumpFileError, DumpNotFoundError, PipelineError, UnsafePickleError

try:  # numpy >= 2 moved the pickle helpers; 1.x pickles name `numpy.core`, 2.x `numpy._core`
    from numpy._core import multiarray as _multiarray
except ImportError:  # pragma: no cover - numpy 1.x
    from numpy.core import multiarray as _multiarray  # type: ignore[no-redef]

# A file modified less than this long ago may still be written in place (dump-format.md 7).
FRESH_SECONDS = 60.0

_LOCAL_HEADER = b"PK\x03\x04"
_LOCAL_HEADER_SIZE = 30


class _Forbidden(Exception):
    """The pickle asked for a global outside the allow-list (becomes UnsafePickleError)."""

    def __init__(self, global_name: str) -> None:
        super().__init__(global_name)
        self.global_name = global_name


class _Corrupt(Exception):
    """The archive or pickle is malformed (becomes DumpFileError); `reason` is user text."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# --- stand-ins for the miles dataclasses -----------------------------------------------------


class _Sealed(type):
    """Metaclass whose classes refuse attribute changes once sealed.

    A pickle may BUILD state onto any object it can name; sealing keeps it from patching the
    stand-in classes themselves, which would leak into every later load in the process.
    """

    def __setattr__(cls, name: str, value: Any) -> None:
        if cls.__dict__.get("_sealed"):
            raise TypeError(f"class {cls.__name__} is read-only")
        super().__setattr__(name, value)

    def __delattr__(cls, name: str) -> None:
        if cls.__dict__.get("_sealed"):
            raise TypeError(f"class {cls.__name__} is read-only")
        super().__delattr__(name)


def _seal(cls: type) -> type:
    """Seal a stand-in class after `dataclass` has finished adding its methods."""
    type.__setattr__(cls, "_sealed", True)
    return cls


def _set_state(obj: Any, state: Any) -> None:
    """Apply pickle BUILD state to a frozen stand-in.

    Accepts a ``dict`` (plain dataclass), a ``(dict, slots_dict)`` pair, and the list of field
    values that frozen slotted dataclasses pickle. Extra public keys from newer miles versions
    are kept as attributes; private names are dropped so state cannot touch internals.
    """
    if isinstance(state, (list, tuple)) and not (
        len(state) == 2 and all(s is None or isinstance(s, dict) for s in state)
    ):
        state = dict(zip([f.name for f in fields(obj)], state, strict=False))
    elif isinstance(state, tuple):
        state = {**(state[0] or {}), **(state[1] or {})}
    if not isinstance(state, dict):
        raise _Corrupt(f"`{type(obj).__name__}` got pickle state of type `{type(state).__name__}`")
    for key, value in state.items():
        if isinstance(key, str) and not key.startswith("_"):
            object.__setattr__(obj, key, value)


@_seal
@dataclass(frozen=True)
class AdapterRef(metaclass=_Sealed):
    """Stand-in for `miles.utils.types.AdapterRef` (multi-LoRA adapter of a sample)."""

    name: str | None = None
    slot: int | None = None

    def __setstate__(self, state: Any) -> None:
        _set_state(self, state)


@_seal
@dataclass(frozen=True)
class RewardSpec(metaclass=_Sealed):
    """Stand-in for `miles.utils.types.RewardSpec` (per-sample reward model choice)."""

    rm_type: str | None = None
    custom_rm_path: str | None = None

    def __setstate__(self, state: Any) -> None:
        _set_state(self, state)


@_seal
@dataclass(frozen=True)
class SpecInfo(metaclass=_Sealed):
    """Stand-in for `miles.utils.types.Sample.SpecInfo` (dumps of 2025-11-01 .. 2025-12-01).

    Newer dumps store the same four counters as a plain dict; `to_dict` gives that form.
    """

    spec_accept_token_num: int = 0
    spec_draft_token_num: int = 0
    spec_verify_ct: int = 0
    completion_token_num: int = 0

    def __setstate__(self, state: Any) -> None:
        _set_state(self, state)

    def to_dict(self) -> dict[str, int]:
        """Return the four counters as the dict that current dumps hold."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


class _SampleClassRef(NamedTuple):
    """Stand-in for the class `miles.utils.types.Sample`: only `.SpecInfo` can be reached."""


_SAMPLE = _SampleClassRef()


# --- immutable callables the pickle may name -------------------------------------------------


class _Call(NamedTuple):
    """Immutable wrapper around a function: BUILD cannot rewrite its defaults or code."""

    fn: Callable[..., Any]

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)


def _restricted_getattr(obj: Any, name: Any) -> Any:
    """`builtins.getattr` as old pickles use it, limited to `Sample.SpecInfo`."""
    if obj is _SAMPLE and name == "SpecInfo":
        return SpecInfo
    if obj is _SAMPLE:
        raise _Forbidden(f"miles.utils.types.Sample.{name}")
    owner = obj if isinstance(obj, type) else type(obj)
    raise _Forbidden(f"getattr({owner.__module__}.{owner.__qualname__}, {name!r})")


def _encode(text: Any, encoding: Any = "utf-8") -> bytes:
    """`_codecs.encode` as protocol-2 pickles use it for `bytes` values (str -> bytes)."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1", "utf-8", "utf8"):
        raise _Forbidden(f"_codecs.encode({type(text).__name__}, {encoding!r})")
    return text.encode(encoding)


def _make_dtype(spec: Any, align: Any = False, copy: Any = True) -> np.dtype:
    """`numpy.dtype` for pickles, always copying.

    With ``copy=False`` numpy returns its shared singleton, and a BUILD on that would change
    the descriptor for the whole process.
    """
    return np.dtype(spec, align=bool(align), copy=True)


class _DTypeClass(NamedTuple):
    """A `numpy.dtypes.*DType` class as pickles call it, returning a private dtype copy."""

    cls: type

    def __call__(self, *args: Any) -> np.dtype:
        return np.dtype(self.cls(*args), copy=True)


class _TorchDType(NamedTuple):
    """Marker for a torch storage class or torch dtype global: the dtype its bytes have."""

    dtype: np.dtype
    bf16: bool = False  # numpy has no bfloat16: the bytes are read as uint16, then widened


_BF16 = _TorchDType(np.dtype(np.uint16), bf16=True)


def _widen_bf16(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bits (uint16) -> float32, exactly: bf16 is the top half of a float32."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _tensor_view(
    storage: Any, storage_offset: Any, size: Any, stride: Any, *_rest: Any
) -> np.ndarray:
    """`_rebuild_tensor_v2`: a numpy view with the tensor's offset, shape and strides."""
    if not isinstance(storage, np.ndarray) or storage.ndim != 1:
        raise _Corrupt(f"a tensor was rebuilt from a `{type(storage).__name__}`, not a storage")
    if storage_offset == 0 and stride == (1,) and size == storage.shape:
        return storage[:]  # the common 1-d whole-storage tensor: skip the strided constructor
    item = storage.dtype.itemsize
    try:
        return np.ndarray(
            tuple(size),
            storage.dtype,
            buffer=storage,
            offset=int(storage_offset) * item,
            strides=tuple(int(s) * item for s in stride),
        )
    except (TypeError, ValueError) as exc:
        raise _Corrupt(f"a tensor does not fit its storage ({exc})") from exc


def _tensor_view_v3(
    storage: Any,
    storage_offset: Any,
    size: Any,
    stride: Any,
    requires_grad: Any,
    hooks: Any,
    dtype: Any,
    *_rest: Any,
) -> np.ndarray:
    """`_rebuild_tensor_v3`: an untyped (byte) storage reinterpreted as `dtype`."""
    if not isinstance(dtype, _TorchDType) or not isinstance(storage, np.ndarray):
        raise _Corrupt("`_rebuild_tensor_v3` got arguments that are not a storage and dtype")
    if storage.dtype != np.uint8:
        raise _Corrupt("`_rebuild_tensor_v3` got a typed storage")
    typed = storage.view(dtype.dtype)
    return _tensor_view(_widen_bf16(typed) if dtype.bf16 else typed, storage_offset, size, stride)


# Legacy storage classes (what `torch.save` names for tensors), as `torch.<Name>Storage`.
_STORAGE_NAMES = "Float Double Half Long Int Short Char Byte Bool ComplexFloat ComplexDouble"
_STORAGE_NUMPY = "float32 float64 float16 int64 int32 int16 int8 uint8 bool complex64 complex128"
_STORAGE_DTYPES = {
    f"{n}Storage": _TorchDType(np.dtype(d))
    for n, d in zip(_STORAGE_NAMES.split(), _STORAGE_NUMPY.split(), strict=True)
} | {"BFloat16Storage": _BF16}

# `torch.<dtype>` globals, which `_rebuild_tensor_v3` names for dtypes without a storage class.
_TORCH_DTYPES = {
    d: _TorchDType(np.dtype(d)) for d in [*_STORAGE_NUMPY.split(), "uint16", "uint32", "uint64"]
} | {"bfloat16": _BF16}


def _allowed_globals() -> dict[str, Any]:
    """Every global a dump may name (`module.name` -> the object handed to the pickle)."""
    allowed: dict[str, Any] = {
        "collections.OrderedDict": OrderedDict,
        "builtins.set": set,
        "builtins.frozenset": frozenset,
        "builtins.complex": complex,
        "builtins.bytes": bytes,
        "builtins.bytearray": bytearray,
        "builtins.getattr": _Call(_restricted_getattr),
        "_codecs.encode": _Call(_encode),
        "torch._utils._rebuild_tensor_v2": _Call(_tensor_view),
        "torch._utils._rebuild_tensor_v3": _Call(_tensor_view_v3),
        "torch.storage.UntypedStorage": _TorchDType(np.dtype(np.uint8)),
        "torch.UntypedStorage": _TorchDType(np.dtype(np.uint8)),
        "numpy.ndarray": np.ndarray,
        "numpy.dtype": _Call(_make_dtype),
        "miles.utils.types.AdapterRef": AdapterRef,
        "miles.utils.types.RewardSpec": RewardSpec,
        "miles.utils.types.Sample": _SAMPLE,
        "miles.utils.types.Sample.SpecInfo": SpecInfo,  # protocol >= 4 names it directly
    }
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        allowed[f"{module}._reconstruct"] = _multiarray._reconstruct
        allowed[f"{module}.scalar"] = _multiarray.scalar
    for name in dir(np.dtypes):
        if name.endswith("DType") and isinstance(getattr(np.dtypes, name), type):
            allowed[f"numpy.dtypes.{name}"] = _DTypeClass(getattr(np.dtypes, name))
    for name, marker in _STORAGE_DTYPES.items():
        allowed[f"torch.{name}"] = marker
        allowed[f"torch.cuda.{name}"] = marker  # writers before torch 1.x's storage unification
    for name, marker in _TORCH_DTYPES.items():
        allowed[f"torch.{name}"] = marker
    return allowed


_ALLOWED = _allowed_globals()


# --- the archive -----------------------------------------------------------------------------


class _Entry(NamedTuple):
    """One zip member: where its local header starts, its sizes and compression."""

    header_offset: int
    file_size: int
    compressed: bool


class _Archive(NamedTuple):
    """An opened dump: its bytes (a private memory map or a copy) and zip directory."""

    buf: Any  # mmap.mmap or bytearray; both export a writable buffer
    entries: dict[str, _Entry]
    prefix: str  # "<archive>/" of the torch record names


_EOCD = struct.Struct("<4sHHHHIIH")  # end of central directory record
_CENTRAL = struct.Struct("<4s6H3I5H2I")  # central directory file header


def _fast_directory(buf: Any) -> dict[str, _Entry] | None:
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
    entries: dict[str, _Entry] = {}
    for _ in range(count):
        row = _CENTRAL.unpack_from(buf, pos)
        if row[0] != b"PK\x01\x02" or 0xFFFFFFFF in (row[8], row[9], row[16]):
            return None
        name_end = pos + _CENTRAL.size + row[10]
        name = bytes(buf[pos + _CENTRAL.size : name_end]).decode("utf-8", "replace")
        entries[name] = _Entry(row[16], row[9], row[4] != zipfile.ZIP_STORED)
        pos = name_end + row[11] + row[12]
    return entries


def _slow_directory(buf: Any) -> dict[str, _Entry]:
    """The directory through `zipfile` (zip64 and other rare layouts); copies the buffer."""
    with zipfile.ZipFile(io.BytesIO(buf)) as zf:
        return {
            i.filename: _Entry(i.header_offset, i.file_size, i.compress_type != zipfile.ZIP_STORED)
            for i in zf.infolist()
        }


def _entry_bytes(archive: _Archive, name: str, nbytes: int | None = None) -> Any:
    """Return entry `name` as a buffer: a zero-copy memoryview if stored, else decompressed."""
    entry = archive.entries.get(name)
    if entry is None:
        raise _Corrupt(f"the zip archive has no entry `{name}`")
    size = entry.file_size if nbytes is None else nbytes
    if entry.file_size < size:
        raise _Corrupt(f"entry `{name}` holds {entry.file_size} bytes; its storage needs {size}")
    if entry.compressed:  # torch.save never compresses; other zip tools may
        with zipfile.ZipFile(io.BytesIO(archive.buf)) as zf:
            return memoryview(bytearray(zf.read(name)))[:size]
    buf, start = archive.buf, entry.header_offset
    if buf[start : start + 4] != _LOCAL_HEADER:
        raise _Corrupt(f"entry `{name}` has no valid local zip header")
    # torch pads the local header's extra field to align data, so it differs from the central one
    name_len, extra_len = struct.unpack_from("<HH", buf, start + 26)
    data = start + _LOCAL_HEADER_SIZE + name_len + extra_len
    if data + size > len(buf):
        raise _Corrupt(f"entry `{name}` runs past the end of the file")
    return memoryview(buf)[data : data + size]


def _find_prefix(names: Iterable[str]) -> str:
    """The `<archive>/` folder that holds `data.pkl` (torch names it after the file)."""
    for name in names:
        if name == "data.pkl" or (name.endswith("/data.pkl") and name.count("/") == 1):
            return name[: -len("data.pkl")]
    raise _Corrupt("the zip archive has no `data.pkl` entry, so `torch.save` did not write it")


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


def _directory(buf: Any) -> dict[str, _Entry]:
    """The zip directory, with a message that says why when there is none."""
    try:
        return _fast_directory(buf) or _slow_directory(buf)
    except (zipfile.BadZipFile, struct.error, OSError, ValueError, EOFError) as exc:
        if buf[:4] == _LOCAL_HEADER:
            raise _Corrupt(
                "the zip archive is incomplete (no central directory at its end), so the"
                " file is truncated"
            ) from exc
        raise _Corrupt("it is not a zip archive, so `torch.save` did not write it") from exc


def _open_archive(path: Path, size: int, fresh: bool) -> _Archive:
    """Open the zip directory and check that this is a little-endian torch archive."""
    buf = _read_buffer(path, size, fresh)
    entries = _directory(buf)
    archive = _Archive(buf, entries, _find_prefix(entries))
    order_name = archive.prefix + "byteorder"
    if order_name in entries:  # absent in files from torch < 1.13: little-endian
        order = bytes(_entry_bytes(archive, order_name)).decode("ascii", "replace")
        if order != "little":
            raise _BigEndian(order)
    return archive


class _BigEndian(Exception):
    """The file was written on a big-endian machine; not a sign of an unfinished write."""


# --- the unpickler ---------------------------------------------------------------------------


class _RestrictedUnpickler(pickle.Unpickler):
    """C unpickler that resolves only `_ALLOWED` and maps storages onto the archive."""

    def __init__(self, file: io.BufferedIOBase, archive: _Archive) -> None:
        super().__init__(file)
        self._archive = archive
        self._storages: dict[str, np.ndarray] = {}

    def find_class(self, module: str, name: str) -> Any:
        """Resolve an allow-listed global; anything else stops the load before it runs."""
        if module == "__builtin__":  # protocol-2 pickles spell `builtins` the Python 2 way
            module = "builtins"
        key = f"{module}.{name}"
        if key not in _ALLOWED:
            raise _Forbidden(key)
        return _ALLOWED[key]

    def persistent_load(self, pid: Any) -> np.ndarray:
        """('storage', class, key, location, numel) -> 1-d numpy array on the file's bytes."""
        if not (
            isinstance(pid, tuple)
            and len(pid) == 5
            and pid[0] == "storage"
            and isinstance(pid[1], _TorchDType)
            and isinstance(pid[2], str)
            and isinstance(pid[4], int)
            and pid[4] >= 0
        ):
            raise _Corrupt(f"its pickle holds an unknown persistent id `{str(pid)[:80]}`")
        _, kind, key, _location, numel = pid
        if key not in self._storages:
            self._storages[key] = self._load_storage(kind, key, numel)
        return self._storages[key]

    def _load_storage(self, kind: _TorchDType, key: str, numel: int) -> np.ndarray:
        """Read one storage; bf16 is widened here so every tensor of it shares the copy."""
        dtype = kind.dtype
        name = f"{self._archive.prefix}data/{key}"
        raw = _entry_bytes(self._archive, name, numel * dtype.itemsize)
        array = np.frombuffer(raw, dtype=dtype, count=numel) if numel else np.empty(0, dtype)
        return _widen_bf16(array) if kind.bf16 else array


def _unpickle(archive: _Archive) -> Any:
    """Unpickle `data.pkl` of an opened archive."""
    payload = _entry_bytes(archive, archive.prefix + "data.pkl")
    # BufferedReader adds `peek`, which lets the C unpickler prefetch instead of calling
    # `read` once per opcode.
    stream = io.BufferedReader(io.BytesIO(payload), buffer_size=1 << 20)
    return _RestrictedUnpickler(stream, archive).load()


def _stat(path: Path) -> os.stat_result:
    """`os.stat`, with a missing file reported as DumpNotFoundError."""
    try:
        return path.stat()
    except FileNotFoundError as exc:
        raise DumpNotFoundError(path, "does not exist") from exc


def load(path: Path) -> Any:
    """Load a `torch.save` file as plain Python objects with numpy arrays for tensors.

    Tensors become numpy arrays with their dtype, shape and strides; they are zero-copy views
    on a private memory map (writable, never written back). bfloat16 tensors become float32
    (exact); float16 stays float16. Miles dataclasses become `AdapterRef`, `RewardSpec` and
    `SpecInfo` from this module. Files younger than `FRESH_SECONDS` are copied into memory
    instead of mapped, because they may still be written.

    Args:
        path: A `.pt` file written by `torch.save` (zip format).

    Returns:
        The unpickled object.

    Raises:
        DumpNotFoundError: The file does not exist.
        UnsafePickleError: The pickle names a global outside the allow-list; nothing ran.
        DumpFileError: The file is empty, truncated, not a torch zip archive, big-endian, or
            its pickle or storages are corrupt. `still_writing` is set for files modified
            less than `FRESH_SECONDS` ago.
    """
    path = Path(path)
    st = _stat(path)
    fresh = time.time() - st.st_mtime < FRESH_SECONDS
    try:
        if st.st_size == 0:
            raise _Corrupt("the file is empty (0 bytes)")
        return _unpickle(_open_archive(path, st.st_size, fresh))
    except _Forbidden as exc:
        raise UnsafePickleError(path, exc.global_name) from None
    except _BigEndian as exc:
        reason = f"it was written on a big-endian machine (`byteorder` is `{exc}`); tokenlake reads only little-endian dumps"
        raise DumpFileError(path, reason) from None
    except _Corrupt as exc:
        raise DumpFileError(path, exc.reason, still_writing=fresh) from exc
    except PipelineError:
        raise
    except Exception as exc:  # any other failure inside the pickle is a corrupt file
        reason = f"its pickle is corrupt ({type(exc).__name__}: {exc})"
        raise DumpFileError(path, reason, still_writing=fresh) from exc
