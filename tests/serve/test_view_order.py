"""Views are created in the order their `Inputs:` headers declare (pipeline/tokenlake/serve/catalog.py)."""

from __future__ import annotations

import pytest

from tokenlake.errors import LakeError
from tokenlake.serve import sql_views


def test_each_view_comes_after_the_views_it_reads() -> None:
    order = sql_views.view_order({"c": ("b", "tokens"), "b": ("a",), "a": (), "d": ("samples",)})
    assert order == ["a", "d", "b", "c"]


def test_every_shipped_view_declares_inputs_that_exist() -> None:
    texts = {p.stem: p.read_text(encoding="utf-8") for p in sql_views.iter_view_files()}
    order = sql_views.view_order(
        {name: sql_views.view_inputs(text) for name, text in texts.items()}
    )
    assert sorted(order) == sorted(texts)
    assert order.index("drift_samples") < order.index("drift_steps")
    assert order.index("sample_stats") < order.index("step_stats")


def test_inputs_continue_on_indented_lines_and_notes_are_not_inputs() -> None:
    text = (
        "-- Purpose.\n"
        "-- Inputs: tokens, drift_settings (is_cap,\n"
        "--         icepop_high), samples; macros clamp_to,\n"
        "--         ess_fraction (sql/macros).\n"
        "-- Columns:\n"
        "CREATE OR REPLACE VIEW v AS SELECT 1"
    )
    assert sql_views.view_inputs(text) == ("tokens", "drift_settings", "samples")
    assert sql_views.view_inputs("-- Purpose only.\nSELECT 1") is None


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        (
            {"a": ("b",), "b": ("a",), "c": ()},
            "views `a`, `b` name each other as inputs in a cycle",
        ),
        (
            {"a": ("tokenz",)},
            "names unknown input `tokenz` in its `Inputs:` header (tables: tokens, samples,"
            " runs, vocab, metrics, experts; or a view under sql/)",
        ),
        ({"a": None}, "has no `-- Inputs:` line in its header"),
    ],
)
def test_a_wrong_header_is_one_clear_error(inputs, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(LakeError) as caught:
        sql_views.view_order(inputs)
    assert caught.value.problem == message


def test_a_connection_gets_only_the_views_it_asks_for_and_what_they_read() -> None:
    import duckdb

    from tokenlake import schema

    con = duckdb.connect()
    for table in schema.TABLES:
        con.execute(f"CREATE VIEW {table} AS {sql_views.base_view_sql(table, [])}")
    for path in sql_views.iter_macro_files():
        con.execute(path.read_text(encoding="utf-8"))
    created = sql_views.create_views_reading(con, ["drift_sample_parts", "sample_token_parts"])
    assert created == [
        "drift_settings",
        "sample_token_parts",
        "trained_tokens",
        "drift_tokens",
        "drift_sample_parts",
    ]
    listed = con.execute("SELECT view_name, comment FROM duckdb_views() WHERE NOT internal")
    assert sorted(listed.fetchall()) == sorted(
        [(name, None) for name in [*schema.TABLES, *created]]
    )


def test_asking_for_a_view_no_file_defines_is_an_error() -> None:
    import duckdb

    with pytest.raises(ValueError, match="no view file defines `drift_tokenz`"):
        sql_views.create_views_reading(duckdb.connect(), ["drift_tokenz"])


def test_a_view_that_cannot_be_created_is_named_by_its_file(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import duckdb

    texts = {
        "a": "-- Inputs: none.\nCREATE OR REPLACE VIEW a AS SELECT 1 AS x",
        "b": "-- Inputs: a.\nCREATE OR REPLACE VIEW b AS SELECT x FROM a, nowhere",
    }
    monkeypatch.setattr(sql_views, "_view_texts", lambda: texts)
    con = duckdb.connect()
    with pytest.raises(LakeError) as caught:
        sql_views.create_views_reading(con, ["b"])
    assert caught.value.path == str(sql_views.sql_dir() / "b.sql")
    assert caught.value.problem == (
        "view cannot be created: Catalog Error: Table with name nowhere does not exist!"
    )
    assert con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall() == [
        ("a",)
    ]


@pytest.mark.parametrize("failing", ["b", "c"])  # made by `con`, or by the second connection
def test_a_view_of_either_connection_that_fails_is_named_and_left_out(monkeypatch, failing) -> None:  # type: ignore[no-untyped-def]
    import duckdb

    texts = {
        name: f"-- {name}.\n-- Inputs: {inputs}.\nCREATE OR REPLACE VIEW {name} AS {query}"
        for name, inputs, query in [
            ("a", "none", "SELECT 1 AS x"),
            ("b", "a", "SELECT x FROM a"),
            ("c", "a", "SELECT x + 1 AS y FROM a"),
        ]
    }
    texts[failing] = texts[failing].replace("FROM a", "FROM a, nowhere")
    monkeypatch.setattr(sql_views, "_view_texts", lambda: texts)
    con = duckdb.connect()
    with pytest.raises(LakeError) as caught:
        sql_views.create_sql_views(con)
    assert caught.value.path == str(sql_views.sql_dir() / f"{failing}.sql")
    assert caught.value.problem == (
        "view cannot be created: Catalog Error: Table with name nowhere does not exist!"
    )
    made = con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal ORDER BY 1")
    assert made.fetchall() == [("a",), ("c",) if failing == "b" else ("b",)]


def test_views_are_made_by_two_connections_a_layer_at_a_time_with_their_comments() -> None:
    import duckdb

    from tokenlake import schema

    con = duckdb.connect()
    for table in schema.TABLES:
        con.execute(f"CREATE VIEW {table} AS {sql_views.base_view_sql(table, [])}")
    for path in sql_views.iter_macro_files():
        con.execute(path.read_text(encoding="utf-8"))
    created = sql_views.create_sql_views(con)
    texts = {p.stem: p.read_text(encoding="utf-8") for p in sql_views.iter_view_files()}
    assert created == sql_views.view_order(
        {name: sql_views.view_inputs(text) for name, text in texts.items()}
    )
    listed = con.execute(
        "SELECT view_name, comment FROM duckdb_views() WHERE NOT internal AND view_name NOT IN"
        f" ({', '.join(sql_views.quote_literal(t) for t in schema.TABLES)})"
    )
    assert sorted(listed.fetchall()) == sorted(
        (name, sql_views.header_comment(texts[name])) for name in created
    )


def test_views_are_not_made_inside_a_callers_transaction() -> None:
    import duckdb

    con = duckdb.connect()
    con.execute("BEGIN TRANSACTION")
    with pytest.raises(duckdb.TransactionException):
        sql_views.create_sql_views(con)
