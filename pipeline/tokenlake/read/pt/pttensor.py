"""Tensors of a `.pt` file as numpy arrays: storage dtypes and the views torch rebuilds.

A tensor in a torch pickle is `_rebuild_tensor_v2/v3(storage, offset, size, stride, ...)` over a
storage (one zip member); here it becomes a zero-copy numpy view on that storage's array. Torch's
storage classes and dtypes are `TorchDType` markers naming the numpy dtype of their bytes;
bfloat16, which numpy lacks, is widened to float32 once per storage. All views of one file
together may claim at most `tokenlake.read.pt.ptcheck.budget_of` elements (`Rebuild`): a stride-0
view repeats one element as often as it likes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from tokenlake.read.pt.ptcheck import too_big
from tokenlake.read.pt.ptzip import Corrupt


class TorchDType(NamedTuple):
    """Marker for a torch storage class or torch dtype global: the dtype its bytes have."""

    dtype: np.dtype
    bf16: bool = False  # numpy has no bfloat16: the bytes are read as uint16, then widened


_BF16 = TorchDType(np.dtype(np.uint16), bf16=True)


def widen_bf16(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bits (uint16) -> float32, exactly: bf16 is the top half of a float32."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def tensor_view(
    storage: Any, storage_offset: Any, size: Any, stride: Any, *_rest: Any
) -> np.ndarray:
    """`_rebuild_tensor_v2`: a numpy view with the tensor's offset, shape and strides.

    How many elements a view may claim (stride 0 repeats one) is bounded later, with the whole
    value graph (`tokenlake.read.pt.ptcheck.settle`).
    """
    if type(storage) is not np.ndarray or storage.ndim != 1:
        raise Corrupt(f"a tensor was rebuilt from a `{type(storage).__name__}`, not a storage")
    if (  # the common 1-d whole-storage tensor: exact types checked before any `==`
        type(size) is tuple
        and type(stride) is tuple
        and len(size) == 1
        and len(stride) == 1
        and type(size[0]) is int
        and type(stride[0]) is int
        and type(storage_offset) is int
        and storage_offset == 0
        and stride[0] == 1
        and size[0] == len(storage)
    ):
        return storage[:]  # no strided constructor, and no per-element checks
    if not (
        type(storage_offset) is int
        and storage_offset >= 0
        and _ints(size)
        and _ints(stride)
        and len(size) == len(stride)
    ):
        raise Corrupt("a tensor has an offset, shape or strides that are not whole numbers")
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


def tensor_view_v3(
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
    if type(dtype) is not TorchDType or type(storage) is not np.ndarray:
        raise Corrupt("`_rebuild_tensor_v3` got arguments that are not a storage and dtype")
    if storage.dtype != np.uint8 or storage.ndim != 1:
        raise Corrupt("`_rebuild_tensor_v3` got a typed storage")
    usable = storage.size - storage.size % dtype.dtype.itemsize
    typed = storage[:usable].view(dtype.dtype)
    if dtype.bf16:
        if id(storage) not in widened:
            widened[id(storage)] = (storage, widen_bf16(typed))
        typed = widened[id(storage)][1]
    return tensor_view(typed, storage_offset, size, stride)


# Legacy storage classes (what `torch.save` names for tensors), as `torch.<Name>Storage`.
_STORAGE_NAMES = "Float Double Half Long Int Short Char Byte Bool ComplexFloat ComplexDouble"
_STORAGE_NUMPY = "float32 float64 float16 int64 int32 int16 int8 uint8 bool complex64 complex128"
STORAGE_DTYPES = {
    f"{n}Storage": TorchDType(np.dtype(d))
    for n, d in zip(_STORAGE_NAMES.split(), _STORAGE_NUMPY.split(), strict=True)
} | {"BFloat16Storage": _BF16}

# `torch.<dtype>` globals, which `_rebuild_tensor_v3` names for dtypes without a storage class.
TORCH_DTYPES = {
    d: TorchDType(np.dtype(d)) for d in [*_STORAGE_NUMPY.split(), "uint16", "uint32", "uint64"]
} | {"bfloat16": _BF16}


class Rebuild(NamedTuple):
    """`_rebuild_tensor_v2` or `_v3` as a pickle calls it: immutable (BUILD cannot rewrite it,
    as `tokenlake.read.pt.ptglobals.Call`), and all tensors of a file together may claim at
    most `budget_of` elements (a stride-0 view repeats one element as often as it likes).
    `budget`: [left, whole]."""

    budget: list[int]
    rebuild: Callable[..., np.ndarray]  # `tensor_view`, or `tensor_view_v3` with its cache

    def __call__(self, *args: Any) -> np.ndarray:
        view = self.rebuild(*args)
        budget = self.budget
        budget[0] -= view.size
        if budget[0] < 0:
            raise too_big(budget[1])
        return view
