"""The sampler's support per response token (dump-format.md 9b, miles #2595).

With top-k / top-p sampling miles records, per response position, the token ids the sampler
kept: `rollout_sampling_mask_ids` (all supports, flattened) and
`rollout_sampling_mask_offsets` (R + 1 offsets: first 0, last `len(ids)`, strictly
increasing); both None when sampling was unbounded. Kept here is the support size of each
token (the offsets' differences): a log-prob normalised over a bounded support is a different
quantity from one over the whole vocabulary, so the lake marks which tokens had one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenlake.errors import SampleValueError, shown
from tokenlake.read.values import INT64_MAX, flat_array, is_int

IDS = "rollout_sampling_mask_ids"
OFFSETS = "rollout_sampling_mask_offsets"


def support_sizes(sample: dict[str, Any], response_length: int) -> np.ndarray | None:
    """int32 [R] support sizes, or None: unbounded sampling (both keys missing or None), or
    offsets for another number of positions (they do not fit this response).

    Raises:
        SampleValueError: one key without the other, or offsets that are not what miles
            writes (integers, first 0, strictly increasing, last the number of ids).
    """
    ids, offsets = sample.get(IDS), sample.get(OFFSETS)
    if ids is None and offsets is None:
        return None
    if ids is None or offsets is None:
        given, missing = (IDS, OFFSETS) if offsets is None else (OFFSETS, IDS)
        raise SampleValueError(given, f"is set but `{missing}` is None; miles writes both")
    for field, value in ((IDS, ids), (OFFSETS, offsets)):
        if not isinstance(value, list | tuple):
            raise SampleValueError(field, f"is {shown(value)}, not a list of integers")
    values = _offsets_array(offsets, len(ids))
    outside = (values < 0) | (values > len(ids))
    if outside.any():
        bad = int(values[np.argmax(outside)])
        problem = f"holds {shown(bad)}, outside 0..{len(ids)} (the number of `{IDS}`)"
        raise SampleValueError(OFFSETS, problem)
    if values[0] != 0 or values[-1] != len(ids):
        problem = f"run from {values[0]} to {values[-1]}; expected 0 to {len(ids)}"
        raise SampleValueError(OFFSETS, f"{problem} (the number of `{IDS}`)")
    sizes = np.diff(values)
    if (sizes <= 0).any():
        raise SampleValueError(OFFSETS, "are not strictly increasing (an empty support)")
    if len(sizes) != response_length:
        return None
    return sizes.astype(np.int32)


def _offsets_array(offsets: list[Any] | tuple[Any, ...], count: int) -> np.ndarray:
    """The offsets as one int64 array, converted in one numpy call (as `validate` reads the
    per-token lists); only when that fails is the list walked to name the first bad entry."""
    array = flat_array(offsets) if offsets else None
    if array is not None and array.dtype.kind in "iu" and array.max() <= INT64_MAX:
        return array.astype(np.int64, copy=False)
    bad = next((v for v in offsets if not is_int(v)), None) if offsets else offsets
    if bad is not None or not offsets:
        raise SampleValueError(OFFSETS, f"holds {shown(bad)}, not integer offsets")
    # Integers numpy could not hold together (beyond int64, or int64 mixed with uint64).
    outside = next((v for v in offsets if not 0 <= v <= count), None)
    if outside is not None:
        problem = f"holds {shown(outside)}, outside 0..{count} (the number of `{IDS}`)"
        raise SampleValueError(OFFSETS, problem)
    return np.array([int(v) for v in offsets], dtype=np.int64)
