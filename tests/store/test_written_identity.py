"""A lake file's identity, recorded in its manifest as written, is read from the temporary
file a local write makes before it is renamed into place: it equals what readers and `verify`
read from the file under its name (`store.parquet.footer_identity`)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from tests.conftest import local_store
from tokenlake.load import write
from tokenlake.store.parquet import UnreadableLakeFile, footer_identity, written_identity


def test_the_identity_of_a_written_file_is_the_one_read_under_its_name(tmp_path):
    store = local_store(tmp_path)
    rows = pa.table({"k": pa.array([1, 2, 3], pa.int64()), "x": [0.5, 1.0, 1.5]})
    schema = rows.schema
    recorded = write.write_lake_file(store, "t/a.parquet", "drift_step_parts", rows, {}, schema)
    assert recorded == footer_identity(store, "t/a.parquet")
    size = (tmp_path / "t" / "a.parquet").stat().st_size
    assert recorded.startswith(f"{size}:")


def test_a_written_file_without_a_footer_is_refused_by_name(tmp_path):
    path = tmp_path / "x.parquet"
    path.write_bytes(b"PAR1 and then nothing")
    with pytest.raises(UnreadableLakeFile, match="ends in no Parquet footer"):
        written_identity(str(path))
