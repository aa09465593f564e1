"""A masked, missing or unaligned value is NULL, never a made-up number.

Each case is a one-step dump held in memory (`tests.memdump`), run through the real step path,
and checked value by value: which positions are NULL and what `alignment_failed` says.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import store_of
from tests.memdump import MemDump, column, sample, train_rows
from tokenlake.read import cp_layout
from tokenlake.read.trajectory import messages_by_position

QUARTERS = [-0.25 * (k + 1) for k in range(6)]  # exact in float32
HALVES = [-0.5 * (k + 1) for k in range(6)]


def _cp_file(dump: MemDump, cp_rank: int, full_t: int, base: dict) -> None:
    """One CP rank's file: the zigzag slice of `rollout_log_probs` and `log_probs`."""
    sliced = {
        name: [cp_layout.slice_for_rank(np.float32(values), full_t, cp_rank, 2)]
        for name, values in (("rollout_log_probs", QUARTERS), ("log_probs", HALVES))
    }
    dump.train(cp_rank, {**base, **sliced}, cp_rank=cp_rank, cp_size=2, qkv_format="thd")


def test_cp_with_an_empty_prompt_leaves_the_unowned_position_null(tmp_path, monkeypatch):
    # P = 0: no CP rank stores response position 0 (dump-format.md 8.2); it was a fake 0.0.
    dump = MemDump(tmp_path, monkeypatch)
    tokens = [11, 12, 13, 14, 15, 16]
    dump.rollout([sample(0, tokens, 6, rollout_log_probs=QUARTERS)])
    base = train_rows([0], [tokens], [6])
    for cp_rank in (0, 1):
        _cp_file(dump, cp_rank, 6, base)
    tokens_table, samples_table = dump.tables()
    assert column(tokens_table, "rollout_log_prob") == [None, *QUARTERS[1:]]
    assert column(tokens_table, "train_log_prob") == [None, *HALVES[1:]]
    diffs = [h - q for h, q in zip(HALVES, QUARTERS, strict=True)]
    assert column(tokens_table, "lp_diff") == [None, *diffs[1:]]
    assert column(tokens_table, "entropy") == [None] * 6  # not dumped: NULL as before
    assert column(tokens_table, "loss_mask") == [1] * 6  # full length on every rank: known
    assert column(samples_table, "alignment_failed") == [True]


def test_cp_with_a_prompt_is_untouched(tmp_path, monkeypatch):
    dump = MemDump(tmp_path, monkeypatch)
    tokens = [1, 2, 11, 12, 13, 14, 15, 16]
    dump.rollout([sample(0, tokens, 6, rollout_log_probs=QUARTERS)])
    base = train_rows([0], [tokens], [6])
    for cp_rank in (0, 1):
        _cp_file(dump, cp_rank, 8, base)
    tokens_table, samples_table = dump.tables()
    assert column(tokens_table, "train_log_prob") == HALVES
    assert column(samples_table, "alignment_failed") == [False]


def test_media_expansion_leaves_the_mask_null(tmp_path, monkeypatch):
    # The train side has 2 more response tokens (expanded media): its mask does not fit the
    # rollout token grid, so no mask is known there (it was written as 0 everywhere).
    dump = MemDump(tmp_path, monkeypatch)
    dump.rollout([sample(0, [1, 2, 3, 4], 2, rollout_log_probs=[-0.5, -0.25])])
    dump.train(0, train_rows([0], [[1, 2, 3, 9, 9, 4]], [4], log_probs=[[-1, -1, -1, -1]]))
    tokens_table, samples_table = dump.tables()
    assert column(tokens_table, "loss_mask") == [None, None]
    for name in ("rollout_log_prob", "train_log_prob", "lp_diff"):
        assert column(tokens_table, name) == [None, None], name
    assert column(samples_table, "alignment_failed") == [True]
    assert column(samples_table, "train_response_length") == [4]


def test_siblings_on_different_dp_shards_get_their_own_rows(tmp_path, monkeypatch):
    # Two agentic siblings share index 3 and tokens; shard 0 (rank 0) holds one with index 4,
    # shard 1 (rank 1) the other with index 5. They are two samples, not TP copies of one.
    dump = MemDump(tmp_path, monkeypatch)
    same = [1, 2, 7, 8]
    dump.rollout(
        [sample(3, same, 2), sample(3, same, 2), sample(4, [5, 6], 1), sample(5, [5, 7], 1)]
    )
    dump.train(0, train_rows([3, 4], [same, [5, 6]], [2, 1], log_probs=[[-1, -1], [-1]]))
    dump.train(1, train_rows([3, 5], [same, [5, 7]], [2, 1], log_probs=[[-2, -2], [-2]]))
    tokens_table, samples_table = dump.tables()
    assert column(samples_table, "has_train_row") == [True, True, True, True]
    assert column(samples_table, "dumped_rank") == [0, 1, 0, 1]
    assert column(tokens_table, "train_log_prob") == [-1, -1, -2, -2, -1, -2]


def test_tp_peers_of_one_shard_still_count_once(tmp_path, monkeypatch):
    dump = MemDump(tmp_path, monkeypatch)
    same = [1, 2, 7, 8]
    dump.rollout([sample(3, same, 2), sample(3, same, 2)])
    rows = train_rows([3, 3], [same, same], [2, 2], log_probs=[[-1, -1], [-3, -3]])
    dump.train(0, rows)
    dump.train(1, rows)
    tokens_table, samples_table = dump.tables()
    assert column(samples_table, "dumped_rank") == [0, 0]
    assert column(tokens_table, "train_log_prob") == [-1, -1, -3, -3]


def _line(index: int, messages: list, **keys) -> str:
    return json.dumps({"sample_index": index, **keys, "messages": messages})


def test_a_conversation_goes_to_the_sample_whose_fields_it_carries(tmp_path):
    # Two eval datasets: index 0 twice. Only the second sample recorded a conversation; the
    # line's prompt and reward say which one it is (it used to go to the first).
    path = tmp_path / "eval_0.jsonl"
    keys = {"group_index": None, "status": "completed"}
    path.write_text(_line(0, ["b"], reward=0.0, prompt="second", **keys) + "\n")
    samples = [
        {"index": 0, "group_index": None, "status": "completed", "reward": 1.0, "prompt": "first"},
        {"index": 1, "group_index": None, "status": "completed", "reward": 1.0, "prompt": "x"},
        {"index": 0, "group_index": None, "status": "completed", "reward": 0.0, "prompt": "second"},
    ]
    assert messages_by_position(path, samples) == [None, None, '["b"]']


def test_an_ambiguous_conversation_is_left_null(tmp_path):
    # One line, two samples it fits equally: which one recorded it is unknowable.
    path = tmp_path / "eval_0.jsonl"
    path.write_text(_line(0, ["a"], reward=1.0, prompt="p") + "\n")
    samples = [
        {"index": 0, "reward": 1.0, "prompt": "p"},
        {"index": 0, "reward": 1.0, "prompt": "p"},
    ]
    assert messages_by_position(path, samples) == [None, None]


def test_conversations_keep_the_file_order_when_that_decides(tmp_path):
    # Three samples fit both lines; two lines in batch order can only be (0, 1), (0, 2) or
    # (1, 2): no line is forced, so all stay NULL. With every sample recorded, order decides.
    path = tmp_path / "0.jsonl"
    path.write_text(_line(0, ["a"]) + "\n" + _line(0, ["b"]) + "\n")
    three = [{"index": 0}] * 3
    assert messages_by_position(path, three) == [None, None, None]
    assert messages_by_position(path, three[:2]) == ['["a"]', '["b"]']


def test_a_wrong_length_rollout_side_array_flags_the_sample_like_the_train_side(
    tmp_path, monkeypatch
):
    # Sample 0: rollout-side `rollout_log_probs` has 3 entries for R = 2 while its train-side
    # copy (the one used) is fine. Sample 1: the train-side copy has the wrong length.
    # Both: the step lands, the misfit array is NULL, the sample is `alignment_failed`.
    dump = MemDump(tmp_path, monkeypatch)
    dump.rollout(
        [
            sample(0, [1, 2, 3], 2, rollout_log_probs=[-0.5, -0.25, -1.0]),
            sample(1, [1, 4, 5], 2, rollout_log_probs=[-0.5, -0.25]),
        ]
    )
    rlp = [[-0.75, -0.75], [-0.75, -0.75, -0.75]]
    dump.train(0, train_rows([0, 1], [[1, 2, 3], [1, 4, 5]], [2, 2], rollout_log_probs=rlp))
    assert dump.error() is None
    tokens_table, samples_table = dump.tables()
    # sample 0 uses its train-side copy; sample 1 has none that fits and keeps the rollout's
    assert column(tokens_table, "rollout_log_prob") == [-0.75, -0.75, -0.5, -0.25]
    assert column(samples_table, "alignment_failed") == [True, True]


def test_a_wrong_length_rollout_side_array_without_train_side_is_null(tmp_path, monkeypatch):
    dump = MemDump(tmp_path, monkeypatch)
    dump.rollout(
        [
            sample(0, [1, 2, 3], 2, rollout_log_probs=[-0.5], loss_mask=[1, 0]),
            sample(1, [1, 2, 3], 2, rollout_log_probs=[-0.5, -0.25], loss_mask=[1, 1, 1]),
        ],
        evaluation=True,
    )
    tokens_table, samples_table = dump.tables()
    assert column(tokens_table, "rollout_log_prob") == [None, None, -0.5, -0.25]
    assert column(tokens_table, "loss_mask") == [1, 0, None, None]
    assert column(samples_table, "alignment_failed") == [True, True]


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["true-on-policy-bf16", "true-on-policy-fp16"])
def test_rollout_log_prob_is_the_half_precision_train_side_copy(preset: str, tmp_path: Path):
    # Under --true-on-policy-mode the train-side copy is bf16/fp16 (spec 3.3, 8.12) while the
    # rollout dump keeps float64: the lake shows the copy the trainer compared with.
    import duckdb
    import torch

    from tokenlake.generator import synth
    from tokenlake.orchestrate.extract import ExtractOptions, extract_run

    truth = synth.write_dump(tmp_path / "dump", synth.PRESETS[preset], keep_truth=True)
    assert truth is not None
    dtype = torch.load(tmp_path / "dump" / "train_data" / "0_0.pt")["rollout_data"][
        "rollout_log_probs"
    ][0].dtype
    assert (
        dtype
        == {"true-on-policy-bf16": torch.bfloat16, "true-on-policy-fp16": torch.float16}[preset]
    )
    extract_run(tmp_path / "dump", store_of(tmp_path / "lake"), ExtractOptions(run_name="r"))
    con = duckdb.connect(str(tmp_path / "lake" / "tokenlake.duckdb"), read_only=True)
    rows = con.execute(
        "SELECT batch_position, rollout_log_prob, lp_diff, loss_mask FROM tokens"
        " WHERE rollout_id = 0 AND NOT evaluation ORDER BY batch_position, position"
    ).fetchall()
    t = truth.samples[(0, False, 0)]
    half = torch.tensor(t.rollout_log_probs.astype(np.float32)).to(dtype).float().numpy()
    r = t.response_length
    got = np.array([row[1] for row in rows[:r]], dtype=np.float32)
    assert np.array_equal(got, half)
    assert not np.array_equal(got, t.rollout_log_probs.astype(np.float32))  # where it matters
    diff = np.array([row[2] for row in rows[:r]], dtype=np.float32)
    assert np.array_equal(diff, t.log_probs - half)


def test_a_key_the_sample_lacks_does_not_count_against_the_line(tmp_path):
    # Older dumps may lack `group_index`; the line's prompt still tells the two samples apart.
    path = tmp_path / "0.jsonl"
    path.write_text(_line(0, ["a"], group_index=4, prompt="q2") + "\n")
    samples = [{"index": 0, "prompt": "q1"}, {"index": 0, "prompt": "q2"}]
    assert messages_by_position(path, samples) == [None, '["a"]']
