"""The allow-list of a `.pt` file's pickle: every global it may name, and what each becomes.

`tokenlake.read.pt.ptread`'s unpickler resolves a global only through `ALLOWED` (dump-format.md 2.4
and 3.6); any other name raises `Forbidden` before the pickle runs. No name resolves to the real
object: the miles dataclasses become sealed stand-ins defined here (`AdapterRef`, `RewardSpec`,
`SpecInfo`), builtins become immutable wrappers (`Call`) that check the exact types of their
arguments, numpy's constructors come from `tokenlake.read.pt.ptnumpy`, and torch's storage classes
and dtypes are markers from `tokenlake.read.pt.pttensor`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

import numpy as np

from tokenlake.errors import shown
from tokenlake.read.pt import ptnumpy
from tokenlake.read.pt.pttensor import STORAGE_DTYPES, TORCH_DTYPES, TorchDType
from tokenlake.read.pt.ptzip import Corrupt


class Forbidden(Exception):
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


class Call(NamedTuple):
    """Immutable wrapper around a function: BUILD cannot rewrite its defaults or code."""

    fn: Callable[..., Any]

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)


def _restricted_getattr(obj: Any, name: Any) -> Any:
    """`builtins.getattr` as old pickles use it, limited to `Sample.SpecInfo`."""
    if type(name) is not str:
        raise Forbidden(f"getattr(..., <{type(name).__name__}>)")
    if obj is _SAMPLE and name == "SpecInfo":
        return SpecInfo
    if obj is _SAMPLE:
        raise Forbidden(f"miles.utils.types.Sample.{shown(name, literal=False)}")
    raise Forbidden(f"getattr({_global_name(obj)}, {shown(name)})")


def _global_name(obj: Any) -> str:
    """The allow-list name of a global the pickle holds (wrappers included), else its type's."""
    for key, value in ALLOWED.items():
        if value is obj:
            return key
    owner = obj if isinstance(obj, type) else type(obj)
    return f"{owner.__module__}.{owner.__qualname__}"


def _encode(text: Any, encoding: Any = "utf-8") -> bytes:
    """`_codecs.encode` as protocol-2 pickles use it for `bytes` values (str -> bytes)."""
    if type(text) is not str or type(encoding) is not str or encoding not in _TEXT_CODECS:
        raise Forbidden(f"_codecs.encode({type(text).__name__}, {shown(encoding)})")
    return text.encode(encoding)


_TEXT_CODECS = ("latin1", "latin-1", "utf-8", "utf8")


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


def _allowed_globals() -> dict[str, Any]:
    """Every global a dump may name (`module.name` -> the object handed to the pickle)."""
    allowed: dict[str, Any] = {
        "collections.OrderedDict": Call(_collection(OrderedDict)),
        "builtins.set": Call(_collection(set)),
        "builtins.frozenset": Call(_collection(frozenset)),
        "builtins.complex": Call(_complex),
        "builtins.bytes": Call(_bytes),
        "builtins.bytearray": Call(_bytearray),
        "builtins.getattr": Call(_restricted_getattr),
        "_codecs.encode": Call(_encode),
        "torch.storage.UntypedStorage": TorchDType(np.dtype(np.uint8)),
        "torch.UntypedStorage": TorchDType(np.dtype(np.uint8)),
        "numpy.ndarray": ptnumpy.NDARRAY,
        "numpy.dtype": Call(ptnumpy.make_dtype),
        "miles.utils.types.AdapterRef": AdapterRef,
        "miles.utils.types.RewardSpec": RewardSpec,
        "miles.utils.types.Sample": _SAMPLE,
        "miles.utils.types.Sample.SpecInfo": SpecInfo,  # protocol >= 4 names it directly
    }
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        allowed[f"{module}._reconstruct"] = Call(ptnumpy.reconstruct)
        allowed[f"{module}.scalar"] = Call(ptnumpy.scalar)
    for name, dtype_class in ptnumpy.dtype_classes().items():
        allowed[f"numpy.dtypes.{name}"] = dtype_class
    for name, marker in STORAGE_DTYPES.items():
        allowed[f"torch.{name}"] = marker
        allowed[f"torch.cuda.{name}"] = marker  # writers before torch 1.x's storage unification
    for name, marker in TORCH_DTYPES.items():
        allowed[f"torch.{name}"] = marker
    return allowed


ALLOWED = _allowed_globals()
