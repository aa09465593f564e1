"""`tokens.first_occurrence`: each sample's first drift row of every token id, at extraction."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

from tests.conftest import store_of
from tokenlake import schema
from tokenlake.serve.query import run_query
from tokenlake.transform.flatten import first_occurrence_column

INF, NAN = math.inf, math.nan


def _flags(samples: list[list[tuple]]) -> list[list[bool | None]]:
    """Rows are (token_id, loss_mask, lp_diff, train_log_prob, rollout_log_prob), by position."""
    rows = [row for sample in samples for row in sample]
    lengths = np.array([len(s) for s in samples], dtype=np.int64)
    columns = zip(*rows, strict=True) if rows else ([],) * 5
    ids, masks, *values = (list(c) for c in columns)
    arrays = {
        schema.TOKEN_ID: pa.array(ids, pa.int64()),
        schema.LOSS_MASK: pa.array(masks, pa.int8()),
        **{
            name: pa.array(column, pa.float32())
            for name, column in zip(
                (schema.LP_DIFF, schema.TRAIN_LOG_PROB, schema.ROLLOUT_LOG_PROB),
                values,
                strict=True,
            )
        },
    }
    flat = first_occurrence_column(arrays, lengths).to_pylist()
    ends = np.cumsum(lengths)
    return [flat[end - n : end] for end, n in zip(ends, lengths, strict=True)]


OK = (1, 0.1, -1.0, -1.1)  # loss-covered, all values finite


def test_first_drift_row_of_each_id_per_sample() -> None:
    samples = [
        [(7, *OK), (8, *OK), (7, *OK), (8, *OK), (9, *OK)],
        [(7, *OK), (7, *OK)],  # the same ids in the next sample are new there
    ]
    assert _flags(samples) == [[True, True, False, False, True], [True, False]]


def test_rows_left_out_of_drift_are_null_and_do_not_count() -> None:
    left_out = [
        (5, 0, 0.1, -1.0, -1.1),  # masked
        (5, None, 0.1, -1.0, -1.1),  # no mask known
        (5, 1, None, None, -1.1),  # no train side at this position
        (5, 1, NAN, NAN, -1.1),
        (5, 1, INF, 0.0, -INF),
        (5, 1, 0.1, -1.0, NAN),
    ]
    # The first drift row with id 5 is the one after all of them.
    assert _flags([[*left_out, (5, *OK), (5, *OK)]]) == [[None] * 6 + [True, False]]


def test_ids_spread_too_wide_to_combine_give_the_same_flags() -> None:
    wide = [-(2**62), 2**62, -(2**62), 0, 2**62]
    narrow = [1, 3, 1, 2, 3]
    for ids in (wide, narrow):
        samples = [[(i, *OK) for i in ids], [(i, *OK) for i in reversed(ids)]]
        assert _flags(samples) == [
            [True, True, False, True, False],
            [True, True, True, False, False],
        ]


def test_empty_step_and_empty_sample() -> None:
    assert _flags([]) == []
    assert _flags([[], [(1, *OK)], []]) == [[], [True], []]


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["nonfinite", "multi-turn", "cp-thd"])
def test_flags_mark_exactly_the_drift_tokens_rows(tmp_path, preset):
    """Extraction's drift rows are drift_tokens' rows, and the flags count distinct samples."""
    from tokenlake.generator import synth
    from tokenlake.orchestrate.extract import ExtractOptions, extract_run

    synth.write_dump(tmp_path / "dump", synth.PRESETS[preset])
    lake = tmp_path / "lake"
    extract_run(tmp_path / "dump", store_of(lake), ExtractOptions(run_name=preset, strict=True))
    counts = run_query(
        store_of(lake),
        "SELECT count(*), count(*) FILTER (WHERE first_occurrence IS NULL) FROM drift_tokens",
    )
    [(drift_rows, unflagged)] = zip(*counts.to_pydict().values(), strict=True)
    assert drift_rows > 0 and unflagged == 0
    flagged = "SELECT count(*) FROM tokens WHERE NOT evaluation AND first_occurrence IS NOT NULL"
    assert run_query(store_of(lake), flagged).column(0).to_pylist() == [drift_rows]
    mismatched = run_query(
        store_of(lake),
        """
        SELECT rollout_id, token_id
        FROM drift_tokens
        GROUP BY rollout_id, token_id
        HAVING count(*) FILTER (WHERE first_occurrence) != count(DISTINCT batch_position)
        """,
    )
    assert mismatched.num_rows == 0


@pytest.mark.parametrize("chunk", [1, 3, 7, 1 << 18])
def test_samples_taken_a_chunk_at_a_time_give_the_same_flags(
    chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks of whole samples (a sample longer than a chunk is one chunk, empty samples
    included) mark exactly what one pass over the step marks."""
    from tokenlake.transform import flatten

    rng = np.random.default_rng(7)
    samples = [
        [(int(rng.integers(0, 5)), int(rng.integers(0, 2)), 0.1, -1.0, -1.1) for _ in range(n)]
        for n in (5, 0, 1, 9, 0, 4, 12, 2, 0)
    ]
    expected = _flags(samples)
    monkeypatch.setattr(flatten, "CHUNK_ROWS", chunk)
    assert _flags(samples) == expected
    assert [sum(bool(f) for f in s) for s in expected] == [
        len({row[0] for row in s if row[1]}) for s in samples
    ]
