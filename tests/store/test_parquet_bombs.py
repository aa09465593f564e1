"""Lake Parquet files that decode to gigabytes: each is one line naming it, read within
`store.parquet.decoded_bound` of its size, and the other steps are served."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.fixture_paths import REAL_DUMPS
from tests.limits import run_cli_limited
from tests.store.test_hostile_lake import extract
from tokenlake.store import parquet
from tokenlake.store.local import LocalStore

MiB = 1 << 20
# Enough for the CLI and one step's honest rows; far below what a bomb decodes to.
MEMORY = 1536 * MiB


def _dictionary_of(value: str, rows: int) -> pa.DictionaryArray:
    """`rows` references to one dictionary entry: a few bytes on disk, `rows` x its length
    decoded."""
    return pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), pa.array([value]))


def _bomb_tokens(path: Path, value_bytes: int) -> None:
    """The tokens file at `path`, its columns and rows kept, each token's `token_version` one
    shared dictionary string of `value_bytes` bytes (the footer's arrow schema says string)."""
    honest = pq.read_table(path)
    at = honest.schema.get_field_index("token_version")
    bomb = honest.set_column(
        at, "token_version", _dictionary_of("v" * value_bytes, honest.num_rows)
    )
    pq.write_table(bomb, path, compression="zstd", store_schema=False)


@pytest.mark.slow  # extracts a real fixture dump
def test_a_token_file_whose_dictionary_decodes_to_gigabytes_is_one_line(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    extract(REAL_DUMPS / "basic", lake)
    (bomb,) = (lake / "tokens/run=basic/rollout_id=1").glob("train-*.parquet")
    _bomb_tokens(bomb, 32 * MiB)  # 82 tokens: 2.6 GB decoded
    name = bomb.relative_to(lake).as_posix()
    size = bomb.stat().st_size
    bound = f"{(64 * size + 64 * MiB) / MiB:,.0f} MiB"
    reason = (
        f"it would decode to 2,656 MiB, more than the {bound} a file of {size:,} bytes may:"
        " 64 x its size + 64 MiB"
    )

    done = run_cli_limited(["verify", str(lake)], MEMORY, 120, "RLIMIT_DATA")
    assert (done.returncode, done.stdout.splitlines(), done.stderr) == (
        1,
        [
            f"run `basic` step 1: file `{name}` cannot be read ({reason}); delete it and extract"
            " again",
            "3 steps checked, 1 problem",
        ],
        "",
    )
    done = run_cli_limited(["views", str(lake), "--recompute"], MEMORY, 120, "RLIMIT_DATA")
    assert (done.returncode, done.stdout, done.stderr.splitlines()) == (
        0,
        f"Computed the rollups of 2 steps from their tokens.\nRebuilt {lake / 'tokenlake.duckdb'}\n",
        [
            f"Warning: run `basic` step 1: rollups not computed: Lake `{bomb}`: cannot be read"
            f" ({reason}); extract the run again",
            f"Warning: run `basic` step 1: not served: `{name}` is not the file its manifest"
            " records (its size or footer changed); `tokenlake verify LAKE` names it",
        ],
    )


def _read(folder: Path, table: pa.Table, **options: object) -> str:
    pq.write_table(table, folder / "x.parquet", **options)  # type: ignore[arg-type]
    with pytest.raises(parquet.UnreadableLakeFile) as refused:
        parquet.read_table(LocalStore(folder), "x.parquet")
    return refused.value.reason


def test_every_kind_of_expansion_is_refused_before_it_is_decoded(tmp_path: Path) -> None:
    # A list of dictionary strings (a samples file's `weight_versions`).
    listed = pa.ListArray.from_arrays(pa.array([0, 1, 2, 3]), _dictionary_of("w" * MiB, 3))
    reason = _read(tmp_path, pa.table({"weight_versions": pa.concat_arrays([listed] * 30)}))
    assert reason == (
        "it would decode to 91 MiB, more than the 67 MiB a file of 49,829 bytes may:"
        " 64 x its size + 64 MiB"
    )
    # Ten million NULL rows: a run-length validity bitmap on disk, 8 bytes a row decoded.
    reason = _read(tmp_path, pa.table({"count": pa.nulls(10_000_000, pa.int64())}))
    assert reason == (
        "it would decode to 153 MiB, more than the 65 MiB a file of 19,563 bytes may:"
        " 64 x its size + 64 MiB"
    )
    # More rows than the manifest records.
    pq.write_table(pa.table({"n": [1, 2, 3]}), tmp_path / "x.parquet")
    with pytest.raises(parquet.UnreadableLakeFile) as refused:
        parquet.read_table(LocalStore(tmp_path), "x.parquet", max_rows=2)
    assert refused.value.reason == "it declares 3 rows; its manifest records 2"


def test_an_honest_file_reads_back_exactly_as_written(tmp_path: Path) -> None:
    written = pa.table(
        {
            "weight_versions": pa.array([["a", "b"], None, [], ["a"]], pa.list_(pa.string())),
            "token_version": pa.array(["a", None, "a", "b"]),
            "n": pa.array([1, None, 3, 4], pa.int64()),
        }
    ).replace_schema_metadata({b"tokenlake.table": b"x"})
    pq.write_table(written, tmp_path / "x.parquet", use_dictionary=True)
    read = parquet.read_table(LocalStore(tmp_path), "x.parquet", max_rows=4)
    assert read.equals(written) and read.schema.metadata == written.schema.metadata


def test_rows_read_as_values_are_the_tables_rows_and_as_bounded(tmp_path: Path) -> None:
    """`read_rows` leaves dictionary strings undecoded (no cast): the same Python values."""
    written = pa.table(
        {
            "weight_versions": pa.array([["a", "b"], None, [], ["a"]], pa.list_(pa.string())),
            "token_version": pa.array(["a", None, "a", "b"]),
            "n": pa.array([1, None, 3, 4], pa.int64()),
        }
    )
    pq.write_table(written, tmp_path / "x.parquet", use_dictionary=True)
    store = LocalStore(tmp_path)
    assert parquet.read_rows(store, "x.parquet", 3) == [
        {"weight_versions": ["a", "b"], "token_version": "a", "n": 1},
        {"weight_versions": None, "token_version": None, "n": None},
        {"weight_versions": [], "token_version": "a", "n": 3},
    ]
    assert parquet.read_rows(store, "x.parquet", 9) == written.to_pylist()
    pq.write_table(pa.table({"v": _dictionary_of("v" * MiB, 100)}), tmp_path / "x.parquet")
    with pytest.raises(parquet.UnreadableLakeFile) as refused:
        parquet.read_rows(store, "x.parquet", 1)
    assert refused.value.reason == (
        "it would decode to 101 MiB, more than the 67 MiB a file of 49,649 bytes may:"
        " 64 x its size + 64 MiB"
    )
