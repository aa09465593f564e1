"""bshd train rows each padded to their own length (miles #2698, open on 2026-08-21): the CP
slices of a row are cut with the row's own `max_seq_lens`, which now differs between the rows
of one file. The reader reassembles each row with its own value (dump-format.md 4.8, 9b)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.conftest import store_of
from tokenlake.generator.synth import PRESETS, write_dump
from tokenlake.read.cp_layout import slice_for_rank


def test_rows_padded_to_their_own_length_land_as_the_truth(tmp_path: Path) -> None:
    import duckdb
    import torch

    from tokenlake.orchestrate.extract import ExtractOptions, extract_run

    truth = write_dump(tmp_path / "dump", PRESETS["cp-bshd-per-sample"], keep_truth=True)
    assert truth is not None
    data = torch.load(tmp_path / "dump" / "train_data" / "0_0.pt", weights_only=True)
    columns = data["rollout_data"]
    pads = columns["max_seq_lens"]
    assert len(set(pads)) > 1  # the rows of one file differ
    # ... and cutting a row with the file's largest instead of its own moves its values
    moved = [
        row
        for row, (total, pad) in enumerate(zip(columns["total_lengths"], pads, strict=True))
        if not np.array_equal(
            slice_for_rank(np.arange(columns["response_lengths"][row]), total, 0, 2, pad),
            slice_for_rank(np.arange(columns["response_lengths"][row]), total, 0, 2, max(pads)),
        )
    ]
    assert moved
    summary = extract_run(tmp_path / "dump", store_of(tmp_path / "lake"), ExtractOptions(workers=1))
    assert summary.failed == []
    with duckdb.connect(str(tmp_path / "lake" / "tokenlake.duckdb"), read_only=True) as con:
        got = con.execute(
            "SELECT rollout_id, batch_position, list(train_log_prob ORDER BY position),"
            " bool_or(alignment_failed) FROM tokens JOIN samples"
            " USING (run, rollout_id, evaluation, batch_position) WHERE NOT evaluation"
            " GROUP BY ALL ORDER BY ALL"
        ).fetchall()
    for rid, position, values, failed in got:
        want = truth.samples[rid, False, position]
        assert not failed
        if want.log_probs is not None and want.has_train_row:
            assert np.array_equal(np.asarray(values, dtype=np.float32), want.log_probs)
