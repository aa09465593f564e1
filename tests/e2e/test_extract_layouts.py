"""Every generator preset through the extractor, checked row by row against the ground truth.

The expected lake content is built from `synth.Truth` (the full-length values before any CP
slicing, PP placement or dropped file) with the rules of dump-format.md 5.3/6.1 and the
comments of `pipeline/tokenlake/schema.py`:
- a sample with a train side: every stat column is NULL where the train mask is 0;
- a sample without one: the rollout dump's own `loss_mask` masks it when it has one, else the
  values stay as dumped; the train-side columns are NULL;
- `lp_diff` = train log-prob - train-side rollout log-prob, in float32;
- a field absent from the dump is NULL; an alignment failure makes every train-side CP-sliced
  column NULL, while `rollout_log_prob` falls back to the rollout dump's own value (6.1).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from tests.conftest import store_of
from tokenlake import layout, schema
from tokenlake.generator import synth
from tokenlake.generator.synth import PRESETS
from tokenlake.generator.synth_truth import SampleTruth, Truth

LAYOUT_PRESETS = sorted(name for name in PRESETS if not name.startswith("bench"))
KEY_COLUMNS = (schema.ROLLOUT_ID, schema.EVALUATION, schema.BATCH_POSITION)
ORDER = ", ".join(KEY_COLUMNS)

Column = tuple[np.ndarray, np.ndarray]  # (values, valid)


def _stat_arrays(t: SampleTruth) -> dict[str, np.ndarray | None]:
    """Each stat column's full-length values for one sample (None = NULL everywhere)."""
    if t.alignment_fails:
        # The train-side copies are unreadable; `rollout_log_prob` falls back to the rollout
        # dump's own value (not CP-sliced), as the reference's token view does (6.1).
        stats = dict.fromkeys(schema.TOKEN_STAT_COLUMNS)
        stats[schema.ROLLOUT_LOG_PROB] = t.rollout_log_probs.astype(np.float32)
        return stats
    if not t.has_train_row:
        stats: dict[str, np.ndarray | None] = dict.fromkeys(schema.TOKEN_STAT_COLUMNS)
        stats[schema.ROLLOUT_LOG_PROB] = t.rollout_log_probs.astype(np.float32)
        return stats
    # Fields the generator does not write (teacher, critic, loss weights) are NULL.
    stats = dict.fromkeys(schema.TOKEN_STAT_COLUMNS)  # the weight streams: prime-rl's own
    stats.update({c: getattr(t, f, None) for f, c in schema.TRAIN_TOKEN_FIELDS.items()})
    stats[schema.ROLLOUT_LOG_PROB] = t.train_rollout_log_probs
    lp, rlp = t.log_probs, t.train_rollout_log_probs
    with np.errstate(invalid="ignore"):
        stats[schema.LP_DIFF] = None if lp is None or rlp is None else (lp - rlp).astype(np.float32)
    return stats


def _sample_columns(t: SampleTruth) -> dict[str, Column]:
    r = t.response_length
    mask = t.loss_mask if t.has_train_row else t.rollout_loss_mask
    on = np.ones(r, dtype=bool) if mask is None else mask > 0
    columns: dict[str, Column] = {
        schema.ROLLOUT_ID: (np.full(r, t.rollout_id), np.ones(r, bool)),
        schema.EVALUATION: (np.full(r, t.evaluation), np.ones(r, bool)),
        schema.BATCH_POSITION: (np.full(r, t.batch_position), np.ones(r, bool)),
        schema.SAMPLE_INDEX: (
            np.full(r, t.sample_index or 0),
            np.full(r, t.sample_index is not None),
        ),
        schema.POSITION: (np.arange(r), np.ones(r, bool)),
        schema.TOKEN_ID: (t.token_ids[t.prompt_length :], np.ones(r, bool)),
        schema.LOSS_MASK: (
            np.zeros(r, np.int32) if mask is None else mask,
            np.full(r, mask is not None),
        ),
    }
    for column, values in _stat_arrays(t).items():
        if values is None:
            columns[column] = (np.zeros(r, np.float32), np.zeros(r, bool))
        else:
            columns[column] = (values.astype(np.float32), on.copy())
    return columns


def expected_tokens(truth: Truth) -> dict[str, Column]:
    """The `tokens` rows the lake must hold, in (rollout_id, evaluation, batch_position,
    position) order."""
    parts = [_sample_columns(truth.samples[k]) for k in sorted(truth.samples)]
    return {
        name: (
            np.concatenate([p[name][0] for p in parts]),
            np.concatenate([p[name][1] for p in parts]),
        )
        for name in parts[0]
    }


def _fetch(con: Any, sql: str) -> dict[str, Column]:
    table: pa.Table = con.sql(sql).to_arrow_table()
    out = {}
    for name in table.column_names:
        column = table.column(name)
        valid = ~column.is_null().to_numpy(zero_copy_only=False)
        values = column.fill_null(False if pa.types.is_boolean(column.type) else 0)
        out[name] = (values.to_numpy(), valid)
    return out


def _assert_column(name: str, got: Column, want: Column, keys: dict[str, Column]) -> None:
    (gv, gok), (wv, wok) = got, want
    assert len(gv) == len(wv), f"{name}: {len(gv)} rows, expected {len(wv)}"
    bad = gok != wok
    both = gok & wok
    if np.issubdtype(wv.dtype, np.floating):
        same = np.array_equal(gv[both].astype(np.float32), wv[both], equal_nan=True)
        diff = ~((gv.astype(np.float32) == wv) | (np.isnan(gv) & np.isnan(wv)))
    else:
        same = np.array_equal(gv[both], wv[both])
        diff = gv != wv
    bad |= both & diff
    if bad.any() or not same:
        row = int(np.flatnonzero(bad)[0])
        where = {k: keys[k][0][row] for k in (*KEY_COLUMNS, schema.POSITION)}
        pytest.fail(
            f"`{name}` differs at {where}: got {gv[row]} (valid {gok[row]}),"
            f" expected {wv[row]} (valid {wok[row]}); {int(bad.sum())} rows differ"
        )


def _check_samples(con: Any, truth: Truth) -> None:
    rows = con.execute(
        "SELECT rollout_id, evaluation, batch_position, sample_index, has_train_row,"
        " alignment_failed, raw_reward, normalized_reward, remove_sample, status,"
        f" response_length, prompt_length FROM samples ORDER BY {ORDER}"
    ).fetchall()
    expected = [
        (*key, t.sample_index, t.has_train_row, t.alignment_fails, t.raw_reward,
         t.normalized_reward, t.remove_sample, t.status,
         *((t.response_length, t.prompt_length) if t.lengths_known else (None, None)))
        for key, t in sorted(truth.samples.items())
    ]  # fmt: skip
    assert rows == expected


@pytest.mark.slow
@pytest.mark.parametrize("preset", LAYOUT_PRESETS)
def test_lake_matches_truth(preset: str, tmp_path: Path) -> None:
    import duckdb

    from tokenlake.orchestrate.extract import ExtractOptions, extract_run

    dump, lake = tmp_path / "dump", tmp_path / "lake"
    truth = synth.write_dump(dump, PRESETS[preset], keep_truth=True)
    assert truth is not None
    # settle 0: the dump is finished, so a preset's missing rank is a step that lands marked
    # incomplete, not one still being written
    extract_run(dump, store_of(lake), ExtractOptions(run_name="synth", settle_seconds=0.0))
    con = duckdb.connect(str(lake / layout.CATALOG_FILE), read_only=True)
    want = expected_tokens(truth)
    columns = ", ".join(want)
    got = _fetch(
        con, f"SELECT {columns} FROM tokens WHERE run = 'synth' ORDER BY {ORDER}, position"
    )
    for name in want:
        _assert_column(name, got[name], want[name], got)
    _check_samples(con, truth)


def test_every_layout_preset_is_covered() -> None:
    assert LAYOUT_PRESETS == [
        "cp-bshd",
        "cp-bshd-per-sample",
        "cp-legacy",
        "cp-legacy-missing-rank",
        "cp-missing-rank",
        "cp-thd",
        "empty-response",
        "example",
        "log-probs-missing-step",
        "multi-turn",
        "nemo-rl",
        "nemo-rl-2026-01",
        "no-dashboard-columns",
        "no-entropy",
        "no-log-probs",
        "nonfinite",
        "pp",
        "pre-dashboard",
        "prime-rl",
        "prime-rl-2026-05",
        "prime-rl-2026-06",
        "removed",
        "rollout-only",
        "sampling-support",
        "slime-v1",
        "slime-v2",
        "slime-v2-top-p",
        "sparse-ranks",
        "sparse-ranks-cp",
        "spec-rename",
        "tp",
        "true-on-policy-bf16",
        "true-on-policy-fp16",
        "weight-spans",
    ]  # fmt: skip
