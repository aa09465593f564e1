"""`count_nonfinite`: the NaN/inf values a step keeps, as the extraction reports them."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa

from tokenlake import schema
from tokenlake.transform.tables import count_nonfinite

NAN, INF = math.nan, math.inf


def _table(columns: dict[str, pa.Array | pa.ChunkedArray], rows: int) -> pa.Table:
    return pa.table(
        {
            name: columns.get(name, pa.nulls(rows, pa.float32()))
            for name in schema.TOKEN_STAT_COLUMNS
        }
    )


def test_counts_nan_and_both_infinities_but_not_nulls() -> None:
    values = pa.array([1.0, NAN, None, INF, -INF, 0.0], pa.float32())
    other = pa.array([NAN, None, None, None, None, 2.5], pa.float32())
    table = _table({schema.TRAIN_LOG_PROB: values, schema.ENTROPY: other}, 6)
    assert count_nonfinite(table) == 4


def test_a_nan_under_a_null_is_not_counted() -> None:
    # The flattener leaves real values in the slots it masks: only valid rows count.
    values = np.array([NAN, INF, NAN, 1.0], dtype=np.float32)
    validity = pa.py_buffer(np.packbits([False, True, False, True], bitorder="little"))
    column = pa.Array.from_buffers(pa.float32(), 4, [validity, pa.py_buffer(values)])
    assert count_nonfinite(_table({schema.LP_DIFF: column}, 4)) == 1


def test_chunks_and_slices_are_read_at_their_offsets() -> None:
    whole = pa.array([NAN, None, 1.0, INF, None, NAN, 3.0, -INF, None, 2.0], pa.float32())
    chunked = pa.chunked_array([whole.slice(1, 4), whole.slice(5, 5)])  # rows 1-4, 5-9
    assert count_nonfinite(_table({schema.ROLLOUT_LOG_PROB: chunked}, 9)) == 3


def test_a_step_without_values_has_none() -> None:
    assert count_nonfinite(_table({}, 3)) == 0
    assert count_nonfinite(_table({}, 0)) == 0
