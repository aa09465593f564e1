"""Join and layout resolution on hand-made train files (no torch): the cases no fixture has."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tokenlake.read import cp_layout
from tokenlake.read.resolve import Location, TrainFile, locate_rows, resolve_cp_fields


def _file(rank: int, rows: dict, **top) -> TrainFile:
    return TrainFile(rank, Path(f"train_data/0_{rank}.pt"), {"rollout_data": rows, **top})


def test_agentic_siblings_sharing_an_index_are_matched_by_tokens():
    samples = [
        {"index": 7, "tokens": [1, 2, 3]},
        {"index": 7, "tokens": [1, 2, 4]},
        {"index": 8, "tokens": [5, 6]},
    ]
    rows = {"sample_indices": [7, 8, 7], "tokens": [[1, 2, 4], [5, 6], [1, 2, 3]]}
    located = locate_rows(samples, [_file(0, rows)])
    assert {pos: [loc.row for loc in locs] for pos, locs in located.items()} == {
        1: [0],
        2: [1],
        0: [2],
    }


def test_identical_siblings_still_get_distinct_rows():
    samples = [{"index": 3, "tokens": [9, 9]}, {"index": 3, "tokens": [9, 9]}]
    rows = {"sample_indices": [3, 3], "tokens": [[9, 9], [9, 9]]}
    located = locate_rows(samples, [_file(0, rows), _file(1, rows)])
    assert {pos: [(loc.file.rank, loc.row) for loc in locs] for pos, locs in located.items()} == {
        0: [(0, 0), (1, 0)],
        1: [(0, 1), (1, 1)],
    }


def _cp_files(full: np.ndarray, total: int, ranks: list[int], recorded: bool) -> list:
    files = []
    for cp_rank in ranks:
        part = cp_layout.slice_for_rank(full, total, cp_rank, 2)
        top = {"cp_rank": cp_rank, "cp_size": 2} if recorded else {}
        files.append(_file(cp_rank, {"rollout_log_probs": [part], "log_probs": [part * 2]}, **top))
    return files


def test_recorded_cp_reassembles_and_a_missing_rank_fails_alignment():
    full = np.arange(12, dtype=np.float32) - 20

    locs = [Location(f, 0) for f in _cp_files(full, 20, [0, 1], recorded=True)]
    fields, failed = resolve_cp_fields(locs, 20, 12)
    assert not failed
    assert fields["log_probs"].tolist() == (full * 2).tolist()
    assert fields["entropy"] is None  # not dumped: null, not a failure

    locs = [Location(f, 0) for f in _cp_files(full, 20, [1], recorded=True)]
    fields, failed = resolve_cp_fields(locs, 20, 12)
    assert failed and fields["log_probs"] is None and fields["rollout_log_probs"] is None


def test_legacy_cp_is_inferred_and_identical_slices_are_refused():
    full = np.arange(12, dtype=np.float32) - 20

    locs = [Location(f, 0) for f in _cp_files(full, 20, [0, 1], recorded=False)]
    fields, failed = resolve_cp_fields(locs, 20, 12)
    assert not failed and fields["rollout_log_probs"].tolist() == full.tolist()

    zeros = np.zeros(12, dtype=np.float32)  # both ranks hold all-zero placeholders of width 6
    same = [_file(r, {"rollout_log_probs": [zeros[:6]], "log_probs": [zeros[:6]]}) for r in (0, 1)]
    fields, failed = resolve_cp_fields([Location(f, 0) for f in same], 20, 12)
    assert failed and fields["log_probs"] is None
