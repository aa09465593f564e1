"""Routing-replay arrays of a rollout sample (dump-format.md 2.3): `rollout_routed_experts`
(the MoE experts each token was routed to, numpy int [T-1, layers, top-k]) and
`rollout_indexer_topk` (the indexer's top-k, [T-1, indexer layers, index top-k]).

They are very large (tens of KB per token for big MoE models), so the lake keeps them only on
request (`tokenlake extract --with-experts`), in their own table (`experts`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenlake.errors import SampleValueError, shown

ROUTED_EXPERTS = "rollout_routed_experts"
INDEXER_TOPK = "rollout_indexer_topk"
REPLAY_FIELDS = (ROUTED_EXPERTS, INDEXER_TOPK)
_INT32 = np.iinfo(np.int32)


def replay_arrays(sample: dict[str, Any]) -> dict[str, np.ndarray]:
    """The sample's replay arrays that are set, each int32 [positions, layers, k].

    An array's rows (positions) and layers cost memory in the `experts` table whatever they
    hold, so each must hold a value: a zero-size array declaring 10^9 positions is refused
    (the values themselves are bounded by the file's bytes, `ptcheck`).

    Raises:
        SampleValueError: a value that is not a 3-D integer array of int32 values, or whose
            positions and layers hold no values.
    """
    arrays = {}
    for field in REPLAY_FIELDS:
        value = sample.get(field)
        if value is None:
            continue
        if not isinstance(value, np.ndarray) or value.ndim != 3 or value.dtype.kind not in "iu":
            raise SampleValueError(field, f"is {shown(value)}, not a 3-D integer array")
        positions, layers = value.shape[0], value.shape[1]
        if value.size < positions * max(layers, 1):  # rows that cost bytes the file never held
            problem = (
                f"is an array of shape {tuple(value.shape)}: {positions:,} positions of"
                f" {layers:,} layers that hold no values"
            )
            raise SampleValueError(field, problem)
        if value.size and (value.min() < _INT32.min or value.max() > _INT32.max):
            raise SampleValueError(field, "holds values outside the int32 range")
        arrays[field] = value.astype(np.int32, copy=False)
    return arrays
