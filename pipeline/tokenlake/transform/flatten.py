"""Turn one resolved step into Arrow tables: pure functions over whole columns.

Per-sample work is a handful of numpy calls; nothing loops per token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from tokenlake import schema
from tokenlake.read import replay, weight_versions
from tokenlake.steptypes import CheckedSample, TrainRow
from tokenlake.transform.summary import sample_summary


@dataclass(frozen=True)
class SampleTokens:
    """The response-aligned arrays of one sample, before masking."""

    token_ids: np.ndarray  # int64 [R]
    mask: np.ndarray | None  # int8 [R]: train mask, else the rollout dump's, else None
    has_train: bool
    columns: dict[str, np.ndarray | None]  # tokens column -> float32 [R] or None
    # tokens column -> bool [R] of positions whose value is unknown (CP holes): NULL there
    unknown: dict[str, np.ndarray] = field(default_factory=dict)
    # an array (rollout or train side) did not fit the response: NULL there, and the sample
    # is `alignment_failed` in `samples` (besides what resolve found for its train row)
    misaligned: bool = False
    # the weight version that generated each token, where the dump says it
    versions: weight_versions.TokenVersions | None = None
    support_sizes: np.ndarray | None = None  # int32 [R]; None: unbounded sampling


def sample_tokens(
    checked: CheckedSample, train: TrainRow | None, placeholders: frozenset[str] = frozenset()
) -> SampleTokens:
    """Collect one sample's per-token values under the masking rules of section 5.3.

    Reads the arrays validation checked (`validate.check_sample`), never the sample dict, and
    changes neither `checked` nor `train`. `placeholders` names the train fields whose values
    the writer filled in for this sample (`tinker.placeholder_fields`): NULL, never data.
    """
    token_ids = checked.response_tokens
    response_length = checked.response_length
    rollout_lp = _rollout_side(checked.rollout_log_probs, response_length)
    # Calls are placed on the generator's mask: the train side zeroes a removed sample's.
    versions = weight_versions.per_token(
        checked.weights, len(checked.tokens), response_length, checked.loss_mask
    )
    supports = checked.support_sizes
    if train is None:
        mask = _rollout_side(checked.loss_mask, response_length)
        columns: dict[str, np.ndarray | None] = dict.fromkeys(schema.TOKEN_STAT_COLUMNS)
        columns[schema.ROLLOUT_LOG_PROB] = _f32(rollout_lp.values)
        misaligned = rollout_lp.misaligned or mask.misaligned
        misaligned = _add_rollout_fields(columns, checked) or misaligned
        return SampleTokens(
            token_ids, _i8(mask.values), False, columns, {}, misaligned, versions, supports
        )
    if train.response_length != response_length or _other_tokens(train, token_ids):
        # Media expansion (section 8.13): the train arrays (mask included) do not fit the
        # rollout token grid, so nothing of the train side is placed on it. Nor when the
        # train row's response tokens are others (a stale rank file of a restarted run): its
        # log-probs are of those tokens, not of these.
        empty: dict[str, np.ndarray | None] = dict.fromkeys(schema.TOKEN_STAT_COLUMNS)
        return SampleTokens(token_ids, None, True, empty, {}, True, versions, supports)
    columns = _train_columns(train, rollout_lp.values, placeholders)
    extra_misaligned = _add_rollout_fields(columns, checked)
    return SampleTokens(
        token_ids,
        _i8(train.loss_mask),
        True,
        columns,
        _unknown(train, columns),
        rollout_lp.misaligned or extra_misaligned,
        versions,
        supports,
    )


def _other_tokens(train: TrainRow, token_ids: np.ndarray) -> bool:
    """Whether the train row says which response tokens its values are of, and they differ
    from the rollout sample's (equal lengths: `sample_tokens` checked them first)."""
    theirs = train.response_tokens
    return theirs is not None and not np.array_equal(theirs, token_ids)


def _train_columns(
    train: TrainRow, rollout_lp: np.ndarray | None, placeholders: frozenset[str]
) -> dict[str, np.ndarray | None]:
    fields = {
        name: None if name in placeholders else values for name, values in train.fields.items()
    }
    columns: dict[str, np.ndarray | None] = {
        # a field this format's train rows do not carry is NULL
        column: _f32(fields.get(name))
        for name, column in schema.TRAIN_TOKEN_FIELDS.items()
    }
    if schema.ROLLOUT_LOG_PROBS_FIELD in placeholders:  # no engine log-prob: none at all
        rollout_lp = None
    train_rlp = _f32(fields.get(schema.ROLLOUT_LOG_PROBS_FIELD))
    # The trainer compared its log-probs with the train-side copy: lp_diff uses that pair.
    for name, column in (*schema.WEIGHT_TOKEN_FIELDS.items(), *schema.FLAG_TOKEN_FIELDS.items()):
        columns[column] = _f32(fields.get(name))  # flags as 1.0 / 0.0 until `_flag_column`
    lp = columns[schema.TRAIN_LOG_PROB]
    columns[schema.LP_DIFF] = None if lp is None or train_rlp is None else _lp_diff(lp, train_rlp)
    columns[schema.ROLLOUT_LOG_PROB] = train_rlp if train_rlp is not None else _f32(rollout_lp)
    return columns


def _lp_diff(lp: np.ndarray, rollout_lp: np.ndarray) -> np.ndarray:
    """Train minus rollout log-prob in float32; inf - inf is NaN (IEEE), counted as the other
    non-finite values are, not a warning of numpy's."""
    with np.errstate(invalid="ignore", over="ignore"):
        return lp - rollout_lp


def _add_rollout_fields(columns: dict[str, np.ndarray | None], checked: CheckedSample) -> bool:
    """Fill the columns the train side left empty from the rollout sample's own per-token
    fields (`schema.ROLLOUT_TOKEN_FIELDS`); True when one of those did not fit the response."""
    misaligned = False
    for key, values in checked.per_token.items():
        column = schema.ROLLOUT_TOKEN_FIELDS[key]
        if columns.get(column) is None:
            array = _rollout_side(values, checked.response_length)
            columns[column] = _f32(array.values)
            misaligned = misaligned or array.misaligned
    return misaligned


def _unknown(train: TrainRow, columns: dict[str, np.ndarray | None]) -> dict[str, np.ndarray]:
    """Positions no CP rank stored, in every column built from a CP-sliced field, and the
    positions the format wrote as unknown (`TrainRow.nulls`)."""
    unknown = _cp_holes(train, columns)
    by_field = {
        **schema.TRAIN_TOKEN_FIELDS,
        **schema.WEIGHT_TOKEN_FIELDS,
        **schema.FLAG_TOKEN_FIELDS,
        schema.ROLLOUT_LOG_PROBS_FIELD: schema.ROLLOUT_LOG_PROB,
    }
    # lp_diff is unknown wherever either of its log-probs is
    in_lp_diff = ("log_probs", schema.ROLLOUT_LOG_PROBS_FIELD)
    for name, where in train.nulls.items():
        targets = (by_field[name], schema.LP_DIFF) if name in in_lp_diff else (by_field[name],)
        for column in targets:
            if columns.get(column) is not None:
                earlier = unknown.get(column)
                unknown[column] = where if earlier is None else earlier | where
    return unknown


def _cp_holes(train: TrainRow, columns: dict[str, np.ndarray | None]) -> dict[str, np.ndarray]:
    if train.holes is None:
        return {}
    # A column filled from the rollout sample instead (`_add_rollout_fields`) has no holes.
    from_cp = {c for f, c in schema.TRAIN_TOKEN_FIELDS.items() if train.fields[f] is not None}
    from_cp.add(schema.LP_DIFF)
    if train.fields[schema.ROLLOUT_LOG_PROBS_FIELD] is not None:
        from_cp.add(schema.ROLLOUT_LOG_PROB)
    return {column: train.holes for column in from_cp if columns.get(column) is not None}


@dataclass
class _RolloutArray:
    values: np.ndarray | None
    misaligned: bool = False


def _rollout_side(values: np.ndarray | None, response_length: int) -> _RolloutArray:
    """A response-aligned rollout-side array; one that does not fit the response is NULL and
    flags the sample, as a train-side field of the wrong length does (section 4.5)."""
    if values is None:
        return _RolloutArray(None)
    if values.ndim != 1 or len(values) != response_length:
        return _RolloutArray(None, misaligned=True)
    return _RolloutArray(values)


def _f32(values: np.ndarray | None) -> np.ndarray | None:
    """The lake's float32; a value beyond its range is ±inf, as torch casts it (one of the
    NaN/inf values the extraction counts and reports, not a warning of numpy's)."""
    if values is None:
        return None
    with np.errstate(over="ignore"):
        return np.asarray(values, dtype=np.float32)


def _i8(values: np.ndarray | None) -> np.ndarray | None:
    return None if values is None else (np.asarray(values) > 0).astype(np.int8)


def tokens_table(
    evaluation: bool,
    sample_indices: Sequence[int | None],
    parts: list[SampleTokens],
    rollout_id: int | None = None,
) -> pa.Table:
    """One row per response token of the step, sorted by (batch_position, position);
    `token_staleness` needs the step's `rollout_id` (without it, NULL).

    The masks and drift columns stay numpy arrays while the columns derived from them
    (`turn_index`, `first_occurrence`) are computed: no Arrow column is read back.
    """
    lengths = np.fromiter((len(p.token_ids) for p in parts), dtype=np.int64, count=len(parts))
    total = int(lengths.sum())
    starts = np.cumsum(lengths) - lengths
    positions = np.arange(total, dtype=np.int64) - np.repeat(starts, lengths)
    index_values = np.array([-1 if i is None else i for i in sample_indices], dtype=np.int64)
    index_valid = np.array([i is not None for i in sample_indices], dtype=bool)
    mask, mask_valid = _per_sample_values([part.mask for part in parts], lengths, np.int8)
    mask_valid = np.ones(total, dtype=bool) if mask_valid is None else mask_valid
    token_ids = _concat([p.token_ids for p in parts], np.int64, total)
    arrays: dict[str, pa.Array] = {
        schema.EVALUATION: pa.array(np.full(total, evaluation, dtype=bool)),
        schema.BATCH_POSITION: pa.array(np.repeat(np.arange(len(parts), dtype=np.int32), lengths)),
        schema.SAMPLE_INDEX: _with_validity(
            np.repeat(index_values, lengths), np.repeat(index_valid, lengths)
        ),
        schema.POSITION: pa.array(positions.astype(np.int32)),
        schema.TOKEN_ID: pa.array(token_ids),
        schema.LOSS_MASK: _with_validity(mask, mask_valid),
    }
    on = mask > 0  # a sample without a mask holds zeros there
    arrays[schema.TURN_INDEX] = _turn_index(on, starts)
    # Values are shown where the mask is on, or where the sample has no mask at all.
    covered = on | ~mask_valid
    covered_bits = None if covered.all() else _bitmap(covered)
    kept = on  # the drift rows, narrowed by each drift column below
    for column in schema.TOKEN_STAT_COLUMNS:
        values = _stat_values(parts, column, lengths)
        if column in _DRIFT_COLUMNS:
            kept = kept & _finite(values)
        arrays[column] = _float_column(values, covered, covered_bits, total)
    for column in schema.TOKEN_FLAG_COLUMNS:
        values = _stat_values(parts, column, lengths)
        arrays[column] = _flag_column(values, covered, covered_bits, total)
    arrays[schema.FIRST_OCCURRENCE] = _first_occurrence(kept, token_ids, lengths)
    arrays[schema.TOKEN_VERSION], arrays[schema.TOKEN_STALENESS] = version_columns(
        parts, total, rollout_id
    )
    arrays[schema.SUPPORT_SIZE] = _support_column(parts, lengths)
    return pa.Table.from_pydict(arrays, schema=schema.TOKENS_SCHEMA)


# The columns a drift row needs finite (with loss_mask > 0): `drift_rows`.
_DRIFT_COLUMNS = (schema.LP_DIFF, schema.TRAIN_LOG_PROB, schema.ROLLOUT_LOG_PROB)


def version_columns(
    parts: Sequence[SampleTokens], total: int, rollout_id: int | None
) -> tuple[pa.Array, pa.Array]:
    """`token_version` and `token_staleness` of the step's rows: each sample's version codes
    mapped onto one step-wide list of versions, then taken from it (no loop per token)."""
    names: dict[str, int] = {}
    # The step code of each sample's names, the samples' lists end to end, each list after a
    # -1 that its sample's code -1 (no version) lands on; `bases`: where each list starts.
    local: list[int] = [-1]
    bases = np.ones(len(parts), dtype=np.int64)  # a sample without versions: codes all -1
    own_codes: list[np.ndarray] = []
    for number, part in enumerate(parts):
        versions = part.versions
        if versions is not None and versions.names:
            bases[number] = len(local) + 1
            local += [-1, *(names.setdefault(v, len(names)) for v in versions.names)]
            own_codes.append(versions.codes)
        else:
            own_codes.append(np.full(len(part.token_ids), -1, dtype=np.int32))
    if not names:
        return pa.nulls(total, pa.string()), pa.nulls(total, pa.int64())
    lengths = np.fromiter((len(p.token_ids) for p in parts), dtype=np.int64, count=len(parts))
    step_codes = np.array(local, dtype=np.int64)
    step_codes[step_codes < 0] = len(names)  # the NULL after the step's versions, below
    # R codes a sample (`weight_versions.per_token`), each offset into its sample's list
    codes = step_codes[np.repeat(bases, lengths) + np.concatenate(own_codes)]
    numbers = [weight_versions.numeric(v) for v in names]
    lag = [None if rollout_id is None or n is None else rollout_id - n for n in numbers]
    return _strings_taken([*names, None], codes), _integers_taken([*lag, None], codes)


# Below this many rows a column of a few strings is made from a Python list rather than by
# Arrow's `take`, whose module (pyarrow.compute) costs ~50 ms of CPU to import: a small step
# (the example's) then never imports it, a large one pays it once among seconds.
_LISTED_ROWS = 1 << 16


def _strings_taken(values: list[str | None], codes: np.ndarray) -> pa.Array:
    """`values[code]` for each code, as a string column (None: NULL)."""
    if len(codes) < _LISTED_ROWS:
        return pa.array(np.array(values, dtype=object)[codes], pa.string())
    return pa.array(values, pa.string()).take(pa.array(codes))


def _integers_taken(values: list[int | None], codes: np.ndarray) -> pa.Array:
    """`values[code]` for each code, as an int64 column (None: NULL)."""
    numbers = np.array([0 if v is None else v for v in values], dtype=np.int64)
    null = np.array([v is None for v in values])
    return pa.array(numbers[codes], pa.int64(), mask=null[codes])


def turn_index_column(loss_mask: pa.Array, starts: np.ndarray) -> pa.Array:
    """`turn_index` of every row from the step's `loss_mask` column (`_turn_index`)."""
    return _turn_index(_positive(loss_mask), starts)


def _turn_index(on: np.ndarray, starts: np.ndarray) -> pa.Array:
    """`turn_index` of every row: the 0-based number of the loss-covered run it is in.

    Rows are the step's tokens in (batch_position, position) order, `on` where loss_mask > 0
    and `starts` the row where each sample begins. A run is a maximal stretch of `on` within
    one sample; rows outside a run (mask 0 or NULL) are NULL. One cumulative sum over the run
    starts of the whole step, minus the count before each sample's first row: no loop per
    token or sample.
    """
    total = len(on)
    if total == 0:
        return pa.array(np.zeros(0, dtype=np.int32), type=pa.int32())
    previous = np.concatenate(([False], on[:-1]))
    previous[starts[starts < total]] = False  # a sample's first row never continues a run
    run_starts = np.cumsum(on & ~previous, dtype=np.int64)
    before = np.concatenate(([0], run_starts))[starts]  # run starts before each sample
    lengths = np.diff(np.append(starts, total))
    turn = run_starts - np.repeat(before, lengths) - 1
    return _with_validity(turn.astype(np.int32), on)


def _positive(column: pa.Array) -> np.ndarray:
    """`column > 0` for each row as numpy bools, NULL as false (a NULL reads as NaN)."""
    return np.asarray(column.to_numpy(zero_copy_only=False)) > 0


def first_occurrence_column(arrays: dict[str, pa.Array], lengths: np.ndarray) -> pa.Array:
    """`first_occurrence` of every row: true on the first of a sample's drift rows with its
    token id, false on that id's later drift rows, NULL on the rows that are not drift rows.

    `arrays` holds the step's `tokens` columns in (batch_position, position) order and
    `lengths` the rows of each sample. Drift rows are the rows `drift_tokens` keeps (its
    `drift_covered` and `drift_finite` macros): loss_mask > 0 and lp_diff, train_log_prob and
    rollout_log_prob all finite. With it, `drift_by_token` counts the samples holding a token
    as a sum instead of a distinct count over a step's ~30 k token ids.
    """
    token = np.asarray(arrays[schema.TOKEN_ID].to_numpy(zero_copy_only=False))
    return _first_occurrence(drift_rows(arrays), token, lengths)


def _first_occurrence(kept: np.ndarray, token: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """`first_occurrence_column` from the drift rows `kept` and the token ids."""
    first = np.zeros(len(kept), dtype=bool)
    ends = np.cumsum(lengths, dtype=np.int64)
    # Whole samples at a time, about CHUNK_ROWS rows each: the sort's memory stays a few MB
    # instead of several step-long int64 arrays (~100 MB on a 2.4 M-token step).
    cuts = np.unique(np.searchsorted(ends, np.arange(CHUNK_ROWS, len(kept), CHUNK_ROWS), "right"))
    for first_sample, last_sample in zip(
        np.concatenate(([0], cuts)), np.concatenate((cuts, [len(lengths)])), strict=True
    ):
        if first_sample < last_sample:
            _mark_first(
                kept, token, lengths[first_sample:last_sample], ends[last_sample - 1], first
            )
    return pa.Array.from_buffers(pa.bool_(), len(kept), [_bitmap(kept), _bitmap(first)])


CHUNK_ROWS = 1 << 18


def _mark_first(
    kept: np.ndarray, token: np.ndarray, lengths: np.ndarray, end: int, first: np.ndarray
) -> None:
    """Set `first` on the first drift row of each (sample, token id) of consecutive samples
    (`lengths`) whose rows end at `end`."""
    start = end - int(lengths.sum())
    rows = np.flatnonzero(kept[start:end])
    ends = np.cumsum(lengths, dtype=np.int64)
    kept_before = np.concatenate(([0], np.cumsum(kept[start:end], dtype=np.int64)))
    per_sample = kept_before[ends] - kept_before[ends - lengths]
    sample = np.repeat(np.arange(len(lengths), dtype=np.int64), per_sample)
    first[start + rows[_first_of_each_pair(sample, token[start:end][rows])]] = True


def drift_rows(arrays: dict[str, pa.Array]) -> np.ndarray:
    """The rows the drift statistics keep: loss_mask > 0 and lp_diff, train_log_prob and
    rollout_log_prob finite (a NULL is not finite). Keep in step with the macros
    `drift_covered` and `drift_finite` (sql/macros/drift_macros.sql)."""
    kept = _positive(arrays[schema.LOSS_MASK])
    for column in _DRIFT_COLUMNS:
        kept &= np.isfinite(arrays[column].to_numpy(zero_copy_only=False))  # NULL reads as NaN
    return kept


def _first_of_each_pair(sample: np.ndarray, token: np.ndarray) -> np.ndarray:
    """Index of the first element of each distinct (sample, token) pair; `sample` ascends
    (int64; it is overwritten)."""
    n = len(token)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    low, span = int(token.min()), int(token.max()) - int(token.min()) + 1
    new = np.ones(n, dtype=bool)
    if (int(sample[-1]) + 1) * span * n < 2**63:
        # One int64 per element, pair key * n + index: all distinct, so a plain sort (twice as
        # fast as a stable argsort) orders the pairs, and each pair's elements by index. Built
        # in place in `sample`'s buffer (the caller's own copy): two step-long arrays at most.
        key = sample
        key *= span
        key += token
        key -= low
        key *= n
        key += np.arange(n, dtype=np.int64)
        key.sort()
        index = key % n
        key //= n  # the pair of each element, ascending
        new[1:] = key[1:] != key[:-1]
        return index[new]
    order = np.lexsort((token, sample))  # ids spread too wide to combine (a hostile dump)
    s, t = sample[order], token[order]
    new[1:] = (s[1:] != s[:-1]) | (t[1:] != t[:-1])
    return order[new]


def _support_column(parts: Sequence[SampleTokens], lengths: np.ndarray) -> pa.Array:
    if all(part.support_sizes is None for part in parts):
        return pa.nulls(int(lengths.sum()), pa.int32())
    values, valid = _per_sample_values([part.support_sizes for part in parts], lengths, np.int32)
    return pa.array(values) if valid is None else _with_validity(values, valid)


def _per_sample_values(
    arrays: Sequence[np.ndarray | None], lengths: np.ndarray, dtype: type
) -> tuple[np.ndarray, np.ndarray | None]:
    """Each sample's array over its rows, end to end, and the rows that have one (None: all;
    a sample without one holds zeros). One concatenation, no loop per row."""
    chunks = [
        np.zeros(int(length), dtype) if array is None else array
        for array, length in zip(arrays, lengths, strict=True)
    ]
    if any(len(chunk) != length for chunk, length in zip(chunks, lengths, strict=True)):
        raise ValueError("a per-token array does not fit its sample's response")
    has = np.fromiter((a is not None for a in arrays), dtype=bool, count=len(arrays))
    valid = None if has.all() else np.repeat(has, lengths)
    return _concat(chunks, dtype, int(lengths.sum())), valid


def _concat(chunks: list[np.ndarray], dtype: type, total: int) -> np.ndarray:
    return np.concatenate(chunks).astype(dtype, copy=False) if chunks else np.zeros(total, dtype)


def _with_validity(values: np.ndarray, valid: np.ndarray) -> pa.Array:
    return pa.array(values, mask=~valid) if not valid.all() else pa.array(values)


def _bitmap(flags: np.ndarray) -> pa.Buffer:
    """Numpy bools as an Arrow bitmap (validity or boolean values)."""
    return pa.py_buffer(np.packbits(flags, bitorder="little"))


_StatValues = tuple[np.ndarray, np.ndarray | None]  # float32 values, valid rows (None: all)


def _stat_values(
    parts: Sequence[SampleTokens], column: str, lengths: np.ndarray
) -> _StatValues | None:
    """One per-token column's values over the step's rows (zeros where a sample lacks it) and
    the rows whose value is known; None when no sample has it."""
    sources = [part.columns.get(column) for part in parts]
    if all(source is None for source in sources):
        return None  # a field the dump does not have: no work
    values, valid = _per_sample_values(sources, lengths, np.float32)
    unknown = [part.unknown.get(column) for part in parts]
    if any(u is not None for u in unknown):
        holes, _ = _per_sample_values(unknown, lengths, np.bool_)
        valid = ~holes if valid is None else valid & ~holes
    return values, None if valid is None or valid.all() else valid


def _finite(stat: _StatValues | None) -> np.ndarray | bool:
    """Rows whose value is known and finite (a column no sample has: none)."""
    if stat is None:
        return False
    values, valid = stat
    finite = np.isfinite(values)
    return finite if valid is None else finite & valid


def _float_column(
    stat: _StatValues | None, covered: np.ndarray, covered_bits: pa.Buffer | None, total: int
) -> pa.Array:
    """A per-token float column, NULL outside `covered` and where the value is unknown."""
    if stat is None:
        return pa.nulls(total, pa.float32())
    values, valid = stat
    bits = covered_bits if valid is None else _bitmap(valid & covered)
    return pa.Array.from_buffers(pa.float32(), total, [bits, pa.py_buffer(values)])


def _flag_column(
    stat: _StatValues | None, covered: np.ndarray, covered_bits: pa.Buffer | None, total: int
) -> pa.Array:
    """A per-token flag column (read as 1.0 / 0.0: any non-zero value is true), NULL as in
    `_float_column`."""
    if stat is None:
        return pa.nulls(total, pa.bool_())
    values, valid = stat
    bits = covered_bits if valid is None else _bitmap(valid & covered)
    return pa.Array.from_buffers(pa.bool_(), total, [bits, _bitmap(values != 0)])


def samples_table(
    rollout_id: int,
    evaluation: bool,
    samples: list[dict[str, Any]],
    train_rows: dict[int, TrainRow],
    train_files: int,
    messages: list[str | None],
    parts: Sequence[SampleTokens],
) -> pa.Table:
    """One row per rollout-dump sample with the reference summary's scalar columns.

    `parts` (the samples' `SampleTokens`, one per sample) adds what did not fit the response
    when flattening to `alignment_failed`.
    """
    rows = [
        sample_summary(
            rollout_id, evaluation, position, sample, train_rows.get(position), train_files
        )
        | {schema.MESSAGES_JSON: messages[position]}
        for position, sample in enumerate(samples)
    ]
    for row, part in zip(rows, parts, strict=True):
        row[schema.ALIGNMENT_FAILED] = bool(row[schema.ALIGNMENT_FAILED]) or part.misaligned
    return schema.table_from_rows(schema.SAMPLES, rows)


def null_columns(table: pa.Table, names: Sequence[str]) -> pa.Table:
    """The table with the (nullable) columns `names` NULL in every row."""
    for name in names:
        index = table.schema.get_field_index(name)
        field = table.schema.field(index)
        table = table.set_column(index, field, pa.nulls(table.num_rows, field.type))
    return table


def experts_table(
    evaluation: bool, sample_indices: Sequence[int | None], arrays: list[dict[str, np.ndarray]]
) -> pa.Table:
    """The `experts` rows of a step: one per position of each sample's replay arrays (the
    longer of the two when both exist; the shorter is NULL past its end), nested lists built
    from offsets over the flat values (no loop per position)."""
    lengths = np.array([max((len(a) for a in p.values()), default=0) for p in arrays], np.int64)
    total = int(lengths.sum())
    starts = np.cumsum(lengths) - lengths
    index_values = np.array([-1 if i is None else i for i in sample_indices], dtype=np.int64)
    index_valid = np.array([i is not None for i in sample_indices], dtype=bool)
    columns: dict[str, pa.Array] = {
        schema.EVALUATION: pa.array(np.full(total, evaluation, dtype=bool)),
        schema.BATCH_POSITION: pa.array(np.repeat(np.arange(len(arrays), dtype=np.int32), lengths)),
        schema.SAMPLE_INDEX: _with_validity(
            np.repeat(index_values, lengths), np.repeat(index_valid, lengths)
        ),
        "token_position": pa.array(
            (np.arange(total, dtype=np.int64) - np.repeat(starts, lengths)).astype(np.int32)
        ),
    }
    for key, column in (
        (replay.ROUTED_EXPERTS, "routed_experts"),
        (replay.INDEXER_TOPK, "indexer_topk"),
    ):
        columns[column] = _nested_column([p.get(key) for p in arrays], lengths)
    return pa.Table.from_pydict(columns, schema=schema.EXPERTS_SCHEMA)


def _nested_column(parts: list[np.ndarray | None], lengths: np.ndarray) -> pa.Array:
    """list<list<int32>> rows for [n, layers, k] arrays, padded with NULL rows to `lengths`."""
    kind = pa.list_(pa.list_(pa.int32()))
    chunks = []
    for part, length in zip(parts, lengths, strict=True):
        rows = 0 if part is None else len(part)
        if part is not None and rows:
            n, layers, k = part.shape
            inner = pa.ListArray.from_arrays(
                pa.array(np.arange(n * layers + 1, dtype=np.int32) * k),
                pa.array(np.ascontiguousarray(part).reshape(-1), pa.int32()),
            )
            outer = pa.ListArray.from_arrays(
                pa.array(np.arange(n + 1, dtype=np.int32) * layers), inner
            )
            chunks.append(outer)
        if int(length) > rows:
            chunks.append(pa.nulls(int(length) - rows, kind))
    if not chunks:
        return pa.nulls(0, kind)
    return pa.concat_arrays([c.cast(kind) for c in chunks])
