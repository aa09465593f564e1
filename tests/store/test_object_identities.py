"""On an object store, readers compare each listed file's size with the identity its manifest
records, from the listing the catalog build makes anyway (no request per file): a step file
or a side file rewritten by a stranger is left out with one warning, the rest is served;
`verify` names it by its footer (moto's S3 server)."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.fixture_paths import REAL_DUMPS
from tests.s3server import cli, fresh_s3, list_keys, new_bucket, rows
from tokenlake.store.object import ObjectStore

pytestmark = pytest.mark.slow  # a server, and a real extraction

BASIC = REAL_DUMPS / "basic"
BY_STEP = "SELECT rollout_id, count(*) FROM tokens GROUP BY ALL"


@pytest.fixture(scope="module")
def s3() -> Iterator[dict[str, str]]:
    with fresh_s3() as env:
        yield env


def _rewrite(bucket: str, key: str, change: str | None = None) -> tuple[int, int]:
    """Write the object `key` again uncompressed (another size, the same rows; with `change`,
    that integer column holds 99). Returns its size before and after."""
    import boto3

    client = boto3.client("s3")
    body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    table = pq.read_table(io.BytesIO(body))
    if change is not None:
        index = table.schema.get_field_index(change)
        values = pa.array([99] * table.num_rows, table.schema.field(index).type)
        table = table.set_column(index, change, values)
    out = io.BytesIO()
    pq.write_table(table, out, compression="NONE")
    client.put_object(Bucket=bucket, Key=key, Body=out.getvalue())
    return len(body), len(out.getvalue())


def test_an_object_rewritten_since_commit_is_left_out_without_a_request_per_file(
    s3: dict[str, str], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    bucket = new_bucket()
    url = f"s3://{bucket}/lake"
    assert cli("extract", str(BASIC), "--lake", url, "--silent")[0] == 0
    assert rows(url, BY_STEP) == [("0", "124"), ("1", "82")]
    assert rows(url, "SELECT train_steps FROM runs") == [("2",)]
    keys = list_keys(bucket, "lake/")
    (step_key,) = [k for k in keys if k.startswith("lake/tokens/run=basic/rollout_id=1/")]
    (runs_key,) = [k for k in keys if k.startswith("lake/runs/")]
    step_sizes = _rewrite(bucket, step_key)
    runs_sizes = _rewrite(bucket, runs_key, "train_steps")
    step_name, runs_name = step_key.removeprefix("lake/"), runs_key.removeprefix("lake/")

    heads: list[str] = []
    given = ObjectStore.reading_filesystem

    def counted(store: ObjectStore):  # type: ignore[no-untyped-def]
        fs = given(store)
        call = fs._call_s3

        async def counting(method, *args, **kwargs):  # type: ignore[no-untyped-def]
            if getattr(method, "__name__", str(method)) == "head_object":
                heads.append(method)
            return await call(method, *args, **kwargs)

        fs._call_s3 = counting
        return fs

    monkeypatch.setattr(ObjectStore, "reading_filesystem", counted)
    caplog.set_level(logging.WARNING)
    assert rows(url, BY_STEP) == [("0", "124")]
    assert rows(url, "SELECT train_steps FROM runs") == []
    assert heads == []
    changed = (
        "is not the file its manifest records (its size or footer changed);"
        " `tokenlake verify LAKE` names it"
    )
    assert sorted(set(caplog.messages)) == [
        f"run `basic` step 1: not served: `{step_name}` {changed}",
        f"run `basic`: side files not served: `{runs_name}` {changed}",
    ]

    code, out = cli("verify", url)
    assert (code, out.splitlines()) == (
        1,
        [
            f"run `basic` step 1: file `{step_name}` changed since it was written:"
            f" {step_sizes[1]:,} bytes, written {step_sizes[0]:,}; delete it and extract again",
            f"run `basic`: file `{runs_name}` changed since it was written:"
            f" {runs_sizes[1]:,} bytes, written {runs_sizes[0]:,}; extract the run again",
            "3 steps checked, 2 problems",
        ],
    )
