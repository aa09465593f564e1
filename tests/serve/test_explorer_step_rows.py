"""The explorer's per-step rows kept per step identity (`serve/explore/step_rows.py`): only the
steps not kept are read, the rows (NaN included) come back from the user's cache as they were
read, a planted link or a damaged file in the cache is never read (the steps are read again),
and a step's identity holds everything of `runs` its rows read.
"""

from __future__ import annotations

import math
import os
from typing import Any

import pyarrow as pa
import pytest

from tests.conftest import store_of
from tokenlake.generator import synth
from tokenlake.orchestrate.extract import ExtractOptions, extract_run
from tokenlake.serve import catalog
from tokenlake.serve.explore import data, step_rows

COUNTS = pa.schema([("run", pa.string()), ("rollout_id", pa.int64()), ("evaluation", pa.bool_())])
# drift_steps' keys, and each windowed column with the one it is of.
DRIFT = pa.schema(
    [("run", pa.string()), ("rollout_id", pa.int64())]
    + [
        (name, pa.int64() if name == "prev_rollout_id" else pa.float64())
        for column, of in step_rows.WINDOWED.items()
        for name in ((column,) if of == "rollout_id" else (of, column))
    ]
)
# What the lake holds, per step: its k3 (step 2: NaN, as a lake can hold).
LAKE = {("a", 0, False): 0.5, ("a", 1, False): 0.25, ("a", 2, False): math.nan}


class Reader:
    """Reads the steps `LAKE` holds, and records which were asked for."""

    def __init__(self) -> None:
        self.asked: list[Any] = []

    def __call__(self, chosen: Any) -> tuple[pa.Table, pa.Table]:
        self.asked.append(None if chosen is None else sorted(chosen))
        steps = sorted(LAKE if chosen is None else chosen)
        counts = [{"run": r, "rollout_id": s, "evaluation": e} for r, s, e in steps]
        drift = [
            {
                "run": r,
                "rollout_id": s,
                **{
                    n: None if n in step_rows.WINDOWED else LAKE[(r, s, e)] for n in DRIFT.names[2:]
                },
            }
            for r, s, e in steps
        ]
        return pa.Table.from_pylist(counts, COUNTS), pa.Table.from_pylist(drift, DRIFT)


def _k3(tables: tuple[pa.Table, pa.Table]) -> list[tuple[int, float]]:
    return [(row["rollout_id"], row["k3_kl"]) for row in tables[1].to_pylist()]


def test_only_the_steps_not_kept_are_read_and_the_cache_gives_back_what_was_read(tmp_path):
    two = {("a", 0, False): "id-0", ("a", 1, False): "id-1"}
    kept, read = step_rows.StepRowsKept(tmp_path), Reader()
    assert _k3(kept.tables(two, read)) == [(0, 0.5), (1, 0.25)]
    three = {**two, ("a", 2, False): "id-2"}
    found = kept.tables(three, read)
    changed = {**three, ("a", 1, False): "id-1-again"}  # step 1 extracted again
    kept.tables(changed, read)
    assert read.asked == [None, [("a", 2, False)], [("a", 1, False)]]
    assert [r["rollout_id"] for r in found[0].to_pylist()] == [0, 1, 2]
    again, fresh = Reader(), step_rows.StepRowsKept(tmp_path)  # a new server
    back = fresh.tables(changed, again)
    assert again.asked == [] and back[0] == found[0] and back[0].schema == COUNTS
    assert _k3(back)[:2] == [(0, 0.5), (1, 0.25)] and math.isnan(_k3(back)[2][1])
    assert back[1].schema == DRIFT
    fresh.tables({("a", 0, False): "id-0"}, again)  # a step dropped from the lake
    assert [p.name for p in tmp_path.iterdir()] == [step_rows.FILE]
    assert step_rows._read_file(tmp_path / step_rows.FILE).num_rows == 1


@pytest.mark.parametrize("planted", ["link", "damaged", "another table"])
def test_a_planted_or_damaged_cache_file_is_not_read_and_the_steps_are_read_again(
    tmp_path, planted
):
    two = {("a", 0, False): "id-0", ("a", 1, False): "id-1"}
    (tmp_path / "elsewhere").mkdir()
    step_rows.StepRowsKept(tmp_path / "elsewhere").tables(two, Reader())
    kept_file = tmp_path / step_rows.FILE
    if planted == "link":  # to a real file of kept rows: still not followed
        os.symlink(tmp_path / "elsewhere" / step_rows.FILE, kept_file)
    elif planted == "damaged":
        kept_file.write_bytes(b"ARROW1\0\0 not an arrow file")
    else:
        with pa.ipc.new_file(str(kept_file), COUNTS) as writer:
            writer.write_table(Reader()(None)[0])
    read = Reader()
    assert _k3(step_rows.StepRowsKept(tmp_path).tables(two, read)) == [(0, 0.5), (1, 0.25)]
    assert read.asked == [None]
    assert not kept_file.is_symlink()  # replaced by the rows read, the link's target untouched
    assert step_rows._read_file(tmp_path / "elsewhere" / step_rows.FILE).num_rows == 2


@pytest.mark.slow
def test_the_per_step_rows_read_no_column_of_runs_but_the_framework(tmp_path):
    """A step's identity digests its run's `runs` values that `runs_rows` reads: with a `runs`
    of those columns only, the per-step rows' queries still bind."""
    synth.write_dump(tmp_path / "dump", synth.PRESETS["example"])
    lake = tmp_path / "lake"
    extract_run(tmp_path / "dump", store_of(lake), ExtractOptions(run_name="r", workers=1))
    con = catalog.connect(store_of(lake))
    try:
        assert step_rows.runs_rows(con) == {"r": '["miles"]'}
        own = f"{con.execute('SELECT current_database()').fetchall()[0][0]}.main.runs"
        assert step_rows.RUNS_ROWS_SQL == "SELECT run, framework FROM runs"
        con.execute(f"CREATE TEMP VIEW runs AS SELECT run, framework FROM {own}")
        counts, drift = data.read_step_rows(con)
        assert counts.num_rows == 4 and drift.num_rows == 3
        con.execute(f"CREATE OR REPLACE TEMP VIEW runs AS SELECT run FROM {own}")
        with pytest.raises(Exception, match="framework"):
            data.read_step_rows(con)
    finally:
        con.close()


def test_the_windows_are_computed_as_duckdb_computes_the_views_lag():
    """`with_windows` against DuckDB's LAG over the same rows (given out of order), with NULL,
    NaN and infinite values: every column equal, NaN where DuckDB gives NaN."""
    import duckdb

    values = [1.0, 3.0, math.nan, None, math.inf, math.inf, -2.5, math.inf]
    keys = [("b", 0), ("a", 7), ("a", 2), ("a", 0), ("b", 3), ("a", 9), ("c", 1), ("a", 11)]
    read = []
    for (run, step), value in zip(keys, values, strict=True):
        row: dict[str, Any] = {"run": run, "rollout_id": step}
        for column, of in step_rows.WINDOWED.items():
            row[column] = -1  # as read step by step: wrong, computed again
            if of != "rollout_id":
                row[of] = value if of != "ess" else (None if value is None else value / 2)
        read.append(row)
    lagged = ", ".join(
        f"LAG({of}) OVER w AS {column}"
        if column == "prev_rollout_id"
        else f"{of} - LAG({of}) OVER w AS {column}"
        for column, of in step_rows.WINDOWED.items()
    )
    relation = (
        duckdb.connect()
        .from_arrow(pa.Table.from_pylist(read))
        .query(
            "t",
            f"SELECT * REPLACE ({lagged}) FROM t WINDOW w AS (PARTITION BY run ORDER BY rollout_id)"
            " ORDER BY run, rollout_id",
        )
    )
    expected = [
        dict(zip([d[0] for d in relation.description], r, strict=True)) for r in relation.fetchall()
    ]
    found = step_rows.with_windows(read)
    assert [(r["run"], r["rollout_id"]) for r in found] == sorted(keys)
    assert repr(found) == repr(expected)  # nan == nan is false: compared as text
    changes = [r["k3_kl_change"] for r in found]  # a: None nan 3 inf inf; b: 1 inf; c
    assert [found[1]["prev_rollout_id"], changes[0], changes[1]] == [0, None, None]
    assert math.isnan(changes[2]) and changes[3] == math.inf and math.isnan(changes[4])
    assert changes[5:] == [None, math.inf, None]
    assert read[0]["prev_rollout_id"] == -1  # the rows read are left as they were


@pytest.mark.slow
def test_a_rollup_computed_under_the_settings_read_is_served_without_the_fallback(tmp_path):
    """Given the digests of the settings a connection reads (`rollups.settings_digests`), a
    step's rollup computed under them is read from its file alone; under other settings it
    keeps the fallback to the tokens. Both give the same rows."""
    from tokenlake.serve import rollups
    from tokenlake.serve.served import served_records
    from tokenlake.store import manifest

    synth.write_dump(tmp_path / "dump", synth.PRESETS["example"])
    lake = tmp_path / "lake"
    extract_run(tmp_path / "dump", store_of(lake), ExtractOptions(run_name="r", workers=1))
    store = store_of(lake)
    records = served_records(store, manifest.load_all(store))[0]
    con = catalog.connect(store)
    try:
        settled = rollups.settings_digests(con)
        assert sorted(settled) == ["drift_sample_parts"]
        guarded = catalog.step_view_queries(store, records, "r", 1, False)
        fixed = catalog.step_view_queries(store, records, "r", 1, False, settled)
        other = catalog.step_view_queries(
            store, records, "r", 1, False, {"drift_sample_parts": "0" * 32}
        )
        assert "tokenlake_settings_hit" in guarded["drift_sample_parts"]
        assert "tokenlake_settings_hit" in other["drift_sample_parts"]
        assert "tokenlake_settings_hit" not in fixed["drift_sample_parts"]
        assert {k: v for k, v in fixed.items() if k != "drift_sample_parts"} == {
            k: v for k, v in guarded.items() if k != "drift_sample_parts"
        }
        sql = "SELECT * FROM drift_samples ORDER BY batch_position"
        found = []
        for queries in (guarded, fixed):
            cursor = con.cursor()
            data.read_only_step(cursor, queries)
            found.append(cursor.execute(sql).fetchall())
            cursor.close()
        assert len(found[0]) == 31 and found[0] == found[1]  # one removed sample
    finally:
        con.close()


class OlderCatalog(Reader):
    """A catalog built before an extraction landed step 2, which the manifests, read after it,
    list: reading every step gives steps 0 and 1; the chosen steps are read from their files."""

    def __call__(self, chosen: Any) -> tuple[pa.Table, pa.Table]:
        counts, drift = super().__call__(chosen)
        if chosen is None:
            counts, drift = counts.slice(0, 2), drift.slice(0, 2)
        return counts, drift


def test_a_step_the_catalog_read_did_not_hold_is_not_kept_and_is_read_next_time(tmp_path):
    """A server's catalog built before an extraction landed a step, its manifests read after:
    that step is in no row read, and is not kept as a step without rows."""
    three = {("a", 0, False): "id-0", ("a", 1, False): "id-1", ("a", 2, False): "id-2"}
    older = OlderCatalog()
    first = step_rows.StepRowsKept(tmp_path).tables(three, older)
    assert [r["rollout_id"] for r in first[0].to_pylist()] == [0, 1]
    assert step_rows._read_file(tmp_path / step_rows.FILE).num_rows == 2
    read = Reader()
    found = step_rows.StepRowsKept(tmp_path).tables(three, read)  # the next server
    assert read.asked == [[("a", 2, False)]]
    assert [r["rollout_id"] for r in found[0].to_pylist()] == [0, 1, 2]
    assert _k3(found)[:2] == [(0, 0.5), (1, 0.25)] and math.isnan(_k3(found)[2][1])


def test_a_step_kept_without_rows_by_an_older_tokenlake_is_read_again(tmp_path):
    two = {("a", 0, False): "id-0", ("a", 1, False): "id-1"}
    step_rows.StepRowsKept(tmp_path).tables(two, Reader())
    kept = step_rows._read_file(tmp_path / step_rows.FILE)
    counts = kept.column("counts").combine_chunks()
    emptied = pa.array([counts[0].as_py(), None], counts.type)  # step 1: no rows, as kept before
    step_rows._write_file(tmp_path, kept.set_column(1, "counts", emptied))
    read = Reader()
    found = step_rows.StepRowsKept(tmp_path).tables(two, read)
    assert read.asked == [[("a", 1, False)]]
    assert [r["rollout_id"] for r in found[0].to_pylist()] == [0, 1]
