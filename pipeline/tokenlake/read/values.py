"""What counts as an integer in a dump value: one definition for every reader.

A dump's values come from pickles anyone could write, so `int` is never applied blindly:
a bool is not an integer here (Python counts it as one), a 0-d array is read as the scalar
it holds, and an integer must fit the int64 columns it lands in.
"""

from __future__ import annotations

from typing import Any

import numpy as np

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


def is_int(value: Any) -> bool:
    """A Python or numpy integer, not a bool (which Python counts as one).

    Examples:
        >>> is_int(3), is_int(np.int8(3)), is_int(True), is_int(3.0)
        (True, True, False, False)
    """
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def scalar(value: Any) -> Any:
    """The value a 0-d array holds (a train column entry may be one); anything else as it is."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        return value[()]
    return value


# numpy >= 2.4 can refuse nesting up front (`ndmax`); older ones would build the nested shape,
# which a few shared references in a pickle make astronomically large.
_HAS_NDMAX = np.lib.NumpyVersion(np.__version__) >= "2.4.0"


def flat_array(values: list[Any] | tuple[Any, ...]) -> np.ndarray | None:
    """The values as a 1-D array in one numpy call, or None if an entry is itself a sequence
    (or something numpy cannot hold)."""
    try:
        if _HAS_NDMAX:
            return np.array(values, ndmax=1)  # type: ignore[call-overload,unused-ignore]
        if any(isinstance(v, list | tuple | np.ndarray) for v in values):  # pragma: no cover
            return None
        return np.asarray(values)  # pragma: no cover - numpy < 2.4
    except (ValueError, TypeError, OverflowError):  # nested, or entries numpy cannot hold
        return None


def first_bool(values: Any, array: np.ndarray) -> int | None:
    """The entry of a list that is a bool although numpy made numbers of the list, or None.

    numpy reads `[True, -0.5]` as `[1.0, -0.5]` and `[True, 7]` as `[1, 7]`: a `true` among a
    JSON line's log-probs or token ids would land as a log-prob of 1.0 or token 1. A bool can
    only hide where the array holds 0 or 1, so other lists cost one array comparison.

    Examples:
        >>> first_bool([0.5, True], np.asarray([0.5, True])), first_bool([1, 2], np.asarray([1, 2]))
        (1, None)
    """
    if not isinstance(values, list | tuple) or array.ndim != 1 or array.dtype.kind not in "iuf":
        return None
    if not ((array == 0) | (array == 1)).any():
        return None
    if not {bool, np.bool_} & set(map(type, values)):
        return None
    return next(i for i, v in enumerate(values) if isinstance(v, bool | np.bool_))
