"""Broken train files and trajectory sidecars: one line for the step, never a crash or a
silently coerced value.

Each case is a one-step dump held in memory (`tests.memdump`) run through `extract_step`; the
asserted text is what the CLI prints after `Skipped step 0: `.
"""

from __future__ import annotations

import numpy as np

from tests.memdump import MemDump, column, sample, train_rows

REPLACE = "Replace or remove the file, then extract again."
TOKENS = [1, 2, 3]


def _dump(tmp_path, monkeypatch, **changes) -> tuple[MemDump, object]:
    """Step 0: one sample (R = 2) and one rank file, with `changes` made to its columns."""
    dump = MemDump(tmp_path, monkeypatch)
    dump.rollout([sample(0, TOKENS, 2, rollout_log_probs=[-0.5, -0.25])])
    columns = train_rows([0], [TOKENS], [2], log_probs=[[-1.0, -2.0]])
    columns.update(changes.pop("columns", {}))
    path = dump.train(0, columns, **changes)
    return dump, path


def test_a_train_column_that_is_an_int(tmp_path, monkeypatch):
    dump, path = _dump(tmp_path, monkeypatch, columns={"tokens": 5})
    assert dump.error() == (
        f"rank 0: `{path}`: column `tokens` is of type `int`, not a list with one entry per"
        f" row. {REPLACE}"
    )


def test_a_required_train_column_that_is_none(tmp_path, monkeypatch):
    dump, path = _dump(tmp_path, monkeypatch, columns={"loss_masks": None})
    assert dump.error() == (
        f"rank 0: `{path}`: column `loss_masks` is None, not a list with one entry per row."
        f" {REPLACE}"
    )


def test_an_optional_train_column_that_is_an_int(tmp_path, monkeypatch):
    dump, path = _dump(tmp_path, monkeypatch, columns={"raw_reward": 7})
    assert dump.error() == (
        f"rank 0: `{path}`: column `raw_reward` is of type `int`, not a list with one entry"
        f" per row. {REPLACE}"
    )


def test_an_optional_train_column_that_is_none_is_absent(tmp_path, monkeypatch):
    dump, _ = _dump(tmp_path, monkeypatch, columns={"log_probs": None})
    tokens, samples = dump.tables()
    assert column(tokens, "train_log_prob") == [None, None]
    assert column(samples, "alignment_failed") == [False]


def test_a_string_cp_size(tmp_path, monkeypatch):
    dump, path = _dump(tmp_path, monkeypatch, cp_rank=0, cp_size="2")
    assert (
        dump.error()
        == f"rank 0: `{path}`: `cp_size` is '2' (a str); expected an integer. {REPLACE}"
    )


def test_an_unknown_qkv_format_under_cp(tmp_path, monkeypatch):
    """`sbhd` slices would be placed as `thd`'s: at the wrong positions, with no error."""
    dump, path = _dump(tmp_path, monkeypatch, cp_rank=0, cp_size=2, qkv_format="sbhd")
    assert dump.error() == (
        f"rank 0: `{path}`: `qkv_format` is 'sbhd'; tokenlake places the context-parallel"
        f" slices of `thd` and `bshd` only. {REPLACE}"
    )


def test_an_unknown_qkv_format_without_cp_is_read(tmp_path, monkeypatch):
    dump, _ = _dump(tmp_path, monkeypatch, cp_rank=0, cp_size=1, qkv_format="sbhd")
    tokens, _ = dump.tables()
    assert column(tokens, "train_log_prob") == [-1.0, -2.0]


def test_a_cp_rank_outside_cp_size(tmp_path, monkeypatch):
    dump, path = _dump(tmp_path, monkeypatch, cp_rank=2, cp_size=2)
    assert dump.error() == (
        f"rank 0: `{path}`: `cp_rank` is 2; expected 0..1 (`cp_size` 2). {REPLACE}"
    )


def test_a_string_response_length(tmp_path, monkeypatch):
    dump, path = _dump(tmp_path, monkeypatch, columns={"response_lengths": ["2"]})
    assert dump.error() == (
        f"rank 0: `{path}` (batch position 0, sample_index 0): `response_lengths` is '2'"
        f" (a str); expected an integer. {REPLACE}"
    )


def test_a_fractional_sample_index(tmp_path, monkeypatch):
    dump, path = _dump(tmp_path, monkeypatch, columns={"sample_indices": [0.5]})
    assert dump.error() == (
        f"rank 0: `{path}` (train row 0): `sample_indices` is 0.5 (a float); expected an"
        f" integer. {REPLACE}"
    )


def test_a_response_longer_than_the_sequence(tmp_path, monkeypatch):
    dump, path = _dump(tmp_path, monkeypatch, columns={"total_lengths": [1]})
    assert dump.error() == (
        f"rank 0: `{path}` (batch position 0, sample_index 0): `response_lengths` is 2 and"
        f" `total_lengths` 1; expected 0 <= response length <= total length. {REPLACE}"
    )


def test_int64_log_probs_are_an_error_not_0_1_2(tmp_path, monkeypatch):
    ints = [np.array([0, 1], dtype=np.int64)]
    dump, path = _dump(tmp_path, monkeypatch, columns={"log_probs": ints})
    assert dump.error() == (
        f"rank 0: `{path}` (batch position 0, sample_index 0): `log_probs` holds int64 values;"
        f" expected floating-point numbers. {REPLACE}"
    )


def test_a_latin1_trajectory_line(tmp_path, monkeypatch):
    dump, _ = _dump(tmp_path, monkeypatch)
    line = '{"sample_index": 0, "messages": [{"role": "user", "content": "café"}]}\n'
    path = dump.trajectory(line.encode("latin-1"))
    assert dump.error() == (
        f"`{path}`: line 1 is not a trajectory record (sample_index 0: byte 66 of the line is"
        f" not UTF-8); delete or fix it. {REPLACE}"
    )


def test_a_100000_deep_trajectory_line(tmp_path, monkeypatch):
    dump, _ = _dump(tmp_path, monkeypatch)
    path = dump.trajectory(b'{"sample_index": 0, "messages": ' + b"[" * 100_000 + b"\n")
    assert dump.error() == (
        f"`{path}`: line 1 is not a trajectory record (JSON nested too deeply to read);"
        f" delete or fix it. {REPLACE}"
    )


def test_a_5000_digit_sample_index(tmp_path, monkeypatch):
    dump, path = _dump(tmp_path, monkeypatch, columns={"sample_indices": [10**5000]})
    assert dump.error() == (
        f"rank 0: `{path}` (train row 0): `sample_indices` is an integer of 16610 bits;"
        f" expected a 64-bit integer. {REPLACE}"
    )


def test_a_cp_size_of_2_40_is_an_alignment_failure_not_a_2_40_list(tmp_path, monkeypatch):
    """One rank of a CP group claiming 2**40 ranks: its slices cannot be assembled (flagged,
    NULL), and nothing the size of the claim is built."""
    dump, _ = _dump(tmp_path, monkeypatch, cp_rank=0, cp_size=2**40)
    tokens, samples = dump.tables()
    assert column(tokens, "train_log_prob") == [None, None]
    assert column(samples, "alignment_failed") == [True]


BEYOND_FLOAT = f"{'1' + '0' * 59}…, beyond the float64 range"


def test_a_raw_reward_beyond_float64(tmp_path, monkeypatch):
    dump, path = _dump(tmp_path, monkeypatch, columns={"raw_reward": [10**400]})
    assert dump.error() == f"rank 0: `{path}`: `raw_reward` entry 0 is {BEYOND_FLOAT}. {REPLACE}"


def test_a_normalised_reward_beyond_float64(tmp_path, monkeypatch):
    dump, path = _dump(tmp_path, monkeypatch, columns={"rewards": [10**400]})
    assert dump.error() == (
        f"rank 0: `{path}` (batch position 0, sample_index 0): `rewards` is {BEYOND_FLOAT}."
        f" {REPLACE}"
    )


def test_a_train_row_for_other_response_tokens_is_not_placed(tmp_path, monkeypatch):
    """A stale rank file (a run restarted over the same step; equal lengths, as truncated
    responses have) holds the trainer's log-probs of other tokens: NULL on the rollout's
    tokens and `alignment_failed`, never the other sequence's numbers on these tokens."""
    dump = MemDump(tmp_path, monkeypatch)
    dump.rollout([sample(0, TOKENS, 2, rollout_log_probs=[-0.5, -0.25])])
    dump.train(0, train_rows([0], [[1, 2, 9]], [2], log_probs=[[-1.0, -2.0]]))
    tokens, samples = dump.tables()
    assert column(tokens, "token_id") == [2, 3]
    assert column(tokens, "train_log_prob") == [None, None]
    assert column(tokens, "lp_diff") == [None, None]
    assert column(tokens, "loss_mask") == [None, None]  # as a media-expanded row's
    assert column(samples, "alignment_failed") == [True]


def test_a_train_row_whose_prompt_differs_is_still_placed(tmp_path, monkeypatch):
    """Media expansion changes the prompt the trainer saw (section 8.13), not the response
    tokens its log-probs are of: those are placed."""
    dump = MemDump(tmp_path, monkeypatch)
    dump.rollout([sample(0, TOKENS, 2, rollout_log_probs=[-0.5, -0.25])])
    dump.train(0, train_rows([0], [[7, 7, 2, 3]], [2], log_probs=[[-1.0, -2.0]]))
    tokens, samples = dump.tables()
    assert column(tokens, "train_log_prob") == [-1.0, -2.0]
    assert column(samples, "alignment_failed") == [False]
