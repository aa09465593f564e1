"""Stages take values and return values: validation, resolve and flatten change nothing they
are given, so no stage depends on another having run first (pipeline/tokenlake/read/validate.py, flatten.py)."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest

from tests.memdump import MemDump, column, sample, train_rows
from tokenlake import schema
from tokenlake.read import validate
from tokenlake.steptypes import TrainRow
from tokenlake.transform import flatten


def test_extraction_leaves_the_loaded_samples_as_they_were(tmp_path, monkeypatch) -> None:
    dump = MemDump(tmp_path, monkeypatch)
    samples = [
        sample(0, [1, 2, 3, 4], 2, loss_mask=[1, 0], rollout_log_probs=[-0.5, -1.0]),
        sample(1, [5, 6, 7], 3, loss_mask=[1, 1]),  # does not fit the response
    ]
    before = copy.deepcopy(samples)
    dump.rollout(samples)
    tokens, table = dump.tables()
    assert samples == before  # the lists are still lists: nothing replaced them with arrays
    assert column(tokens, schema.LOSS_MASK) == [1, 0, None, None, None]
    assert column(table, "alignment_failed") == [False, True]


def test_a_train_row_that_does_not_fit_flags_the_sample_without_changing_the_row(
    tmp_path, monkeypatch
) -> None:
    dump = MemDump(tmp_path, monkeypatch)
    dump.rollout([sample(0, [1, 2, 3, 4], 2)])
    dump.train(0, train_rows([0], [[1, 2, 3, 4]], [3]))  # media expansion: R 3, not 2
    tokens, table = dump.tables()
    assert column(tokens, schema.LOSS_MASK) == [None, None]
    assert column(table, "alignment_failed") == [True]


def test_flatten_reads_the_checked_arrays_and_changes_no_train_row() -> None:
    checked = validate.check_sample(sample(0, [1, 2, 3, 4], 2))
    row = TrainRow(
        dumped_rank=0,
        response_length=3,
        total_length=4,
        loss_mask=np.ones(3, np.int32),
        normalized_reward=None,
        truncated=None,
        raw_reward=None,
        fields=dict.fromkeys(schema.CP_SLICED_FIELDS),
        alignment_failed=False,
    )
    part = flatten.sample_tokens(checked, row)
    assert (part.misaligned, part.mask, part.token_ids.tolist()) == (True, None, [3, 4])
    assert row.alignment_failed is False
    with pytest.raises(dataclasses.FrozenInstanceError):
        row.alignment_failed = True  # type: ignore[misc]
