"""Fast, safe reader for `torch.save` dump files, without torch.

`torch.load(weights_only=True)` is safe but unpickles in pure Python, which is ~10x slower on
rollout files holding millions of Python floats. `load` runs the C unpickler instead, with a
`find_class` that resolves only an explicit allow-list (dump-format.md 2.4 and 3.6), and turns
every tensor into a numpy array that is a zero-copy view on a private copy of the file.

Every byte is hostile (docs/live-runs.md, "Hostile files"): every allowed callable checks the
exact types of its arguments, numpy objects are built only from plain dtypes and exactly the
bytes they need, and `pipeline.read.ptcheck` bounds what the pickle costs before and after it runs.

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
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from pipeline.errors import (
    DumpFileError,
    DumpNotFoundError,
    PipelineError,
    UnsafePickleError,
    shown,
)
from pipeline.read.ptcheck import Placeholder, budget_of, check_opcodes, settle, too_big
from pipeline.read.ptzip import (
    Archive,
    BigEndian,
    Changed,
    Corrupt,
    entry_bytes,
    open_archive,
)

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
    if type(name) is not str:
        raise _Forbidden(f"getattr(..., <{type(name).__name__}>)")
    if obj is _SAMPLE and name == "SpecInfo":
        return SpecInfo
    if obj is _SAMPLE:
        raise _Forbidden(f"miles.utils.types.Sample.{shown(name, literal=False)}")
    raise _Forbidden(f"getattr({_global_name(obj)}, {shown(name)})")


def _global_name(obj: Any) -> str:
    """The allow-list name of a global the pickle holds (wrappers included), else its type's."""
    for key, value in _ALLOWED.items():
        if value is obj:
            return key
    owner = obj if isinstance(obj, type) else type(obj)
    return f"{owner.__module__}.{owner.__qualname__}"


def _encode(text: Any, encoding: Any = "utf-8") -> bytes:
    """`_codecs.encode` as protocol-2 pickles use it for `bytes` values (str -> bytes)."""
    if type(text) is not str or type(encoding) is not str or encoding not in _TEXT_CODECS:
        raise _Forbidden(f"_codecs.encode({type(text).__name__}, {shown(encoding)})")
    return text.encode(encoding)


_TEXT_CODECS = ("latin1", "latin-1", "utf-8", "utf8")


# --- numpy objects: plain dtypes only, arrays only from exactly their bytes --------------------


def _plain(dtype: np.dtype) -> np.dtype:
    """Refuse every dtype but plain numbers, bool and fixed-width strings (no objects, no
    structs, no void), whose bytes cannot hide pointers."""
    if (
        dtype.kind not in "biufcSU"
        or dtype.fields is not None
        or dtype.subdtype is not None
        or dtype.hasobject
        or dtype.itemsize == 0
    ):
        raise Corrupt(
            f"its pickle builds a numpy `{shown(dtype.str, literal=False)}` dtype; tokenlake reads only plain"
            " numeric, bool and fixed-width string dtypes"
        )
    return dtype


class _DTypeProxy(Placeholder):
    """`numpy.dtype(...)` as a pickle builds it; BUILD may only set what numpy itself writes.

    A real dtype's `__setstate__` lets a pickle forge object fields without the object flag
    (raw bytes read as pointers), so the pickle gets this proxy; `.dtype` is always plain.
    """

    __slots__ = ("dtype",)

    def __init__(self, dtype: np.dtype) -> None:
        self.dtype = _plain(dtype)

    def __setstate__(self, state: Any) -> None:
        self.dtype = _dtype_from_state(self.dtype, state)

    def final(self) -> np.dtype:
        return self.dtype


def _dtype_from_state(base: np.dtype, state: Any) -> np.dtype:
    """The dtype a numpy BUILD state describes, if it is exactly what numpy writes for it."""
    ok = (
        type(state) is tuple
        and len(state) == 8
        and all(type(v) in (int, str, type(None)) for v in state)
        and state[1] in ("<", ">", "|", "=")
    )
    dtype = base
    if ok and base.kind in "SU" and type(state[5]) is int and state[5] > 0:
        dtype = np.dtype(f"{base.kind}{state[5] // (4 if base.kind == 'U' else 1)}")
    if ok and state[1] in "<>":
        dtype = dtype.newbyteorder(state[1])
    if not ok or dtype.__reduce__()[2] != state:
        raise Corrupt(
            f"its pickle sets the state of a numpy `{base.str}` dtype to something numpy never"
            " writes (a forged dtype)"
        )
    return _plain(dtype)


def _make_dtype(spec: Any, align: Any = False, copy: Any = True) -> _DTypeProxy:
    """`numpy.dtype` for pickles: a string spec of a plain dtype."""
    if type(spec) is not str or type(align) is not bool or type(copy) is not bool:
        raise Corrupt("its pickle calls `numpy.dtype` with arguments numpy never writes")
    try:
        dtype = np.dtype(spec)
    except (TypeError, ValueError) as exc:
        raise Corrupt(
            f"its pickle names an invalid numpy dtype `{shown(spec, literal=False)}`"
        ) from exc
    return _DTypeProxy(dtype)


class _DTypeClass(NamedTuple):
    """A `numpy.dtypes.*DType` class as pickles call it (no arguments): a plain dtype."""

    cls: type

    def __call__(self, *args: Any) -> _DTypeProxy:
        if args:
            raise Corrupt(f"its pickle calls `numpy.dtypes.{self.cls.__name__}` with arguments")
        return _DTypeProxy(np.dtype(self.cls()))


class _ArrayProxy(Placeholder):
    """`numpy.ndarray` as `_reconstruct` + BUILD make it: the array exists only once BUILD
    gave a plain dtype and exactly the bytes its shape needs (never uninitialised memory)."""

    __slots__ = ("array",)

    def __init__(self) -> None:
        self.array: np.ndarray | None = None

    def __setstate__(self, state: Any) -> None:
        self.array = _array_from_state(state)

    def final(self) -> np.ndarray:
        if self.array is None:
            raise Corrupt("its pickle creates a numpy array but never gives it data")
        return self.array


def _array_from_state(state: Any) -> np.ndarray:
    """(version, shape, dtype, fortran, bytes) -> a writable array holding a copy of bytes."""
    if type(state) is tuple and len(state) == 5 and state[0] == 1:
        state = state[1:]
    if not (
        type(state) is tuple
        and len(state) == 4
        and type(state[0]) is tuple
        and all(type(n) is int and n >= 0 for n in state[0])
        and type(state[1]) is _DTypeProxy
        and type(state[2]) is bool
        and type(state[3]) is bytes
    ):
        raise Corrupt("its pickle gives a numpy array a state numpy never writes")
    shape, proxy, fortran, raw = state
    dtype = proxy.dtype
    count = 1
    for n in shape:
        count *= n
    if count * dtype.itemsize != len(raw):
        raise Corrupt(
            f"its pickle gives a numpy `{dtype.str}` array of shape {shown(str(shape), literal=False)}"
            f" {len(raw)} bytes; it needs {count * dtype.itemsize}"
        )
    flat = np.frombuffer(raw, dtype, count).copy() if count else np.zeros(0, dtype)
    return flat.reshape(shape, order="F" if fortran else "C")


_NDARRAY = ("numpy.ndarray",)  # not a type: NEWOBJ/REDUCE cannot make arrays from it


def _reconstruct(cls: Any, shape: Any, typecode: Any) -> _ArrayProxy:
    """`numpy.core.multiarray._reconstruct(ndarray, (0,), b'b')`, the only call numpy writes."""
    if cls is not _NDARRAY or shape != (0,) or typecode not in (b"b", "b"):
        raise Corrupt("its pickle calls numpy's `_reconstruct` with arguments numpy never writes")
    return _ArrayProxy()


def _scalar(proxy: Any, data: Any = None) -> Any:
    """`numpy.core.multiarray.scalar(dtype, bytes)`: a plain dtype and exactly its bytes."""
    if type(proxy) is not _DTypeProxy or type(data) is not bytes:
        raise Corrupt("its pickle calls numpy's `scalar` with arguments numpy never writes")
    if len(data) != proxy.dtype.itemsize:
        raise Corrupt(
            f"its pickle gives a numpy `{proxy.dtype.str}` scalar {len(data)} bytes;"
            f" it needs {proxy.dtype.itemsize}"
        )
    return _multiarray.scalar(proxy.dtype, data)


# --- builtins, restricted to the arguments pickles of plain values use -----------------------


def _bytes(*args: Any) -> bytes:
    """`bytes()` / `bytes(b"...")` / `bytes(str, encoding)`; never `bytes(4_000_000_000)`."""
    if args and type(args[0]) is str:
        return _encode(*args)
    if len(args) > 1 or (args and type(args[0]) not in (bytes, bytearray, list)):
        raise Corrupt("its pickle calls `bytes` with arguments other than bytes or text")
    return bytes(*args)


def _bytearray(*args: Any) -> bytearray:
    return bytearray(_bytes(*args))


def _collection(kind: type) -> Callable[..., Any]:
    """`set`/`frozenset`/`OrderedDict` from nothing or one list or tuple (of pairs)."""

    def build(*args: Any) -> Any:
        if len(args) > 1 or (args and type(args[0]) not in (list, tuple)):
            raise Corrupt(f"its pickle calls `{kind.__name__}` with an unexpected argument")
        if (
            kind is OrderedDict
            and args
            and not all(type(p) in (list, tuple) and len(p) == 2 for p in args[0])
        ):
            raise Corrupt("its pickle calls `OrderedDict` with items that are not pairs")
        return kind(*args)

    return build


def _complex(*args: Any) -> complex:
    if len(args) > 2 or not all(type(a) in (int, float) for a in args):
        raise Corrupt("its pickle calls `complex` with arguments that are not numbers")
    return complex(*args)


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
    """`_rebuild_tensor_v2`: a numpy view with the tensor's offset, shape and strides.

    How many elements a view may claim (stride 0 repeats one) is bounded later, with the whole
    value graph (`pipeline.read.ptcheck.settle`).
    """
    if type(storage) is not np.ndarray or storage.ndim != 1:
        raise Corrupt(f"a tensor was rebuilt from a `{type(storage).__name__}`, not a storage")
    if not (
        type(storage_offset) is int
        and storage_offset >= 0
        and _ints(size)
        and _ints(stride)
        and len(size) == len(stride)
    ):
        raise Corrupt("a tensor has an offset, shape or strides that are not whole numbers")
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


def _ints(value: Any) -> bool:
    """A tuple of at most 64 non-negative ints (torch.Size, strides)."""
    return (
        type(value) is tuple and len(value) <= 64 and all(type(n) is int and n >= 0 for n in value)
    )


def _tensor_view_v3(
    widened: dict[int, tuple[np.ndarray, np.ndarray]],
    storage: Any,
    storage_offset: Any,
    size: Any,
    stride: Any,
    requires_grad: Any,
    hooks: Any,
    dtype: Any,
    *_rest: Any,
) -> np.ndarray:
    """`_rebuild_tensor_v3`: an untyped (byte) storage reinterpreted as `dtype`.

    bfloat16 is widened once per storage (`widened`, by id, holding the storage alive), not
    once per tensor: 1 000 tensors of one storage must not copy it 1 000 times.
    """
    if type(dtype) is not _TorchDType or type(storage) is not np.ndarray:
        raise Corrupt("`_rebuild_tensor_v3` got arguments that are not a storage and dtype")
    if storage.dtype != np.uint8 or storage.ndim != 1:
        raise Corrupt("`_rebuild_tensor_v3` got a typed storage")
    usable = storage.size - storage.size % dtype.dtype.itemsize
    typed = storage[:usable].view(dtype.dtype)
    if dtype.bf16:
        if id(storage) not in widened:
            widened[id(storage)] = (storage, _widen_bf16(typed))
        typed = widened[id(storage)][1]
    return _tensor_view(typed, storage_offset, size, stride)


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
        "collections.OrderedDict": _Call(_collection(OrderedDict)),
        "builtins.set": _Call(_collection(set)),
        "builtins.frozenset": _Call(_collection(frozenset)),
        "builtins.complex": _Call(_complex),
        "builtins.bytes": _Call(_bytes),
        "builtins.bytearray": _Call(_bytearray),
        "builtins.getattr": _Call(_restricted_getattr),
        "_codecs.encode": _Call(_encode),
        "torch.storage.UntypedStorage": _TorchDType(np.dtype(np.uint8)),
        "torch.UntypedStorage": _TorchDType(np.dtype(np.uint8)),
        "numpy.ndarray": _NDARRAY,
        "numpy.dtype": _Call(_make_dtype),
        "miles.utils.types.AdapterRef": AdapterRef,
        "miles.utils.types.RewardSpec": RewardSpec,
        "miles.utils.types.Sample": _SAMPLE,
        "miles.utils.types.Sample.SpecInfo": SpecInfo,  # protocol >= 4 names it directly
    }
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        allowed[f"{module}._reconstruct"] = _Call(_reconstruct)
        allowed[f"{module}.scalar"] = _Call(_scalar)
    for name in dir(np.dtypes):
        cls = getattr(np.dtypes, name)
        if name.endswith("DType") and isinstance(cls, type) and _is_plain_class(cls):
            allowed[f"numpy.dtypes.{name}"] = _DTypeClass(cls)
    for name, marker in _STORAGE_DTYPES.items():
        allowed[f"torch.{name}"] = marker
        allowed[f"torch.cuda.{name}"] = marker  # writers before torch 1.x's storage unification
    for name, marker in _TORCH_DTYPES.items():
        allowed[f"torch.{name}"] = marker
    return allowed


def _is_plain_class(cls: type) -> bool:
    try:
        return _plain(np.dtype(cls())) is not None
    except (TypeError, ValueError, Corrupt):  # needs arguments (strings), or not plain
        return False


_ALLOWED = _allowed_globals()


def _counted(budget: list[int], rebuild: Callable[..., np.ndarray], *args: Any) -> np.ndarray:
    """Rebuild a tensor; all tensors of a file may claim at most `budget_of` elements in total
    (a stride-0 view repeats one element as often as it likes). `budget`: [left, whole]."""
    view = rebuild(*args)
    budget[0] -= view.size
    if budget[0] < 0:
        raise too_big(budget[1])
    return view


# --- the unpickler ---------------------------------------------------------------------------


class _RestrictedUnpickler(pickle.Unpickler):
    """C unpickler that resolves only `_ALLOWED` and maps storages onto the archive."""

    def __init__(self, file: io.BufferedIOBase, archive: Archive) -> None:
        super().__init__(file)
        self._archive = archive
        self._storages: dict[str, np.ndarray] = {}
        # per load: the bf16 cache of v3, and how many tensor elements may still be claimed
        # (no bound methods here: a reference cycle would keep the file's copy alive until
        # the garbage collector runs)
        budget = [budget_of(len(archive.buf)), budget_of(len(archive.buf))]
        self._v2 = _Call(partial(_counted, budget, _tensor_view))
        self._v3 = _Call(partial(_counted, budget, partial(_tensor_view_v3, {})))
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
        if key not in _ALLOWED:
            # 120: a real global's whole dotted name, so the user sees what the file needs
            raise _Forbidden(shown(key, 120, literal=False))
        return _ALLOWED[key]

    def persistent_load(self, pid: Any) -> np.ndarray:
        """('storage', class, key, location, numel) -> 1-d numpy array on the file's bytes."""
        # exact types first: `==` on a hostile object could run anything it overloads
        if not (
            type(pid) is tuple
            and len(pid) == 5
            and type(pid[0]) is str
            and pid[0] == "storage"
            and type(pid[1]) is _TorchDType
            and type(pid[2]) is str
            and type(pid[4]) is int
            and pid[4] >= 0
        ):
            raise Corrupt(f"its pickle holds an unknown persistent id (a `{type(pid).__name__}`)")
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
    """Unpickle `data.pkl` of an opened archive, within the bounds of `pipeline.read.ptcheck`."""
    payload = bytes(entry_bytes(archive, archive.prefix + "data.pkl"))
    shares = check_opcodes(payload)
    # BufferedReader adds `peek`, which lets the C unpickler prefetch instead of calling
    # `read` once per opcode.
    stream = io.BufferedReader(io.BytesIO(payload), buffer_size=1 << 20)
    unpickler = _RestrictedUnpickler(stream, archive)
    value = unpickler.load()
    if shares or unpickler.numpy:  # else a tree no larger than the pickle: nothing to walk
        value = settle(value, len(archive.buf))
    return value


def _stat(path: Path) -> os.stat_result:
    """`os.stat`, with a missing file reported as DumpNotFoundError."""
    try:
        return path.stat()
    except FileNotFoundError as exc:
        raise DumpNotFoundError(path, "does not exist") from exc


def load(path: Path) -> Any:
    """Load a `torch.save` file as plain Python objects with numpy arrays for tensors.

    Tensors become numpy arrays with their dtype, shape and strides; they are zero-copy views
    on a private, writable copy of the file (an anonymous memory map; a bytearray for files
    younger than `FRESH_SECONDS`). bfloat16 tensors become float32 (exact); float16 stays
    float16. Miles dataclasses become `AdapterRef`, `RewardSpec` and `SpecInfo` from this
    module.

    Args:
        path: A `.pt` file written by `torch.save` (zip format).

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
        return _unpickle(open_archive(path, st.st_size, fresh))
    except _Forbidden as exc:
        raise UnsafePickleError(path, exc.global_name) from None
    except BigEndian as exc:
        order = shown(str(exc), literal=False)  # the file's `byteorder` entry: any bytes
        reason = f"it was written on a big-endian machine (`byteorder` is `{order}`); tokenlake reads only little-endian dumps"
        raise DumpFileError(path, reason) from None
    except Corrupt as exc:
        changed = isinstance(exc, Changed)
        raise DumpFileError(path, exc.reason, still_writing=fresh or changed) from None
    except PipelineError:
        raise
    except Exception as exc:  # any other failure inside the pickle is a corrupt file
        # 200: the unpickler's own sentence whole (it may quote the file's bytes, so cut)
        text = shown(str(exc), 200, literal=False)
        reason = f"its pickle is corrupt ({type(exc).__name__}: {text})"
        raise DumpFileError(path, reason, still_writing=fresh) from None
