"""A committed lake file whose footer was rewritten, its pages untouched: readers skip row
groups by the forged statistics; `verify` names the file by its recorded size and footer
digest, `verify --deep` by its statistics recomputed from its pages."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.fixture_paths import REAL_DUMPS
from tests.limits import cli_process
from tests.store.test_hostile_lake import cli, extract, rows

pytestmark = pytest.mark.slow  # extracts a real fixture dump

POSITIVE = "SELECT count(*), round(max(lp_diff)::DOUBLE, 6) FROM tokens WHERE rollout_id = 1 AND lp_diff > 0"


def _forge_maximum(path: Path, column: str) -> tuple[float, float]:
    """Rewrite the footer of `path` so that `column` states its minimum as its maximum too;
    the file keeps its size and its pages. Returns the (minimum, maximum) its pages hold."""
    data = path.read_bytes()
    footer_length = int.from_bytes(data[-8:-4], "little")
    start = len(data) - 8 - footer_length
    metadata = pq.read_metadata(path)
    (index,) = [i for i in range(metadata.num_columns) if metadata.schema.column(i).name == column]
    chunk = metadata.row_group(0).column(index)
    stated, packing = chunk.statistics, {"FLOAT": "<f", "DOUBLE": "<d"}[chunk.physical_type]
    real_max, real_min = struct.pack(packing, stated.max), struct.pack(packing, stated.min)
    footer = data[start:-8]
    assert footer.count(real_max) == 2  # max_value and the deprecated max
    path.write_bytes(data[:start] + footer.replace(real_max, real_min) + data[-8:])
    return stated.min, stated.max


def test_a_forged_footer_is_named_by_verify_and_by_verify_deep(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    extract(REAL_DUMPS / "basic", lake)
    honest = rows(lake, POSITIVE)
    (forged,) = (lake / "tokens/run=basic/rollout_id=1").glob("train-*.parquet")
    size = forged.stat().st_size
    low, high = _forge_maximum(forged, "lp_diff")
    name = forged.relative_to(lake).as_posix()
    # What a reader counts changes: DuckDB skips the row group by its stated maximum.
    assert (honest, rows(lake, POSITIVE)) == ([(40, 0.971728)], [(0, None)])
    assert forged.stat().st_size == size

    # A reader leaves the step out, saying so, rather than count by the forged footer.
    by_step = "SELECT rollout_id, count(*) FROM tokens GROUP BY ALL ORDER BY ALL"
    assert cli_process("query", str(lake), by_step, "--format", "csv") == (
        0,
        '"rollout_id","count_star()"\n0,124\n',
        [
            f"Warning: run `basic` step 1: not served: `{name}` is not the file its manifest"
            " records (its size or footer changed); `tokenlake verify LAKE` names it"
        ],
    )

    code, out, _ = cli("verify", str(lake))
    assert (code, out.splitlines()) == (
        1,
        [
            f"run `basic` step 1: file `{name}` changed since it was written: its footer is not"
            " the one written; delete it and extract again",
            "3 steps checked, 1 problem",
        ],
    )

    # A manifest that records no identities (written before they existed): --deep reads pages.
    manifest = lake / "_manifest/basic.json"
    record = json.loads(manifest.read_text())
    for step in record["steps"].values():
        del step["identities"]
    manifest.write_text(json.dumps(record))
    assert cli("verify", str(lake))[:2] == (0, "3 steps checked, 0 problems\n")
    code, out, _ = cli("verify", str(lake), "--deep")
    assert (code, out.splitlines()) == (
        1,
        [
            f"run `basic` step 1: file `{name}` has a footer that disagrees with its pages:"
            f" row group 0, column `lp_diff`: values stated in [{low}, {low}], found in"
            f" [{low}, {high}]; delete it and extract again",
            "3 steps checked, 1 problem",
        ],
    )
    forged.unlink()
    assert extract(REAL_DUMPS / "basic", lake)[0] == 0
    assert cli("verify", str(lake), "--deep")[:2] == (0, "3 steps checked, 0 problems\n")
    assert rows(lake, POSITIVE) == honest


def test_a_kept_catalog_is_not_served_after_a_file_is_forged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader keeps its private catalog while nothing it was built from changed; a file
    forged after that is still left out: the kept catalog is keyed on what may be served."""
    monkeypatch.setenv("TOKENLAKE_CACHE", str(tmp_path / "cache"))
    lake = tmp_path / "lake"
    extract(REAL_DUMPS / "basic", lake)
    by_step = "SELECT rollout_id, count(*) FROM tokens GROUP BY ALL ORDER BY ALL"
    honest = (0, '"rollout_id","count_star()"\n0,124\n1,82\n', [])
    assert cli_process("query", str(lake), by_step, "--format", "csv") == honest
    assert cli_process("query", str(lake), by_step, "--format", "csv") == honest  # kept
    assert len(list((tmp_path / "cache" / "catalogs").glob("*/*/tokenlake.duckdb"))) == 1
    (forged,) = (lake / "tokens/run=basic/rollout_id=1").glob("train-*.parquet")
    _forge_maximum(forged, "lp_diff")
    name = forged.relative_to(lake).as_posix()
    assert cli_process("query", str(lake), by_step, "--format", "csv") == (
        0,
        '"rollout_id","count_star()"\n0,124\n',
        [
            f"Warning: run `basic` step 1: not served: `{name}` is not the file its manifest"
            " records (its size or footer changed); `tokenlake verify LAKE` names it"
        ],
    )


def _rewrite_runs_row(path: Path) -> None:
    """Rewrite a `runs` file with another `train_steps`: another length and footer."""
    table = pq.read_table(path)
    column = table.schema.get_field_index("train_steps")
    forged = table.set_column(column, "train_steps", pa.array([99], table.column(column).type))
    pq.write_table(forged, path, compression="NONE")


def _forge_footer_byte(path: Path) -> None:
    """Change one byte of the footer's key-value metadata: same size, same pages."""
    data = path.read_bytes()
    start = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    footer = data[start:-8]
    key = b".".join((b"tokenlake", b"run"))  # the metadata key of the file's run
    assert footer.count(key) == 1
    path.write_bytes(data[:start] + footer.replace(key, key.upper()) + data[-8:])


RUNS_SQL = "SELECT run, train_steps FROM runs"
VOCAB_SQL = "SELECT count(*) FROM vocab"
TOKENS_SQL = "SELECT count(*) FROM tokens"


def test_a_changed_side_file_is_named_by_verify_left_out_by_readers_and_written_again(
    tmp_path: Path,
) -> None:
    """A run's `runs` and `vocab` files carry identities too: a rewritten `runs` row (another
    size) and a vocab whose footer changed (same size) are each one line of `verify`, left out
    by readers with one warning while the rest is served, refused by `tag` (which would write
    the forged row again as the run's own), and written again by the next extraction."""
    lake = tmp_path / "lake"
    extract(REAL_DUMPS / "basic", lake)
    honest = [rows(lake, sql) for sql in (RUNS_SQL, VOCAB_SQL, TOKENS_SQL)]
    assert honest[0] == [("basic", 2)] and honest[1][0][0] > 0
    (runs_file,) = (lake / "runs/run=basic").glob("run-*.parquet")
    (vocab_file,) = (lake / "vocab/run=basic").glob("vocab-*.parquet")
    runs_name = runs_file.relative_to(lake).as_posix()
    vocab_name = vocab_file.relative_to(lake).as_posix()
    written = runs_file.stat().st_size
    _rewrite_runs_row(runs_file)
    vocab_size = vocab_file.stat().st_size
    _forge_footer_byte(vocab_file)
    assert vocab_file.stat().st_size == vocab_size

    code, out, _ = cli("verify", str(lake))
    assert (code, out.splitlines()) == (
        1,
        [
            f"run `basic`: file `{runs_name}` changed since it was written:"
            f" {runs_file.stat().st_size:,} bytes, written {written:,}; extract the run again",
            f"run `basic`: file `{vocab_name}` changed since it was written: its footer is not"
            " the one written; extract the run again",
            "3 steps checked, 2 problems",
        ],
    )

    # A reader leaves both out (the first named), and serves the steps.
    changed = (
        f"Warning: run `basic`: side files not served: `{runs_name}` is not the file its"
        " manifest records (its size or footer changed); `tokenlake verify LAKE` names it"
    )
    for sql, answer in ((RUNS_SQL, '"run","train_steps"\n'), (VOCAB_SQL, '"count_star()"\n0\n')):
        assert cli_process("query", str(lake), sql, "--format", "csv") == (0, answer, [changed])
    assert cli_process("query", str(lake), TOKENS_SQL, "--format", "csv") == (
        0,
        f'"count_star()"\n{honest[2][0][0]}\n',
        [changed],
    )

    code, _, errors = cli("tag", str(lake), "basic", "owner=me")
    assert (code, errors) == (
        1,
        [
            f"Error: Lake `{runs_file}`: changed since it was written:"
            f" {runs_file.stat().st_size:,} bytes, written {written:,}; extract the run again"
        ],
    )

    assert extract(REAL_DUMPS / "basic", lake)[0] == 0
    assert cli("verify", str(lake))[:2] == (0, "3 steps checked, 0 problems\n")
    assert [rows(lake, sql) for sql in (RUNS_SQL, VOCAB_SQL, TOKENS_SQL)] == honest
    assert not runs_file.exists() and not vocab_file.exists()  # replaced, then swept


def test_side_files_of_a_manifest_without_their_identities_are_served_as_before(
    tmp_path: Path,
) -> None:
    """A manifest written before side files had identities: verify and readers cannot tell a
    rewritten `runs` row, and serve it, as before."""
    lake = tmp_path / "lake"
    extract(REAL_DUMPS / "basic", lake)
    manifest = lake / "_manifest/basic.json"
    record = json.loads(manifest.read_text())
    assert sorted(record.pop("side_identities")) == sorted(
        p.relative_to(lake).as_posix() for p in lake.glob("[rv]*/run=basic/*.parquet")
    )
    manifest.write_text(json.dumps(record))
    (runs_file,) = (lake / "runs/run=basic").glob("run-*.parquet")
    _rewrite_runs_row(runs_file)
    assert cli("verify", str(lake))[:2] == (0, "3 steps checked, 0 problems\n")
    assert cli_process("query", str(lake), RUNS_SQL, "--format", "csv") == (
        0,
        '"run","train_steps"\n"basic",99\n',
        [],
    )


def test_a_listed_file_deleted_is_left_out_and_the_rest_served(tmp_path: Path) -> None:
    # A file its manifest lists, deleted by hand or by another program: every reader failed
    # on the whole lake (`IO Error: No files found ...`, or for the `runs` file "a Parquet
    # file vanished while the catalog was built (an extraction running?)"), where a changed
    # file leaves out its step alone.
    lake = tmp_path / "lake"
    extract(REAL_DUMPS / "basic", lake)
    (tokens,) = (lake / "tokens/run=basic/rollout_id=1").glob("train-*.parquet")
    (runs,) = (lake / "runs/run=basic").glob("run-*.parquet")
    tokens.unlink()
    runs.unlink()
    by_step = "SELECT rollout_id, count(*) FROM tokens GROUP BY ALL ORDER BY ALL"
    assert cli_process("query", str(lake), by_step, "--format", "csv") == (
        0,
        '"rollout_id","count_star()"\n0,124\n',
        [
            f"Warning: run `basic` step 1: not served: `{tokens.relative_to(lake)}` is missing;"
            " `tokenlake verify LAKE` names it",
            f"Warning: run `basic`: side files not served: `{runs.relative_to(lake)}` is"
            " missing; `tokenlake verify LAKE` names it",
        ],
    )
