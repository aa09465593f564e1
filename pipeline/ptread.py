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
import os
import pickle
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from pipeline.errors import DumpFileError, DumpNotFoundError, PipelineError, UnsafePickleError
from pipeline.ptzip import Archive, BigEndian, Corrupt, entry_bytes, open_archive

try:  # numpy >= 2 moved the pickle helpers; 1.x pickles name `numpy.core`, 2.x `numpy._core`
    from numpy._core import multiarray as _multiarray
except ImportError:  # pragma: no cover - numpy 1.x
    from numpy.core import multiarray as _multiarray  # type: ignore[no-redef]

# A file modified less than this long ago may still be written in place (dump-format.md 7).
FRESH_SECONDS = 60.0


class _Forbidden(Exception):
    """The pickle asked for a global outside the allow-list (becomes UnsafePickleError)."""

    def __init__(self, global_name: str) -> None:
        super().__init__(global_name)
        self.global_name = global_name


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
        raise Corrupt(f"`{type(obj).__name__}` got pickle state of type `{type(state).__name__}`")
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
        raise Corrupt(f"a tensor was rebuilt from a `{type(storage).__name__}`, not a storage")
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
        raise Corrupt(f"a tensor does not fit its storage ({exc})") from exc


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
        raise Corrupt("`_rebuild_tensor_v3` got arguments that are not a storage and dtype")
    if storage.dtype != np.uint8:
        raise Corrupt("`_rebuild_tensor_v3` got a typed storage")
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


# --- the unpickler ---------------------------------------------------------------------------


class _RestrictedUnpickler(pickle.Unpickler):
    """C unpickler that resolves only `_ALLOWED` and maps storages onto the archive."""

    def __init__(self, file: io.BufferedIOBase, archive: Archive) -> None:
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
            raise Corrupt(f"its pickle holds an unknown persistent id `{str(pid)[:80]}`")
        _, kind, key, _location, numel = pid
        if key not in self._storages:
            self._storages[key] = self._load_storage(kind, key, numel)
        return self._storages[key]

    def _load_storage(self, kind: _TorchDType, key: str, numel: int) -> np.ndarray:
        """Read one storage; bf16 is widened here so every tensor of it shares the copy."""
        dtype = kind.dtype
        name = f"{self._archive.prefix}data/{key}"
        raw = entry_bytes(self._archive, name, numel * dtype.itemsize)
        array = np.frombuffer(raw, dtype=dtype, count=numel) if numel else np.empty(0, dtype)
        return _widen_bf16(array) if kind.bf16 else array


def _unpickle(archive: Archive) -> Any:
    """Unpickle `data.pkl` of an opened archive."""
    payload = entry_bytes(archive, archive.prefix + "data.pkl")
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
            raise Corrupt("the file is empty (0 bytes)")
        return _unpickle(open_archive(path, st.st_size, fresh))
    except _Forbidden as exc:
        raise UnsafePickleError(path, exc.global_name) from None
    except BigEndian as exc:
        reason = f"it was written on a big-endian machine (`byteorder` is `{exc}`); tokenlake reads only little-endian dumps"
        raise DumpFileError(path, reason) from None
    except Corrupt as exc:
        raise DumpFileError(path, exc.reason, still_writing=fresh) from exc
    except PipelineError:
        raise
    except Exception as exc:  # any other failure inside the pickle is a corrupt file
        reason = f"its pickle is corrupt ({type(exc).__name__}: {exc})"
        raise DumpFileError(path, reason, still_writing=fresh) from exc
