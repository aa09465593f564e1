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
