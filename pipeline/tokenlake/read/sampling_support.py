"""The sampler's support per response token (dump-format.md 9b, miles #2595; slime #2102).

With top-k / top-p sampling miles records, per response position, the token ids the sampler
kept: `rollout_sampling_mask_ids` (all supports, flattened) and
`rollout_sampling_mask_offsets` (R + 1 offsets: first 0, last `len(ids)`, strictly
increasing); both None when sampling was unbounded. slime records the same since 2026-06-19
(#2102, `--rollout-top-p` below 1) as `rollout_top_p_token_ids` and
`rollout_top_p_token_offsets` (lists, or int32 tensors), and its trainer's log-probs are then
normalised over that support too. Kept here is the support size of each token (the offsets'
differences): a log-prob normalised over a bounded support is a different quantity from one
over the whole vocabulary, so the lake marks which tokens had one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenlake.errors import SampleValueError, shown
from tokenlake.read.values import INT64_MAX, flat_array, is_int

IDS = "rollout_sampling_mask_ids"
OFFSETS = "rollout_sampling_mask_offsets"
SLIME_IDS = "rollout_top_p_token_ids"
SLIME_OFFSETS = "rollout_top_p_token_offsets"
# (ids key, offsets key, whose): miles' keys first; a dump has one pair or the other.
_PAIRS = ((IDS, OFFSETS, "miles"), (SLIME_IDS, SLIME_OFFSETS, "slime"))


def bounded(sample: dict[str, Any]) -> bool:
    """Whether the sample recorded a bounded support (checked by `support_sizes` already)."""
    return any(
        sample.get(ids) is not None or sample.get(offsets) is not None for ids, offsets, _ in _PAIRS
    )


def support_sizes(sample: dict[str, Any], response_length: int) -> np.ndarray | None:
    """int32 [R] support sizes, or None: unbounded sampling (both keys of both pairs missing
    or None), or offsets for another number of positions (they do not fit this response).

    Raises:
        SampleValueError: one key without the other, or offsets that are not what miles
            and slime write (integers, first 0, strictly increasing, last the number of ids).
    """
    for ids_key, offsets_key, whose in _PAIRS:
        ids, offsets = sample.get(ids_key), sample.get(offsets_key)
        if ids is not None or offsets is not None:
            return _sizes(ids, offsets, (ids_key, offsets_key, whose), response_length)
    return None


def _sizes(
    ids: Any, offsets: Any, keys: tuple[str, str, str], response_length: int
) -> np.ndarray | None:
    ids_key, offsets_key, whose = keys
    if ids is None or offsets is None:
        given, missing = (ids_key, offsets_key) if offsets is None else (offsets_key, ids_key)
        raise SampleValueError(given, f"is set but `{missing}` is None; {whose} writes both")
    for field, value in ((ids_key, ids), (offsets_key, offsets)):
        if not _is_int_list(value):
            raise SampleValueError(field, f"is {shown(value)}, not a list of integers")
    values = _offsets_array(offsets, len(ids), ids_key, offsets_key)
    outside = (values < 0) | (values > len(ids))
    if outside.any():
        bad = int(values[np.argmax(outside)])
        problem = f"holds {shown(bad)}, outside 0..{len(ids)} (the number of `{ids_key}`)"
        raise SampleValueError(offsets_key, problem)
    if values[0] != 0 or values[-1] != len(ids):
        problem = f"run from {values[0]} to {values[-1]}; expected 0 to {len(ids)}"
        raise SampleValueError(offsets_key, f"{problem} (the number of `{ids_key}`)")
    sizes = np.diff(values)
    if (sizes <= 0).any():
        raise SampleValueError(offsets_key, "are not strictly increasing (an empty support)")
    if len(sizes) != response_length:
        return None
    return sizes.astype(np.int32)


def _is_int_list(value: Any) -> bool:
    """A list or tuple, or a 1-D integer array (slime's int32 tensors)."""
    if isinstance(value, np.ndarray):
        return value.ndim == 1 and value.dtype.kind in "iu"
    return isinstance(value, list | tuple)


def _offsets_array(offsets: Any, count: int, ids_key: str, offsets_key: str) -> np.ndarray:
    """The offsets as one int64 array, converted in one numpy call (as `validate` reads the
    per-token lists); only when that fails is the list walked to name the first bad entry."""
    if isinstance(offsets, np.ndarray):
        if not offsets.size:
            raise SampleValueError(offsets_key, f"holds {shown(offsets)}, not integer offsets")
        return offsets.astype(np.int64)
    array = flat_array(offsets) if offsets else None
    if array is not None and array.dtype.kind in "iu" and array.max() <= INT64_MAX:
        return array.astype(np.int64, copy=False)
    bad = next((v for v in offsets if not is_int(v)), None) if offsets else offsets
    if bad is not None or not offsets:
        raise SampleValueError(offsets_key, f"holds {shown(bad)}, not integer offsets")
    # Integers numpy could not hold together (beyond int64, or int64 mixed with uint64).
    outside = next((v for v in offsets if not 0 <= v <= count), None)
    if outside is not None:
        problem = f"holds {shown(outside)}, outside 0..{count} (the number of `{ids_key}`)"
        raise SampleValueError(offsets_key, problem)
    return np.array([int(v) for v in offsets], dtype=np.int64)
