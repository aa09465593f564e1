"""numpy objects as a `.pt` file's pickle builds them: plain dtypes only, arrays only from
exactly their bytes.

A real `numpy.dtype` lets a pickle's BUILD forge object fields (raw bytes read as pointers), and
an array's state may claim more bytes than it gives; so the pickle gets proxies
(`tokenlake.read.pt.ptcheck.Placeholder`) that become a dtype or an array only once their state is
exactly what numpy itself writes. `tokenlake.read.pt.ptglobals` lists these callables under numpy's
names.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from tokenlake.errors import shown
from tokenlake.read.pt.ptcheck import Placeholder
from tokenlake.read.pt.ptzip import Corrupt

try:  # numpy >= 2 moved the pickle helpers; 1.x pickles name `numpy.core`, 2.x `numpy._core`
    from numpy._core import multiarray as _multiarray
except ImportError:  # pragma: no cover - numpy 1.x
    from numpy.core import multiarray as _multiarray  # type: ignore[no-redef]


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
            f"its pickle builds a numpy `{shown(dtype.str, literal=False)}` dtype; tokenlake"
            " reads only plain numeric, bool and fixed-width string dtypes"
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


def make_dtype(spec: Any, align: Any = False, copy: Any = True) -> _DTypeProxy:
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


NDARRAY = ("numpy.ndarray",)  # not a type: NEWOBJ/REDUCE cannot make arrays from it


def reconstruct(cls: Any, shape: Any, typecode: Any) -> _ArrayProxy:
    """`numpy.core.multiarray._reconstruct(ndarray, (0,), b'b')`, the only call numpy writes."""
    if cls is not NDARRAY or shape != (0,) or typecode not in (b"b", "b"):
        raise Corrupt("its pickle calls numpy's `_reconstruct` with arguments numpy never writes")
    return _ArrayProxy()


def scalar(proxy: Any, data: Any = None) -> Any:
    """`numpy.core.multiarray.scalar(dtype, bytes)`: a plain dtype and exactly its bytes."""
    if type(proxy) is not _DTypeProxy or type(data) is not bytes:
        raise Corrupt("its pickle calls numpy's `scalar` with arguments numpy never writes")
    if len(data) != proxy.dtype.itemsize:
        raise Corrupt(
            f"its pickle gives a numpy `{proxy.dtype.str}` scalar {len(data)} bytes;"
            f" it needs {proxy.dtype.itemsize}"
        )
    return _multiarray.scalar(proxy.dtype, data)


def dtype_classes() -> dict[str, Any]:
    """The `numpy.dtypes.*DType` classes that build a plain dtype, by name, as pickles call them."""
    classes: dict[str, Any] = {}
    for name in dir(np.dtypes):
        cls = getattr(np.dtypes, name)
        if name.endswith("DType") and isinstance(cls, type) and _is_plain_class(cls):
            classes[name] = _DTypeClass(cls)
    return classes


def _is_plain_class(cls: type) -> bool:
    try:
        return _plain(np.dtype(cls())) is not None
    except (TypeError, ValueError, Corrupt):  # needs arguments (strings), or not plain
        return False
