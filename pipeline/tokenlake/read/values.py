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
