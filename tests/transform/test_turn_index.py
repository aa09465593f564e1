"""`tokens.turn_index`: each sample's loss-covered runs numbered at extraction."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from tokenlake.transform.flatten import turn_index_column


def _turns(masks: list[list[int] | None]) -> list[list[int | None]]:
    lengths = np.array([2 if m is None else len(m) for m in masks], dtype=np.int64)
    values = [v for m in masks for v in (m if m is not None else [None, None])]
    column = turn_index_column(pa.array(values, pa.int8()), np.cumsum(lengths) - lengths)
    flat = column.to_pylist()
    ends = np.cumsum(lengths)
    return [flat[end - n : end] for end, n in zip(ends, lengths, strict=True)]


def test_runs_are_numbered_per_sample_and_masked_tokens_are_null() -> None:
    masks = [[1, 1, 0, 1], [0, 0, 1, 0, 0, 1, 1], [], None, [0], [1, 0, 1]]
    assert _turns(masks) == [
        [0, 0, None, 1],
        [None, None, 0, None, None, 1, 1],
        [],
        [None, None],
        [None],
        [0, None, 1],
    ]


def test_a_run_never_continues_into_the_next_sample() -> None:
    assert _turns([[1, 1], [1, 1], [0, 1]]) == [[0, 0], [0, 0], [None, 0]]


def test_empty_step() -> None:
    assert turn_index_column(pa.array([], pa.int8()), np.zeros(0, np.int64)).to_pylist() == []
