"""Rows become a table only with exactly their table's columns (`schema.table_from_rows`).

`pa.Table.from_pylist(rows, schema=...)` drops a key the schema lacks and fills a column no row
has with NULL; a misspelt key would land in the lake as a column of NULLs. A mismatch is a bug
in tokenlake, so it is an `InternalError` (an AssertionError), never a `PipelineError`.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest

from tests.memdump import MemDump, column
from tokenlake import schema
from tokenlake.errors import InternalError, PipelineError, RowKeysError, shown
from tokenlake.orchestrate import step
from tokenlake.transform import flatten
from tokenlake.transform.summary import sample_summary


def test_rows_with_exactly_the_columns_become_the_table() -> None:
    rows = [{schema.TOKEN_ID: 7, "token_text": "a"}, {"token_text": None, schema.TOKEN_ID: 8}]
    table = schema.table_from_rows(schema.VOCAB, rows)
    assert table.schema == schema.VOCAB_SCHEMA
    assert table.to_pylist() == [
        {"token_id": 7, "token_text": "a"},
        {"token_id": 8, "token_text": None},
    ]


def test_a_misspelt_key_is_an_internal_error_naming_it_and_the_column() -> None:
    rows = [{schema.TOKEN_ID: 7, "token_text": "a"}, {schema.TOKEN_ID: 8, "token_txt": "b"}]
    with pytest.raises(RowKeysError) as caught:
        schema.table_from_rows(schema.VOCAB, rows)
    assert str(caught.value) == (
        "Row 1 built for table `vocab` does not match the table's schema: unknown key"
        " `token_txt`; missing column `token_text`"
    )
    assert (caught.value.table, caught.value.row) == ("vocab", 1)
    assert (caught.value.unknown, caught.value.missing) == (["token_txt"], ["token_text"])
    assert isinstance(caught.value, InternalError | AssertionError)
    assert not isinstance(caught.value, PipelineError)


def test_missing_columns_alone_are_listed_in_schema_order() -> None:
    with pytest.raises(RowKeysError) as caught:
        schema.table_from_rows(schema.METRICS, [{"value": 1.0}])
    assert str(caught.value) == (
        "Row 0 built for table `metrics` does not match the table's schema: missing columns"
        " `step_key`, `step`, `metric`, `ts`"
    )


def test_unknown_keys_alone_are_listed_in_the_rows_order_and_escaped() -> None:
    row = {schema.TOKEN_ID: 1, "token_text": "a", "zeta": 0, "al\x1bpha": 0}
    with pytest.raises(RowKeysError) as caught:
        schema.table_from_rows(schema.VOCAB, [row])
    assert str(caught.value) == (
        "Row 0 built for table `vocab` does not match the table's schema: unknown keys `zeta`,"
        " `al\\x1bpha`"
    )


def test_a_samples_row_has_every_samples_column_by_its_schema_name() -> None:
    sample = {"index": 3, "tokens": [5, 6, 7], "response_length": 2, "status": "completed"}
    row = sample_summary(4, False, 0, sample, None) | {schema.MESSAGES_JSON: None}
    assert sorted(row) == sorted(schema.SAMPLES_SCHEMA.names)
    table = schema.table_from_rows(schema.SAMPLES, [row])
    assert table.column(schema.STALENESS).to_pylist() == [None]
    assert table.column(schema.PROMPT_TOKEN_IDS).to_pylist() == [[5]]


def test_a_step_whose_samples_row_is_misspelt_is_reported_as_a_tokenlake_bug(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def misspelt(*args: Any) -> dict[str, Any]:
        row = sample_summary(*args)
        row["stalenes"] = row.pop(schema.STALENESS)
        return row

    dump = MemDump(tmp_path, monkeypatch)
    dump.rollout([{"index": 0, "tokens": [1, 2, 3], "response_length": 2}])
    assert column(dump.tables()[1], schema.STALENESS) == [None]  # the step as it is: fine
    monkeypatch.setattr(flatten, "sample_summary", misspelt)
    message = (
        "Row 0 built for table `samples` does not match the table's schema: unknown key"
        " `stalenes`; missing column `staleness`"
    )
    source, first = inspect.getsourcelines(schema.table_from_rows)
    line = first + next(i for i, text in enumerate(source) if "raise RowKeysError" in text)
    assert dump.error() == (
        f"`{dump.files().rollout_file}`: unexpected RowKeysError({shown(message)}) at"
        f" schema.py:{line} in table_from_rows. {step.BUG_HINT}"
    )
